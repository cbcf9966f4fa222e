// Browser checks of the admin listener: headless Chromium (the system's, /usr/bin/chromium)
// driven by playwright-core, against a live `blindfold serve --admin-listen …` that is under
// load (tests/e2e/features.py runs the soak beside it, and a trickle of requests that lasts as
// long as this script does).
//
//   node check.mjs --admin http://127.0.0.1:PORT --user AK --password SK --out DIR
//                  [--docs-img DIR] [--chromium PATH]
//
// Besides what each page shows, every page is checked for legibility: each canvas's backing
// store matches its displayed size times devicePixelRatio (nothing scaled down to a blur of
// six-pixel labels), axis ticks are round (1, 2 or 5 times a power of ten), nothing overflows
// a phone's width (390×844), and a login given in the address (https://AK:SK@host/) works.
//
// Prints one `ok - …` or `FAIL - …` line per check (scripts/e2e.sh counts them) and saves
// screenshots in --out (and, with --docs-img, the three docs/ shows). Exits non-zero if a
// check failed.
import { chromium } from "playwright-core";
import { mkdirSync, existsSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

const { values: args } = parseArgs({
  options: {
    admin: { type: "string" },
    user: { type: "string" },
    password: { type: "string" },
    out: { type: "string", default: "browser-artefacts" },
    "docs-img": { type: "string" },
    chromium: { type: "string", default: process.env.CHROMIUM || "/usr/bin/chromium" },
  },
});
if (!args.admin || !args.user || !args.password) {
  console.error("usage: node check.mjs --admin URL --user AK --password SK [--out DIR] [--docs-img DIR]");
  process.exit(2);
}
if (!existsSync(args.chromium)) {
  console.log(`FAIL - browser: no Chromium at ${args.chromium} (apt-get install chromium)`);
  process.exit(1);
}
const admin = args.admin.replace(/\/$/, "");
mkdirSync(args.out, { recursive: true });
if (args["docs-img"]) mkdirSync(args["docs-img"], { recursive: true });

let failed = 0;
async function check(name, fn) {
  const t0 = Date.now();
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error("no answer within 120 s")), 120000);
  });
  try {
    await Promise.race([fn(), limit]);
    console.log(`ok - ${name} # ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL - ${name}: ${String(e && e.message ? e.message : e).split("\n")[0]}`);
  } finally {
    clearTimeout(timer);
  }
}
function assert(cond, message) {
  if (!cond) throw new Error(message);
}

