"""The cross-rank buffer of a run: what its cross-rank rules compare, per step.

Each rank's step leaves the values of the metrics those rules read (``{ranks: METRIC}``) and
its hashes (``{hashes: NAME}``) here. When every rank of the step is in (or the step is given
up on, the oldest of more than ``max_pending`` waiting), :meth:`RankBuffer.open` makes it the
step at hand and the readers compare its ranks:

* ``rank_stat(metric, stat)``: ``(value, rank or None)`` with ``stat`` one of
  ``max_over_median`` (the largest finite value over the median of them all, and its rank),
  ``max``, ``median``, or ``held_over_median``; ``(nan, None)`` with fewer than two finite
  values;
* ``held_over_median``: each rank's ratio to the median of the ranks, at this step and the two
  steps of it compared before; the middle of its three ratios, and the largest of those over
  the ranks with its rank (nan until a rank has three). A rank over 3 x the median at two of
  its last three steps reads over 3; ranks whose noise takes turns over the line do not (of
  four ranks scattering 70 % log-normally from step to step, one is over 3 x the median at
  about one step in nine; the same rank at two of its last three, at about one in a hundred);
* ``hash_mismatch(name)``: the ranks whose hash differs from rank 0's, sorted; None when rank
  0 has none or fewer than two ranks have one.

``PyRankBuffer`` is the reference; ``native/src/ranks.rs`` is the same in Rust (the one in use
with the native core, see ``streams.signals.CORE``), number for number and rank for rank
(``tests/unit/test_ranks.py`` compares them).

The state (:meth:`to_state`) is ``{str(step): {str(rank): {"m": {metric: value},
"h": hashes}}}``, the ranks in the order they came; the ratios ``held_over_median`` keeps
(:meth:`held_state`) are ``{metric: {str(rank): [ratio, ratio]}}``, the older first. A ratio
is kept when the step at hand is left (the next ``open``, ``close``, ``clear``), whether or
not a rule read it.
"""
from __future__ import annotations

from typing import Callable

from streams import signals
from streams.signals import median_of

NAN = float("nan")
STATS = ("max_over_median", "max", "median", "held_over_median")
#: ratios a rank's held_over_median takes the middle of (this step's and the ones before)
HELD_POINTS = 3
_NOTHING: dict = {}


def _ratio_pos(x: float, base: float) -> float:
    if base == 0:
        return float("inf") if x > 0 else NAN
    return x / base


