// Drives a real headless Chromium (Debian's /usr/bin/chromium) with playwright-core against a
// running rlwatch dashboard. Run by tests/web/test_browser.py, which starts the server.
//
//   RLWATCH_URL       base URL of the dashboard (http://127.0.0.1:PORT)
//   RLWATCH_SCENARIO  "demo" (rlwatch demo --web: two runs, a KL fault), "fleet" (RLWATCH_RUNS runs,
//                     live), "workers" (the page of one of two workers: every run of both), or
//                     "restarted" (rlwatch web after the workers stopped: every run still there)
//   RLWATCH_RUNS      how many runs the page must list ("fleet", "workers", "restarted")
//   RLWATCH_TOKEN     the operator token the server was started with (demo)
//   RLWATCH_SHOTS     folder for the screenshots
//   RLWATCH_CHROMIUM  the browser (default /usr/bin/chromium)
//
// Prints one JSON object on the last line: {"ok": bool, "checks": [...], "error": ...}.
import { createRequire } from "node:module";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "..", "web", "frontend", "package.json"));
const { chromium } = require("playwright-core");

const BASE = process.env.RLWATCH_URL;
const SCENARIO = process.env.RLWATCH_SCENARIO || "demo";
const TOKEN = process.env.RLWATCH_TOKEN || "";
const RUNS = +(process.env.RLWATCH_RUNS || 50);
const SHOTS = process.env.RLWATCH_SHOTS || join(here, "..", "..", "artifacts", "screenshots");
const checks = [];
const figures = {};
const check = (name, ok, detail) => {
  checks.push({ name, ok: !!ok, detail });
  if (!ok) throw new Error(`check failed: ${name} ${detail === undefined ? "" : JSON.stringify(detail)}`);
};

mkdirSync(SHOTS, { recursive: true });
const profile = mkdtempSync(join(tmpdir(), "rlwatch-chromium-"));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.RLWATCH_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1600, height: 1000 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  // launchPersistentContext passes the fresh profile folder as --user-data-dir
});
const pageErrors = [];
const page = await ctx.newPage();
page.on("pageerror", e => pageErrors.push(String(e)));
page.on("console", m => { if (m.type() === "error") pageErrors.push(m.text()); });
page.setDefaultTimeout(20000);

async function chartStats(p) {
  return p.evaluate(() => {
    const out = {};
    for (const [id, c] of window.rlwatch.cockpit.charts) {
      const d = c.u.data;
      const pts = d.slice(1).reduce((n, s) => n + (s || []).filter(v => v != null).length, 0);
      // pixels actually painted in the plot area (not just axes)
      const cv = c.u.ctx.canvas;
      const b = c.u.bbox;
      const img = c.u.ctx.getImageData(b.left, b.top, Math.max(1, b.width), Math.max(1, b.height)).data;
      let painted = 0;
      for (let i = 3; i < img.length; i += 16) if (img[i] > 0) painted++;
      out[id] = { x: (d[0] || []).length, points: pts, painted, w: cv.width };
    }
    return out;
  });
}

