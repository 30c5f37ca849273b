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

The recorder sees every event, so it does as little as it can per event. In the worker, a step
is kept as the raw bytes it came in (``observe(event, raw)``: no copy, and about 60 % of the
memory of the decoded metrics; a run's tape of the bench fleet is 1.15 MB instead of 1.6 MB,
which made 2 GB for a worker watching 1,250 runs); its metrics and batch ids are read from
them again when a snapshot needs them. Without the bytes,
a step is kept as a tuple that refers to the event's own ``metrics`` dict and ``batch_ids``
list (no copies; the core never changes them in place: a preset's renaming replaces
``event.metrics`` with a new dict, and the recorder keeps the logged one). A sample batch keeps
the event's first ``MAX_SAMPLES`` samples as they are; they become dicts (``sample_fields``, texts
clipped) only when a snapshot is built.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any, Callable

from contract.alert import Alert
from contract.events import EventError, kept_step_values, sample_fields

__all__ = ["SnapshotRecorder", "attach_snapshot", "build_snapshot"]

MAX_TEXT = 1500
MAX_SAMPLES = 12
MAX_WINDOW = 240
MAX_BATCH_IDS = 64
READ_ROWS = 4096      # kept steps a recorder keeps read (a few MB at most)


def _clip(x: Any) -> Any:
    if isinstance(x, str) and len(x) > MAX_TEXT:
        return x[:MAX_TEXT] + f"... [{len(x) - MAX_TEXT} more chars]"
    return x


class _RunTape:
    """Rank 0's steps (the window), other ranks' recent steps (the offending step's ranks) and
    recent sample batches.

    A step is ``(step, rank, metrics, batch_ids or None)``; a sample batch is ``[step, rank,
    count, samples, shown]``, ``samples`` the event's first samples (``Sample`` or ``WireSample`` objects),
    ``shown`` those as a snapshot shows them once one did (the alerts of a run come in bursts,
    and their snapshots show the same batches), else None."""

    __slots__ = ("others", "samples", "steps")

    def __init__(self, steps: int, sample_batches: int, other_ranks: int):
        self.steps: deque[tuple] = deque(maxlen=steps)
        self.others: deque[tuple] = deque(maxlen=other_ranks)
        self.samples: deque[tuple] = deque(maxlen=sample_batches)


