/* rlwatch fleet page: every run of the application, live over server-sent events.
   Sort by any column, filter (text, state, alert tier), group by a tag, a sparkline per run,
   counts by state, by status (live, silent, finished) and by worst open tier. */
"use strict";
(function () {
  const rows = new Map();            // run_id -> row
  let clockOffset = 0;               // server clock - local clock, seconds
  const params = new URLSearchParams(location.hash.slice(1));
  const view = {
    sort: params.get("sort") || "severity",
    desc: params.has("desc") ? params.get("desc") === "1" : true,
    q: params.get("q") || "",
    state: params.get("state") || "",
    sev: params.get("sev") || "",
    group: params.get("group") || "",
    spark: params.get("spark") || "kl/mean",
    collapsed: new Set((params.get("collapsed") || "").split("\u0001").filter(Boolean)),
  };
  const $ = id => document.getElementById(id);
  const tbody = $("rows");
  const stats = { renders: 0, lastRenderMs: 0, maxRenderMs: 0, events: 0 };
  window.rlwatch.fleet = { rows, stats, view };

  $("filter").value = view.q;
  $("state-filter").value = view.state;
  $("sev-filter").value = view.sev;
  $("spark-metric").value = view.spark;

  const sevRank = s => RW.SEVERITIES.indexOf(s);
  const now = () => Date.now() / 1000 + clockOffset;
  const NCOL = 11;

  function sortKey(r) {
    switch (view.sort) {
      case "severity": return r.worst ? sevRank(r.worst.severity) * 1000 + r.active : -1;
      case "reward": return r.signals["reward/mean"];
      case "kl": return r.signals["kl/mean"];
      case "entropy": return r.signals["entropy/mean"];
      case "state": return { paused: 0, stopped: 1, running: 2 }[r.state];
      default: return r[view.sort];
    }
  }

  function visible(r) {
    if (view.state) {
      if (view.state === "active") { if (r.status === "finished") return false; }
      else if (r.state !== view.state && r.status !== view.state) return false;
    }
    if (view.sev === "none" && r.active) return false;
    if (view.sev === "any" && !r.active) return false;
    if (["yellow", "orange", "red", "black"].includes(view.sev) &&
        !(r.worst && sevRank(r.worst.severity) >= sevRank(view.sev))) return false;
    if (view.q) {
      const q = view.q.toLowerCase();
      const hay = [r.run_id, ...Object.entries(r.tags).map(([k, v]) => `${k}=${v}`),
                   r.worst ? r.worst.rule : "", r.status].join(" ").toLowerCase();
      if (!q.split(/\s+/).every(w => hay.includes(w))) return false;
    }
    return true;
  }

  /** A sparkline of the run's smoothed metric over the whole run, with the red KL line. */
  function spark(r) {
    const pts = (r.spark || {})[view.spark] || [];
    const W = 110, H = 24;
    if (pts.length < 2) return `<svg class="spark" width="${W}" height="${H}" data-points="${pts.length}"></svg>`;
    let lo = Infinity, hi = -Infinity;
    for (const [, v] of pts) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const red = view.spark === "kl/mean" && r.kl_lines ? r.kl_lines.red : null;
    if (red != null && red < hi * 1.5) hi = Math.max(hi, red);
    if (hi === lo) { hi += 1e-9; lo -= 1e-9; }
    const s0 = pts[0][0], s1 = pts[pts.length - 1][0] || 1;
    const x = s => ((s - s0) / Math.max(1, s1 - s0)) * (W - 2) + 1;
    const y = v => H - 2 - ((v - lo) / (hi - lo)) * (H - 4);
    const line = pts.map(([s, v]) => `${x(s).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    const th = red != null && red <= hi && red >= lo
      ? `<line class="th" x1="0" x2="${W}" y1="${y(red).toFixed(1)}" y2="${y(red).toFixed(1)}"></line>` : "";
    const last = pts[pts.length - 1];
    return `<svg class="spark" width="${W}" height="${H}" data-points="${pts.length}">` +
      `<title>${RW.esc(view.spark)} at step ${last[0]}: ${RW.num(last[1])}</title>${th}<polyline points="${line}"></polyline></svg>`;
  }

  function rowHtml(r, t) {
    const age = r.last_seen == null ? null : t - r.last_seen;
    const cls = r.status === "finished" ? " finished" : (age > 60 ? " stale" : "");
    const href = `/run?run=${encodeURIComponent(r.run_id)}`;
    const worst = r.worst
      ? `${RW.sevBadge(r.worst.severity)} <b>${RW.esc(r.worst.rule)}</b>` +
        (r.active > 1 ? ` <span class="muted">+${r.active - 1} more</span>` : "") +
        `<span class="summary-text" title="${RW.esc(r.worst.summary)}">${RW.esc(r.worst.summary)}</span>`
      : `<span class="muted">none</span>`;
    const why = r.state !== "running" && r.state_reason
      ? `<div class="muted" title="${RW.esc(r.state_reason)}">${RW.esc(r.state_issuer)}</div>` : "";
    const status = r.status !== "live"
      ? `<span class="status status-${RW.esc(r.status)}" title="${RW.esc(r.closed ? r.closed.reason : "no event for a while")}">${RW.esc(r.status)}</span>` : "";
    const tags = Object.entries(r.tags).map(([k, v]) => `<span class="tag">${RW.esc(k)}=${RW.esc(v)}</span>`).join("");
    return `<tr class="run${cls}" data-run="${RW.esc(r.run_id)}" data-state="${r.state}" data-status="${RW.esc(r.status)}">` +
      `<td><a class="mono" href="${href}">${RW.esc(r.run_id)}</a></td>` +
      `<td>${r.status === "finished" && r.state === "running" ? RW.stateBadge("finished") : RW.stateBadge(r.state) + status}${why}</td>` +
      `<td class="worst">${worst}</td>` +
      `<td class="num">${r.last_step == null ? "–" : r.last_step}</td>` +
      `<td class="num">${r.steps_per_s ? r.steps_per_s.toFixed(1) : "0"}</td>` +
      `<td class="spark-c">${spark(r)}</td>` +
      `<td class="num">${RW.num(r.signals["reward/mean"])}</td>` +
      `<td class="num">${RW.num(r.signals["kl/mean"])}</td>` +
      `<td class="num">${RW.num(r.signals["entropy/mean"])}</td>` +
      `<td class="num" title="${RW.clock(r.last_seen)}">${RW.age(age)}</td>` +
      `<td>${tags}</td></tr>`;
  }

  function counts(list) {
    const c = { state: {}, status: {}, worst: {} };
    for (const r of list) {
      c.state[r.state] = (c.state[r.state] || 0) + 1;
      c.status[r.status] = (c.status[r.status] || 0) + 1;
      const w = r.worst ? r.worst.severity : "none";
      c.worst[w] = (c.worst[w] || 0) + 1;
    }
    return c;
  }

  function renderSummary(all) {
    const c = counts(all);
    const card = (n, l, cls, filter) =>
      `<div class="card${filter ? " click" : ""}${filter && filter.on ? " on" : ""}"` +
      (filter ? ` data-${filter.kind}="${filter.value}"` : "") +
      ` data-count="${l}"><div class="n ${cls || ""}">${n}</div><div class="l">${l}</div></div>`;
    const st = v => ({ kind: "state", value: v, on: view.state === v });
    const sv = v => ({ kind: "sev", value: v, on: view.sev === v });
    $("summary").innerHTML = card(all.length, "runs") +
      card(c.state.running || 0, "running", "state-running", st("running")) +
      card(c.state.paused || 0, "paused", "state-paused", st("paused")) +
      card(c.state.stopped || 0, "stopped", "state-stopped", st("stopped")) +
      card(c.status.finished || 0, "finished", "", st("finished")) +
      card(c.status.silent || 0, "silent", "", st("silent")) +
      `<div class="cards-sep"></div>` +
      ["black", "red", "orange", "yellow"].map(s => card(c.worst[s] || 0, `worst ${s}`, `sev-n-${s}`, sv(s))).join("") +
      card(c.worst.none || 0, "no alert", "", sv("none"));
  }

  function tagKeys(all) {
    const keys = new Set();
    for (const r of all) for (const k of Object.keys(r.tags)) if (!k.startsWith("target.")) keys.add(k);
    return [...keys].sort();
  }

  function renderGroupOptions(all) {
    const sel = $("group-by");
    const keys = tagKeys(all);
    const want = ["", ...keys].join("\u0001");
    if (sel.dataset.keys === want) return;
    sel.dataset.keys = want;
    sel.innerHTML = `<option value="">nothing</option>` +
      keys.map(k => `<option value="${RW.esc(k)}">${RW.esc(k)}</option>`).join("") +
      `<option value=":status">status</option><option value=":worst">worst tier</option>`;
    sel.value = view.group;
  }

  function groupOf(r) {
    if (view.group === ":status") return r.status;
    if (view.group === ":worst") return r.worst ? r.worst.severity : "none";
    return r.tags[view.group] == null ? "(no tag)" : r.tags[view.group];
  }

  function groupHeader(name, list) {
    const c = counts(list);
    const tiers = ["black", "red", "orange", "yellow"].filter(s => c.worst[s])
      .map(s => `${RW.sevBadge(s, `${c.worst[s]} ${s}`)}`).join(" ");
    const open = !view.collapsed.has(name);
    return `<tr class="group" data-group="${RW.esc(name)}"><th colspan="${NCOL}">${open ? "▾" : "▸"} ` +
      `${RW.esc(view.group.startsWith(":") ? view.group.slice(1) : view.group)} = <b>${RW.esc(name)}</b>` +
      `<span class="muted">${list.length} run${list.length === 1 ? "" : "s"}` +
      `${c.state.paused ? `, ${c.state.paused} paused` : ""}${c.status.finished ? `, ${c.status.finished} finished` : ""}</span> ${tiers}</th></tr>`;
  }

  // Only the rows near the viewport are in the DOM (every row has the same height), so a fleet
  // of hundreds of runs renders as fast as a few dozen; spacer rows keep the scroll height.
  const GROUP_H = 30, OVERSCAN = 600;
  let ROW_H = 47;                    // measured after the first rows are drawn
  let items = [];                    // [{kind: "group"|"run", ...}] in display order
  let pending = false;
  function render() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const t0 = performance.now();
      const all = [...rows.values()];
      renderGroupOptions(all);
      const shown = all.filter(visible);
      shown.sort((a, b) => {
        let x = sortKey(a), y = sortKey(b);
        if (x == null) x = -Infinity;
        if (y == null) y = -Infinity;
        const c = typeof x === "string" ? x.localeCompare(y) : x - y;
        return (view.desc ? -c : c) || a.run_id.localeCompare(b.run_id);
      });
      items = [];
      if (view.group) {
        const groups = new Map();
        for (const r of shown) {
          const g = groupOf(r);
          if (!groups.has(g)) groups.set(g, []);
          groups.get(g).push(r);
        }
        for (const g of [...groups.keys()].sort()) {
          items.push({ kind: "group", name: g, list: groups.get(g) });
          if (!view.collapsed.has(g)) for (const r of groups.get(g)) items.push({ kind: "run", r });
        }
      } else {
        for (const r of shown) items.push({ kind: "run", r });
      }
      window.rlwatch.fleet.shown = shown.map(r => r.run_id);
      window.rlwatch.fleet.listed = items.filter(i => i.kind === "run").map(i => i.r.run_id);
      window.rlwatch.fleet.groups = items.filter(i => i.kind === "group").map(i => i.name);
      paint();
      renderSummary(all);
      $("count").textContent = `${shown.length} of ${all.length} runs`;
      for (const th of document.querySelectorAll("th[data-sort]")) {
        th.classList.toggle("sorted", th.dataset.sort === view.sort);
        th.classList.toggle("desc", th.dataset.sort === view.sort && view.desc);
      }
      const ms = performance.now() - t0;
      stats.renders++;
      stats.lastRenderMs = ms;
      stats.maxRenderMs = Math.max(stats.maxRenderMs, ms);
    });
  }

  /** Write the rows of ``items`` that are near the viewport into the table. */
  function paint() {
    const total = rows.size;
    if (!items.length) {
      tbody.innerHTML = `<tr><td colspan="${NCOL}" class="empty">${total ? "No run matches the filter." : "Waiting for runs…"}</td></tr>`;
      return;
    }
    const top = tbody.getBoundingClientRect().top + window.scrollY;
    const lo = window.scrollY - top - OVERSCAN, hi = window.scrollY - top + window.innerHeight + OVERSCAN;
    const t = now();
    let y = 0, before = 0, after = 0;
    const html = [];
    for (const it of items) {
      const h = it.kind === "group" ? GROUP_H : ROW_H;
      if (y + h < lo) before += h;
      else if (y > hi) after += h;
      else html.push(it.kind === "group" ? groupHeader(it.name, it.list) : rowHtml(it.r, t));
      y += h;
    }
    tbody.innerHTML = (before ? `<tr class="spacer" style="height:${before}px"><td colspan="${NCOL}"></td></tr>` : "") +
      html.join("") + (after ? `<tr class="spacer" style="height:${after}px"><td colspan="${NCOL}"></td></tr>` : "");
    const tr = tbody.querySelector("tr.run");
    if (tr) ROW_H = tr.getBoundingClientRect().height || ROW_H;
  }

  let scrolling = false;
  window.addEventListener("scroll", () => {
    if (scrolling) return;
    scrolling = true;
    requestAnimationFrame(() => { scrolling = false; paint(); });
  }, { passive: true });

  function saveView() {
    const p = new URLSearchParams();
    p.set("sort", view.sort);
    p.set("desc", view.desc ? "1" : "0");
    if (view.q) p.set("q", view.q);
    if (view.state) p.set("state", view.state);
    if (view.sev) p.set("sev", view.sev);
    if (view.group) p.set("group", view.group);
    if (view.spark !== "kl/mean") p.set("spark", view.spark);
    if (view.collapsed.size) p.set("collapsed", [...view.collapsed].join("\u0001"));
    history.replaceState(null, "", "#" + p.toString());
  }

  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      if (view.sort === th.dataset.sort) view.desc = !view.desc;
      else { view.sort = th.dataset.sort; view.desc = th.dataset.sort !== "run_id"; }
      saveView(); render();
    });
  }
  $("filter").addEventListener("input", e => { view.q = e.target.value.trim(); saveView(); render(); });
  $("state-filter").addEventListener("change", e => { view.state = e.target.value; saveView(); render(); });
  $("sev-filter").addEventListener("change", e => { view.sev = e.target.value; saveView(); render(); });
  $("group-by").addEventListener("change", e => { view.group = e.target.value; view.collapsed.clear(); saveView(); render(); });
  $("spark-metric").addEventListener("change", e => { view.spark = e.target.value; saveView(); render(); });
  $("summary").addEventListener("click", e => {
    const card = e.target.closest(".card.click");
    if (!card) return;
    if (card.dataset.state) {
      view.state = view.state === card.dataset.state ? "" : card.dataset.state;
      $("state-filter").value = view.state;
    } else if (card.dataset.sev) {
      view.sev = view.sev === card.dataset.sev ? "" : card.dataset.sev;
      $("sev-filter").value = view.sev;
    }
    saveView(); render();
  });
  tbody.addEventListener("click", e => {
    const g = e.target.closest("tr.group");
    if (g) {
      const name = g.dataset.group;
      if (view.collapsed.has(name)) view.collapsed.delete(name); else view.collapsed.add(name);
      saveView(); render();
      return;
    }
    const tr = e.target.closest("tr.run");
    if (tr && !e.target.closest("a")) location.href = `/run?run=${encodeURIComponent(tr.dataset.run)}`;
  });

  RW.stream("/api/stream", {
    fleet(msg) {
      stats.events++;
      clockOffset = msg.now - Date.now() / 1000;
      if (msg.full) rows.clear();
      for (const r of msg.rows) rows.set(r.run_id, r);
      for (const id of msg.removed || []) rows.delete(id);
      const err = $("store-error");
      err.hidden = !msg.store_error;
      err.textContent = msg.store_error || "";
      render();
      window.rlwatch.fleet.ready = true;
    },
  }, $("live"));
  setInterval(render, 5000);   // ages
})();
