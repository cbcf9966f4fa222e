// blindfold admin pages: the dashboard's live charts and the access-pattern visualizer.
// Plain JavaScript and <canvas>; no libraries, nothing fetched from anywhere but the gateway.
"use strict";

const COLORS = ["#2458d6", "#d6246e", "#15803d", "#b45309", "#6d28d9"];

function fmtNumber(v, digits) {
  if (!isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return v.toFixed(digits === undefined ? (a < 10 ? 2 : 0) : digits);
}

function fmtBytes(v) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return v.toFixed(i === 0 ? 0 : 1) + " " + units[i];
}

function context(canvas) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = "12px system-ui, sans-serif";
  return ctx;
}

// A line chart: series = [{name, values}], xs = unix seconds.
function lineChart(canvas, xs, series, opts) {
  const ctx = context(canvas);
  const W = canvas.width, H = canvas.height, L = 52, R = 10, T = 18, B = 24;
  let max = 0;
  for (const s of series) for (const v of s.values) if (isFinite(v) && v > max) max = v;
  if (max <= 0) max = 1;
  max *= 1.1;
  // Whole-number series (digits 0): whole-number grid lines.
  if (opts && opts.digits === 0) max = Math.max(4, Math.ceil(max / 4) * 4);
  ctx.strokeStyle = "#d9dee5"; ctx.fillStyle = "#5d6b7c"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = T + (H - T - B) * (1 - i / 4);
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
    ctx.fillText(fmtNumber(max * i / 4, opts && opts.digits), 4, y + 4);
  }
  const n = xs.length;
  if (n > 1) {
    const span = Math.max(1, xs[n - 1] - xs[0]);
    ctx.fillText("-" + span + " s", L, H - 6);
    ctx.fillText("now", W - R - 24, H - 6);
  } else {
    ctx.fillText("waiting for data…", L + 8, T + 16);
  }
  series.forEach((s, k) => {
    ctx.strokeStyle = COLORS[k % COLORS.length]; ctx.lineWidth = 2;
    ctx.beginPath();
    s.values.forEach((v, i) => {
      const x = L + (W - L - R) * (n <= 1 ? 1 : i / (n - 1));
      const y = T + (H - T - B) * (1 - (isFinite(v) ? v : 0) / max);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    ctx.fillStyle = COLORS[k % COLORS.length];
    ctx.fillText(s.name, L + 8 + k * 90, 12);
  });
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store", credentials: "same-origin" });
  if (!r.ok) throw new Error(url + ": HTTP " + r.status);
  return r.json();
}

async function post(url) {
  const r = await fetch(url, { method: "POST", credentials: "same-origin", headers: { "X-Blindfold-Admin": "1" } });
  const text = await r.text();
  if (!r.ok) throw new Error(text.trim() || ("HTTP " + r.status));
  return JSON.parse(text);
}

// ---------------------------------------------------------------- dashboard

const dashboard = { updates: 0, points: 0, lastError: null };
window.blindfoldDashboard = dashboard;

async function refreshDashboard() {
  let s;
  try {
    s = await getJSON("/api/summary");
    dashboard.lastError = null;
  } catch (e) {
    dashboard.lastError = String(e);
    document.getElementById("meta").textContent = "cannot reach the gateway: " + e.message;
    return;
  }
  const status = document.getElementById("status");
  status.textContent = s.poisoned ? "engine stopped" : "serving";
  status.className = s.poisoned ? "badge bad" : "badge";
  document.getElementById("meta").textContent =
    "blindfold " + s.version + " · engine " + s.engine + " (" + s.layout + ") · store " + s.store +
    " · " + fmtBytes(s.capacity_bytes) + " in " + s.blocks + " blocks of " + s.block_size +
    " B, Z = " + s.z + (s.cache_levels ? ", " + s.cache_levels + " tree levels in memory" : "") +
    (s.pad_objects ? " · sizes padded" : "") + " · up " + s.uptime_s + " s" +
    (s.price_provider ? " · prices: " + s.price_provider : "");
  const h = s.history;
  const xs = h.map(p => p.t);
  const last = h.length ? h[h.length - 1] : null;
  if (last) {
    document.getElementById("t-rps").textContent = fmtNumber(last.requests_per_s, 0);
    document.getElementById("t-p99").textContent = fmtNumber(last.p99_ms, 1) + " ms";
    document.getElementById("t-blowup").textContent = fmtNumber(last.blowup, 1) + "×";
    document.getElementById("t-stash").textContent = String(s.gauges.stash);
    document.getElementById("t-cost").textContent = "$" + last.cost_dollars.toFixed(4);
    document.getElementById("t-rss").textContent = fmtBytes(last.resident_bytes);
  }
  lineChart(document.getElementById("c-rps"), xs, [{ name: "requests/s", values: h.map(p => p.requests_per_s) }]);
  lineChart(document.getElementById("c-lat"), xs, [
    { name: "p50", values: h.map(p => p.p50_ms) },
    { name: "p90", values: h.map(p => p.p90_ms) },
    { name: "p99", values: h.map(p => p.p99_ms) },
  ], { digits: 1 });
  lineChart(document.getElementById("c-bytes"), xs, [
    { name: "S3 clients", values: h.map(p => p.s3_bytes_per_s) },
    { name: "store", values: h.map(p => p.store_bytes_per_s) },
  ]);
  lineChart(document.getElementById("c-blowup"), xs, [{ name: "blow-up", values: h.map(p => p.blowup) }], { digits: 1 });
  lineChart(document.getElementById("c-stash"), xs, [{ name: "stash", values: h.map(p => p.stash) }], { digits: 0 });
  lineChart(document.getElementById("c-cost"), xs, [{ name: "US $", values: h.map(p => p.cost_dollars) }], { digits: 4 });
  dashboard.updates += 1;
  dashboard.points = h.length;
  dashboard.lastRequestsPerSecond = last ? last.requests_per_s : 0;
  dashboard.totalRequests = h.reduce((a, p) => a + p.requests_per_s, 0);
}

// ---------------------------------------------------------------- visualizer

const visualizer = { source: null, physical: 0, logical: 0, pValue: null, draws: 0, recording: false };
window.blindfoldVisualizer = visualizer;

function drawLogical(w) {
  const canvas = document.getElementById("c-logical");
  const ctx = context(canvas);
  const W = canvas.width, H = canvas.height, L = 40, B = 18;
  const span = Math.max(1, w.elapsed_ms);
  let maxBlock = 1;
  for (const e of w.logical) if (e.block > maxBlock) maxBlock = e.block;
  ctx.fillStyle = "#5d6b7c";
  ctx.fillText("block", 2, 12);
  ctx.fillText(String(maxBlock), 2, 26);
  ctx.fillText("0", 2, H - B);
  ctx.fillText("time →", W - 48, H - 4);
  for (const e of w.logical) {
    const x = L + (W - L - 4) * (e.t_ms / span);
    const y = 4 + (H - B - 8) * (1 - e.block / maxBlock);
    ctx.fillStyle = e.write ? "#d6246e" : "#2458d6";
    ctx.fillRect(x, y, 2, 2);
  }
  document.getElementById("logical-count").textContent = w.logical.length + " accesses";
}

function drawPhysical(w) {
  const canvas = document.getElementById("c-physical");
  const ctx = context(canvas);
  const W = canvas.width, H = canvas.height, L = 40, B = 18, ROWS = 32, COLS = 60;
  const span = Math.max(1, w.elapsed_ms);
  const grid = new Array(ROWS * COLS).fill(0);
  let max = 0;
  for (const e of w.physical) {
    if (e.write || e.target === null) continue;
    const c = Math.min(COLS - 1, Math.floor(COLS * e.t_ms / span));
    const r = Math.min(ROWS - 1, Math.floor(ROWS * e.target / Math.max(1, w.targets)));
    const v = ++grid[r * COLS + c];
    if (v > max) max = v;
  }
  const cw = (W - L - 4) / COLS, rh = (H - B - 4) / ROWS;
  for (let r = 0; r < ROWS; r++) {
    for (let c = 0; c < COLS; c++) {
      const v = grid[r * COLS + c];
      if (!v) continue;
      const a = Math.sqrt(v / max);
      ctx.fillStyle = "rgba(214, 36, 110, " + a.toFixed(3) + ")";
      ctx.fillRect(L + c * cw, 4 + (ROWS - 1 - r) * rh, Math.ceil(cw), Math.ceil(rh));
    }
  }
  ctx.fillStyle = "#5d6b7c";
  const what = w.view.kind === "tree" ? "leaf" : "cell";
  ctx.fillText(what, 2, 12);
  ctx.fillText("0", 2, H - B);
  ctx.fillText("time →", W - 48, H - 4);
  document.getElementById("physical-axis").textContent =
    w.view.kind === "tree"
      ? "rows: the leaf each path read reaches (" + w.targets + " leaves)"
      : "rows: the cell each read touches (" + w.targets + " cells)";
  document.getElementById("physical-count").textContent = w.physical.length + " store requests";
}

function drawHistogram(w) {
  const canvas = document.getElementById("c-hist");
  const ctx = context(canvas);
  const W = canvas.width, H = canvas.height, L = 40, B = 16;
  const h = w.histogram;
  const max = Math.max(1, ...h);
  const bw = (W - L - 4) / h.length;
  ctx.fillStyle = "#2458d6";
  h.forEach((v, i) => {
    const bh = (H - B - 8) * v / max;
    ctx.fillRect(L + i * bw + 1, H - B - bh, bw - 2, bh);
  });
  const expected = w.uniformity.samples / h.length;
  if (expected > 0) {
    const y = H - B - (H - B - 8) * expected / max;
    ctx.strokeStyle = "#b45309"; ctx.setLineDash([4, 3]);
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - 4, y); ctx.stroke(); ctx.setLineDash([]);
    ctx.fillStyle = "#b45309"; ctx.fillText("uniform", W - 52, y - 3);
  }
  ctx.fillStyle = "#5d6b7c"; ctx.fillText(String(max), 2, 14); ctx.fillText("0", 2, H - B);
  const u = w.uniformity;
  document.getElementById("chi").textContent = u.chi_square.toFixed(1) + " (" + u.dof + " dof, " + u.samples + " reads)";
  const verdict = document.getElementById("verdict");
  if (u.p_value === null) {
    document.getElementById("pvalue").textContent = "–";
    verdict.textContent = "too few reads yet";
    verdict.className = "verdict";
  } else {
    document.getElementById("pvalue").textContent = u.p_value < 1e-6 ? u.p_value.toExponential(1) : u.p_value.toFixed(3);
    const uniform = u.p_value >= 0.001;
    verdict.textContent = uniform ? "consistent with uniform" : "not uniform: the store sees the workload";
    verdict.className = uniform ? "verdict ok" : "verdict bad";
  }
}