class SnapshotRecorder:
    """Recent history per run, bounded in steps, sample batches and runs (least recent first out).

    >>> from contract.events import parse_event
    >>> r = SnapshotRecorder(steps=4)
    >>> for s in range(6):
    ...     r.observe(parse_event({"schema": 1, "kind": "step", "run_id": "a", "step": s,
    ...                            "metrics": {"kl/mean": 0.01 * s}}, 0.0))
    >>> [step for step, rank, metrics, batch_ids in r.tape("a").steps]
    [2, 3, 4, 5]
    """

    def __init__(self, steps: int = 256, sample_batches: int = 16, max_runs: int = 1000,
                 other_ranks: int = 512, read_rows: int = READ_ROWS):
        if min(steps, sample_batches, max_runs, other_ranks) < 1:
            raise ValueError("steps, sample_batches, max_runs and other_ranks must be at least 1")
        if read_rows < 0:
            raise ValueError("read_rows must be 0 or more")
        self.steps, self.sample_batches, self.max_runs = steps, sample_batches, max_runs
        self.other_ranks = other_ranks
        self.runs: OrderedDict[str, _RunTape] = OrderedDict()
        # kept steps read again from their bytes, by kept row (the oldest read first out): the
        # alerts of a run come in bursts (each rank's, a tier and the next), and their
        # snapshots show mostly the same steps
        self.read_rows = read_rows
        self._read: dict[tuple, tuple] = {}

    def read_row(self, row: tuple) -> tuple:
        """A kept step as ``(step, rank, metrics, batch ids or None)`` (see :func:`_read_row`),
        read from its bytes once while it stays among the last ``read_rows`` steps read."""
        if row[3] is not _UNREAD:
            return row
        got = self._read.get(row)
        if got is None:
            got = _read_row(row)
            if self.read_rows:
                read = self._read
                read[row] = got
                if len(read) > self.read_rows:
                    del read[next(iter(read))]
        return got

    def tape(self, run_id: str) -> _RunTape:
        t = self.runs.get(run_id)
        if t is None:
            t = self.runs[run_id] = _RunTape(self.steps, self.sample_batches, self.other_ranks)
            while len(self.runs) > self.max_runs:
                self.runs.popitem(last=False)
        else:
            self.runs.move_to_end(run_id)
        return t

    def rank_keeper(self, run_id: str) -> "RankKeeper":
        """``keep(step, rank, raw)``: keeps a step of a rank other than 0 of ``run_id`` as
        ``observe(event, raw)`` keeps it, without looking the run up again: for a run's steps
        taken one after another (the worker's events lane). Valid while nothing else is
        observed: another run's events may push this one's history out."""
        return RankKeeper(self.tape(run_id).others.append)

    def observe(self, event, raw: bytes | None = None) -> None:
        """Feed one parsed event (any kind; only steps and samples are kept). Call it before the
        core processes the event: the window shows the metrics as logged.

        ``raw``: the bytes the event was parsed from, when the caller has them (the worker).
        A step is then kept as those bytes, and its metrics and batch ids are read from them
        again only when a snapshot needs them: a worker keeps 768 steps of every run it
        watches, about 1.3 MB a run of the bench fleet decoded and 0.8 MB as bytes."""
        kind = event.kind
        if kind == "step":     # a StepEvent or a WireStep (contract.events.read_event)
            rank = event.rank
            tape = self.tape(event.run_id)
            if type(raw) is bytes:
                (tape.others if rank else tape.steps).append((event.step, rank, raw, _UNREAD))
                return
            ids = event.batch_ids
            if ids:
                ids = ids if len(ids) <= MAX_BATCH_IDS else ids[:MAX_BATCH_IDS]
            else:
                ids = None
            (tape.others if rank else tape.steps).append((event.step, rank, event.metrics, ids))
        elif kind == "samples":
            samples = event.samples
            self.tape(event.run_id).samples.append(
                [event.step, event.rank, len(samples), samples[:MAX_SAMPLES], None])


_UNREAD = object()    # a step kept as its raw event: metrics and batch ids not read yet


class RankKeeper:
    """``keep(step, rank, raw)`` of :meth:`SnapshotRecorder.rank_keeper`: appends the row
    ``(step, rank, raw, unread)`` to the run's tape with ``append``. The native routine
    (``Routine.take_run``) appends its rows itself, with ``append`` and ``unread``, without a
    Python call per step."""

    __slots__ = ("append", "unread")

    def __init__(self, append: Callable[[tuple], None]):
        self.append, self.unread = append, _UNREAD

    def __call__(self, step: int, rank: int, raw: bytes) -> None:
        self.append((step, rank, raw, _UNREAD))


def _read_row(row: tuple) -> tuple:
    """A kept step as ``(step, rank, metrics, batch ids or None)``, its metrics and batch ids
    read again from its raw event when it was kept as one (it parsed when it came; an event
    that does not parse again shows no metrics rather than fail the snapshot)."""
    if row[3] is not _UNREAD:
        return row
    try:
        metrics, ids = kept_step_values(row[2])
    except EventError:
        return (row[0], row[1], {}, None)
    if ids:
        ids = ids if len(ids) <= MAX_BATCH_IDS else ids[:MAX_BATCH_IDS]
    return (row[0], row[1], metrics, ids or None)


def _dump_samples(samples: list) -> list[dict]:
    """Samples as a snapshot shows them: their fields that are set, long texts clipped."""
    return [{k: _clip(v) for k, v in sample_fields(s).items()} for s in samples]


def _shown(batch: list | None) -> list[dict]:
    """A kept sample batch's samples as a snapshot shows them, made once per batch."""
    if batch is None:
        return []
    if batch[4] is None:
        batch[4] = _dump_samples(batch[3])
    return batch[4]


def _samples_at(batches: list[list], lo: int | None, hi: int) -> list | None:
    hits = [b for b in batches if b[0] <= hi and (lo is None or b[0] >= lo)]
    return max(hits, key=lambda b: b[0]) if hits else None


