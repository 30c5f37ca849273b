/* rlwatch dashboard: helpers shared by the fleet page and the cockpit. */
"use strict";

window.rlwatch = window.rlwatch || {};

const RW = {
  SEVERITIES: ["info", "yellow", "orange", "red", "black"],
  SEV_COLOR: { info: "#5ea1ff", yellow: "#f2cc0c", orange: "#ff8833", red: "#f2495c", black: "#ffffff" },

  esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, c =>
      ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  },

  num(x, digits = 4) {
    if (x == null || Number.isNaN(x)) return "–";
    const a = Math.abs(x);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return x.toExponential(2);
    return Number(x.toPrecision(digits)).toString();
  },

  age(seconds) {
    if (seconds == null) return "–";
    if (seconds < 2) return "now";
    if (seconds < 90) return `${Math.round(seconds)}s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)}m ago`;
    return `${(seconds / 3600).toFixed(1)}h ago`;
  },

  clock(ts) {
    if (ts == null) return "–";
    const d = new Date(ts * 1000);
    return d.toLocaleTimeString([], { hour12: false });
  },

  async getJSON(url) {
    const r = await fetch(url, { headers: { Accept: "application/json" } });
    if (!r.ok) {
      let msg = `${r.status}`;
      try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
      const err = new Error(msg);
      err.status = r.status;
      throw err;
    }
    return r.json();
  },

  sevBadge(sev, text) {
    return `<span class="sev sev-${RW.esc(sev)}">${RW.esc(text || sev)}</span>`;
  },

  stateBadge(state) {
    return `<span class="badge state-${RW.esc(state)}">${RW.esc(state)}</span>`;
  },

  /** An EventSource that says on `indicator` whether it is connected, and reconnects. */
  stream(url, handlers, indicator) {
    let es = null;
    let closed = false;
    const open = () => {
      es = new EventSource(typeof url === "function" ? url() : url);
      es.onopen = () => { if (indicator) { indicator.className = "live on"; indicator.textContent = "live"; } };
      es.onerror = () => {
        if (indicator) { indicator.className = "live off"; indicator.textContent = "reconnecting"; }
        if (es.readyState === EventSource.CLOSED && !closed) setTimeout(open, 2000);
      };
      for (const [name, fn] of Object.entries(handlers)) {
        es.addEventListener(name, ev => {
          let data;
          try { data = JSON.parse(ev.data); } catch (e) { return; }
          fn(data);
        });
      }
    };
    open();
    return {
      close() { closed = true; if (es) es.close(); },
      reopen() { if (es) es.close(); open(); },
    };
  },
};
window.RW = RW;