class PyRankBuffer:
    def __init__(self, max_pending: int):
        self.max_pending = max_pending
        self.tracked: dict[str, None] = {}        # the metrics kept (an ordered set)
        self.pending: dict[int, dict[int, dict]] = {}
        self.current: dict[int, dict] = _NOTHING  # the step at hand, between open and close
        self.memo: dict[str, tuple] = {}          # metric -> (top value, its rank, median)
        # held_over_median: metric -> rank -> its last ratios (HELD_POINTS - 1 at most)
        self.held: dict[str, dict[int, list[float]]] = {}

    def __len__(self) -> int:
        return len(self.pending)

    def track(self, metric: str) -> None:
        """Keep ``metric`` from each rank's steps from now on."""
        self.tracked[metric] = None

    def take(self, step: int, rank: int, metrics: dict, hashes: dict, world: int) -> list[int]:
        """Keep a rank's step; the steps now complete (all ``world`` ranks in) or given up on
        (the oldest, when more than ``max_pending`` wait), in order."""
        kept = {}
        for k in self.tracked:
            if k in metrics:
                kept[k] = metrics[k]
        pending = self.pending
        ranks = pending.get(step)
        if ranks is None:
            ranks = pending[step] = {}
        ranks[rank] = {"m": kept, "h": hashes}
        complete = len(ranks) >= world
        # steps that will never complete (a rank missed them): give up on the oldest
        if len(pending) > self.max_pending:
            oldest = min(pending)
            if oldest != step:
                return sorted([step, oldest]) if complete else [oldest]
        return [step] if complete else []

    def open(self, step: int) -> None:
        """Make ``step`` the step the readers compare (it leaves the buffer)."""
        self._leave()
        self.current = self.pending.pop(step, _NOTHING)
        self.memo = {}

    def close(self) -> None:
        self._leave()
        self.current = _NOTHING
        self.memo = {}

    def _values(self, metric: str) -> dict[int, float]:
        """The finite values of ``metric`` at the step at hand, by rank in the order they came."""
        out = {}
        for r, e in self.current.items():
            v = e["m"].get(metric)
            if v is not None and v - v == 0.0:
                out[r] = v
        return out

    def _stat(self, metric: str) -> tuple:
        """(top value, its rank, median) of the step at hand, () with fewer than two values;
        once per step at hand and metric."""
        got = self.memo.get(metric)
        if got is None:
            values, top, top_value = self._values(metric), None, NAN
            for r, v in values.items():
                if top is None or v > top_value:   # the first of the largest
                    top, top_value = r, v
            got = () if len(values) < 2 else (top_value, top, median_of(sorted(values.values())))
            self.memo[metric] = got
        return got

    def _ratios(self, metric: str) -> dict[int, float]:
        """Each rank's value over the median of the step at hand ({} with fewer than two)."""
        got = self._stat(metric)
        if not got:
            return {}
        med = got[2]
        return {r: _ratio_pos(v, med) for r, v in self._values(metric).items()}

    def _leave(self) -> None:
        """Keep the ratios of the step at hand that held_over_median reads later."""
        if not self.current:
            return
        for metric, ranks in self.held.items():
            for r, x in self._ratios(metric).items():
                if x == x:
                    kept = ranks.setdefault(r, [])
                    kept.append(x)
                    if len(kept) >= HELD_POINTS:
                        del kept[0]

    def clear(self) -> None:
        """Forget the steps waiting (a run started over); the ratios kept go too."""
        self.pending.clear()
        self.close()
        for ranks in self.held.values():
            ranks.clear()

    def rank_stat(self, metric: str, stat: str) -> Callable[[], tuple]:
        if stat not in STATS:
            raise ValueError(f"unknown rank statistic {stat!r}")
        if stat == "held_over_median":
            return self._held_reader(metric)

        def read():
            got = self._stat(metric)
            if not got:
                return NAN, None
            top_value, top, med = got
            if stat == "max":
                return top_value, top
            if stat == "median":
                return med, None
            return _ratio_pos(top_value, med), top
        return read

    def _held_reader(self, metric: str) -> Callable[[], tuple]:
        ranks = self.held.setdefault(metric, {})

        def read():
            top, top_value = None, NAN
            for r, x in self._ratios(metric).items():
                kept = ranks.get(r)
                if x != x or kept is None or len(kept) < HELD_POINTS - 1:
                    continue
                a, b = kept[-2], kept[-1]
                mid = max(min(a, b), min(max(a, b), x))     # the middle of the three
                if top is None or mid > top_value:          # the first of the largest
                    top, top_value = r, mid
            return top_value, top
        return read

    def held_state(self) -> dict:
        return {m: {str(r): list(k) for r, k in ranks.items()} for m, ranks in self.held.items()}

    def load_held(self, state: dict) -> None:
        """Take back :meth:`held_state` (for the metrics a reader asked for)."""
        for m, ranks in state.items():
            kept = self.held.get(m)
            if kept is not None:            # (in place: the readers hold it)
                kept.clear()
                kept.update((int(r), [float(x) for x in k][-(HELD_POINTS - 1):])
                            for r, k in ranks.items())

    def hash_mismatch(self, name: str) -> Callable[[], list[int] | None]:
        def read():
            steps = self.current
            first = steps.get(0)
            ref = None if first is None else first["h"].get(name)
            if ref is None:
                return None
            differ, seen = [], 0
            for r, e in steps.items():
                h = e["h"].get(name)
                if h is not None:
                    seen += 1
                    if h != ref:
                        differ.append(r)
            return None if seen < 2 else sorted(differ)
        return read

    def to_state(self) -> dict:
        return {str(s): {str(r): e for r, e in ranks.items()} for s, ranks in self.pending.items()}

    def load(self, state: dict) -> None:
        """Take back :meth:`to_state` (what was pending replaces what is)."""
        self.pending = {int(s): {int(r): e for r, e in ranks.items()} for s, ranks in state.items()}
        self.close()


#: the buffer in use: the native one with the native core
RankBuffer = PyRankBuffer
if signals.CORE == "native":
    from streams._native import RankBuffer  # type: ignore[assignment]  # noqa: F811
