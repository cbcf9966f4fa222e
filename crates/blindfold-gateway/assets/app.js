// blindfold admin pages: the dashboard's live charts and the access-pattern visualizer.
// Plain JavaScript and <canvas>; no libraries, nothing fetched from anywhere but the gateway.
"use strict";

const COLORS = ["#2458d6", "#d6246e", "#15803d", "#b45309", "#6d28d9"];

// Every chart's axis as last drawn (canvas id → {ticks, labels}), for the browser checks.
const charts = {};
window.blindfoldCharts = charts;

// A number with at most `digits` decimals, trailing zeros dropped; thousands as k, M, G.
function fmtNumber(v, digits) {
  if (!isFinite(v)) return "–";
  const a = Math.abs(v);
  const trim = (x, d) => String(Number(x.toFixed(d)));
  if (a >= 1e9) return trim(v / 1e9, 2) + "G";
  if (a >= 1e6) return trim(v / 1e6, 2) + "M";
  if (a >= 1e4) return trim(v / 1e3, 1) + "k";
  return trim(v, digits === undefined ? (a < 10 ? 2 : 0) : digits);
}

function fmtBytes(v) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? String(Math.round(v)) : v.toFixed(1)) + " " + units[i];
}

// Bytes for an axis: decimal units, so 1/2/5 steps read as round numbers (2 MB, 500 kB).
function fmtBytesSI(v) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return String(Number(v.toFixed(2))) + " " + units[i];
}

// Round axis ticks from 0 to at least `max`: a step of 1, 2 or 5 times a power of ten.
// `integer`: whole numbers only (counts), so the step is at least 1.
function niceTicks(max, count, integer) {
  if (!(max > 0)) max = 1;
  const raw = max / (count || 4);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw * (1 - 1e-9));
  if (integer && step < 1) step = 1;
  const ticks = [];
  // Decimals the step needs, so 0.1 + 0.2 prints as 0.3.
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  for (let i = 0; ; i++) {
    const t = Number((i * step).toFixed(decimals));
    ticks.push(t);
    if (t >= max * (1 - 1e-9)) break;
  }
  return { ticks, step, top: ticks[ticks.length - 1], decimals };
}

// Sizes the canvas's backing store to its displayed box times the device pixel ratio (so
// nothing is scaled: text stays crisp and 12 px is 12 px), and returns a context that draws
// in CSS pixels with the box's width and height.
function context(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const W = Math.max(1, Math.round(canvas.clientWidth));
  const H = Math.max(1, Math.round(canvas.clientHeight));
  if (canvas.width !== Math.round(W * dpr) || canvas.height !== Math.round(H * dpr)) {
    canvas.width = Math.round(W * dpr);
    canvas.height = Math.round(H * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, W, H);
  ctx.font = "12px system-ui, sans-serif";
  ctx.textBaseline = "alphabetic";
  return { ctx, W, H };
}

// A line chart: series = [{name, values}] (NaN or null: no value, a gap), xs = unix seconds.
// opts.format prints a tick value (with its unit).
function lineChart(canvas, xs, series, opts) {
  const { ctx, W, H } = context(canvas);
  const format = (opts && opts.format) || ((v, axis) => fmtNumber(v, axis.decimals));
  let max = 0;
  for (const s of series) for (const v of s.values) if (v !== null && isFinite(v) && v > max) max = v;
  const axis = niceTicks(max > 0 ? max : (opts && opts.emptyMax) || 1, 4, opts && opts.integer);
  const labels = axis.ticks.map((t) => format(t, axis));
  ctx.font = "12px system-ui, sans-serif";
  const L = Math.ceil(Math.max(...labels.map((l) => ctx.measureText(l).width))) + 10;
  const R = 10, T = 22, B = 22;
  ctx.strokeStyle = "#d9dee5"; ctx.fillStyle = "#5d6b7c"; ctx.lineWidth = 1;
  axis.ticks.forEach((t, i) => {
    const y = Math.round(T + (H - T - B) * (1 - t / axis.top)) + 0.5;
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
    ctx.textAlign = "right";
    ctx.fillText(labels[i], L - 6, y + 4);
  });
  ctx.textAlign = "left";
  charts[canvas.id] = { ticks: axis.ticks, step: axis.step, labels };
  const n = xs.length;
  if (n > 1) {
    const span = Math.max(1, xs[n - 1] - xs[0]);
    ctx.fillText("−" + span + " s", L, H - 6);
    ctx.textAlign = "right";
    ctx.fillText("now", W - R, H - 6);
    ctx.textAlign = "left";
  } else {
    ctx.fillText("waiting for data…", L + 8, T + 16);
  }
  if (opts && opts.note && max <= 0 && n > 1) ctx.fillText(opts.note, L + 8, T + 16);
  let legendX = L;
  series.forEach((s, k) => {
    const color = COLORS[k % COLORS.length];
    ctx.strokeStyle = color; ctx.lineWidth = 2;
    ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || !isFinite(v)) { pen = false; return; }
      const x = L + (W - L - R) * (n <= 1 ? 1 : i / (n - 1));
      const y = T + (H - T - B) * (1 - v / axis.top);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    });
    ctx.stroke();
    ctx.fillStyle = color;
    ctx.fillRect(legendX, 6, 10, 10);
    ctx.fillStyle = "#1c2430";
    ctx.fillText(s.name, legendX + 14, 15);
    legendX += 14 + ctx.measureText(s.name).width + 16;
  });
}

