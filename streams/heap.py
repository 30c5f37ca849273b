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
older generations stay empty. Frozen objects are never collected, though: a run dropped
meanwhile (evicted, expired, handed to another worker) would stay in memory, and so would any
other cycle that became garbage after surviving a pass. So the frozen heap is thawed and
collected (:meth:`Heap.tick`) once in a while: after ``thaw_every`` seconds, or sooner once
half as many runs were dropped as the worker holds (at least ``MIN_DROPPED``). That pause is as
long as a full collection was (1.6-2.2 s with 1,250 runs), but it comes rarely, when the
worker's loop asks for it, and is logged with what it freed. In a worker under a steady load of
1,250 runs, thawing every minute freed 80 objects the first time and none after: little but
dropped runs becomes cyclic garbage after surviving a pass.

Reference counting frees everything else as before: most of what an event allocates is freed
at once and never reaches the collector.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from streams.processor import tune_gc

__all__ = ["Heap", "MIN_DROPPED", "THAW_EVERY", "YOUNG"]

#: allocations (less deallocations) of tracked objects between two young passes; each pass
#: visits at most about this many objects (20,000: 10-40 ms on a small, busy host)
YOUNG = 20_000

#: seconds between thaws of the frozen heap (the dropped runs it holds are then freed)
THAW_EVERY = 3600.0
#: a thaw comes sooner once this many runs were dropped, and half as many as the worker holds
MIN_DROPPED = 200


@dataclass
class Thaw:
    """What one thaw did: objects the collection found unreachable, how many it left frozen,
    and how long it took (the worker stood still meanwhile)."""

    collected: int
    frozen: int
    seconds: float
    dropped: int


class Heap:
    """The freeze-what-survives policy of a worker process (see the module doc).

    ``install`` once, after start-up; then ``tick(now, held, dropped)`` now and then from the
    worker's loop, with the runs it holds decoded and the runs it dropped so far (a counter
    that only grows). Without ``install`` it does nothing: an application built in a test
    leaves its process's collector alone."""

    def __init__(self, *, thaw_every: float = THAW_EVERY, min_dropped: int = MIN_DROPPED):
        self.thaw_every, self.min_dropped = thaw_every, min_dropped
        self.installed = False
        self.passes = 0                # collections seen (their survivors then frozen)
        self.thaws = 0
        self._thawed_at: float | None = None
        self._dropped_at_thaw = 0

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

    def due(self, now: float, held: int, dropped: int) -> bool:
        """A thaw is due: ``thaw_every`` seconds since the last (the first tick starts the
        clock), or half as many runs dropped since as are held, at least ``min_dropped``."""
        if self._thawed_at is None:
            self._thawed_at, self._dropped_at_thaw = now, dropped
            return False
        gone = dropped - self._dropped_at_thaw
        return now - self._thawed_at >= self.thaw_every or gone >= max(self.min_dropped, held / 2)

    def tick(self, now: float, held: int, dropped: int) -> Thaw | None:
        """Thaw and collect the frozen heap when due (then freeze it again); what it did, or
        None."""
        if not self.installed or not self.due(now, held, dropped):
            return None
        t = time.perf_counter()
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        seconds = time.perf_counter() - t
        self.thaws += 1
        thaw = Thaw(collected, gc.get_freeze_count(), seconds, dropped - self._dropped_at_thaw)
        self._thawed_at, self._dropped_at_thaw = now, dropped
        return thaw
