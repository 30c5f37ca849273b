"""Evaluate one condition of the rule language against a view of a run. Pure.

A condition evaluates to a :class:`Verdict`: ``holds`` is True, False, or None when the data
to decide is not there at this step (the metric was not logged, the window is not full yet).
``None`` neither advances nor resets an alert's ``for`` count: a metric logged every fourth
step does not resolve an alert on the steps in between.

The view (:class:`RunView`) is the seam to the statistics layer: it answers "what is signal S
of metric M over window W now", and the other source questions, from state kept elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Protocol

from rules.schema import Condition, Threshold

__all__ = ["RunView", "Verdict", "evaluate", "leaves", "resolve_threshold"]


class RunView(Protocol):
    """What a condition may ask about a run at the step being evaluated."""

    def metric_signal(self, metric: str, signal: str, window: int, cycle_metric: str | None,
                      smooth: int | None) -> tuple[float, int, bool]:
        """(value of the signal now, finite values seen so far, logged at this step)."""

    def nonfinite(self, names: list[str] | None) -> list[str]: ...
    def rank_stat(self, metric: str, stat: str) -> tuple[float, int | None]: ...
    def hash_mismatch(self, name: str) -> list[int] | None: ...
    def dist_stat(self, name: str, stat: str, window: int, cap: float | None) -> float: ...
    def corr(self, x: str, y: str, window: int) -> float: ...
    def group_stat(self, metric: str, stat: str, window: int) -> tuple[float, str | None]: ...
    def sample_stat(self, field: str, stat: str) -> tuple[float, str | None]: ...
    def seconds_since_event(self) -> float: ...


@dataclass(frozen=True)
class Verdict:
    holds: bool | None
    value: float | None = None
    threshold: float | None = None
    metric: str | None = None
    detail: str | None = None
    rank: int | None = None      # the rank the verdict is about (cross-rank checks)


UNKNOWN = Verdict(None)


def resolve_threshold(spec: float | Threshold | None, targets: dict[str, float],
                      params: dict[str, float]) -> float | None:
    """A threshold as a number; None when it names a target or parameter nobody set."""
    if spec is None:
        return None
    if isinstance(spec, Threshold):
        base = targets.get(spec.target) if spec.target else params.get(spec.param)
        return None if base is None else base * spec.factor
    return float(spec)


def _compare(value: float, cond: Condition, targets: dict[str, float],
             params: dict[str, float], metric: str | None, detail: str | None = None) -> Verdict:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return Verdict(None, metric=metric)
    for spec, test in ((cond.above, lambda v, t: v > t), (cond.below, lambda v, t: v < t),
                       (cond.abs_above, lambda v, t: abs(v) > t)):
        if spec is not None:
            threshold = resolve_threshold(spec, targets, params)
            if threshold is None:
                return Verdict(None, value, None, metric)
            return Verdict(bool(test(value, threshold)), value, threshold, metric, detail)
    return Verdict(None, value, None, metric)


def evaluate(cond: Condition, view: RunView, targets: dict[str, float],
             params: dict[str, float]) -> Verdict:
    """Evaluate ``cond`` against ``view``; composites evaluate every child (no short cut)."""
    if cond.all is not None:
        parts = [evaluate(c, view, targets, params) for c in cond.all]
        if any(p.holds is False for p in parts):
            return Verdict(False, *_first_numbers(parts))
        if any(p.holds is None for p in parts):
            return Verdict(None, *_first_numbers(parts))
        return Verdict(True, *_first_numbers(parts))
    if cond.any is not None:
        parts = [evaluate(c, view, targets, params) for c in cond.any]
        hit = [p for p in parts if p.holds]
        if hit:
            return Verdict(True, *_first_numbers(hit))
        if any(p.holds is None for p in parts):
            return Verdict(None, *_first_numbers(parts))
        return Verdict(False, *_first_numbers(parts))
    if cond.not_ is not None:
        inner = evaluate(cond.not_, view, targets, params)
        return Verdict(None if inner.holds is None else not inner.holds,
                       inner.value, inner.threshold, inner.metric, inner.detail)

    if cond.metric is not None:
        value, seen, logged = view.metric_signal(cond.metric, cond.signal, cond.window,
                                                 cond.cycle_metric, cond.smooth)
        if not logged or seen < max(cond.min_steps, 1):
            return Verdict(None, metric=cond.metric)
        return _compare(value, cond, targets, params, cond.metric)
    if cond.nonfinite is not None:
        bad = view.nonfinite(None if cond.nonfinite == "any" else cond.nonfinite)
        return Verdict(bool(bad), math.nan if bad else 0.0, None,
                       bad[0] if bad else None, ", ".join(bad) if bad else None)
    if cond.ranks is not None:
        value, rank = view.rank_stat(cond.ranks, cond.stat)
        v = _compare(value, cond, targets, params, cond.ranks,
                     None if rank is None else f"rank {rank}")
        return Verdict(v.holds, v.value, v.threshold, v.metric, v.detail, rank)
    if cond.hashes is not None:
        bad = view.hash_mismatch(cond.hashes)
        if bad is None:
            return Verdict(None, metric=f"hashes.{cond.hashes}")
        return Verdict(bool(bad), float(len(bad)), 0.0, f"hashes.{cond.hashes}",
                       ("ranks " + ", ".join(map(str, bad)) + " differ from rank 0") if bad else None,
                       bad[0] if bad else None)
    if cond.dist is not None:
        cap = resolve_threshold(cond.cap, targets, params)
        return _compare(view.dist_stat(cond.dist, cond.stat, cond.window, cap), cond, targets,
                        params, f"dists.{cond.dist}")
    if cond.corr is not None:
        x, y = cond.corr
        return _compare(view.corr(x, y, cond.window), cond, targets, params, f"corr({x},{y})")
    if cond.groups is not None:
        value, detail = view.group_stat(cond.groups, cond.stat, cond.window)
        return _compare(value, cond, targets, params, f"groups.{cond.groups}", detail)
    if cond.samples is not None:
        value, detail = view.sample_stat(cond.samples, cond.stat)
        return _compare(value, cond, targets, params, f"samples.{cond.samples}", detail)
    if cond.stalled_seconds is not None:
        quiet = view.seconds_since_event()
        if math.isnan(quiet):
            return UNKNOWN
        return Verdict(quiet > cond.stalled_seconds, quiet, cond.stalled_seconds, "heartbeat")
    return UNKNOWN


def _first_numbers(parts: list[Verdict]) -> tuple:
    for p in parts:
        if p.value is not None:
            return p.value, p.threshold, p.metric, p.detail, p.rank
    return None, None, None, None, None


def leaves(cond: Condition) -> Iterator[Condition]:
    """Every non-composite condition inside ``cond``."""
    if cond.all is not None or cond.any is not None:
        for c in (cond.all or cond.any):
            yield from leaves(c)
    elif cond.not_ is not None:
        yield from leaves(cond.not_)
    else:
        yield cond