// Every console error, uncaught exception and failed request of a page, so a check can demand
// there were none.
function watch(page) {
  const problems = [];
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`exception: ${e.message}`));
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`);
  });
  return problems;
}

// How many pixels of a canvas are drawn (not the background), so "the chart updates" means
// something was painted, not only that a counter moved.
async function painted(page, id) {
  return page.evaluate((id) => {
    const c = document.getElementById(id);
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] !== 0 && (d[i] < 235 || d[i + 1] < 235 || d[i + 2] < 235)) n++;
    return n;
  }, id);
}

// Canvases whose backing store is not their displayed size times devicePixelRatio.
async function blurredCanvases(page) {
  return page.evaluate(() => {
    const dpr = window.devicePixelRatio || 1;
    return [...document.querySelectorAll("canvas")]
      .map((c) => ({ id: c.id, width: c.width, height: c.height, want: [Math.round(c.clientWidth * dpr), Math.round(c.clientHeight * dpr)] }))
      .filter((c) => Math.abs(c.width - c.want[0]) > 1 || Math.abs(c.height - c.want[1]) > 1)
      .map((c) => `${c.id} is ${c.width}×${c.height}, shown at ${c.want[0]}×${c.want[1]} device pixels`);
  });
}

// Axis ticks that are not round: every step must be 1, 2 or 5 times a power of ten, every
// tick a multiple of it, and no label longer than the step needs (no "1421.6", "0.3671").
async function unroundTicks(page) {
  const charts = await page.evaluate(() => window.blindfoldCharts || {});
  const problems = [];
  if (!Object.keys(charts).length) problems.push("no chart axes recorded");
  for (const [id, c] of Object.entries(charts)) {
    const mantissa = c.step / Math.pow(10, Math.floor(Math.log10(c.step) + 1e-9));
    if (![1, 2, 5].some((m) => Math.abs(mantissa - m) < 1e-6)) problems.push(`${id}: step ${c.step}`);
    for (const t of c.ticks) {
      const k = t / c.step;
      if (Math.abs(k - Math.round(k)) > 1e-6) problems.push(`${id}: tick ${t} is not a multiple of ${c.step}`);
    }
    for (const l of c.labels) {
      const digits = (l.match(/\.(\d+)/) || ["", ""])[1].length;
      if (digits > Math.max(0, -Math.floor(Math.log10(c.step) + 1e-9))) problems.push(`${id}: label "${l}"`);
    }
  }
  return problems;
}

// Whether the page is wider than the viewport (a phone would scroll sideways).
async function overflow(page) {
  return page.evaluate(() => {
    const wide = document.documentElement.scrollWidth - window.innerWidth;
    if (wide <= 0) return null;
    const culprits = [...document.querySelectorAll("body *")]
      .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1)
      .slice(0, 3)
      .map((e) => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.className ? "." + e.className : ""));
    return `${wide} px wider than the screen (${culprits.join(", ")})`;
  });
}

const browser = await chromium.launch({
  executablePath: args.chromium,
  headless: true,
  // This machine has no outside network: keep Chromium from reaching for it.
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
});
const credentials = { username: args.user, password: args.password };
const viewport = { width: 1400, height: 900 };
const phone = { viewport: { width: 390, height: 844 }, deviceScaleFactor: 3, isMobile: true, hasTouch: true };

try {
  await check("browser: unauthenticated requests are refused (401), the probes are open", async () => {
    const ctx = await browser.newContext({ viewport });
    const page = await ctx.newPage();
    const health = await page.goto(admin + "/healthz");
    assert(health.status() === 200, `/healthz answered ${health.status()}`);
    // From an open page, the browser's own requests to everything else are refused (with
    // credentials "omit" Chromium hands a 401 to the page instead of waiting on a login prompt).
    for (const path of ["/", "/visualizer", "/metrics", "/api/summary", "/api/window", "/assets/app.js"]) {
      const status = await page.evaluate((p) => fetch(p, { cache: "no-store", credentials: "omit" }).then((r) => r.status), path);
      assert(status === 401, `${path} answered ${status} without credentials`);
    }
    const post = await page.evaluate(() =>
      fetch("/api/demo?oram=off&seconds=1", { method: "POST", credentials: "omit", headers: { "X-Blindfold-Admin": "1" } }).then(
        (r) => r.status,
      ),
    );
    assert(post === 401, `POST /api/demo answered ${post} without credentials`);
    const wrong = await page.evaluate(
      (h) => fetch("/metrics", { credentials: "omit", headers: { Authorization: h } }).then((r) => r.status),
      "Basic " + Buffer.from(`${args.user}:wrong-secret`).toString("base64"),
    );
    assert(wrong === 401, `/metrics answered ${wrong} to a wrong secret key`);
    const bearer = await page.evaluate(
      () => fetch("/metrics", { credentials: "omit", headers: { Authorization: "Bearer not-the-token" } }).then((r) => r.status),
    );
    assert(bearer === 401, `/metrics answered ${bearer} to a wrong token`);
    // Navigating (in its own tab) to a page that asks for Basic credentials, with none to
    // give: Chromium gets the 401 and, headless, gives up on the navigation.
    const other = await ctx.newPage();
    try {
      const r = await other.goto(admin + "/");
      assert(r.status() === 401, `/ answered ${r.status()} without credentials`);
    } catch (e) {
      assert(/ERR_INVALID_AUTH_CREDENTIALS/.test(String(e)), `navigation failed unexpectedly: ${e}`);
    }
    await other.screenshot({ path: join(args.out, "refused.png") });
    await ctx.close();
  });

  const ctx = await browser.newContext({ viewport, httpCredentials: credentials });

  await check("browser: the dashboard loads without console errors and its charts update under load", async () => {
    const page = await ctx.newPage();
    const problems = watch(page);
    const r = await page.goto(admin + "/");
    assert(r.status() === 200, `/ answered ${r.status()}`);
    await page.waitForFunction(() => window.blindfoldDashboard && window.blindfoldDashboard.updates >= 2, null, {
      timeout: 20000,
    });
    const first = await page.evaluate(() => ({ ...window.blindfoldDashboard }));
    const firstPixels = await painted(page, "c-rps");
    // Under load the request rate is non-zero and the history grows second by second.
    await page.waitForFunction(
      (u) => window.blindfoldDashboard.updates >= u + 4 && window.blindfoldDashboard.lastRequestsPerSecond > 0,
      first.updates,
      { timeout: 30000 },
    );
    const later = await page.evaluate(() => ({ ...window.blindfoldDashboard }));
    assert(later.totalRequests > first.totalRequests, `requests did not grow (${first.totalRequests} → ${later.totalRequests})`);
    for (const id of ["c-rps", "c-lat", "c-bytes", "c-blowup", "c-stash", "c-cost"]) {
      const n = await painted(page, id);
      assert(n > 200, `chart ${id} is blank (${n} pixels drawn)`);
    }
    const laterPixels = await painted(page, "c-rps");
    assert(laterPixels !== firstPixels || later.points > first.points, "the throughput chart did not change");
    const meta = await page.textContent("#meta");
    assert(/engine \w+/.test(meta), `the engine is not shown: ${meta}`);
    const rps = await page.textContent("#t-rps");
    assert(rps && rps !== "–", `no request rate shown (${rps})`);
    const fullness = await page.textContent("#t-fullness");
    const blocks = await page.textContent("#t-fullness-blocks");
    assert(/^[<\d.\s]+% full$/.test(fullness), `no store fullness shown (${fullness})`);
    assert(/^\d+ of \d+ blocks of /.test(blocks), `no blocks used of the capacity shown (${blocks})`);
    assert(/\d/.test(await page.textContent("#t-objects")), "no object count shown");
    assert(/free of/.test(await page.textContent("#t-disk-of")), "no free disk space shown");
    const basis = await page.textContent("#t-cost-basis");
    assert(/prices|no bill|no price/.test(basis), `the cost does not say what it is priced at (${basis})`);
    const p99 = await page.textContent("#t-p99");
    assert(!/^0(\.0+)? ms$/.test(p99) || later.lastRequestsPerSecond > 0, `an idle second shows p99 ${p99}`);
    const blurred = await blurredCanvases(page);
    assert(blurred.length === 0, blurred.join("; "));
    const unround = await unroundTicks(page);
    assert(unround.length === 0, `axis ticks not round: ${unround.join("; ")}`);
    await page.screenshot({ path: join(args.out, "dashboard.png"), fullPage: true });
    if (args["docs-img"]) await page.screenshot({ path: join(args["docs-img"], "dashboard.png"), fullPage: true });
    assert(problems.length === 0, problems.join("; "));
    await page.close();
  });

  await check("browser: a login in the address (http://AK:SK@host/) loads the dashboard without console errors", async () => {
    const bare = await browser.newContext({ viewport });
    const page = await bare.newPage();
    const problems = watch(page);
    const u = new URL(admin + "/");
    u.username = encodeURIComponent(args.user);
    u.password = encodeURIComponent(args.password);
    const r = await page.goto(u.href);
    assert(r.status() === 200, `${u.origin}/ with the login in the address answered ${r.status()}`);
    await page.waitForFunction(() => window.blindfoldDashboard && window.blindfoldDashboard.updates >= 2, null, { timeout: 20000 });
    const d = await page.evaluate(() => ({ ...window.blindfoldDashboard }));
    assert(d.lastError === null, `the dashboard could not fetch its data: ${d.lastError}`);
    for (const id of ["c-rps", "c-lat", "c-bytes"]) {
      const n = await painted(page, id);
      assert(n > 200, `chart ${id} is blank (${n} pixels drawn)`);
    }
    assert(problems.length === 0, problems.join("; "));
    await bare.close();
  });

  await check("browser: on a phone (390×844) the dashboard fits the width and its charts are sharp", async () => {
    const small = await browser.newContext({ ...phone, httpCredentials: credentials });
    const page = await small.newPage();
    const problems = watch(page);
    await page.goto(admin + "/");
    await page.waitForFunction(() => window.blindfoldDashboard && window.blindfoldDashboard.updates >= 2, null, { timeout: 20000 });
    const wide = await overflow(page);
    assert(wide === null, `the dashboard overflows a phone: ${wide}`);
    const blurred = await blurredCanvases(page);
    assert(blurred.length === 0, blurred.join("; "));
    const unround = await unroundTicks(page);
    assert(unround.length === 0, `axis ticks not round: ${unround.join("; ")}`);
    await page.screenshot({ path: join(args.out, "dashboard-phone.png"), fullPage: true });
    assert(problems.length === 0, problems.join("; "));
    await small.close();
  });

  // One demo run on the page: click, wait for the window to close, return what it shows.
  async function demo(page, button, label) {
    await page.fill("#seconds", "5");
    await page.click(button);
    await page.waitForFunction(
      (label) => {
        const v = window.blindfoldVisualizer;
        return v.label && v.label.startsWith(label) && !v.recording && v.physical > 0 && v.logical > 0;
      },
      label,
      { timeout: 30000 },
    );
    return page.evaluate(() => ({ ...window.blindfoldVisualizer }));
  }

  await check("browser: the visualizer shows both views; the demo is uniform with ORAM and not without", async () => {
    const page = await ctx.newPage();
    const problems = watch(page);
    const r = await page.goto(admin + "/visualizer");
    assert(r.status() === 200, `/visualizer answered ${r.status()}`);
    const on = await demo(page, "#demo-on", "demo: Path ORAM");
    for (const id of ["c-logical", "c-physical", "c-hist"]) {
      const n = await painted(page, id);
      assert(n > 200, `view ${id} is blank with ORAM on (${n} pixels drawn)`);
    }
    assert(on.pValue !== null && on.pValue > 1e-4, `with ORAM the store's view looks skewed (p = ${on.pValue})`);
    assert((await page.textContent("#verdict")).includes("uniform"), "no uniform verdict shown");
    const p = await page.textContent("#pvalue");
    assert(/^p (= \d\.\d{3}|< 0\.001)$/.test(p), `the p-value prints as "${p}"`);
    const note = await page.textContent("#requests-note");
    assert(/demo/.test(note) && /S3/.test(note), `no word on why a demo lists no S3 requests (${note})`);
    const blurred = await blurredCanvases(page);
    assert(blurred.length === 0, blurred.join("; "));
    const unround = await unroundTicks(page);
    assert(unround.length === 0, `axis ticks not round: ${unround.join("; ")}`);
    await page.screenshot({ path: join(args.out, "visualizer-oram-on.png"), fullPage: true });
    if (args["docs-img"]) await page.screenshot({ path: join(args["docs-img"], "visualizer.png"), fullPage: true });
    const off = await demo(page, "#demo-off", "demo: sealed blocks, no ORAM");
    assert(off.pValue !== null && off.pValue < 1e-6, `without ORAM the skew did not show (p = ${off.pValue})`);
    assert((await page.textContent("#verdict")).includes("not uniform"), "no skew verdict shown");
    assert((await page.textContent("#pvalue")) === "p < 0.001", "a vanishing p-value is not printed as p < 0.001");
    await page.screenshot({ path: join(args.out, "visualizer-oram-off.png"), fullPage: true });
    if (args["docs-img"]) await page.screenshot({ path: join(args["docs-img"], "visualizer-off.png"), fullPage: true });
    assert(problems.length === 0, problems.join("; "));
    await page.close();
  });

  await check("browser: the visualizer opens on the last recording, also on a phone without overflow", async () => {
    for (const options of [{ viewport }, phone]) {
      const c = await browser.newContext({ ...options, httpCredentials: credentials });
      const page = await c.newPage();
      const problems = watch(page);
      await page.goto(admin + "/visualizer");
      await page.waitForFunction(() => window.blindfoldVisualizer.draws > 0, null, { timeout: 20000 });
      for (const id of ["c-logical", "c-physical", "c-hist"]) {
        const n = await painted(page, id);
        assert(n > 200, `view ${id} is blank on opening (${n} pixels drawn)`);
      }
      const wide = await overflow(page);
      assert(wide === null, `the visualizer overflows ${options.viewport.width} px: ${wide}`);
      const blurred = await blurredCanvases(page);
      assert(blurred.length === 0, blurred.join("; "));
      if (options === phone) await page.screenshot({ path: join(args.out, "visualizer-phone.png"), fullPage: true });
      assert(problems.length === 0, problems.join("; "));
      await c.close();
    }
  });

  await check("browser: recording the live gateway shows its S3 requests, logical and store accesses", async () => {
    const page = await ctx.newPage();
    const problems = watch(page);
    // Record clicked while the page is still fetching the last recording to show (a slow link,
    // or a gateway under load: how this check failed in CI on 2026-11-30). The page's first
    // fetch of the demo's window is held until the live recording has started; the page must
    // go on showing the live one, not the demo that answer brings.
    let release;
    const held = new Promise((r) => { release = r; });
    let holding = true;
    await page.route(/\/api\/window\?source=demo/, async (route) => {
      if (holding) {
        holding = false;
        await held;
      }
      await route.continue();
    });
    const isWindow = (r, method) => new URL(r.url()).pathname === "/api/window" && r.request().method() === method;
    const firstLook = page.waitForResponse((r) => isWindow(r, "GET"));
    await page.goto(admin + "/visualizer");
    await firstLook;
    await page.fill("#seconds", "4");
    const started = page.waitForResponse((r) => isWindow(r, "POST"));
    await page.click("#record");
    await started;
    release();
    try {
      await page.waitForFunction(
        () => {
          const v = window.blindfoldVisualizer;
          return v.label === "live gateway" && !v.recording && v.draws > 0;
        },
        null,
        { timeout: 30000 },
      );
    } catch (e) {
      const v = await page.evaluate(() => ({ ...window.blindfoldVisualizer }));
      throw new Error(`the page never showed the finished live recording (${JSON.stringify(v)}; ${problems.join("; ") || "no page errors"})`);
    }
    const live = await page.evaluate(() => ({ ...window.blindfoldVisualizer }));
    assert(live.physical > 0 && live.logical > 0, `empty window under load: ${JSON.stringify(live)}`);
    const rows = await page.locator("#requests tr").count();
    assert(rows > 0, "no S3 requests listed");
    await page.screenshot({ path: join(args.out, "visualizer-live.png"), fullPage: true });
    assert(problems.length === 0, problems.join("; "));
    await page.close();
  });
  await ctx.close();
} finally {
  await browser.close();
}
console.log(`screenshots in ${args.out}`);
process.exit(failed ? 1 : 0);
