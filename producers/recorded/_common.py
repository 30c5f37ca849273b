"""What the readers share: the record shape, numbers and steps from logged values, bookkeeping
keys, contract events passing through, and merging the entries of one step."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

#: ``(position, record)`` or ``(position, reason)``; position: line, row, entry or TFRecord number.
Item = tuple[int, "dict | str"]

#: Keys that count steps or time (or are run summaries), not training signals.
META_KEYS = frozenset({
    "step", "global_step", "_step", "train/global_step", "trainer/global_step", "epoch",
    "train/epoch", "total_flos", "_runtime", "_timestamp", "timestamp", "Step",
    "train_runtime", "train_samples_per_second", "train_steps_per_second",
})
STEP_KEYS = ("step", "_step", "global_step", "train/global_step", "trainer/global_step", "Step")


def num(v: Any) -> float | None:
    """A logged value as a float (numbers and numeric strings), else None."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def step_of(v: Any) -> int | None:
    """A logged value as a step (a non-negative whole number), else None."""
    x = num(v)
    if x is None or not math.isfinite(x) or x < 0 or not float(x).is_integer():
        return None
    return int(x)


def first_step(d: dict) -> int | None:
    """The step under the first of :data:`STEP_KEYS` that holds a usable one."""
    return next((s for s in (step_of(d.get(k)) for k in STEP_KEYS) if s is not None), None)


def metrics_of(d: dict, drop=META_KEYS) -> dict[str, float]:
    """The numbers of a logged dict, bookkeeping keys (and keys starting with ``_``) left out."""
    out = {}
    for k, v in d.items():
        if k in drop or str(k).startswith("_"):
            continue
        x = num(v) if not isinstance(v, str) else None   # a string in JSON is text, not a number
        if x is not None:
            out[str(k)] = x
    return out


def normalise_record(rec: dict) -> dict | None:
    """A logged dict as a replayable record, or None when it carries no step.

    Contract events and ``{"step", "metrics"}`` records are returned unchanged; a ``metrics``
    record without ``step`` gets it from ``_step``/``global_step``; a flat dict becomes
    ``{"step", "metrics"}`` with its numbers (bookkeeping keys such as ``_runtime`` left out).
    """
    if "kind" in rec or "schema" in rec:
        return rec
    if isinstance(rec.get("metrics"), dict):
        if "step" in rec:
            return rec
        step = first_step(rec)
        return None if step is None else {**rec, "step": step}
    if "step" in rec:
        return rec          # replay's flat-dict handling (and its error messages) apply
    step = first_step(rec)
    if step is None:
        return None
    return {"step": step, "metrics": metrics_of(rec)}


def merge_by_step(items: Iterable[tuple[int, int, dict]]) -> Iterator[Item]:
    """(position, step, metrics) -> one record per step, ascending; later values win."""
    merged: dict[int, tuple[int, dict]] = {}
    for pos, step, metrics in items:
        if step in merged:
            merged[step][1].update(metrics)
        else:
            merged[step] = (pos, dict(metrics))
    yield from records_by_step(merged)


def records_by_step(merged: dict[int, tuple[int, dict]]) -> Iterator[Item]:
    """``{step: (position, metrics)}`` as records, ascending by step; empty ones left out."""
    for step in sorted(merged):
        pos, metrics = merged[step]
        if metrics:
            yield pos, {"step": step, "metrics": metrics}
