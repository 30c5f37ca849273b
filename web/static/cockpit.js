/* rlwatch run cockpit: Q8's three rows of charts (uPlot), samples, controls, audit; live via SSE. */
"use strict";
(function () {
  const runId = new URLSearchParams(location.search).get("run") || "";
  const $ = id => document.getElementById(id);
  const C = {
    grid: "#262a31", axis: "#8b94a3", raw: "rgba(94,161,255,0.55)", ema: "#ffffff",
    a: "#5ea1ff", b: "#ff8833", c: "#56c26b", d: "#c678dd", e: "#f2cc0c",
  };
  const CAT_COLORS = ["#5ea1ff", "#56c26b", "#ff8833", "#c678dd", "#f2cc0c", "#2ec4b6", "#f2495c"];
  const S = {
    x: localStorage.getItem("rlwatch-axis") === "time" ? "time" : "step",
    data: null, markers: [], active: [], kl: {}, groups: {}, dists: {}, row: null,
    seq: 0, aseq: 0, appended: 0, zoom: null, cfg: null, clockOffset: 0, bucket: 1,
  };
  const charts = new Map();     // id -> {u, spec, panel}
  const stats = { updates: 0, resyncs: 0, steps: 0 };
  window.rlwatch.cockpit = { charts, S, stats, runId };

  // -- chart specs (Q8 rows 1-3) ---------------------------------------------------------------
  const raw = (m, label, color, extra) => Object.assign({ m, kind: "raw", label, stroke: color || C.raw, width: 1 }, extra);
  const ema = (m, label, color, extra) => Object.assign({ m, kind: "ema", label, stroke: color || C.ema, width: 2 }, extra);
  const SPECS = [
    { id: "reward", row: 1, title: "Reward (mean)", series: [raw("reward/mean", "raw"), ema("reward/mean", "smoothed")] },
    { id: "kl", row: 1, title: "KL divergence (policy vs reference)", kl: true,
      series: [raw("kl/mean", "raw"), ema("kl/mean", "smoothed")] },
    { id: "entropy", row: 1, title: "Policy entropy", series: [raw("entropy/mean", "raw"), ema("entropy/mean", "smoothed")] },
    { id: "loss", row: 1, title: "Actor / critic loss",
      series: [raw("loss/policy", "actor", "rgba(94,161,255,0.35)"), ema("loss/policy", "actor smoothed", C.a),
               raw("loss/value", "critic", "rgba(255,136,51,0.35)", { scale: "v" }),
               ema("loss/value", "critic smoothed", C.b, { scale: "v" })], twoAxes: true },
    { id: "length", row: 2, title: "Response length (tokens)",
      series: [raw("response/length_mean", "mean"), ema("response/length_mean", "smoothed"),
               ema("response/length_max", "max (smoothed)", "rgba(255,136,51,0.8)", { width: 1, dash: [4, 3] })] },
    { id: "clip", row: 2, title: "Clip fraction",
      series: [raw("ppo/clip_frac", "policy", "rgba(94,161,255,0.45)"), ema("ppo/clip_frac", "policy smoothed", C.a),
               raw("value/clip_frac", "value", "rgba(255,136,51,0.45)"), ema("value/clip_frac", "value smoothed", C.b)] },
    { id: "eos", row: 2, title: "EOS / truncation ratio",
      series: [raw("response/eos_frac", "EOS", "rgba(86,194,107,0.5)"), ema("response/eos_frac", "EOS smoothed", C.c),
               raw("response/truncated_frac", "truncated", "rgba(242,73,92,0.45)"),
               ema("response/truncated_frac", "truncated smoothed", "#f2495c")] },
    { id: "grad", row: 2, title: "Gradient norm",
      series: [raw("grad_norm/actor", "actor", "rgba(94,161,255,0.45)"), ema("grad_norm/actor", "actor smoothed", C.a),
               raw("grad_norm/critic", "critic", "rgba(255,136,51,0.45)"), ema("grad_norm/critic", "critic smoothed", C.b)] },
  ];
  const KL_LINES = [["target", "target", "#8b94a3", [2, 4]], ["yellow", "yellow", "#f2cc0c", [6, 4]],
                    ["orange", "orange", "#ff8833", [6, 4]], ["red", "red", "#f2495c", [6, 4]],
                    ["black", "black (stop)", "#ffffff", [2, 2]]];

  // -- helpers ---------------------------------------------------------------------------------
  const xs = () => (S.x === "time" ? S.data.ts : S.data.step);
  const axisFmt = (u, vals) => vals.map(v => RW.num(v, 3));
  const xLabel = () => (S.x === "time" ? "time" : "step");

  function tsOfStep(step, fallback) {
    const st = S.data ? S.data.step : [];
    let lo = 0, hi = st.length - 1;
    if (hi < 0) return fallback;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (st[mid] < step) lo = mid + 1; else hi = mid;
    }
    return st[lo] >= step ? S.data.ts[lo] : fallback;
  }

  function throttle(fn, ms) {
    let last = 0, timer = null;
    return function () {
      const wait = ms - (Date.now() - last);
      if (wait <= 0) { last = Date.now(); fn(); }
      else if (!timer) timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, wait);
    };
  }

  // -- alert onset markers (DOM elements over each chart) --------------------------------------
  function markerList() {
    const seen = new Map();
    for (const m of S.markers) {
      if (m.state !== "firing") continue;
      const k = `${m.rule}/${m.severity}/${m.onset_step}`;
      if (!seen.has(k)) seen.set(k, m);
    }
    return [...seen.values()];
  }

  function placeMarkers(u) {
    if (!u._markers) return;
    const w = u.over.clientWidth;
    const html = [];
    for (const m of markerList()) {
      const xv = S.x === "time" ? tsOfStep(m.onset_step, m.ts) : m.onset_step;
      const left = u.valToPos(xv, "x");
      if (!(left >= 0 && left <= w)) continue;
      const title = `${m.severity.toUpperCase()} ${m.rule} from step ${m.onset_step}: ${m.summary}`;
      html.push(`<div class="alert-marker sev-${RW.esc(m.severity)}" data-rule="${RW.esc(m.rule)}" ` +
                `data-step="${m.onset_step}" style="left:${left.toFixed(1)}px" title="${RW.esc(title)}"></div>`);
    }
    u._markers.innerHTML = html.join("");
  }

  const markersPlugin = {
    hooks: {
      init: [u => {
        u._markers = document.createElement("div");
        u.over.appendChild(u._markers);
      }],
      draw: [placeMarkers],
    },
  };

  // -- zoom shared by all charts ---------------------------------------------------------------
  let syncing = false;
  function zoomPlugin() {
    return {
      hooks: {
        setSelect: [u => {
          if (u.select.width < 3) return;
          const min = u.posToVal(u.select.left, "x"), max = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          S.zoom = { min, max };
          applyZoom();
        }],
        ready: [u => u.over.addEventListener("dblclick", () => { S.zoom = null; refreshAll(); })],
      },
    };
  }
  function applyZoom() {
    if (syncing) return;
    syncing = true;
    for (const { u, spec } of charts.values()) {
      if (spec.kind === "hist") continue;
      if (S.zoom) u.setScale("x", S.zoom);
    }
    syncing = false;
  }

  // -- time-series charts ----------------------------------------------------------------------
  // legend values: at the cursor while hovering, else the latest value of each series
  function lastOf(arr) {
    if (arr) for (let i = arr.length - 1; i >= 0; i--) if (arr[i] != null) return arr[i];
    return null;
  }
  const xValue = (u, v, si, idx) => {
    const x = idx == null ? lastOf(u.data[0]) : v;
    return x == null ? "–" : S.x === "time" ? RW.clock(x) : x;
  };
  const yValue = (u, v, si, idx) => RW.num(idx == null ? lastOf(u.data[si]) : v);

  function seriesOpts(spec) {
    const out = [{ label: xLabel(), value: xValue }];
    for (const s of spec.series) {
      out.push({ label: s.label, stroke: s.stroke, width: s.width, dash: s.dash, scale: s.scale || "y",
                 spanGaps: false, points: { show: false }, value: yValue });
    }
    if (spec.kl) {
      for (const [key, label, color, dash] of KL_LINES) {
        if (S.kl[key] == null) continue;
        out.push({ label, stroke: color, width: 1, dash, points: { show: false },
                   value: () => RW.num(S.kl[key]), _line: key });
      }
    }
    return out;
  }

  function dataOf(spec) {
    const x = xs();
    const cols = [x];
    const empty = () => new Array(x.length).fill(null);
    for (const s of spec.series) {
      const src = (s.kind === "ema" ? S.data.ema : S.data.raw)[s.m];
      cols.push(src || empty());
    }
    if (spec.kl) {
      for (const [key] of KL_LINES) if (S.kl[key] != null) cols.push(new Array(x.length).fill(S.kl[key]));
    }
    return cols;
  }

  function hasData(spec) {
    return spec.series.some(s => {
      const a = (s.kind === "ema" ? S.data.ema : S.data.raw)[s.m];
      return a && a.some(v => v != null);
    });
  }

  function lineOpts(spec, width) {
    const axes = [
      { stroke: C.axis, grid: { stroke: C.grid, width: 1 }, ticks: { stroke: C.grid, width: 1 }, size: S.x === "time" ? 48 : 36 },
      { stroke: C.axis, grid: { stroke: C.grid, width: 1 }, ticks: { stroke: C.grid, width: 1 }, size: 52,
        values: axisFmt },
    ];
    const scales = { x: { time: S.x === "time" } };
    if (spec.twoAxes) {
      axes.push({ scale: "v", side: 1, stroke: C.b, grid: { show: false }, size: 52, values: axisFmt });
      scales.v = {};
    }
    if (spec.kl) {
      // range from the KL data and the target/yellow/red lines, not from the far stop cap
      scales.y = { range: u => {
        let lo = 0, hi = 0;
        for (let i = 1; i <= spec.series.length; i++) {
          for (const v of u.data[i] || []) if (v != null) { if (v > hi) hi = v; if (v < lo) lo = v; }
        }
        for (const k of ["target", "yellow", "red"]) if (S.kl[k] != null && S.kl[k] > hi) hi = S.kl[k];
        return [lo, (hi || 1) * 1.08];
      } };
    }
    return {
      width, height: 190, series: seriesOpts(spec), axes, scales,
      legend: { show: true, live: true },
      cursor: { sync: { key: "rlwatch" }, drag: { x: true, y: false, setScale: false }, points: { size: 5 } },
      plugins: [markersPlugin, zoomPlugin()],
    };
  }

  // -- distributions: heatmap over steps and the latest histogram -----------------------------
  const RAMP = [[13, 8, 135], [126, 3, 168], [204, 71, 120], [248, 149, 64], [240, 249, 33]];
  function ramp(t) {
    t = Math.max(0, Math.min(1, t)) * (RAMP.length - 1);
    const i = Math.min(RAMP.length - 2, Math.floor(t)), f = t - i;
    const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * f));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function paintHeat(u, name) {
    const d = S.dists[name];
    if (!d || !d.heatmap.density.length) return;
    const H = d.heatmap, x = S.x === "time" ? H.ts : H.steps, E = H.edges;
    const ctx = u.ctx;
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    for (let i = 0; i < H.density.length; i++) {
      const col = H.density[i];
      const peak = Math.max(...col) || 1;
      const xa = u.valToPos(i > 0 ? x[i - 1] : x[0] - (x.length > 1 ? x[1] - x[0] : 1), "x", true);
      const xb = u.valToPos(x[i], "x", true);
      for (let j = 0; j < col.length; j++) {
        if (col[j] <= 0) continue;
        const ya = u.valToPos(E[j], "y", true), yb = u.valToPos(E[j + 1], "y", true);
        ctx.fillStyle = ramp(col[j] / peak);
        ctx.fillRect(Math.min(xa, xb), Math.min(ya, yb), Math.abs(xb - xa) + 0.5, Math.abs(yb - ya) + 0.5);
      }
    }
    ctx.restore();
  }

  function heatOpts(spec, width) {
    return {
      width, height: 190,
      series: [{ label: xLabel(), value: xValue },
               { label: "median", stroke: "#ffffff", width: 1, points: { show: false }, value: yValue }],
      axes: [{ stroke: C.axis, grid: { show: false }, ticks: { stroke: C.grid }, size: S.x === "time" ? 48 : 36 },
             { stroke: C.axis, grid: { show: false }, size: 52, values: axisFmt }],
      scales: { x: { time: S.x === "time",
                     // the same x range as the line charts, so columns line up with them
                     range: (u, min, max) => {
                       if (S.zoom) return [S.zoom.min, S.zoom.max];
                       const x = S.data ? xs() : [];
                       return x.length > 1 ? [Math.min(x[0], min), Math.max(x[x.length - 1], max)] : [min, max];
                     } },
                y: { range: () => {
                  const E = (S.dists[spec.dist] || { heatmap: { edges: [] } }).heatmap.edges;
                  return E.length ? [E[0], E[E.length - 1]] : [0, 1];
                } } },
      legend: { show: true, live: true },
      cursor: { sync: { key: "rlwatch" }, drag: { x: true, y: false, setScale: false } },
      hooks: { drawClear: [u => paintHeat(u, spec.dist)] },
      plugins: [markersPlugin, zoomPlugin()],
    };
  }

  function heatData(spec) {
    const d = S.dists[spec.dist];
    if (!d) return [[], []];
    const H = d.heatmap;
    return [S.x === "time" ? H.ts : H.steps, H.median];
  }

  function histOpts(spec, width) {
    return {
      width, height: 190,
      series: [{ label: spec.xlabel, value: (u, v) => RW.num(v) },
               { label: "count", stroke: C.a, fill: "rgba(94,161,255,0.45)", width: 1,
                 paths: uPlot.paths.bars({ size: [0.92, 100] }), points: { show: false } }],
      axes: [{ stroke: C.axis, grid: { stroke: C.grid }, ticks: { stroke: C.grid }, size: 36, values: axisFmt },
             { stroke: C.axis, grid: { stroke: C.grid }, size: 40 }],
      scales: { x: { time: false }, y: { range: (u, min, max) => [0, Math.max(1, max || 1) * 1.1] } },
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } },
    };
  }

  function histData(spec) {
    const d = S.dists[spec.dist];
    if (!d || !d.latest.counts.length) return [[], []];
    const E = d.latest.edges;
    return [d.latest.counts.map((_, i) => (E[i] + E[i + 1]) / 2), d.latest.counts];
  }

  // -- reward per prompt category --------------------------------------------------------------
  function groupSpec() {
    const metric = S.groups["reward/mean"] ? "reward/mean" : Object.keys(S.groups)[0];
    const cats = metric ? S.groups[metric] : [];
    const series = [];
    cats.forEach((c, i) => {
      const col = CAT_COLORS[i % CAT_COLORS.length];
      series.push(raw(`${metric}@${c}`, c, col, { width: 1.5 }));
    });
    return { id: "groups", row: 3, wide: true, kind: "line", series, title: `${metric || "reward/mean"} per prompt category` };
  }

  // -- building and updating -------------------------------------------------------------------
  function panel(rowEl, spec, before) {
    const p = document.createElement("div");
    p.className = "panel" + (spec.wide ? " wide" : "");
    p.dataset.chart = spec.id;
    p.innerHTML = `<h3><span>${RW.esc(spec.title)}</span><span class="cur"></span></h3>` +
                  `<div class="chart"></div><div class="nodata" hidden>no data yet</div>`;
    rowEl.insertBefore(p, before || null);
    return p;
  }

  function build() {
    for (const { u } of charts.values()) u.destroy();
    charts.clear();
    for (const r of ["row1", "row2"]) $(r).innerHTML = "";
    for (const p of $("row3").querySelectorAll(".panel[data-chart]")) p.remove();
    const specs = SPECS.slice();
    specs.push({ id: "reward_heat", row: 3, kind: "heat", dist: "reward", title: "Reward distribution over steps" });
    specs.push({ id: "reward_hist", row: 3, kind: "hist", dist: "reward", xlabel: "reward", title: "Reward histogram (latest step)" });
    specs.push({ id: "length_heat", row: 3, kind: "heat", dist: "response_length", title: "Response length distribution over steps" });
    specs.push({ id: "length_hist", row: 3, kind: "hist", dist: "response_length", xlabel: "tokens", title: "Response length histogram (latest step)" });
    specs.push(groupSpec());
    const samples = $("samples-panel");
    for (const spec of specs) {
      const rowEl = $(`row${spec.row}`);
      const p = panel(rowEl, spec, spec.row === 3 ? samples : null);
      const width = Math.max(200, p.querySelector(".chart").clientWidth);
      let opts, data;
      if (spec.kind === "heat") { opts = heatOpts(spec, width); data = heatData(spec); }
      else if (spec.kind === "hist") { opts = histOpts(spec, width); data = histData(spec); }
      else { opts = lineOpts(spec, width); data = dataOf(spec); }
      const u = new uPlot(opts, data, p.querySelector(".chart"));
      charts.set(spec.id, { u, spec, panel: p });
    }
    refreshAll();
  }

  function setNoData(c, none, text) {
    const nd = c.panel.querySelector(".nodata");
    nd.hidden = !none;
    if (text) nd.textContent = text;
  }

  function refreshLine(c) {
    const { u, spec } = c;
    u.setData(dataOf(spec), !S.zoom);
    if (S.zoom) u.setScale("x", S.zoom);
    const none = !hasData(spec);
    setNoData(c, none, S.data.step.length ? "not logged by this run" : "no data yet");
    // the smoothed value the rules read where a rule smooths the metric, else the last value
    const lastOf = a => { if (a) for (let i = a.length - 1; i >= 0; i--) if (a[i] != null) return a[i]; return null; };
    const first = spec.series.find(s => s.kind === "ema") || spec.series[0];
    let cur = first ? lastOf(S.data.ema[first.m]) : null, what = "smoothed";
    if (cur == null && spec.series[0]) { cur = lastOf(S.data.raw[spec.series[0].m]); what = "last"; }
    c.panel.querySelector(".cur").textContent = cur == null ? "" : `${what} ${RW.num(cur)}`;
  }

  function refreshDist(c) {
    const { u, spec } = c;
    if (spec.kind === "heat") {
      u.setData(heatData(spec), !S.zoom);
      if (S.zoom) u.setScale("x", S.zoom);
      const d = S.dists[spec.dist];
      setNoData(c, !d || !d.heatmap.density.length, "no per-sample data yet");
      c.panel.querySelector(".cur").textContent = d && d.steps_per_column > 1 ? `${d.steps_per_column} steps/column` : "";
    } else {
      u.setData(histData(spec));
      const d = S.dists[spec.dist];
      setNoData(c, !d || !d.latest.counts.length, "no per-sample data yet");
      c.panel.querySelector(".cur").textContent = d && d.latest_step != null ? `step ${d.latest_step}` : "";
    }
  }

  function refreshAll() {
    if (!S.data) return;
    stats.updates++;
    for (const c of charts.values()) {
      if (c.spec.kind === "heat" || c.spec.kind === "hist") refreshDist(c);
      else refreshLine(c);
    }
  }
  const refreshSoon = throttle(refreshAll, 250);

  function resize() {
    for (const { u, panel: p } of charts.values()) {
      const w = p.querySelector(".chart").clientWidth;
      if (w > 0 && Math.abs(w - u.width) > 2) u.setSize({ width: w, height: 190 });
    }
  }
  new ResizeObserver(throttle(resize, 150)).observe(document.querySelector("main"));

  // -- header, alerts, audit, samples ----------------------------------------------------------
  function renderRow(row) {
    if (!row) return;
    S.row = row;
    $("run-id").textContent = row.run_id;
    document.title = `rlwatch · ${row.run_id}`;
    $("state").innerHTML = RW.stateBadge(row.status === "finished" && row.state === "running" ? "finished" : row.state) +
      (row.state !== "running" && row.state_reason ? ` <span class="muted">${RW.esc(row.state_issuer)}: ${RW.esc(row.state_reason)}</span>` : "");
    $("state").dataset.state = row.state;
    $("last-step").textContent = row.last_step == null ? "–" : row.last_step;
    $("rate").textContent = (row.steps_per_s || 0).toFixed(1);
    $("age").textContent = row.last_seen == null ? "–" : RW.age(Date.now() / 1000 + S.clockOffset - row.last_seen);
    $("tags").innerHTML = Object.entries(row.tags).map(([k, v]) => `<span class="tag">${RW.esc(k)}=${RW.esc(v)}</span>`).join("");
    const info = [];
    if (row.status !== "live") {
      info.push(`<span class="status status-${RW.esc(row.status)}">${RW.esc(row.status)}</span>` +
        (row.closed ? ` ${RW.esc(row.closed.reason)} at step ${RW.esc(row.closed.step)}` : ""));
    }
    if (row.incarnation) info.push(`incarnation <b class="mono">${RW.esc(row.incarnation)}</b>`);
    if (row.generation) info.push(`rollback generation <b>${RW.esc(row.generation)}</b>`);
    const tg = Object.entries(row.targets || {});
    if (tg.length) info.push("targets " + tg.map(([k, v]) => `<b>${RW.esc(k)}=${RW.num(v)}</b>`).join(" "));
    if (!row.local) {
      info.push(`<span id="remote-note">this dashboard does not process this run: the charts show its ` +
        `smoothed KL and reward over the whole run (from the fleet view); the full charts are on the ` +
        `dashboard of the worker that processes it${row.writer ? ` (${RW.esc(row.writer)})` : ""}</span>`);
    }
    $("runinfo").innerHTML = info.join(" · ");
    updateButtons();
  }

  function renderAlerts() {
    $("alertbar").innerHTML = S.active.length
      ? S.active.map(a => `<span class="alertchip" title="${RW.esc(a.summary)}">${RW.sevBadge(a.severity)} ` +
          `<b>${RW.esc(a.rule)}</b> since step ${a.onset_step}: ${RW.esc(a.summary)}</span>`).join("")
      : `<span class="muted">no active alert</span>`;
    const list = S.markers.slice().reverse().slice(0, 200);
    $("alerts").querySelector("tbody").innerHTML = list.map(m =>
      `<tr><td class="num">${m.onset_step}</td><td class="num">${m.step}</td>` +
      `<td>${m.state === "resolved" ? RW.sevBadge("resolved", `${m.severity} resolved`) : RW.sevBadge(m.severity)}</td>` +
      `<td class="mono">${RW.esc(m.rule)}</td><td>${RW.esc(m.summary)}</td></tr>`).join("") ||
      `<tr><td colspan="5" class="muted">no alert so far</td></tr>`;
    $("alert-count").textContent = `${S.markers.filter(m => m.state === "firing").length} fired`;
  }

  // The history holds signed commands: the server gives it to operators only. It is fetched
  // with a token that the server accepted (a command sent, or "show" clicked with the token typed).
  async function loadAudit(explicit) {
    const token = explicit ? tokenInput.value : sessionStorage.getItem("rlwatch-token-ok");
    if (!token) {
      $("audit-state").innerHTML = `operators only: type the operator token above, then ` +
        `<button type="button" id="audit-show">show</button>`;
      $("audit-show").addEventListener("click", () => loadAudit(true));
      return;
    }
    let a;
    try {
      const r = await fetch(`/api/run/audit?run=${encodeURIComponent(runId)}`,
                            { headers: { Accept: "application/json", "X-RLWatch-Token": token } });
      a = await r.json();
      if (!r.ok) throw new Error(a.error || `HTTP ${r.status}`);
    } catch (e) {
      if (!explicit) sessionStorage.removeItem("rlwatch-token-ok");
      $("audit-state").textContent = e.message;
      return;
    }
    sessionStorage.setItem("rlwatch-token-ok", token);
    let said = "";
    if (a.command && a.state && a.state !== "running") {   // the brake: has the run applied it?
      said = a.answered ? ` (${a.answered.held ? "the run answered" : "not applied everywhere"}: ${a.answered.said})`
        : ` (sent ${RW.clock(a.command.ts)}; no rank has acknowledged it yet)`;
    }
    $("audit-state").textContent = a.state ? `control state: ${a.state}${said}` : (a.error || "");
    $("audit").querySelector("tbody").innerHTML = (a.history || []).slice().reverse().map(e => {
      const ack = e.type === "ack";
      return `<tr class="${ack ? "ack" : "command"}"><td>${RW.clock(e.ts)}</td><td>${ack ? "ack" : "command"}</td>` +
        `<td><b>${RW.esc(e.action)}</b></td>` +
        `<td>${ack ? `${RW.esc(e.status)} (rank ${RW.esc(e.rank)})` : RW.esc(e.issuer)}</td>` +
        `<td>${RW.esc(ack ? e.detail : e.reason)}</td></tr>`;
    }).join("") || `<tr><td colspan="5" class="muted">no command yet</td></tr>`;
  }
  const loadAuditSoon = throttle(loadAudit, 1000);

  async function loadIncidents() {
    let d;
    try { d = await RW.getJSON(`/api/run/incidents?run=${encodeURIComponent(runId)}`); } catch (e) { return; }
    $("incident-note").textContent = d.note || d.error || (d.incidents.length ? "rlwatch incidents show ID" : "");
    $("incidents").querySelector("tbody").innerHTML = d.incidents.map(i =>
      `<tr data-incident="${RW.esc(i.id)}"><td class="mono">${RW.esc(i.id)}</td><td>${RW.clock(i.created)}</td>` +
      `<td>${RW.sevBadge(i.severity)}</td><td class="mono">${RW.esc(i.rule)}</td><td class="num">${RW.esc(i.step)}</td></tr>`
    ).join("") || `<tr><td colspan="5" class="muted">no incident recorded</td></tr>`;
  }
  const loadIncidentsSoon = throttle(loadIncidents, 2000);

  async function loadDists() {
    try {
      const d = await RW.getJSON(`/api/run/dists?run=${encodeURIComponent(runId)}`);
      S.dists = d.dists || {};
    } catch (e) { return; }
    for (const c of charts.values()) if (c.spec.kind === "heat" || c.spec.kind === "hist") refreshDist(c);
  }
  const loadDistsSoon = throttle(loadDists, 2000);

  async function loadSamples() {
    const cat = $("sample-category").value, step = $("sample-step").value;
    const q = new URLSearchParams({ run: runId, limit: "50" });
    if (cat) q.set("category", cat);
    if (step) q.set("step", step);
    let d;
    try { d = await RW.getJSON(`/api/run/samples?${q}`); } catch (e) { return; }
    const keep = (sel, values, label) => {
      const cur = sel.value;
      sel.innerHTML = `<option value="">${label}</option>` +
        values.map(v => `<option${String(v) === cur ? " selected" : ""}>${RW.esc(v)}</option>`).join("");
    };
    keep($("sample-category"), d.categories, "all");
    keep($("sample-step"), d.steps.slice(0, 50), "all recent");
    $("samples-count").textContent = `${d.samples.length} of ${d.total}`;
    $("samples").querySelector("tbody").innerHTML = d.samples.map(s =>
      `<tr><td class="num">${s.step}</td><td>${RW.esc(s.category || "")}</td>` +
      `<td class="num">${RW.num(s.reward)}</td><td class="num">${RW.num(s.kl)}</td>` +
      `<td class="num">${s.length == null ? "–" : s.length}${s.truncated ? ' <span class="trunc" title="truncated">✂</span>' : ""}</td>` +
      `<td class="text"><details><summary>${RW.esc(s.prompt)}</summary><p>${RW.esc(s.response)}</p></details></td>` +
      `<td class="mono tok" title="${RW.esc(s.token_kl_argmax || "")}">${RW.esc(s.token_kl_argmax || "")}${s.token_kl_max != null ? ` <span class="muted">${RW.num(s.token_kl_max, 3)}</span>` : ""}</td></tr>`
    ).join("") || `<tr><td colspan="7" class="muted">no samples yet</td></tr>`;
  }
  const loadSamplesSoon = throttle(loadSamples, 2000);
  $("sample-category").addEventListener("change", loadSamples);
  $("sample-step").addEventListener("change", loadSamples);

  // -- controls --------------------------------------------------------------------------------
  const tokenInput = $("token");
  tokenInput.value = sessionStorage.getItem("rlwatch-token") || "";
  tokenInput.addEventListener("change", () => sessionStorage.setItem("rlwatch-token", tokenInput.value));

  function updateButtons() {
    const enabled = S.cfg && S.cfg.controls.enabled;
    const st = S.row ? S.row.state : "running";
    for (const b of document.querySelectorAll("#controls button")) {
      const a = b.dataset.action;
      b.disabled = !enabled || (a === "pause" && st !== "running") || (a === "resume" && st !== "paused") ||
                   ((a === "stop" || a === "adjust" || a === "rollback" || a === "snapshot") && st === "stopped");
    }
    $("reason").disabled = tokenInput.disabled = $("factors").disabled = !enabled;
  }

  function say(text, ok) {
    const m = $("control-msg");
    m.textContent = text;
    m.className = `msg ${ok ? "ok" : "err"}`;
  }

  // the server's answer to a command (or a dry run of one); null, with the reason said, if refused
  async function post(sent) {
    let r, body;
    try {
      r = await fetch(`/api/run/command?run=${encodeURIComponent(runId)}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-RLWatch-Token": tokenInput.value },
        body: JSON.stringify(sent),
      });
      body = await r.json();
    } catch (e) { say(`failed: ${e.message}`, false); return null; }
    if (!r.ok) { say(body.error || `HTTP ${r.status}`, false); return null; }
    return body;
  }

  async function command(action) {
    const reason = $("reason").value.trim();
    if (!reason) { say("Give a reason: it goes to the audit log.", false); $("reason").focus(); return; }
    if (action === "stop" && !confirm(`Stop ${runId}? A stopped run cannot be resumed.`)) return;
    const sent = { action, reason };
    if (action === "adjust") {
      sent.params = $("factors").value.trim();
      if (!sent.params) { say("Give factors for Adjust, e.g. beta=1.5", false); $("factors").focus(); return; }
    }
    sessionStorage.setItem("rlwatch-token", tokenInput.value);
    if (action === "rollback") {      // the server picks the checkpoint: ask which, then confirm
      const would = await post(Object.assign({ dry_run: true }, sent));
      if (!would) return;
      const p = would.would.params;
      if (!confirm(`Roll ${runId} back to step ${p.to_step} (${p.checkpoint}): ${would.why}?`)) return;
    }
    const body = await post(sent);
    if (!body) return;
    const what = action === "rollback" ? `rollback to step ${body.command.params.to_step} (${body.why})`
      : action === "adjust" ? `adjust ${Object.entries(body.command.params).map(([k, v]) => `${k}=${v}`).join(" ")}` : action;
    const told = Object.assign({ sent: [], failed: {}, silenced: {}, retrying: [], unqueued: {} }, body.announced || {});
    const failed = Object.entries(told.failed).map(([name, why]) =>
      `telling ${name} failed: ${why}` + (told.retrying.includes(name) ? " (a worker retries it)"
        : told.unqueued[name] ? ` (${told.unqueued[name]})` : ""));
    const muted = Object.entries(told.silenced).map(([name, by]) => `${name} (${by})`);
    say(`${what} sent (command ${body.command.id.slice(0, 8)}); run is now ${body.state}`
      + (told.sent.length ? `; told ${told.sent.join(", ")}` : "")
      + (muted.length ? `; not told, silenced: ${muted.join(", ")}` : "")
      + (failed.length ? `; ${failed.join("; ")}` : ""), !failed.length);
    $("reason").value = "";
    if (action === "adjust") $("factors").value = "";
    sessionStorage.setItem("rlwatch-token-ok", tokenInput.value);
    if (S.row) renderRow(Object.assign({}, S.row, { state: body.state }));
    loadAudit();
  }
  for (const b of document.querySelectorAll("#controls button")) b.addEventListener("click", () => command(b.dataset.action));
  $("controls").addEventListener("submit", e => e.preventDefault());

  // -- data: snapshot + live tail --------------------------------------------------------------
  function appendRows(rows) {
    const d = S.data;
    for (const row of rows) {
      for (const k of Object.keys(row.v)) if (!(k in d.raw)) { resync(); return; }
      const n = d.step.length;
      if (n && row.step <= d.step[n - 1]) continue;
      d.step.push(row.step);
      d.ts.push(row.ts);
      for (const k of Object.keys(d.raw)) {
        d.raw[k].push(k in row.v ? row.v[k] : null);
        d.ema[k].push(k in row.e ? row.e[k] : null);
      }
      S.appended++;
      stats.steps++;
    }
    if (S.appended > 600) resync();
    else refreshSoon();
  }

  let loading = null;
  async function loadSnapshot() {
    const snap = await RW.getJSON(`/api/run?run=${encodeURIComponent(runId)}&points=400`);
    S.clockOffset = snap.now - Date.now() / 1000;
    S.data = snap.series;
    S.seq = snap.series.seq;
    S.aseq = snap.versions.alert_seq;
    S.markers = snap.markers;
    S.active = snap.active;
    S.kl = snap.kl_lines;
    const groupsChanged = JSON.stringify(S.groups) !== JSON.stringify(snap.groups);
    S.groups = snap.groups;
    S.appended = 0;
    S.bucket = snap.series.bucket_steps;
    $("bucket").textContent = S.bucket > 1 ? `(long run: 1 point per ${S.bucket} steps, min/max kept)` : "";
    renderRow(snap.row);
    renderAlerts();
    return groupsChanged;
  }

  function resync() {
    if (loading) return;
    stats.resyncs++;
    loading = loadSnapshot().then(changed => {
      if (changed || !charts.size) build(); else refreshAll();
      live.reopen();
    }).catch(() => {}).finally(() => { loading = null; });
  }

  let live = { reopen() {}, close() {} };
  function startLive() {
    live = RW.stream(() => `/api/stream?run=${encodeURIComponent(runId)}&since=${S.seq}&asince=${S.aseq}`, {
      steps(msg) { S.seq = msg.seq; if (S.data && !loading) appendRows(msg.rows); },
      resync() { resync(); },
      alerts(msg) {
        for (const m of msg.markers) { S.markers.push(m); S.aseq = Math.max(S.aseq, m.seq); }
        if (S.markers.length > 500) S.markers.splice(0, S.markers.length - 500);
        S.active = msg.active;
        if (msg.kl_lines && JSON.stringify(msg.kl_lines) !== JSON.stringify(S.kl)) { S.kl = msg.kl_lines; build(); }
        renderAlerts();
        loadIncidentsSoon();
        for (const { u } of charts.values()) placeMarkers(u);
      },
      row(row) { renderRow(row); },
      changed(v) {
        if (v.dists !== S.dv) { S.dv = v.dists; loadDistsSoon(); }
        if (v.samples !== S.sv) { S.sv = v.samples; loadSamplesSoon(); }
        if (v.commands !== S.cv) { S.cv = v.commands; loadAuditSoon(); }
      },
    }, $("live"));
  }

  for (const b of document.querySelectorAll("#axis button")) {
    b.classList.toggle("on", b.dataset.axis === S.x);
    b.addEventListener("click", () => {
      S.x = b.dataset.axis;
      localStorage.setItem("rlwatch-axis", S.x);
      S.zoom = null;
      for (const o of document.querySelectorAll("#axis button")) o.classList.toggle("on", o === b);
      build();
    });
  }

  async function main() {
    if (!runId) { $("run-id").textContent = "no run given"; return; }
    $("run-id").textContent = runId;
    S.cfg = await RW.getJSON("/api/config");
    if (!S.cfg.controls.enabled) {
      $("controls").classList.add("disabled");
      say(S.cfg.controls.reason, false);
    }
    for (;;) {
      try { await loadSnapshot(); break; }
      catch (e) {
        $("state").innerHTML = `<span class="muted">${e.status === 404 ? "waiting for the run's first event…" : RW.esc(e.message)}</span>`;
        await new Promise(r => setTimeout(r, 1000));
      }
    }
    build();
    updateButtons();
    loadDists();
    loadSamples();
    loadAudit();
    loadIncidents();
    startLive();
    setInterval(() => { if (S.row) $("age").textContent = RW.age(Date.now() / 1000 + S.clockOffset - S.row.last_seen); }, 1000);
    setInterval(loadAudit, 5000);      // worker acknowledgements arrive without a command event
    // the category chart appears once the run has logged groups
    setInterval(() => { if (!Object.keys(S.groups).length) resync(); }, 5000);
    window.rlwatch.cockpit.ready = true;
  }
  main();
})();
