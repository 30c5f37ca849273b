"""The worker's heap and the cycle collector.

A worker of many runs holds millions of objects the cycle collector tracks: a run's compiled
rules are a few thousand closures and cells (1,250 runs of the built-in pack: 3.3 million
objects). A collection visits every object of the generations it collects, with the GIL held,
so the worker does nothing meanwhile, the brake included. Measured in a worker under a load of
1,250 runs: passes of the middle generation of 0.4-0.7 s while the runs were being compiled
(it holds up to 20 young passes' survivors), and a full collection of 2.1 s.

Nearly all of those objects live as long as their run. So what survives any collection is
frozen (``gc.freeze``, which is cheap): later collections visit only what is newer than the
last pass, at most a young generation's worth of objects (``YOUNG`` allocations), and the
older generations stay empty. Frozen objects are never collected, though, so a cycle that
becomes garbage after surviving a pass stays in memory. A run's state and its compiled rules
form such a cycle: the worker breaks it when it drops a run (evicted, expired, handed to
another worker: ``RunState.release``), and reference counting frees the run at once. For any
other cycle, the frozen heap is thawed and collected (:meth:`Heap.tick`) every ``thaw_every``
seconds. That pause is as long as a full collection was (1.6-2.2 s with 1,250 runs), but it
comes rarely, when the worker's loop asks for it, and is logged with what it freed. In a worker
under a steady load of 1,250 runs, thawing every minute freed 80 objects the first time and
none after. So the interval adapts to what the thaws find: it starts at an hour, doubles (up
to a day) after a thaw that found less than one object in ``QUIET_SHARE`` garbage, and halves
(down to ten minutes) after one that found more than ``BUSY_SHARE``.

Reference counting frees everything else as before: most of what an event allocates is freed
at once and never reaches the collector.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from streams.processor import tune_gc

__all__ = ["BUSY_SHARE", "Heap", "QUIET_SHARE", "THAW_EVERY", "YOUNG"]

#: allocations (less deallocations) of tracked objects between two young passes; each pass
#: visits at most about this many objects (20,000: 10-40 ms on a small, busy host)
YOUNG = 20_000

#: seconds between thaws of the frozen heap (the cycles that became garbage are then freed):
#: the first interval, and the least and most it adapts to
THAW_EVERY = 3600.0
MIN_THAW_EVERY = 600.0
MAX_THAW_EVERY = 86_400.0
#: a thaw that finds less than this share of the heap garbage doubles the interval; one that
#: finds more than BUSY_SHARE halves it
QUIET_SHARE = 1e-4
BUSY_SHARE = 1e-2


@dataclass
class Thaw:
    """What one thaw did: objects the collection found unreachable, how many it left frozen,
    how long it took (the worker stood still meanwhile), and the seconds to the next."""

    collected: int
    frozen: int
    seconds: float
    next_in: float


class Heap:
    """The freeze-what-survives policy of a worker process (see the module doc).

    ``install`` once, after start-up; then ``tick(now)`` now and then from the worker's loop.
    Without ``install`` it does nothing: an application built in a test leaves its process's
    collector alone."""

    def __init__(self, *, thaw_every: float = THAW_EVERY, least: float = MIN_THAW_EVERY,
                 most: float = MAX_THAW_EVERY):
        self.thaw_every, self.least, self.most = thaw_every, least, most
        self.installed = False
        self.passes = 0                # collections seen (their survivors then frozen)
        self.thaws = 0
        self._thawed_at: float | None = None

    def install(self) -> None:
        if self.installed:
            return
        tune_gc()                      # start-up objects frozen
        gc.set_threshold(YOUNG, 20, 20)
        gc.callbacks.append(self._on_gc)
        self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            gc.callbacks.remove(self._on_gc)
            self.installed = False

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "stop":
            self.passes += 1
            gc.freeze()                # the survivors of a pass: not visited again

    def due(self, now: float) -> bool:
        """A thaw is due: ``thaw_every`` seconds since the last (the first call starts the
        clock)."""
        if self._thawed_at is None:
            self._thawed_at = now
            return False
        return now - self._thawed_at >= self.thaw_every

    def tick(self, now: float) -> Thaw | None:
        """Thaw and collect the frozen heap when due (then freeze it again); what it did, or
        None."""
        if not self.installed or not self.due(now):
            return None
        t = time.perf_counter()
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        seconds = time.perf_counter() - t
        frozen = gc.get_freeze_count()
        self.thaws += 1
        self._thawed_at = now
        self.thaw_every = self.next_interval(collected, frozen)
        return Thaw(collected, frozen, seconds, self.thaw_every)

    def next_interval(self, collected: int, frozen: int) -> float:
        """The interval after a thaw that found ``collected`` garbage objects among
        ``collected + frozen``: doubled when that share is under QUIET_SHARE, halved when over
        BUSY_SHARE, within [least, most]."""
        share = collected / max(1, collected + frozen)
        factor = 2.0 if share < QUIET_SHARE else 0.5 if share > BUSY_SHARE else 1.0
        return min(self.most, max(self.least, self.thaw_every * factor))