def _crosses(value: Any, threshold: float, above: bool) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and (
        value > threshold if above else value < threshold)


def _last_stable_step(alert: Alert, rows: list[tuple], onset: int, read) -> int:
    """The last step before ``onset`` whose logged value of the alert's metric does not cross
    the alert's threshold, when the threshold is on the metric's own scale (some logged value
    from the onset to the alert crosses it); else ``onset - 1``. ``rows``: the recorder's steps
    of one rank; ``read`` reads a kept row (:meth:`SnapshotRecorder.read_row`)."""
    metric, value, thr = alert.metric, alert.value, alert.threshold
    if not metric or not isinstance(value, (int, float)) or not isinstance(thr, (int, float)) \
            or not math.isfinite(value) or not math.isfinite(thr) or value == thr:
        return onset - 1
    above = value > thr
    if not any(_crosses(read(r)[2].get(metric), thr, above) for r in rows if onset <= r[0] <= alert.step):
        return onset - 1                  # a signal's threshold (a z-score, a ratio), not the metric's
    for r in sorted((r for r in rows if r[0] < onset), key=lambda r: r[0], reverse=True):
        v = read(r)[2].get(metric)
        if isinstance(v, (int, float)) and math.isfinite(v) and not _crosses(v, thr, above):
            return r[0]
    return onset - 1


def build_snapshot(alert: Alert, recorder: SnapshotRecorder, state=None, before: int = 40,
                   after: int = 40) -> dict:
    """The snapshot of ``alert`` from the recorder (and a :class:`~streams.run.RunState`)."""
    tape = recorder.runs.get(alert.run_id)
    onset = alert.onset_step if alert.onset_step is not None else alert.step
    rank = alert.rank or 0
    batches = list(tape.samples) if tape else []              # [step, rank, count, samples, shown]
    lo, hi = onset - before, max(alert.step, onset + after)
    read = recorder.read_row
    # the rank's kept rows (step, rank, metrics, ids), read only where shown: rank 0's are the
    # tape's steps, the other ranks' among its others
    if not tape:
        mine = []
    elif rank:
        mine = [r for r in tape.others if r[1] == rank]
    else:
        mine = list(tape.steps)
    window = [{"step": r[0], "metrics": read(r)[2]} for r in mine if lo <= r[0] <= hi]
    if len(window) > MAX_WINDOW:  # a long way from onset to alert: both ends, not the middle
        head = min(before + after, MAX_WINDOW // 2)
        window = window[:head] + window[-(MAX_WINDOW - head):]
    stable_step = _last_stable_step(alert, mine, onset, read)
    stable_row = max((r for r in mine if r[0] <= stable_step), key=lambda r: r[0], default=None)
    if stable_row is not None:
        stable_row = read(stable_row)
    offending = _samples_at(batches, onset, alert.step) or _samples_at(batches, None, alert.step)
    stable = _samples_at(batches, None, stable_step)
    offending_step = offending[0] if offending else alert.step
    ranks: dict[str, dict] = {}
    at = alert.step
    rows = ([r for r in tape.steps if r[0] == at] + [r for r in tape.others if r[0] == at]) if tape else []
    for r in rows:
        r = read(r)
        entry: dict[str, Any] = {}
        if alert.metric and alert.metric in r[2]:
            entry["value"] = r[2][alert.metric]
        if r[3] is not None:
            entry["batch_ids"] = list(r[3])
        ranks[str(r[1])] = entry
    snap: dict[str, Any] = {
        "run_id": alert.run_id, "rule": alert.rule, "severity": alert.severity, "rank": alert.rank,
        "step": alert.step, "onset_step": alert.onset_step, "metric": alert.metric,
        "value": alert.value, "threshold": alert.threshold,
        "window": {"from": lo, "to": hi, "rank": rank, "steps": window},
        "offending": {"step": offending_step,
                      "samples": _shown(offending),
                      "samples_total": offending[2] if offending else 0},
        "last_stable": {"step": stable[0] if stable else (stable_row[0] if stable_row else None),
                        "samples": _shown(stable),
                        "metrics": stable_row[2] if stable_row else {}},
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
