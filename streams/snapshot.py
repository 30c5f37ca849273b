"""Incident snapshots: what a person needs to look at an alert. Pure.

:class:`SnapshotRecorder` keeps, per run, a bounded ring of recent step records (every rank's
metrics and batch ids) and of recent sample batches; the processor feeds it every event with
``recorder.observe(event)``. When an alert with the ``snapshot`` action fires,
:func:`build_snapshot` turns the recorder's view of the run (and the run's
:class:`~streams.run.RunState`) into a dict:

* ``window``: the run's metrics step by step around the onset (rank of the alert, else 0);
* ``offending`` / ``last_stable``: the samples of the offending step (the latest sample batch at
  or before the alert's step, from the onset on) beside those of the last stable step: the last
  step before the onset whose value of the alert's metric was on the healthy side of the
  threshold (a rule that reads a median or holds for a few steps has its onset a few steps
  after the first bad one), else the step before the onset;
* ``ranks``: what every rank reported at the offending step (its metric value, batch ids);
* ``checkpoints``, ``rollback_to``, ``tags``, ``world_size``.

:func:`attach_snapshot` puts that dict on the alert (``alert.snapshot``) on its way to the
alerts topic; the dispatcher stores it in Redis as an incident and strips it from
notifications. Everything is bounded: a snapshot stays well under Kafka's message limit.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any

from contract.alert import Alert
from contract.events import SamplesEvent, StepEvent

__all__ = ["SnapshotRecorder", "attach_snapshot", "build_snapshot"]

MAX_TEXT = 1500
MAX_SAMPLES = 12
MAX_WINDOW = 240


def _clip(x: Any) -> Any:
    if isinstance(x, str) and len(x) > MAX_TEXT:
        return x[:MAX_TEXT] + f"... [{len(x) - MAX_TEXT} more chars]"
    return x


class _RunTape:
    """Rank 0's steps (the window), other ranks' recent steps (the offending step's ranks)."""

    __slots__ = ("others", "samples", "steps")

    def __init__(self, steps: int, sample_batches: int, other_ranks: int):
        self.steps: deque[dict] = deque(maxlen=steps)
        self.others: deque[dict] = deque(maxlen=other_ranks)
        self.samples: deque[dict] = deque(maxlen=sample_batches)


class SnapshotRecorder:
    """Recent history per run, bounded in steps, sample batches and runs (least recent first out).

    >>> from contract.events import parse_event
    >>> r = SnapshotRecorder(steps=4)
    >>> for s in range(6):
    ...     r.observe(parse_event({"schema": 1, "kind": "step", "run_id": "a", "step": s,
    ...                            "metrics": {"kl/mean": 0.01 * s}}, 0.0))
    >>> [x["step"] for x in r.tape("a").steps]
    [2, 3, 4, 5]
    """

    def __init__(self, steps: int = 256, sample_batches: int = 16, max_runs: int = 1000,
                 other_ranks: int = 512):
        if min(steps, sample_batches, max_runs, other_ranks) < 1:
            raise ValueError("steps, sample_batches, max_runs and other_ranks must be at least 1")
        self.steps, self.sample_batches, self.max_runs = steps, sample_batches, max_runs
        self.other_ranks = other_ranks
        self.runs: OrderedDict[str, _RunTape] = OrderedDict()

    def tape(self, run_id: str) -> _RunTape:
        t = self.runs.get(run_id)
        if t is None:
            t = self.runs[run_id] = _RunTape(self.steps, self.sample_batches, self.other_ranks)
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(run_id)
        return t

    def observe(self, event) -> None:
        """Feed one parsed event (any kind; only steps and samples are kept)."""
        if isinstance(event, StepEvent):
            rec = {"step": event.step, "rank": event.rank, "ts": event.ts, "metrics": dict(event.metrics)}
            if event.batch_ids:
                rec["batch_ids"] = list(event.batch_ids[:64])
            tape = self.tape(event.run_id)
            (tape.steps if event.rank == 0 else tape.others).append(rec)
        elif isinstance(event, SamplesEvent):
            samples = [{k: _clip(v) for k, v in s.model_dump(exclude_none=True).items()}
                       for s in event.samples[:MAX_SAMPLES]]
            self.tape(event.run_id).samples.append(
                {"step": event.step, "rank": event.rank, "count": len(event.samples), "samples": samples})


def _samples_at(batches: list[dict], lo: int | None, hi: int) -> dict | None:
    hits = [b for b in batches if b["step"] <= hi and (lo is None or b["step"] >= lo)]
    return max(hits, key=lambda b: b["step"]) if hits else None


def _crosses(value: Any, threshold: float, above: bool) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and (
        value > threshold if above else value < threshold)


def _last_stable_step(alert: Alert, rows: list[dict], onset: int) -> int:
    """The last step before ``onset`` whose logged value of the alert's metric does not cross
    the alert's threshold, when the threshold is on the metric's own scale (some logged value
    from the onset to the alert crosses it); else ``onset - 1``."""
    metric, value, thr = alert.metric, alert.value, alert.threshold
    if not metric or not isinstance(value, (int, float)) or not isinstance(thr, (int, float)) \
            or not math.isfinite(value) or not math.isfinite(thr) or value == thr:
        return onset - 1
    above = value > thr
    if not any(_crosses(r["metrics"].get(metric), thr, above) for r in rows if onset <= r["step"] <= alert.step):
        return onset - 1                  # a signal's threshold (a z-score, a ratio), not the metric's
    for r in sorted((r for r in rows if r["step"] < onset), key=lambda r: r["step"], reverse=True):
        v = r["metrics"].get(metric)
        if isinstance(v, (int, float)) and math.isfinite(v) and not _crosses(v, thr, above):
            return r["step"]
    return onset - 1


def build_snapshot(alert: Alert, recorder: SnapshotRecorder, state=None, before: int = 40,
                   after: int = 40) -> dict:
    """The snapshot of ``alert`` from the recorder (and a :class:`~streams.run.RunState`)."""
    tape = recorder.runs.get(alert.run_id)
    onset = alert.onset_step if alert.onset_step is not None else alert.step
    rank = alert.rank or 0
    steps = (list(tape.steps) + list(tape.others)) if tape else []
    batches = list(tape.samples) if tape else []
    lo, hi = onset - before, max(alert.step, onset + after)
    window = [{"step": r["step"], "metrics": r["metrics"]} for r in steps
              if r["rank"] == rank and lo <= r["step"] <= hi]
    if len(window) > MAX_WINDOW:  # a long way from onset to alert: both ends, not the middle
        head = min(before + after, MAX_WINDOW // 2)
        window = window[:head] + window[-(MAX_WINDOW - head):]
    mine = [r for r in steps if r["rank"] == rank]
    stable_step = _last_stable_step(alert, mine, onset)
    stable_metrics = max((r for r in mine if r["step"] <= stable_step), key=lambda r: r["step"], default=None)
    offending = _samples_at(batches, onset, alert.step) or _samples_at(batches, None, alert.step)
    stable = _samples_at(batches, None, stable_step)
    offending_step = offending["step"] if offending else alert.step
    ranks: dict[str, dict] = {}
    for r in steps:
        if r["step"] == alert.step:
            entry: dict[str, Any] = {}
            if alert.metric and alert.metric in r["metrics"]:
                entry["value"] = r["metrics"][alert.metric]
            if "batch_ids" in r:
                entry["batch_ids"] = r["batch_ids"]
            ranks[str(r["rank"])] = entry
    snap: dict[str, Any] = {
        "run_id": alert.run_id, "rule": alert.rule, "severity": alert.severity, "rank": alert.rank,
        "step": alert.step, "onset_step": alert.onset_step, "metric": alert.metric,
        "value": alert.value, "threshold": alert.threshold,
        "window": {"from": lo, "to": hi, "rank": rank, "steps": window},
        "offending": {"step": offending_step, "samples": offending["samples"] if offending else [],
                      "samples_total": offending["count"] if offending else 0},
        "last_stable": {"step": stable["step"] if stable else (stable_metrics or {}).get("step"),
                        "samples": stable["samples"] if stable else [],
                        "metrics": stable_metrics["metrics"] if stable_metrics else {}},
        "ranks": ranks,
        "rollback_to": alert.rollback_to,
    }
    if state is not None:
        snap["checkpoints"] = [{"step": s, "path": p} for s, p in list(state.checkpoints)[-8:]]
        snap["tags"] = dict(state.tags)
        snap["world_size"] = state.world_size
        snap["latest_metrics"] = {k: v for k, v in state.latest_metrics.items()
                                  if not isinstance(v, float) or math.isfinite(v)}
    return snap


def attach_snapshot(alert: Alert, recorder: SnapshotRecorder, state=None) -> Alert:
    """``alert`` with its snapshot attached when it fires with the ``snapshot`` action."""
    if alert.state != "firing" or "snapshot" not in alert.actions:
        return alert
    return alert.model_copy(update={"snapshot": build_snapshot(alert, recorder, state)})