function drawRequests(w) {
  const body = document.getElementById("requests");
  body.textContent = "";
  for (const r of w.requests.slice(-40).reverse()) {
    const tr = document.createElement("tr");
    for (const v of [r.t_ms, r.operation, r.name, r.status]) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

let pollTimer = null;

async function pollWindow() {
  if (!visualizer.source) return;
  let w;
  try {
    w = await getJSON("/api/window" + (visualizer.source === "demo" ? "?source=demo" : ""));
  } catch (e) {
    document.getElementById("state").textContent = String(e.message);
    return;
  }
  if (!w) return;
  document.getElementById("label").textContent =
    w.label + " · " + (w.recording ? "recording, " : "recorded ") + (w.elapsed_ms / 1000).toFixed(1) +
    " of " + (w.length_ms / 1000).toFixed(0) + " s" + (w.dropped ? " · " + w.dropped + " events over the cap not kept" : "");
  drawLogical(w);
  drawPhysical(w);
  drawHistogram(w);
  drawRequests(w);
  visualizer.physical = w.physical.length;
  visualizer.logical = w.logical.length;
  visualizer.pValue = w.uniformity.p_value;
  visualizer.recording = w.recording;
  visualizer.label = w.label;
  visualizer.draws += 1;
  if (!w.recording && pollTimer) {
    clearInterval(pollTimer);
    pollTimer = null;
    document.getElementById("state").textContent = "done";
  }
}

async function start(source, url) {
  const seconds = Math.max(1, Math.min(120, parseInt(document.getElementById("seconds").value, 10) || 10));
  try {
    await post(url + (url.includes("?") ? "&" : "?") + "seconds=" + seconds);
  } catch (e) {
    document.getElementById("state").textContent = "could not start: " + e.message;
    document.getElementById("state").className = "note error";
    return;
  }
  visualizer.source = source;
  document.getElementById("state").textContent = "recording…";
  if (pollTimer) clearInterval(pollTimer);
  pollTimer = setInterval(pollWindow, 1000);
  setTimeout(pollWindow, 300);
}

function initVisualizer() {
  document.getElementById("record").addEventListener("click", () => start("live", "/api/window"));
  document.getElementById("demo-on").addEventListener("click", () => start("demo", "/api/demo?oram=on"));
  document.getElementById("demo-off").addEventListener("click", () => start("demo", "/api/demo?oram=off"));
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "dashboard") {
    refreshDashboard();
    setInterval(refreshDashboard, 1000);
  } else if (page === "visualizer") {
    initVisualizer();
  }
});
