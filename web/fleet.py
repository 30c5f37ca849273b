"""The dashboard's model of the fleet: every run, its history, alerts and control state.

:class:`Fleet` is fed by the pipeline through the same three hooks as the demo's
``Observer`` (``observe_event``, ``observe_alert``, ``observe_command``) and by the control
channel (``set_control_state``). It keeps, per run, bounded state only:

* a :class:`~web.series.StepTable` of all step metrics (min/max-bucketed, spikes kept) and
  their EMAs, plus per-category group metrics as ``metric@category`` columns;
* a short tail of recent rows, which the live view streams to open cockpits;
* :class:`~web.dists.DistHistory` per per-sample distribution (reward, response length);
* the latest samples, alert onsets (markers), the active alerts, observed commands.

It computes the fleet table's rows and the values ``/metrics`` exports. No I/O; the clock is
injectable; every method is thread-safe (the demo feeds it from its own thread while the web
server reads it from another).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from web.dists import DistHistory, heatmap, histogram
from web.series import StepTable, ema_alpha

__all__ = ["CHARTS", "CHART_METRICS", "SEVERITIES", "Fleet", "charted", "kl_lines_from_pack"]

SEVERITIES = ("info", "yellow", "orange", "red", "black")
_SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: The cockpit's charts (Q8's three rows); the page and the Grafana dashboard follow this.
CHARTS: dict[str, list[str]] = {
    "reward": ["reward/mean"],
    "kl": ["kl/mean"],
    "entropy": ["entropy/mean"],
    "loss": ["loss/policy", "loss/value"],
    "length": ["response/length_mean"],
    "clip": ["ppo/clip_frac", "value/clip_frac"],
    "eos": ["response/eos_frac", "response/truncated_frac"],
    "grad": ["grad_norm/actor", "grad_norm/critic"],
}
#: What the cockpit draws: the charts' metrics and every per-category group metric.
CHART_METRICS = frozenset(m for ms in CHARTS.values() for m in ms) | {"response/length_max"}


def charted(name: str) -> bool:
    return name in CHART_METRICS or "@" in name


#: Metrics shown in the fleet table (their EMA).
ROW_SIGNALS = ("reward/mean", "kl/mean", "entropy/mean")


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def kl_lines_from_pack(pack) -> dict[str, float]:
    """KL target and tier thresholds of ``kl_above_target`` in ``pack`` (for the KL chart)."""
    out: dict[str, float] = {}
    targets = dict(getattr(pack, "targets", {}) or {})
    if "kl" in targets:
        out["target"] = float(targets["kl"])
    for rule in getattr(pack, "rules", []):
        if rule.id != "kl_above_target":
            continue
        for tier in rule.tiers:
            cond = tier.when
            th = cond.above
            if cond.metric != "kl/mean" or th is None:
                continue
            if isinstance(th, (int, float)):
                out[tier.severity] = float(th)
            elif th.target is not None and th.target in targets:
                out[tier.severity] = float(targets[th.target]) * th.factor
            elif th.param is not None and th.param in rule.params:
                out[tier.severity] = float(rule.params[th.param]) * th.factor
    return {k: round(v, 9) for k, v in out.items()}


class _Run:
    def __init__(self, run_id: str, now: float, fleet: Fleet):
        self.run_id = run_id
        self.first_seen = now
        self.last_seen = now
        self.last_event_ts: float | None = None
        self.tags: dict[str, str] = {}
        self.world_size: int | None = None
        self.ranks: set[int] = set()
        self.primary_rank: int | None = None
        self.events = 0
        self.out_of_order = 0
        self.last_step: int | None = None
        self.state = "running"
        self.state_reason = ""
        self.state_issuer = ""
        self.state_ts: float | None = None
        self.table = StepTable(fleet.capacity, fleet.max_metrics)
        self.ema: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.names: list[str] = []            # column order of the tail rows
        self.name_index: dict[str, int] = {}
        self.tail: deque = deque(maxlen=fleet.tail_rows)
        self.seq = 0
        self.dists: dict[str, DistHistory] = {}
        self.dist_version = 0
        self.samples: deque = deque(maxlen=fleet.max_samples)
        self.sample_version = 0
        self.markers: deque = deque(maxlen=fleet.max_markers)
        self.alert_seq = 0
        self.active: dict[tuple, dict] = {}
        self.alert_keys: set[tuple[str, str]] = set()
        self.fired: dict[str, int] = {s: 0 for s in SEVERITIES}
        self.commands: deque = deque(maxlen=100)
        self.command_seq = 0
        self.rate: deque = deque(maxlen=512)
        self.rewind_ok = False
        self.kl_lines: dict[str, float] = dict(fleet.kl_lines)
        self.checkpoint: dict | None = None
        self.version = 0


class Fleet:
    """Thread-safe model of every run the dashboard knows (see the module docstring)."""

    def __init__(self, *, capacity: int = 512, dist_capacity: int = 240, tail_rows: int = 256,
                 max_samples: int = 200, max_markers: int = 500, max_metrics: int = 96,
                 max_runs: int = 500, ema_span: int = 20, rate_window: float = 30.0,
                 kl_lines: dict[str, float] | None = None, clock: Callable[[], float] = time.time):
        self.capacity = capacity
        self.dist_capacity = dist_capacity
        self.tail_rows = tail_rows
        self.max_samples = max_samples
        self.max_markers = max_markers
        self.max_metrics = max_metrics
        self.max_runs = max_runs
        self.alpha = ema_alpha(ema_span)
        self.ema_span = ema_span
        self.rate_window = rate_window
        self.kl_lines = dict(kl_lines or {})
        self.clock = clock
        self.runs: dict[str, _Run] = {}
        self.version = 0
        self.errors = 0
        self._lock = threading.RLock()

    # -- ingestion (the Observer hooks) ---------------------------------------------------------
    def _run(self, run_id: str, now: float) -> _Run:
        r = self.runs.get(run_id)
        if r is None:
            if len(self.runs) >= self.max_runs:
                oldest = min(self.runs.values(), key=lambda x: x.last_seen)
                del self.runs[oldest.run_id]
            r = self.runs[run_id] = _Run(run_id, now, self)
        return r

    def observe_event(self, event) -> None:
        """A parsed event (``contract.events.parse_event``). Never raises."""
        try:
            with self._lock:
                self._event(event, self.clock())
        except Exception:  # noqa: BLE001 - the dashboard must never break the pipeline
            self.errors += 1

    def _event(self, ev, now: float) -> None:
        r = self._run(ev.run_id, now)
        r.events += 1
        r.last_seen = now
        r.last_event_ts = ev.ts if ev.ts is not None else now
        if ev.tags and len(r.tags) < 32:
            r.tags.update({k: str(v) for k, v in list(ev.tags.items())[:32]})
        if ev.world_size:
            r.world_size = ev.world_size
        if len(r.ranks) < 4096:
            r.ranks.add(ev.rank)
        self.version += 1
        r.version += 1
        kind = ev.kind
        if kind == "samples":
            self._samples(r, ev)
            return
        if kind == "checkpoint":
            r.checkpoint = {"step": ev.step, "path": ev.path}
            return
        if kind != "step":
            return
        if r.primary_rank is None or ev.rank < r.primary_rank:
            r.primary_rank = ev.rank
        if ev.rank != r.primary_rank:
            return
        step, ts = ev.step, r.last_event_ts
        if r.last_step is not None and step <= r.last_step:
            if r.rewind_ok and step < r.last_step:
                self._rewind(r, step - 1)
            else:
                r.out_of_order += 1
                return
        r.last_step = step
        r.rate.append((now, step))
        values: dict[str, float] = {}
        for name, v in ev.metrics.items():
            values[name] = v
        for metric, cats in ev.groups.items():
            for cat, v in cats.items():
                values[f"{metric}@{cat}"] = v
        emas: dict[str, float] = {}
        a = self.alpha
        for name, v in values.items():
            if name not in r.name_index:
                if len(r.names) >= self.max_metrics:
                    continue
                r.name_index[name] = len(r.names)
                r.names.append(name)
            r.last[name] = v
            prev = r.ema.get(name)
            if math.isfinite(v):
                e = v if prev is None or not math.isfinite(prev) else prev + a * (v - prev)
                r.ema[name] = e
            else:
                e = prev if prev is not None else math.nan
            emas[name] = e
        values = {k: v for k, v in values.items() if k in r.name_index}
        r.table.append(step, ts, values, emas)
        r.seq += 1
        r.tail.append((r.seq, step, ts, values, emas))
        for name, xs in ev.dists.items():
            h = r.dists.get(name)
            if h is None:
                if len(r.dists) >= 8:
                    continue
                h = r.dists[name] = DistHistory(self.dist_capacity)
            h.add(step, ts, xs)
            r.dist_version += 1

    def _rewind(self, r: _Run, step: int) -> None:
        """The run rolled back: forget what came after ``step``; the open views resync."""
        r.table.truncate_after(step)
        for h in r.dists.values():
            h.truncate_after(step)
        r.tail.clear()
        r.seq += r.tail.maxlen or 1           # open tails see a gap and resync
        r.rewind_ok = False
        r.last_step = step
        r.dist_version += 1

    def _samples(self, r: _Run, ev) -> None:
        for s in ev.samples[:64]:
            r.samples.append({
                "step": ev.step, "ts": ev.ts, "prompt_id": s.prompt_id,
                "prompt": (s.prompt or "")[:2000], "response": (s.response or "")[:4000],
                "reward": s.reward, "length": s.length, "truncated": s.truncated,
                "category": s.category, "kl": s.kl, "token_kl_max": s.token_kl_max,
                "token_kl_argmax": s.token_kl_argmax})
        r.sample_version += 1

    def observe_alert(self, alert) -> None:
        """An alert (``contract.alert.Alert``) as the pipeline emitted it. Never raises."""
        try:
            with self._lock:
                self._alert(alert, self.clock())
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _alert(self, a, now: float) -> None:
        r = self._run(a.run_id, now)
        r.alert_seq += 1
        marker = {"seq": r.alert_seq, "rule": a.rule, "severity": a.severity, "state": a.state,
                  "step": a.step, "onset_step": a.onset_step if a.onset_step is not None else a.step,
                  "ts": a.ts if a.ts is not None else now, "rank": a.rank, "metric": a.metric,
                  "value": _num(a.value), "threshold": _num(a.threshold),
                  "summary": a.summary[:500], "actions": list(a.actions)}
        r.markers.append(marker)
        key = (a.rule, a.rank, a.severity)
        if len(r.alert_keys) < 512:
            r.alert_keys.add((a.rule, a.severity))
        if a.state == "firing":
            r.active[key] = marker
            r.fired[a.severity] = r.fired.get(a.severity, 0) + 1
            if "rollback" in a.actions:
                r.rewind_ok = True
            if a.rule == "kl_above_target" and _num(a.threshold) is not None and a.metric in (None, "kl/mean"):
                r.kl_lines[a.severity] = float(a.threshold)
        else:
            r.active.pop(key, None)
            # an escalated tier fires at the next severity and resolves at its own
            for k in [k for k, m in r.active.items() if k[0] == a.rule and k[1] == a.rank
                      and f"escalated from {a.severity}" in m["summary"]]:
                del r.active[k]
        r.version += 1
        self.version += 1

    def observe_command(self, command, state: str | None = None) -> None:
        """A control command (``contract.commands.Command``); ``state`` is the run's state after it."""
        try:
            with self._lock:
                r = self._run(command.run_id, self.clock())
                if any(c["id"] == command.id for c in r.commands):
                    # seen already (the web server reports the commands it sends; the channel
                    # may report them too): only the state may be news
                    if state in ("running", "paused", "stopped") and state != r.state:
                        self._set_state(r, state, command.reason, command.issuer, command.ts)
                        r.version += 1
                        self.version += 1
                    return
                r.command_seq += 1
                r.commands.append({"id": command.id, "action": command.action, "params": dict(command.params),
                                   "reason": command.reason, "issuer": command.issuer, "ts": command.ts,
                                   "rule": command.rule, "step": command.step})
                if command.action == "rollback":
                    r.rewind_ok = True
                if state in ("running", "paused", "stopped"):
                    self._set_state(r, state, command.reason, command.issuer, command.ts)
                r.version += 1
                self.version += 1
        except Exception:  # noqa: BLE001
            self.errors += 1

    def set_control_state(self, run_id: str, state: str, reason: str = "", issuer: str = "",
                          ts: float | None = None) -> bool:
        """The authoritative control state (from the control channel). True when it changed."""
        with self._lock:
            r = self.runs.get(run_id)
            if r is None or state not in ("running", "paused", "stopped"):
                return False
            if r.state == state and (r.state_reason, r.state_issuer) == (reason, issuer):
                return False
            self._set_state(r, state, reason, issuer, ts)
            r.version += 1
            self.version += 1
            return True

    @staticmethod
    def _set_state(r: _Run, state: str, reason: str, issuer: str, ts: float | None) -> None:
        r.state, r.state_reason, r.state_issuer, r.state_ts = state, reason or "", issuer or "", ts

    # -- reading --------------------------------------------------------------------------------
    def run_ids(self) -> list[str]:
        with self._lock:
            return list(self.runs)

    def __contains__(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self.runs

    def _steps_per_s(self, r: _Run, now: float) -> float:
        pts = [(t, s) for t, s in r.rate if t >= now - self.rate_window]
        if len(pts) < 2:
            return 0.0
        (t0, s0), (t1, s1) = pts[0], pts[-1]
        span = max(now - t0, t1 - t0)
        return (s1 - s0) / span if span > 0 else 0.0

    @staticmethod
    def _worst(r: _Run) -> dict | None:
        if not r.active:
            return None
        m = max(r.active.values(), key=lambda m: (_SEV_RANK.get(m["severity"], 0), m["step"]))
        return {k: m[k] for k in ("rule", "severity", "summary", "step", "onset_step", "rank")}

    def _row(self, r: _Run, now: float) -> dict:
        by_sev = {s: 0 for s in SEVERITIES}
        for m in r.active.values():
            by_sev[m["severity"]] = by_sev.get(m["severity"], 0) + 1
        return {
            "run_id": r.run_id,
            "state": r.state,
            "state_reason": r.state_reason,
            "state_issuer": r.state_issuer,
            "state_ts": r.state_ts,
            "last_step": r.last_step,
            "steps_per_s": round(self._steps_per_s(r, now), 3),
            "last_seen": r.last_seen,
            "age_s": round(max(0.0, now - r.last_seen), 1),
            "first_seen": r.first_seen,
            "last_event_ts": r.last_event_ts,
            "tags": dict(r.tags),
            "world_size": r.world_size or (len(r.ranks) or None),
            "events": r.events,
            "out_of_order": r.out_of_order,
            "worst": self._worst(r),
            "active": len(r.active),
            "active_by_severity": by_sev,
            "fired": dict(r.fired),
            "signals": {k: _num(r.ema.get(k)) for k in ROW_SIGNALS},
            "checkpoint": r.checkpoint,
        }

    def rows(self, now: float | None = None, sort: str | None = None, q: str | None = None,
             state: str | None = None) -> list[dict]:
        """One row per run. ``sort`` is a row key (``-`` prefix: descending; ``severity`` sorts
        by the worst active alert); ``q`` filters on run id, tags and alert rules; ``state``
        on the control state."""
        now = self.clock() if now is None else now
        with self._lock:
            rows = [self._row(r, now) for r in self.runs.values()]
        if state:
            rows = [x for x in rows if x["state"] == state]
        if q:
            ql = q.lower()
            rows = [x for x in rows if ql in x["run_id"].lower()
                    or any(ql in f"{k}={v}".lower() for k, v in x["tags"].items())
                    or (x["worst"] and ql in x["worst"]["rule"].lower())]
        key = (sort or "run_id").lstrip("-")
        desc = (sort or "").startswith("-")

        def k(x):
            if key == "severity":
                w = x["worst"]
                return (_SEV_RANK.get(w["severity"], -1) if w else -1, x["active"])
            v = x.get(key)
            return (v is None, v if v is not None else 0) if not isinstance(v, str) else (False, v)

        try:
            rows.sort(key=k, reverse=desc)
        except TypeError:
            rows.sort(key=lambda x: x["run_id"])
        return rows

    def row(self, run_id: str, now: float | None = None) -> dict | None:
        now = self.clock() if now is None else now
        with self._lock:
            r = self.runs.get(run_id)
            return None if r is None else self._row(r, now)

    def versions(self, run_id: str) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return None
            return {"version": r.version, "seq": r.seq, "alert_seq": r.alert_seq,
                    "dists": r.dist_version, "samples": r.sample_version, "commands": r.command_seq}

    def series(self, run_id: str, points: int | None = None, names: Iterable[str] | None = None) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return None
            out = r.table.view(names, points)
            out["seq"] = r.seq
            return out

    def tail(self, run_id: str, since: int) -> tuple[list[dict], int, bool]:
        """Rows after sequence number ``since``: (rows, latest seq, complete). ``complete`` is
        False when rows in between were already evicted (the view must reload). Only the
        metrics the cockpit draws travel."""
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return [], since, False
            if since >= r.seq:
                return [], r.seq, since == r.seq
            first = r.tail[0][0] if r.tail else r.seq + 1
            if since + 1 < first:
                return [], r.seq, False
            rows = [{"step": s, "ts": t, "v": {k: _num(x) for k, x in v.items() if charted(k)},
                     "e": {k: _num(x) for k, x in e.items() if charted(k)}}
                    for q, s, t, v, e in r.tail if q > since]
            return rows, r.seq, True

    def markers(self, run_id: str, since: int = 0) -> list[dict]:
        with self._lock:
            r = self.runs.get(run_id)
            return [] if r is None else [dict(m) for m in r.markers if m["seq"] > since]

    def active_alerts(self, run_id: str) -> list[dict]:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return []
            return sorted((dict(m) for m in r.active.values()),
                          key=lambda m: (-_SEV_RANK.get(m["severity"], 0), -m["step"]))

    def kl_lines_for(self, run_id: str) -> dict[str, float]:
        with self._lock:
            r = self.runs.get(run_id)
            return dict(self.kl_lines if r is None else r.kl_lines)

    def commands(self, run_id: str) -> list[dict]:
        with self._lock:
            r = self.runs.get(run_id)
            return [] if r is None else [dict(c) for c in r.commands]

    def dists(self, run_id: str, bins: int = 30) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return None
            out = {}
            for name, h in r.dists.items():
                out[name] = {"latest_step": h.latest_step, "latest": histogram(h.latest, bins),
                             "heatmap": heatmap(h, bins), "steps_per_column": h.width}
            return {"dists": out, "version": r.dist_version}

    def samples(self, run_id: str, category: str | None = None, step: int | None = None,
                limit: int = 50) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return None
            all_ = list(r.samples)
        cats = sorted({s["category"] for s in all_ if s["category"]})
        steps = sorted({s["step"] for s in all_}, reverse=True)
        sel = [s for s in all_ if (not category or s["category"] == category)
               and (step is None or s["step"] == step)]
        sel.reverse()
        return {"samples": sel[:max(1, min(limit, 200))], "categories": cats, "steps": steps,
                "total": len(sel)}

    def categories(self, run_id: str) -> dict[str, list[str]]:
        """Group metrics with their categories, e.g. ``{"reward/mean": ["creative", ...]}``."""
        with self._lock:
            r = self.runs.get(run_id)
            names = [] if r is None else list(r.names)
        out: dict[str, list[str]] = {}
        for n in names:
            if "@" in n:
                m, c = n.split("@", 1)
                out.setdefault(m, []).append(c)
        return out

    def snapshot(self, run_id: str, points: int | None = 400, now: float | None = None) -> dict | None:
        """Everything a cockpit needs to draw: row, series, markers, active alerts, KL lines."""
        now = self.clock() if now is None else now
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return None
            return {
                "row": self._row(r, now),
                "series": self.series(run_id, points, [n for n in r.table.metrics() if charted(n)]),
                "markers": self.markers(run_id),
                "active": self.active_alerts(run_id),
                "commands": self.commands(run_id),
                "kl_lines": dict(r.kl_lines),
                "groups": self.categories(run_id),
                "versions": self.versions(run_id),
                "ema_span": self.ema_span,
                "dropped_metrics": sorted(r.table.dropped_metrics)[:20],
            }

    def export(self, now: float | None = None) -> list[dict]:
        """What ``/metrics`` publishes, per run (see :mod:`web.metrics`)."""
        now = self.clock() if now is None else now
        with self._lock:
            out = []
            for r in self.runs.values():
                out.append({
                    "run_id": r.run_id, "state": r.state, "last_step": r.last_step,
                    "steps_per_s": self._steps_per_s(r, now), "last_seen": r.last_seen,
                    "events": r.events, "fired": dict(r.fired),
                    "ema": {k: v for k, v in r.ema.items() if "@" not in k},
                    "groups": {k: v for k, v in r.ema.items() if "@" in k},
                    "active": {(m["rule"], m["severity"]) for m in r.active.values()},
                    "alert_keys": set(r.alert_keys),
                    "kl_lines": dict(r.kl_lines),
                    "quantiles": {name: _quantiles(h.latest) for name, h in r.dists.items() if h.latest},
                })
            return out


EXPORT_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def _quantiles(values: list[float]) -> dict[float, float]:
    import numpy as np

    qs = np.quantile(np.asarray(values, dtype=float), EXPORT_QUANTILES)
    return {q: float(v) for q, v in zip(EXPORT_QUANTILES, qs)}