// Requests go to this page's origin, built from `location.origin`, which never holds the
// user name and password of an address like https://AK:SK@host/ (a URL with credentials
// cannot be fetched); the browser sends the credentials it was given itself.
function api(path) {
  return new URL(path, window.location.origin).href;
}

async function getJSON(path) {
  const r = await fetch(api(path), { cache: "no-store", credentials: "same-origin" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

async function post(path) {
  const r = await fetch(api(path), { method: "POST", credentials: "same-origin", headers: { "X-Blindfold-Admin": "1" } });
  const text = await r.text();
  if (!r.ok) throw new Error(text.trim() || ("HTTP " + r.status));
  return JSON.parse(text);
}

function setText(id, text) {
  const e = document.getElementById(id);
  if (e) e.textContent = text;
}

// ---------------------------------------------------------------- dashboard

const dashboard = { updates: 0, points: 0, lastError: null };
window.blindfoldDashboard = dashboard;

function fmtPercent(part, whole) {
  if (!(whole > 0)) return "–";
  const p = 100 * part / whole;
  return (p > 0 && p < 0.1 ? "< 0.1" : p.toFixed(1)) + "%";
}

// The store fullness tile: blocks in use of the capacity, objects and bytes, the disk.
function showUsage(u) {
  if (!u) return;
  setText("t-fullness", fmtPercent(u.blocks_used, u.blocks_capacity) + " full");
  setText("t-fullness-blocks", u.blocks_used + " of " + u.blocks_capacity + " blocks of " + fmtBytes(u.block_size));
  const bar = document.getElementById("t-fullness-bar");
  if (bar) {
    const p = u.blocks_capacity > 0 ? Math.min(100, 100 * u.blocks_used / u.blocks_capacity) : 0;
    bar.style.width = p.toFixed(1) + "%";
    bar.className = p >= 90 ? "fill bad" : p >= 75 ? "fill warn" : "fill";
  }
  setText("t-objects", String(u.objects));
  setText("t-objects-bytes", fmtBytes(u.object_bytes) + " as sent by clients");
  if (u.data_dir_free_bytes !== null && u.data_dir_size_bytes) {
    setText("t-disk", fmtBytes(u.data_dir_free_bytes));
    setText("t-disk-of", "free of " + fmtBytes(u.data_dir_size_bytes) + " (" +
      fmtPercent(u.data_dir_free_bytes, u.data_dir_size_bytes) + ")");
  } else {
    setText("t-disk", "–");
    setText("t-disk-of", "cannot be read here");
  }
}

// A store the operator pays nobody for (files on this machine, memory).
function localStore(store) {
  return /^(file:|memory:)/.test(store || "");
}

async function refreshDashboard() {
  let s;
  try {
    s = await getJSON("/api/summary");
    dashboard.lastError = null;
  } catch (e) {
    dashboard.lastError = String(e);
    setText("meta", "cannot reach the gateway: " + e.message);
    return;
  }
  const status = document.getElementById("status");
  status.textContent = s.poisoned ? "engine stopped" : "serving";
  status.className = s.poisoned ? "badge bad" : "badge";
  const expiry = s.usage && s.usage.tls_not_after
    ? " · TLS certificate valid until " + new Date(s.usage.tls_not_after * 1000).toISOString().slice(0, 10)
    : "";
  setText("meta",
    "blindfold " + s.version + " · engine " + s.engine + " (" + s.layout + ") · store " + s.store +
    " · " + fmtBytes(s.capacity_bytes) + " in " + s.blocks + " blocks of " + s.block_size +
    " bytes, Z = " + s.z + (s.cache_levels ? ", " + s.cache_levels + " tree levels in memory" : "") +
    (s.pad_objects ? " · sizes padded" : "") + " · up " + s.uptime_s + " s" + expiry);
  showUsage(s.usage);
  const h = s.history;
  const xs = h.map((p) => p.t);
  const last = h.length ? h[h.length - 1] : null;
  const busy = h.filter((p) => p.requests_per_s > 0);
  const lastBusy = busy.length ? busy[busy.length - 1] : null;
  const basis = s.price_provider
    ? (localStore(s.store) ? "if this traffic went to " : "at the list prices of ") + s.price_provider +
      (localStore(s.store) ? " (this store is local: no bill)" : "")
    : "no price table";
  if (last) {
    setText("t-rps", fmtNumber(last.requests_per_s, 0));
    if (last.requests_per_s > 0) {
      setText("t-p99", fmtNumber(last.p99_ms, 1) + " ms");
      setText("t-p99-note", "requests ended in the last second");
    } else if (lastBusy) {
      setText("t-p99", fmtNumber(lastBusy.p99_ms, 1) + " ms");
      setText("t-p99-note", "last busy second, " + (last.t - lastBusy.t) + " s ago");
    } else {
      setText("t-p99", "—");
      setText("t-p99-note", "no requests yet");
    }
    setText("t-blowup", fmtNumber(last.blowup, 1) + "×");
    setText("t-stash", String(s.gauges.stash));
    setText("t-cost", "$" + last.cost_dollars.toFixed(4));
    setText("t-cost-basis", basis);
    setText("t-rss", fmtBytes(last.resident_bytes));
  }
  setText("cost-basis", basis);
  const perSecond = (v, axis) => fmtNumber(v, axis.decimals) + "/s";
  lineChart(document.getElementById("c-rps"), xs, [{ name: "S3 requests per second", values: h.map((p) => p.requests_per_s) }],
    { format: perSecond, emptyMax: 10, integer: true, note: "idle: no requests" });
  // A second without requests has no latency: a gap, not 0 ms.
  const lat = (k) => h.map((p) => (p.requests_per_s > 0 ? p[k] : null));
  lineChart(document.getElementById("c-lat"), xs, [
    { name: "p50", values: lat("p50_ms") },
    { name: "p90", values: lat("p90_ms") },
    { name: "p99", values: lat("p99_ms") },
  ], { format: (v, axis) => fmtNumber(v, axis.decimals) + " ms", emptyMax: 10, note: "no requests yet: no latency" });
  lineChart(document.getElementById("c-bytes"), xs, [
    { name: "S3 clients", values: h.map((p) => p.s3_bytes_per_s) },
    { name: "store", values: h.map((p) => p.store_bytes_per_s) },
  ], { format: (v) => fmtBytesSI(v) + "/s", emptyMax: 1000, note: "idle: no traffic" });
  lineChart(document.getElementById("c-blowup"), xs,
    [{ name: "store bytes per block byte, each second", values: h.map((p) => (p.blowup_interval === undefined ? null : p.blowup_interval)) }],
    { format: (v, axis) => fmtNumber(v, axis.decimals) + "×", emptyMax: 10, note: "no block traffic yet" });
  lineChart(document.getElementById("c-stash"), xs, [{ name: "blocks in the stash", values: h.map((p) => p.stash) }],
    { emptyMax: 4, integer: true });
  lineChart(document.getElementById("c-cost"), xs, [{ name: "US $ since start", values: h.map((p) => p.cost_dollars) }],
    { format: (v, axis) => "$" + v.toFixed(axis.decimals), emptyMax: 0.001 });
  dashboard.updates += 1;
  dashboard.points = h.length;
  dashboard.lastRequestsPerSecond = last ? last.requests_per_s : 0;
  dashboard.totalRequests = h.reduce((a, p) => a + p.requests_per_s, 0);
}

// ---------------------------------------------------------------- visualizer

const visualizer = { source: null, physical: 0, logical: 0, pValue: null, draws: 0, recording: false };
window.blindfoldVisualizer = visualizer;

// Left-axis labels of a heat map or scatter plot: 0 and round values up to `max` (targets or
// blocks), at their heights in a plot from y = top to y = bottom.
function countAxis(ctx, id, max, x, top, bottom) {
  const axis = niceTicks(Math.max(1, max), 4, true);
  const labels = axis.ticks.map((t) => fmtNumber(t, 0));
  ctx.fillStyle = "#5d6b7c";
  ctx.textAlign = "right";
  axis.ticks.forEach((t, i) => {
    if (t > max) return;
    const y = bottom - (bottom - top) * (t / Math.max(1, max));
    ctx.fillText(labels[i], x, Math.max(top + 10, Math.min(bottom, y + 4)));
  });
  ctx.textAlign = "left";
  charts[id] = { ticks: axis.ticks.filter((t) => t <= max), step: axis.step, labels };
}

function drawLogical(w) {
  const canvas = document.getElementById("c-logical");
  const { ctx, W, H } = context(canvas);
  const L = 48, T = 18, B = 20;
  const span = Math.max(1, w.elapsed_ms);
  let maxBlock = 1;
  for (const e of w.logical) if (e.block > maxBlock) maxBlock = e.block;
  ctx.fillStyle = "#5d6b7c";
  ctx.fillText("block", 4, 12);
  countAxis(ctx, "c-logical", maxBlock, L - 6, T, H - B);
  ctx.fillText("0 s", L, H - 5);
  ctx.textAlign = "right";
  ctx.fillText((span / 1000).toFixed(1) + " s", W - 4, H - 5);
  ctx.textAlign = "left";
  for (const e of w.logical) {
    const x = L + (W - L - 6) * (e.t_ms / span);
    const y = T + (H - B - T) * (1 - e.block / maxBlock);
    ctx.fillStyle = e.write ? "#d6246e" : "#2458d6";
    ctx.fillRect(x, y - 1, 2, 2);
  }
  setText("logical-count", w.logical.length + " accesses");
}

function drawPhysical(w) {
  const canvas = document.getElementById("c-physical");
  const { ctx, W, H } = context(canvas);
  const L = 48, T = 18, B = 20, ROWS = 32, COLS = Math.max(20, Math.min(60, Math.floor((W - L) / 8)));
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
  const cw = (W - L - 6) / COLS, rh = (H - B - T) / ROWS;
  for (let r = 0; r < ROWS; r++) {
    for (let c = 0; c < COLS; c++) {
      const v = grid[r * COLS + c];
      if (!v) continue;
      const a = Math.sqrt(v / max);
      ctx.fillStyle = "rgba(214, 36, 110, " + a.toFixed(3) + ")";
      ctx.fillRect(L + c * cw, T + (ROWS - 1 - r) * rh, Math.ceil(cw), Math.ceil(rh));
    }
  }
  ctx.fillStyle = "#5d6b7c";
  ctx.fillText(w.view.kind === "tree" ? "leaf" : "cell", 4, 12);
  countAxis(ctx, "c-physical", Math.max(1, w.targets - 1), L - 6, T, H - B);
  ctx.fillText("0 s", L, H - 5);
  ctx.textAlign = "right";
  ctx.fillText((span / 1000).toFixed(1) + " s", W - 4, H - 5);
  ctx.textAlign = "left";
  setText("physical-axis",
    w.view.kind === "tree"
      ? "rows: the leaf each path read reaches (" + w.targets + " leaves)"
      : "rows: the cell each read touches (" + w.targets + " cells)");
  setText("physical-count", w.physical.length + " store requests");
}

// A p-value as a reader takes it in: three decimals, or "p < 0.001" below that.
function fmtP(p) {
  if (p === null || p === undefined || !isFinite(p)) return "p = –";
  return p < 0.001 ? "p < 0.001" : "p = " + p.toFixed(3);
}

function drawHistogram(w) {
  const canvas = document.getElementById("c-hist");
  const { ctx, W, H } = context(canvas);
  const h = w.histogram;
  const expected = w.uniformity.samples / h.length;
  const axis = niceTicks(Math.max(1, ...h, expected), 4, true);
  const labels = axis.ticks.map((t) => fmtNumber(t, 0));
  const L = Math.ceil(Math.max(...labels.map((l) => ctx.measureText(l).width))) + 10, T = 8, B = 18, R = 4;
  const y = (v) => H - B - (H - B - T) * v / axis.top;
  ctx.strokeStyle = "#d9dee5"; ctx.fillStyle = "#5d6b7c"; ctx.lineWidth = 1;
  ctx.textAlign = "right";
  axis.ticks.forEach((t, i) => {
    const yy = Math.round(y(t)) + 0.5;
    ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(W - R, yy); ctx.stroke();
    ctx.fillText(labels[i], L - 6, yy + 4);
  });
  ctx.textAlign = "left";
  charts["c-hist"] = { ticks: axis.ticks, step: axis.step, labels };
  const bw = (W - L - R) / h.length;
  ctx.fillStyle = "#2458d6";
  h.forEach((v, i) => {
    ctx.fillRect(L + i * bw + 1, y(v), Math.max(1, bw - 2), H - B - y(v));
  });
  if (expected > 0) {
    // Labelled in the legend above the chart, never on the bars.
    ctx.strokeStyle = "#b45309"; ctx.lineWidth = 2; ctx.setLineDash([5, 4]);
    ctx.beginPath(); ctx.moveTo(L, y(expected)); ctx.lineTo(W - R, y(expected)); ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.fillStyle = "#5d6b7c";
  ctx.fillText("bin 1", L, H - 4);
  ctx.textAlign = "right";
  ctx.fillText("bin " + h.length, W - R, H - 4);
  ctx.textAlign = "left";
  const u = w.uniformity;
  setText("chi", u.chi_square.toFixed(1) + " (" + u.dof + " degrees of freedom, " + u.samples + " reads)");
  const verdict = document.getElementById("verdict");
  setText("pvalue", fmtP(u.p_value));
  if (u.p_value === null) {
    verdict.textContent = "too few reads yet (under 5 per bin)";
    verdict.className = "verdict";
  } else {
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
    [r.t_ms, r.operation, r.name, r.status].forEach((v, i) => {
      const td = document.createElement("td");
      td.textContent = String(v);
      if (i === 2) td.className = "name";
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
  let note;
  if (w.label.startsWith("demo")) {
    note = "The demo drives an ORAM of its own directly, not through S3, so it makes no S3 requests: " +
      "record the live gateway to see its requests here.";
  } else if (!w.requests.length) {
    note = w.recording ? "No S3 requests yet in this window." : "No S3 requests arrived during this window.";
  } else {
    note = "The last " + Math.min(40, w.requests.length) + " of " + w.requests.length +
      " requests, newest first; t is milliseconds since the window began.";
  }
  setText("requests-note", note);
}

let pollTimer = null;
// The window last drawn, drawn again when the page's width changes.
let lastWindow = null;

function drawWindow(w) {
  drawLogical(w);
  drawPhysical(w);
  drawHistogram(w);
  drawRequests(w);
}

async function pollWindow() {
  const source = visualizer.source;
  if (!source) return;
  let w;
  try {
    w = await getJSON("/api/window" + (source === "demo" ? "?source=demo" : ""));
  } catch (e) {
    document.getElementById("state").textContent = String(e.message);
    return;
  }
  // A recording started while this answer was on its way: it shows the other one.
  if (!w || visualizer.source !== source) return;
  document.getElementById("label").textContent =
    w.label + " · " + (w.recording ? "recording, " : "recorded ") + (w.elapsed_ms / 1000).toFixed(1) +
    " of " + (w.length_ms / 1000).toFixed(0) + " s" + (w.dropped ? " · " + w.dropped + " events over the cap not kept" : "");
  drawWindow(w);
  lastWindow = w;
  visualizer.physical = w.physical.length;
  visualizer.logical = w.logical.length;
  visualizer.pValue = w.uniformity.p_value;
  visualizer.recording = w.recording;
  visualizer.label = w.label;
  visualizer.draws += 1;
  if (!w.recording && pollTimer) {
    clearInterval(pollTimer);
    pollTimer = null;
    setText("state", "");
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

// On opening, show what was recorded already: the live gateway's window, else the demo's;
// unless a recording was started meanwhile (a click while these answers were on their way):
// that one is what the page shows.
async function showExisting() {
  for (const source of ["live", "demo"]) {
    let w;
    try {
      w = await getJSON("/api/window" + (source === "demo" ? "?source=demo" : ""));
    } catch (e) {
      if (!visualizer.source) setText("state", String(e.message));
      return;
    }
    if (visualizer.source) return;
    if (!w) continue;
    visualizer.source = source;
    await pollWindow();
    if (w.recording && !pollTimer) pollTimer = setInterval(pollWindow, 1000);
    return;
  }
}

function initVisualizer() {
  document.getElementById("record").addEventListener("click", () => start("live", "/api/window"));
  document.getElementById("demo-on").addEventListener("click", () => start("demo", "/api/demo?oram=on"));
  document.getElementById("demo-off").addEventListener("click", () => start("demo", "/api/demo?oram=off"));
  showExisting();
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "dashboard") {
    refreshDashboard();
    setInterval(refreshDashboard, 1000);
  } else if (page === "visualizer") {
    initVisualizer();
    window.addEventListener("resize", () => { if (lastWindow) drawWindow(lastWindow); });
  }
});
