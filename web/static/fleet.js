/* rlwatch fleet page: every run, live over server-sent events; sort and filter in the page. */
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
  };
  const $ = id => document.getElementById(id);
  const tbody = $("rows");
  const stats = { renders: 0, lastRenderMs: 0, maxRenderMs: 0, events: 0 };
  window.rlwatch.fleet = { rows, stats, view };

  $("filter").value = view.q;
  $("state-filter").value = view.state;
  $("sev-filter").value = view.sev;

  const sevRank = s => RW.SEVERITIES.indexOf(s);
  const now = () => Date.now() / 1000 + clockOffset;

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
    if (view.state && r.state !== view.state) return false;
    if (view.sev === "none" && r.active) return false;
    if (view.sev === "any" && !r.active) return false;
    if ((view.sev === "orange" || view.sev === "red") &&
        !(r.worst && sevRank(r.worst.severity) >= sevRank(view.sev))) return false;
    if (view.q) {
      const q = view.q.toLowerCase();
      const hay = [r.run_id, ...Object.entries(r.tags).map(([k, v]) => `${k}=${v}`),
                   r.worst ? r.worst.rule : ""].join(" ").toLowerCase();
      if (!q.split(/\s+/).every(w => hay.includes(w))) return false;
    }
    return true;
  }

  function rowHtml(r, t) {
    const age = t - r.last_seen;
    const stale = age > 60 ? " stale" : "";
    const href = `/run?run=${encodeURIComponent(r.run_id)}`;
    const worst = r.worst
      ? `${RW.sevBadge(r.worst.severity)} <b>${RW.esc(r.worst.rule)}</b>` +
        (r.active > 1 ? ` <span class="muted">+${r.active - 1} more</span>` : "") +
        `<span class="summary-text" title="${RW.esc(r.worst.summary)}">${RW.esc(r.worst.summary)}</span>`
      : `<span class="muted">none</span>`;
    const why = r.state !== "running" && r.state_reason
      ? `<div class="muted" title="${RW.esc(r.state_reason)}">${RW.esc(r.state_issuer)}</div>` : "";
    const tags = Object.entries(r.tags).map(([k, v]) => `<span class="tag">${RW.esc(k)}=${RW.esc(v)}</span>`).join("");
    return `<tr class="run${stale}" data-run="${RW.esc(r.run_id)}" data-state="${r.state}">` +
      `<td><a class="mono" href="${href}">${RW.esc(r.run_id)}</a></td>` +
      `<td>${RW.stateBadge(r.state)}${why}</td>` +
      `<td class="worst">${worst}</td>` +
      `<td class="num">${r.last_step == null ? "–" : r.last_step}</td>` +
      `<td class="num">${r.steps_per_s ? r.steps_per_s.toFixed(1) : "0"}</td>` +
      `<td class="num">${RW.num(r.signals["reward/mean"])}</td>` +
      `<td class="num">${RW.num(r.signals["kl/mean"])}</td>` +
      `<td class="num">${RW.num(r.signals["entropy/mean"])}</td>` +
      `<td class="num" title="${RW.clock(r.last_seen)}">${RW.age(age)}</td>` +
      `<td>${tags}</td></tr>`;
  }

  function renderSummary(all) {
    const by = { running: 0, paused: 0, stopped: 0 };
    const sev = {};
    for (const r of all) {
      by[r.state] = (by[r.state] || 0) + 1;
      if (r.worst) sev[r.worst.severity] = (sev[r.worst.severity] || 0) + 1;
    }
    const card = (n, l, cls) => `<div class="card"><div class="n ${cls || ""}">${n}</div><div class="l">${l}</div></div>`;
    $("summary").innerHTML = card(all.length, "runs") + card(by.running, "running", "state-running") +
      card(by.paused, "paused", "state-paused") + card(by.stopped, "stopped", "state-stopped") +
      ["black", "red", "orange", "yellow"].map(s => card(sev[s] || 0, `worst ${s}`)).join("");
  }

  let pending = false;
  function render() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const t0 = performance.now();
      const all = [...rows.values()];
      const shown = all.filter(visible);
      shown.sort((a, b) => {
        let x = sortKey(a), y = sortKey(b);
        if (x == null) x = -Infinity;
        if (y == null) y = -Infinity;
        const c = typeof x === "string" ? x.localeCompare(y) : x - y;
        return (view.desc ? -c : c) || a.run_id.localeCompare(b.run_id);
      });
      const t = now();
      tbody.innerHTML = shown.length
        ? shown.map(r => rowHtml(r, t)).join("")
        : `<tr><td colspan="10" class="empty">${all.length ? "No run matches the filter." : "Waiting for runs…"}</td></tr>`;
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

  function saveView() {
    const p = new URLSearchParams();
    p.set("sort", view.sort);
    p.set("desc", view.desc ? "1" : "0");
    if (view.q) p.set("q", view.q);
    if (view.state) p.set("state", view.state);
    if (view.sev) p.set("sev", view.sev);
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
  tbody.addEventListener("click", e => {
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
      render();
      window.rlwatch.fleet.ready = true;
    },
  }, $("live"));
  setInterval(render, 5000);   // ages
})();