async function demo() {
  // fleet page: both runs listed, the faulty one gets paused by its red KL alert
  await page.goto(`${BASE}/`);
  await page.waitForFunction(() => document.querySelectorAll("#rows tr.run").length >= 2);
  const runs = await page.$$eval("#rows tr.run", trs => trs.map(t => t.dataset.run));
  check("fleet lists the demo runs", runs.includes("ppo-healthy") && runs.includes("ppo-kl-blowup"), runs);
  await page.waitForSelector('#rows tr[data-run="ppo-kl-blowup"][data-state="paused"]', { timeout: 45000 });
  const worst = await page.textContent('#rows tr[data-run="ppo-kl-blowup"] td.worst');
  check("fleet shows the worst alert of the faulty run", /kl_above_target|kl_rising/.test(worst), worst);
  const rate = await page.textContent('#rows tr[data-run="ppo-healthy"] td:nth-child(5)');
  check("fleet shows steps per second", parseFloat(rate) > 0, rate);
  await page.screenshot({ path: join(SHOTS, "fleet.png"), fullPage: true });

  // cockpit of the faulty run: charts drawn with data, alert onset markers on them
  await page.goto(`${BASE}/run?run=ppo-kl-blowup`);
  await page.waitForFunction(() => window.rlwatch.cockpit && window.rlwatch.cockpit.ready);
  await page.waitForFunction(() => document.querySelectorAll('[data-chart="kl"] .alert-marker').length > 0);
  await page.waitForFunction(() => {
    const c = window.rlwatch.cockpit.charts.get("reward_heat");
    return c && c.u.data[0].length > 5;
  });
  await page.waitForTimeout(600);
  const st = await chartStats(page);
  for (const id of ["reward", "kl", "entropy", "loss", "length", "clip", "eos", "grad", "groups"]) {
    check(`chart ${id} has data`, st[id] && st[id].x > 20 && st[id].points > 20, st[id]);
    check(`chart ${id} is painted`, st[id].painted > 200, st[id]);
  }
  for (const id of ["reward_heat", "reward_hist", "length_heat", "length_hist"]) {
    check(`distribution chart ${id} has data`, st[id] && st[id].x > 3, st[id]);
    check(`distribution chart ${id} is painted`, st[id].painted > 200, st[id]);
  }
  const markers = await page.$$eval('[data-chart="kl"] .alert-marker', ms =>
    ms.map(m => ({ rule: m.dataset.rule, step: +m.dataset.step, cls: m.className })));
  check("KL chart marks the KL alert onset", markers.some(m => m.rule === "kl_above_target"), markers);
  const klLines = await page.evaluate(() => window.rlwatch.cockpit.charts.get("kl").u.series.map(s => s.label));
  check("KL chart draws the target and tier lines", klLines.includes("target") && klLines.includes("red"), klLines);
  const chips = await page.textContent("#alertbar");
  check("active alerts listed", chips.includes("kl_above_target"), chips);
  const samples = await page.$$eval("#samples tbody tr", trs => trs.length);
  check("sample browser lists samples", samples > 3, samples);
  await page.screenshot({ path: join(SHOTS, "cockpit-kl-blowup.png"), fullPage: true });

  // wall-clock axis
  await page.click('#axis button[data-axis="time"]');
  await page.waitForTimeout(400);
  const timeX = await page.evaluate(() => window.rlwatch.cockpit.charts.get("reward").u.data[0].slice(-1)[0]);
  check("wall-clock axis uses timestamps", timeX > 1e9, timeX);
  await page.click('#axis button[data-axis="step"]');

  // cockpit of the healthy run: pause it from the page with a reason and the token
  await page.goto(`${BASE}/run?run=ppo-healthy`);
  await page.waitForFunction(() => window.rlwatch.cockpit && window.rlwatch.cockpit.ready);
  await page.waitForFunction(() => !document.querySelector('#controls button[data-action="pause"]').disabled);
  // no reason: refused in the page
  await page.click('#controls button[data-action="pause"]');
  check("a reason is required", (await page.textContent("#control-msg")).includes("reason"));
  // a wrong token: refused by the server
  await page.fill("#reason", "checking the gradient spikes by hand");
  await page.fill("#token", "not-the-token");
  await page.click('#controls button[data-action="pause"]');
  await page.waitForFunction(() => document.querySelector("#control-msg").textContent.includes("token"));
  check("a wrong token is refused", true);
  // the browser logs the refused request (401) as a console error: expected here
  for (let i = pageErrors.length - 1; i >= 0; i--) if (pageErrors[i].includes("401")) pageErrors.splice(i, 1);
  await page.fill("#token", TOKEN);
  await page.click('#controls button[data-action="pause"]');
  await page.waitForSelector('#state[data-state="paused"]');
  check("the cockpit shows the run paused", true);
  // the worker acknowledges: its training loop is blocked in step_boundary()
  await page.waitForFunction(() => [...document.querySelectorAll("#audit tr.ack")]
    .some(tr => tr.textContent.includes("pause") && tr.textContent.includes("paused at step")), null, { timeout: 15000 });
  const audit = await page.$$eval("#audit tbody tr", trs => trs.map(t => t.textContent));
  check("audit shows the operator's command", audit.some(t => t.includes("web:operator") && t.includes("checking the gradient")), audit);
  await page.waitForFunction(() => document.querySelector("#audit-state").textContent.includes("the run answered"),
                             null, { timeout: 15000 });
  const held = await page.textContent("#audit-state");
  check("the control state says the run applied the pause", /control state: paused \(the run answered: applied \(rank 0\)/.test(held), held);
  const s1 = await page.evaluate(async () => (await (await fetch("/api/fleet")).json()).rows.find(r => r.run_id === "ppo-healthy").last_step);
  await page.waitForTimeout(1500);
  const s2 = await page.evaluate(async () => (await (await fetch("/api/fleet")).json()).rows.find(r => r.run_id === "ppo-healthy").last_step);
  check("the paused run stops advancing", s1 === s2, { s1, s2 });
  // while it is paused the operator raises beta and rolls it back: its script applies both at
  // once (it acknowledges them while still paused)
  await page.fill("#reason", "raising beta by hand");
  await page.click('#controls button[data-action="adjust"]');
  check("Adjust asks for factors", (await page.textContent("#control-msg")).includes("factors"));
  await page.fill("#factors", "beta=1.5");
  await page.click('#controls button[data-action="adjust"]');
  await page.waitForFunction(() => document.querySelector("#control-msg").textContent.includes("adjust beta=1.5 sent"));
  let asked = "";
  page.once("dialog", d => { asked = d.message(); d.accept(); });
  await page.fill("#reason", "back to the last checkpoint");
  await page.click('#controls button[data-action="rollback"]');
  await page.waitForFunction(() => document.querySelector("#control-msg").textContent.includes("rollback to step"));
  const rolled = await page.textContent("#control-msg");
  check("the rollback names its checkpoint", /rollback to step \d+ \(its newest checkpoint/.test(rolled), rolled);
  check("and asked first, naming it", /back to step \d+ \(.+\): its newest checkpoint/.test(asked), asked);
  for (const action of ["adjust", "rollback"]) {
    await page.waitForFunction(a => [...document.querySelectorAll("#audit tr.ack")]
      .some(tr => tr.textContent.includes(a) && tr.textContent.includes("applied")), action, { timeout: 15000 });
    check(`the paused run applied the ${action}`, true);
  }
  check("and stays paused", (await page.getAttribute("#state", "data-state")) === "paused");
  await page.waitForTimeout(300);
  await page.screenshot({ path: join(SHOTS, "cockpit-healthy-paused.png"), fullPage: true });
  check("no page errors", pageErrors.length === 0, pageErrors);
}

async function fleetN() {
  const t0 = Date.now();
  await page.goto(`${BASE}/`);
  await page.waitForFunction(n => (window.rlwatch.fleet.listed || []).length === n, RUNS);
  const firstPaint = Date.now() - t0;
  check(`${RUNS} runs listed`, true, { ms: firstPaint });
  figures.first_render_ms = firstPaint;
  const e0 = await page.evaluate(() => window.rlwatch.fleet.stats.events);
  const step0 = await page.evaluate(() => Math.max(...[...window.rlwatch.fleet.rows.values()].map(r => r.last_step || 0)));
  // live updates: a newer step within 15 s (a loaded machine is slow; the feeder writes every 0.2 s)
  await page.waitForFunction(s => Math.max(...[...window.rlwatch.fleet.rows.values()].map(r => r.last_step || 0)) > s,
    step0, { timeout: 15000 }).catch(() => null);
  await page.waitForTimeout(1000);
  const e1 = await page.evaluate(() => window.rlwatch.fleet.stats.events);
  const step1 = await page.evaluate(() => Math.max(...[...window.rlwatch.fleet.rows.values()].map(r => r.last_step || 0)));
  check("live updates arrive over SSE", e1 > e0 && step1 > step0, { e0, e1, step0, step1 });
  // responsiveness while updates stream in: an input round trip stays short
  const lat = [];
  for (let i = 0; i < 5; i++) {
    const t = Date.now();
    await page.evaluate(() => new Promise(r => requestAnimationFrame(() => r())));
    lat.push(Date.now() - t);
    await page.waitForTimeout(150);
  }
  // timings are figures, not checks (a loaded machine is slow): the test prints them
  const stats = await page.evaluate(() => window.rlwatch.fleet.stats);
  figures.max_render_ms = stats.maxRenderMs;
  figures.frame_round_trip_ms = lat;
  await page.fill("#filter", "grpo");
  await page.waitForTimeout(200);
  const nf = await listed();
  check("filter narrows the table", nf > 0 && nf < RUNS, nf);
  await page.fill("#filter", "");
  await page.click('th[data-sort="last_step"]');
  await page.waitForTimeout(200);
  const steps = await page.$$eval("#rows tr.run td:nth-child(4)", tds => tds.map(t => +t.textContent));
  const sorted = steps.every((v, i) => i === 0 || steps[i - 1] >= v);
  check("sort by last step", sorted, steps.slice(0, 8));
  const drawn = await page.$$eval("#rows tr.run", t => t.length);
  check("only the rows near the viewport are in the page", drawn > 10 && drawn < RUNS, drawn);
  const sparks = await page.$$eval("#rows tr.run svg.spark", s => s.filter(x => +x.dataset.points > 5).length);
  check("a sparkline per run", sparks === drawn, { sparks, drawn });
  await page.evaluate(() => window.scrollTo(0, document.body.scrollHeight));
  await page.waitForTimeout(300);
  const lastShown = await page.$$eval("#rows tr.run", t => t.map(x => x.dataset.run).pop());
  const lastListed = await page.evaluate(() => window.rlwatch.fleet.listed.slice(-1)[0]);
  check("scrolling to the end draws the last runs", lastShown === lastListed, { lastShown, lastListed });
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.waitForTimeout(200);
  await fleetTools();
  await page.click('th[data-sort="severity"]');
  await page.waitForTimeout(200);
  await page.screenshot({ path: join(SHOTS, `fleet-${RUNS}-runs.png`), fullPage: false });
  // a cockpit in a big fleet loads and draws
  const first = await page.$eval("#rows tr.run", t => t.dataset.run);
  await page.goto(`${BASE}/run?run=${encodeURIComponent(first)}`);
  await page.waitForFunction(() => window.rlwatch.cockpit && window.rlwatch.cockpit.ready);
  await page.waitForTimeout(800);
  const st = await chartStats(page);
  check("cockpit in a big fleet draws", st.kl.points > 10 && st.kl.painted > 200, st.kl);
  check("no page errors", pageErrors.length === 0, pageErrors);
}

/** Grouping by a tag, counts by tier, filtering by a tier card (the page must have team= tags). */
const listed = () => page.evaluate(() => window.rlwatch.fleet.listed.length);

async function fleetTools() {
  const total = await listed();
  await page.selectOption("#group-by", "team");
  await page.waitForTimeout(250);
  const groups = await page.evaluate(() => window.rlwatch.fleet.groups);
  check("group by tag: one header per team", groups.length >= 2 && !groups.includes("(no tag)"), groups);
  const grouped = await listed();
  check("grouping keeps every run", grouped === total, { grouped, total });
  await page.click(`#rows tr.group[data-group="${groups[0]}"]`);        // collapse one team
  await page.waitForTimeout(200);
  const collapsed = await listed();
  check("a group collapses", collapsed < total, { collapsed, total });
  await page.selectOption("#group-by", "");
  await page.waitForTimeout(200);
  // a live fleet's first alert may still be on its way (a loaded machine): wait for it, then check
  await page.waitForFunction(() => [...document.querySelectorAll("#summary .card")].some(c =>
    (c.dataset.count || "").startsWith("worst ") && +c.querySelector(".n").textContent > 0),
    null, { timeout: 45000 }).catch(() => {});
  const cards = await page.$$eval("#summary .card", cs => Object.fromEntries(cs.map(c =>
    [c.dataset.count, +c.querySelector(".n").textContent])));
  const tiers = ["worst black", "worst red", "worst orange", "worst yellow", "no alert"]
    .reduce((n, k) => n + (cards[k] || 0), 0);
  check("counts by tier add up to the runs", tiers === total && cards.runs === total, cards);
  const worst = Object.entries(cards).filter(([k, v]) => k.startsWith("worst ") && v > 0).map(([k]) => k);
  check("some run has an open alert", worst.length > 0, cards);
  await page.click(`#summary .card[data-count="${worst[0]}"]`);          // filter by that tier
  await page.waitForTimeout(200);
  const only = await listed();
  check("a tier card filters the table", only === cards[worst[0]], { only, want: cards[worst[0]] });
  await page.click(`#summary .card[data-count="${worst[0]}"]`);
  await page.waitForTimeout(200);
}

/** One worker's page lists the runs of both workers; a closed run is finished. */
async function workers() {
  await page.goto(`${BASE}/`);
  await page.waitForFunction(n => (window.rlwatch.fleet.listed || []).length === n, RUNS, { timeout: 30000 });
  const api = await page.evaluate(async () => (await (await fetch("/api/fleet")).json()).rows);
  const writers = [...new Set(api.map(r => r.writer))];
  check("rows written by both workers", writers.length === 2, writers);
  check("this worker draws only its own runs", api.some(r => r.local) && api.some(r => !r.local),
        api.map(r => [r.run_id, r.local]));
  await page.waitForSelector('#rows tr.run[data-status="finished"]', { timeout: 30000 });
  const finished = await page.$$eval('#rows tr.run[data-status="finished"]', t => t.map(x => x.dataset.run));
  check("the run that closed its monitor is finished", finished.length === 1 && finished[0].includes("done"), finished);
  // a record gains a sparkline point per flush (once a second): give a loaded machine time
  await page.waitForFunction(n => [...document.querySelectorAll("#rows tr.run svg.spark")]
    .filter(x => +x.dataset.points > 2).length === n, RUNS, { timeout: 30000 }).catch(() => {});
  const sparks = await page.$$eval("#rows tr.run svg.spark", s => s.filter(x => +x.dataset.points > 2).length);
  check("sparklines for the runs of both workers", sparks === RUNS, sparks);
  await fleetTools();
  await page.screenshot({ path: join(SHOTS, "fleet-two-workers.png"), fullPage: true });
  // the cockpit of a run the other worker processes: its sparkline and a note, not an error
  const remote = api.find(r => !r.local).run_id;
  await page.goto(`${BASE}/run?run=${encodeURIComponent(remote)}`);
  await page.waitForFunction(() => window.rlwatch.cockpit && window.rlwatch.cockpit.ready);
  await page.waitForSelector("#remote-note");
  const st = await chartStats(page);
  check("the other worker's run draws its smoothed KL", st.kl.points > 2, st.kl);
  check("no page errors", pageErrors.length === 0, pageErrors);
}

/** rlwatch web after every worker stopped: the fleet is still there, from Redis. */
async function restarted() {
  await page.goto(`${BASE}/`);
  await page.waitForFunction(n => (window.rlwatch.fleet.listed || []).length === n, RUNS, { timeout: 30000 });
  const api = await page.evaluate(async () => (await (await fetch("/api/fleet")).json()).rows);
  check("every run survives the workers' restart", api.length === RUNS && api.every(r => !r.local),
        api.map(r => r.run_id));
  check("their last steps too", api.every(r => r.last_step > 0), api.map(r => r.last_step));
  await page.screenshot({ path: join(SHOTS, "fleet-after-restart.png"), fullPage: true });
  check("no page errors", pageErrors.length === 0, pageErrors);
}

let error = null;
try {
  if (SCENARIO === "demo") await demo();
  else if (SCENARIO === "fleet") await fleetN();
  else if (SCENARIO === "workers") await workers();
  else if (SCENARIO === "restarted") await restarted();
  else throw new Error(`unknown scenario ${SCENARIO}`);
} catch (e) {
  error = String(e && e.stack || e);
  try { await page.screenshot({ path: join(SHOTS, `failure-${SCENARIO}.png`), fullPage: true }); } catch (e2) { /* ignore */ }
} finally {
  await ctx.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify({ ok: !error, scenario: SCENARIO, checks, figures, error, pageErrors }));
process.exit(error ? 1 : 0);
