"""The dashboard's model: the fleet's records, and chart history for the runs processed here.

Two kinds of data, kept apart:

* **The numbers** come from the core. Every run's row is built from its record in the fleet
  store (:mod:`streams.fleet_store`: the core's ``RunState.summary()`` plus a sparkline, the
  steps per second and whether the run finished), which every worker writes and every
  dashboard reads, so any dashboard shows the whole fleet. For the runs this process handles,
  the summary the core held right after each event is used directly (it is newer). Smoothed
  values, targets, KL thresholds, open alerts and the last step are the ones the rules use;
  nothing is recomputed here.
* **Display data** for the runs whose events pass through this process: a
  :class:`~web.series.StepTable` of the step metrics beside the smoothed values the rules read
  (min/max-bucketed, spikes kept), per-category group metrics as ``metric@category`` columns, a
  short tail streamed to open cockpits, :class:`~web.dists.DistHistory` per distribution, the
  latest samples, alert onsets (markers) and the commands seen. The charts restart when the core
  reports a new incarnation (a relaunch) and rewind when it reports a new rollback generation.

No I/O; the clock is injectable; every method is thread-safe (the pipeline feeds it from its
thread while the web server reads it from another).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from contract.commands import STATE_ACTIONS
from streams.fleet_store import finite_number as _num
from streams.fleet_store import (
    FINISHED_AFTER,
    SILENT_AFTER,
    kl_lines_of,
    make_record,
    run_status,
    steps_per_second,
)
from web.dists import DistHistory, heatmap, histogram
from web.series import StepTable

__all__ = ["CHARTS", "CHART_METRICS", "SEVERITIES", "Fleet", "charted", "kl_lines_from_pack"]

SEVERITIES = ("info", "yellow", "orange", "red", "black")
_SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}
STATES = ("running", "paused", "stopped")

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


#: Metrics shown in the fleet table (smoothed as the rules read them, else the last value).
ROW_SIGNALS = ("reward/mean", "kl/mean", "entropy/mean")


def kl_lines_from_pack(pack) -> dict[str, float]:
    """KL target and tier thresholds of ``kl_above_target`` in ``pack``, with the pack's own
    targets (a run's own lines come with its summary)."""
    targets = dict(getattr(pack, "targets", {}) or {})
    out = kl_lines_of(getattr(pack, "rules", []), targets, {})
    if "kl" in targets:
        out["target"] = float(targets["kl"])
    return out


def _lines(summary: dict) -> dict[str, float]:
    """The KL lines of a run's summary: the target and each tier's threshold."""
    out = {k: v for k, v in (summary.get("kl_lines") or {}).items() if _num(v) is not None}
    t = _num((summary.get("targets") or {}).get("kl"))
    if t is not None and out:
        out.setdefault("target", t)
    return out


class _Run:
    """Display data of one run whose events pass through this process."""

    def __init__(self, run_id: str, now: float, fleet: Fleet):
        self.run_id = run_id
        self.fleet = fleet
        self.last_seen = now
        self.summary: dict | None = None
        self.incarnation: Any = None
        self.generation: int | None = None
        self.primary_rank: int | None = None
        self.chart_step: int | None = None
        self.reset_charts()
        self.samples: deque = deque(maxlen=fleet.max_samples)
        self.sample_version = 0
        self.markers: deque = deque(maxlen=fleet.max_markers)
        self.alert_seq = 0
        self.alert_keys: set[tuple[str, str]] = set()
        self.fired: dict[str, int] = {s: 0 for s in SEVERITIES}
        self.commands: deque = deque(maxlen=100)
        self.command_seq = 0
        self.checkpoint: dict | None = None
        self.version = 0

    def reset_charts(self) -> None:
        f = self.fleet
        self.table = StepTable(f.capacity, f.max_metrics)
        self.names: list[str] = []
        self.name_index: dict[str, int] = {}
        self.tail: deque = deque(maxlen=f.tail_rows)
        self.seq = getattr(self, "seq", 0) + f.tail_rows + 1     # open tails see a gap: resync
        self.dists: dict[str, DistHistory] = {}
        self.dist_version = getattr(self, "dist_version", 0) + 1
        self.chart_step = None
        self.last_values: dict[str, float] = {}


class Fleet:
    """Thread-safe model of every run the dashboard knows (see the module docstring)."""

    def __init__(self, *, capacity: int = 512, dist_capacity: int = 240, tail_rows: int = 256,
                 max_samples: int = 200, max_markers: int = 500, max_metrics: int = 96,
                 max_runs: int = 500, kl_lines: dict[str, float] | None = None,
                 silent_after: float = SILENT_AFTER, finished_after: float = FINISHED_AFTER,
                 clock: Callable[[], float] = time.time):
        self.capacity = capacity
        self.dist_capacity = dist_capacity
        self.tail_rows = tail_rows
        self.max_samples = max_samples
        self.max_markers = max_markers
        self.max_metrics = max_metrics
        self.max_runs = max_runs
        self.kl_lines = dict(kl_lines or {})     # the pack's defaults, for runs without a summary
        self.silent_after = silent_after
        self.finished_after = finished_after
        self.clock = clock
        self.runs: dict[str, _Run] = {}          # display data (runs processed here)
        self.records: dict[str, dict] = {}       # the fleet store's records (every run)
        self.control: dict[str, dict] = {}       # run -> control state (from the control channel)
        self.version = 0
        self.errors = 0
        self._lock = threading.RLock()

    # -- ingestion ------------------------------------------------------------------------------
    def _run(self, run_id: str, now: float) -> _Run:
        r = self.runs.get(run_id)
        if r is None:
            if len(self.runs) >= self.max_runs:
                oldest = min(self.runs.values(), key=lambda x: x.last_seen)
                del self.runs[oldest.run_id]
            r = self.runs[run_id] = _Run(run_id, now, self)
        return r

    def observe_event(self, event, summary: dict | None = None) -> None:
        """A parsed event, with the core's summary of its run right after it. Never raises."""
        try:
            with self._lock:
                self._event(event, summary, self.clock())
        except Exception:  # noqa: BLE001 - the dashboard must never break the pipeline
            self.errors += 1

    def _event(self, ev, summary: dict | None, now: float) -> None:
        r = self._run(ev.run_id, now)
        r.last_seen = now
        if summary is not None:
            inc, gen = summary.get("incarnation"), summary.get("generation")
            if r.summary is not None and inc != r.incarnation:
                r.reset_charts()             # a relaunch: its charts start afresh
            elif r.generation is not None and gen is not None and gen > r.generation:
                self._rewind(r, ev.step - 1)  # a rollback: the steps after the checkpoint go
            r.summary, r.incarnation, r.generation = summary, inc, gen
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
        step = ev.step
        if r.chart_step is not None and step <= r.chart_step:
            return                          # the chart's axis only goes forward
        r.chart_step = step
        ts = ev.ts if ev.ts is not None else now
        values: dict[str, float] = dict(ev.metrics)
        for metric, cats in ev.groups.items():
            for cat, v in cats.items():
                values[f"{metric}@{cat}"] = v
        smoothed = (summary or {}).get("smoothed") or {}
        emas: dict[str, float] = {}
        for name in values:
            if name not in r.name_index:
                if len(r.names) >= self.max_metrics:
                    continue
                r.name_index[name] = len(r.names)
                r.names.append(name)
            e = _num(smoothed.get(name))
            emas[name] = math.nan if e is None else e
        values = {k: v for k, v in values.items() if k in r.name_index}
        r.last_values.update(values)
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
        r.chart_step = step
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
        """An alert as the pipeline emitted it: a marker on the charts. Never raises."""
        try:
            with self._lock:
                self._alert(alert, self.clock())
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _alert(self, a, now: float) -> None:
        r = self._run(a.run_id, now)
        r.alert_seq += 1
        r.markers.append({"seq": r.alert_seq, "rule": a.rule, "severity": a.severity, "state": a.state,
                          "step": a.step, "onset_step": a.onset_step if a.onset_step is not None else a.step,
                          "ts": a.ts if a.ts is not None else now, "rank": a.rank, "metric": a.metric,
                          "value": _num(a.value), "threshold": _num(a.threshold),
                          "summary": a.summary[:500], "actions": list(a.actions)})
        if len(r.alert_keys) < 512:
            r.alert_keys.add((a.rule, a.severity))
        if a.state == "firing":
            r.fired[a.severity] = r.fired.get(a.severity, 0) + 1
        r.version += 1
        self.version += 1

    def observe_command(self, command, state: str | None = None) -> None:
        """A control command (``contract.commands.Command``); ``state`` is the run's state after it."""
        try:
            with self._lock:
                r = self._run(command.run_id, self.clock())
                if not any(c["id"] == command.id for c in r.commands):
                    r.command_seq += 1
                    r.commands.append({"id": command.id, "action": command.action,
                                       "params": dict(command.params), "reason": command.reason,
                                       "issuer": command.issuer, "ts": command.ts,
                                       "rule": command.rule, "step": command.step})
                # the state's reason is that of the command that set it: an adjust or a rollback
                # of a paused run lists as a command, and the run shows the pause's reason still
                if state in STATES and command.action in STATE_ACTIONS:
                    self._set_state(command.run_id, state, command.reason, command.issuer, command.ts)
                r.version += 1
                self.version += 1
        except Exception:  # noqa: BLE001
            self.errors += 1

    def set_control_state(self, run_id: str, state: str, reason: str = "", issuer: str = "",
                          ts: float | None = None) -> bool:
        """The authoritative control state (from the control channel). True when it changed."""
        with self._lock:
            if state not in STATES or (run_id not in self.runs and run_id not in self.records):
                return False
            return self._set_state(run_id, state, reason, issuer, ts)

    def _set_state(self, run_id: str, state: str, reason: str, issuer: str, ts: float | None) -> bool:
        new = {"state": state, "reason": reason or "", "issuer": issuer or "", "ts": ts}
        old = self.control.get(run_id)
        if old is not None and (old["state"], old["reason"], old["issuer"]) == (state, new["reason"],
                                                                             new["issuer"]):
            return False
        self.control[run_id] = new
        self.version += 1
        return True

    def set_records(self, records: Iterable[dict]) -> int:
        """Records read from the fleet store (newer ones replace older ones). Returns how many
        changed."""
        n = 0
        with self._lock:
            for rec in records:
                run_id = rec.get("run_id")
                if not run_id:
                    continue
                old = self.records.get(run_id)
                if old is None or rec.get("updated", 0) >= old.get("updated", 0):
                    self.records[run_id] = rec
                    n += 1
            if n:
                self.version += 1
        return n

    # -- reading --------------------------------------------------------------------------------
    def run_ids(self) -> list[str]:
        with self._lock:
            return sorted(set(self.runs) | set(self.records))

    def __contains__(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self.runs or run_id in self.records

    def local(self, run_id: str) -> bool:
        """True when this process draws the run's charts (its events pass through here)."""
        with self._lock:
            r = self.runs.get(run_id)
            return r is not None and r.summary is not None

    def _record(self, run_id: str, now: float) -> dict | None:
        """The run's record, with the local summary when it is newer than the stored one."""
        rec = self.records.get(run_id)
        r = self.runs.get(run_id)
        if r is None or r.summary is None:
            return rec
        mine = r.summary
        if rec is not None:
            theirs = rec.get("summary") or {}
            if (_num(theirs.get("last_event_ts")) or 0) > (_num(mine.get("last_event_ts")) or 0):
                return rec
            out = dict(rec)
            out["summary"] = mine
            if mine.get("incarnation") != theirs.get("incarnation"):
                out.update(spark=None, rate=[], closed=None)
            return out
        return make_record(mine, None, now)

    def _worst(self, summary: dict, r: _Run | None) -> dict | None:
        alerts = summary.get("open_alerts") or []
        if not alerts:
            return None
        a = max(alerts, key=lambda m: (_SEV_RANK.get(m.get("severity"), 0), m.get("step") or 0))
        text = a.get("summary") or ""
        if not text and r is not None:    # the text of the alert as it fired, if it fired here
            for m in reversed(r.markers):
                if m["rule"] == a.get("rule") and m["severity"] == a.get("severity") and m["state"] == "firing":
                    text = m["summary"]
                    break
        return {"rule": a.get("rule"), "severity": a.get("severity"), "summary": text,
                "step": a.get("step"), "onset_step": a.get("onset_step"), "rank": a.get("rank")}

    def _row(self, run_id: str, now: float) -> dict | None:
        rec = self._record(run_id, now)
        r = self.runs.get(run_id)
        if rec is None and r is None:
            return None
        rec = rec or {}
        s = rec.get("summary") or {}
        ctl = self.control.get(run_id) or {"state": "running", "reason": "", "issuer": "", "ts": None}
        by_sev = {x: 0 for x in SEVERITIES}
        for a in s.get("open_alerts") or []:
            by_sev[a.get("severity")] = by_sev.get(a.get("severity"), 0) + 1
        smoothed, latest = s.get("smoothed") or {}, s.get("latest") or {}
        last_ts = _num(s.get("last_event_ts"))
        if last_ts is None and r is not None:
            last_ts = r.last_seen
        status = run_status(rec, now, silent_after=self.silent_after,
                            finished_after=self.finished_after) if rec else "live"
        spark = rec.get("spark") or {}
        return {
            "run_id": run_id,
            "state": ctl["state"],
            "state_reason": ctl["reason"],
            "state_issuer": ctl["issuer"],
            "state_ts": ctl["ts"],
            "status": status,
            "closed": rec.get("closed"),
            "incarnation": s.get("incarnation"),
            "generation": s.get("generation"),
            "last_step": s.get("last_step"),
            "steps_per_s": round(steps_per_second(rec, now), 3) if status == "live" else 0.0,
            "last_seen": last_ts,
            "age_s": None if last_ts is None else round(max(0.0, now - last_ts), 1),
            "tags": dict(s.get("tags") or {}),
            "world_size": s.get("world_size"),
            "events": s.get("events"),
            "worst": self._worst(s, r),
            "active": sum(by_sev.values()),
            "active_by_severity": by_sev,
            "fired": dict(r.fired) if r is not None else {},
            "signals": {m: _num(smoothed.get(m, latest.get(m))) for m in ROW_SIGNALS},
            "smoothed": {m: _num(smoothed.get(m)) for m in ROW_SIGNALS if m in smoothed},
            "targets": dict(s.get("targets") or {}),
            "kl_lines": _lines(s) or dict(self.kl_lines),
            "spark": {m: pts for m, pts in (spark.get("points") or {}).items()},
            "checkpoint": r.checkpoint if r is not None else None,
            "local": r is not None and r.summary is not None,
            "writer": rec.get("writer"),
        }

    def rows(self, now: float | None = None, sort: str | None = None, q: str | None = None,
             state: str | None = None) -> list[dict]:
        """One row per run. ``sort`` is a row key (``-`` prefix: descending; ``severity`` sorts
        by the worst active alert); ``q`` filters on run id, tags and alert rules; ``state``
        on the control state, or ``finished`` / ``live`` / ``silent``."""
        now = self.clock() if now is None else now
        with self._lock:
            rows = [x for x in (self._row(rid, now) for rid in set(self.runs) | set(self.records)) if x]
        if state:
            rows = [x for x in rows if state in (x["state"], x["status"])]
        if q:
            words = q.lower().split()
            rows = [x for x in rows if all(
                w in x["run_id"].lower() or any(w in f"{k}={v}".lower() for k, v in x["tags"].items())
                or (x["worst"] and w in (x["worst"]["rule"] or "").lower()) for w in words)]
        key = (sort or "run_id").lstrip("-")
        desc = (sort or "").startswith("-")

        def k(x):
            if key == "severity":
                w = x["worst"]
                return (_SEV_RANK.get(w["severity"], -1) if w else -1, x["active"])
            v = x.get(key)
            return (v is None, v if v is not None else 0) if not isinstance(v, str) else (False, v)

        try:
            rows.sort(key=lambda x: x["run_id"])
            rows.sort(key=k, reverse=desc)
        except TypeError:
            rows.sort(key=lambda x: x["run_id"])
        return rows

    def row(self, run_id: str, now: float | None = None) -> dict | None:
        now = self.clock() if now is None else now
        with self._lock:
            return self._row(run_id, now)

    def summary(self, run_id: str, now: float | None = None) -> dict | None:
        """The run's summary as its row shows it (the stored record's, or this process's own
        when newer): what an operator's rollback picks its checkpoint from."""
        now = self.clock() if now is None else now
        with self._lock:
            return (self._record(run_id, now) or {}).get("summary")

    def versions(self, run_id: str) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                rec = self.records.get(run_id)
                if rec is None:
                    return None
                return {"version": rec.get("updated"), "seq": 0, "alert_seq": 0, "dists": 0,
                        "samples": 0, "commands": 0}
            return {"version": r.version, "seq": r.seq, "alert_seq": r.alert_seq,
                    "dists": r.dist_version, "samples": r.sample_version, "commands": r.command_seq}

    def series(self, run_id: str, points: int | None = None, names: Iterable[str] | None = None) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                rec = self.records.get(run_id)
                return None if rec is None else _spark_series(rec, names)
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
                return [], since, True
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
        """The run's open alerts, as the core holds them."""
        with self._lock:
            rec = self._record(run_id, self.clock())
            r = self.runs.get(run_id)
            if rec is None:
                return []
            out = []
            for a in (rec.get("summary") or {}).get("open_alerts") or []:
                m = dict(a)
                if not m.get("summary") and r is not None:
                    for mk in reversed(r.markers):
                        if mk["rule"] == m.get("rule") and mk["severity"] == m.get("severity"):
                            m["summary"] = mk["summary"]
                            break
                out.append(m)
            return sorted(out, key=lambda m: (-_SEV_RANK.get(m.get("severity"), 0), -(m.get("step") or 0)))

    def kl_lines_for(self, run_id: str) -> dict[str, float]:
        with self._lock:
            rec = self._record(run_id, self.clock())
            lines = _lines((rec or {}).get("summary") or {})
            return lines or dict(self.kl_lines)

    def commands(self, run_id: str) -> list[dict]:
        with self._lock:
            r = self.runs.get(run_id)
            return [] if r is None else [dict(c) for c in r.commands]

    def dists(self, run_id: str, bins: int = 30) -> dict | None:
        with self._lock:
            r = self.runs.get(run_id)
            if r is None:
                return {"dists": {}, "version": 0} if run_id in self.records else None
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
                if run_id in self.records:
                    return {"samples": [], "categories": [], "steps": [], "total": 0}
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
        """Everything a cockpit needs to draw: row, series, markers, active alerts, KL lines.
        For a run processed elsewhere, the series are its record's sparkline (``local`` False)."""
        now = self.clock() if now is None else now
        with self._lock:
            row = self._row(run_id, now)
            if row is None:
                return None
            r = self.runs.get(run_id)
            names = [n for n in r.table.metrics() if charted(n)] if r is not None else None
            return {
                "row": row,
                "series": self.series(run_id, points, names),
                "markers": self.markers(run_id),
                "active": self.active_alerts(run_id),
                "commands": self.commands(run_id),
                "kl_lines": self.kl_lines_for(run_id),
                "groups": self.categories(run_id),
                "versions": self.versions(run_id),
                "smoothing": "the smoothed values the rules read (drawn where a rule smooths the metric)",
                "dropped_metrics": sorted(r.table.dropped_metrics)[:20] if r is not None else [],
                "local": row["local"],
            }

    def export(self, now: float | None = None, scope: str = "all") -> list[dict]:
        """What ``/metrics`` publishes, per run (see :mod:`web.metrics`). ``scope="local"``:
        only the runs processed here (so that scraping every worker counts each run once)."""
        now = self.clock() if now is None else now
        with self._lock:
            ids = set(self.runs) if scope == "local" else set(self.runs) | set(self.records)
            out = []
            for run_id in sorted(ids):
                row = self._row(run_id, now)
                if row is None or (scope == "local" and not row["local"]):
                    continue
                rec = self._record(run_id, now) or {}
                s = rec.get("summary") or {}
                r = self.runs.get(run_id)
                smoothed = {k: v for k, v in (s.get("smoothed") or {}).items() if _num(v) is not None}
                active = {(a.get("rule"), a.get("severity")) for a in s.get("open_alerts") or []}
                out.append({
                    "run_id": run_id, "state": row["state"], "status": row["status"],
                    "last_step": row["last_step"], "steps_per_s": row["steps_per_s"],
                    "last_seen": row["last_seen"], "events": row["events"] or 0,
                    "fired": dict(r.fired) if r is not None else {},
                    "smoothed": smoothed,
                    "latest": {k: v for k, v in ((r.last_values if r is not None and r.last_values
                                                  else s.get("latest")) or {}).items()
                               if _num(v) is not None},
                    "active": active,
                    "alert_keys": (set(r.alert_keys) if r is not None else set()) | active,
                    "kl_lines": row["kl_lines"],
                    "quantiles": {} if r is None else
                    {name: _quantiles(h.latest) for name, h in r.dists.items() if h.latest},
                })
            return out


def _spark_series(rec: dict, names: Iterable[str] | None) -> dict:
    """The chart data of a run processed elsewhere: its record's sparkline points."""
    points = (rec.get("spark") or {}).get("points") or {}
    wanted = [m for m in (names if names is not None else points) if m in points]
    steps = sorted({p[0] for m in wanted for p in points[m]})
    raw: dict[str, list] = {}
    for m in wanted:
        at = {p[0]: p[1] for p in points[m]}
        raw[m] = [at.get(s) for s in steps]
    return {"step": steps, "ts": [None] * len(steps), "raw": {m: [None] * len(steps) for m in wanted},
            "ema": raw, "bad": {}, "bucket_steps": (rec.get("spark") or {}).get("stride", 1), "seq": 0}


EXPORT_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def _quantiles(values: list[float]) -> dict[float, float]:
    import numpy as np

    qs = np.quantile(np.asarray(values, dtype=float), EXPORT_QUANTILES)
    return {q: float(v) for q, v in zip(EXPORT_QUANTILES, qs)}
