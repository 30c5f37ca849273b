"""Rolling window with adaptive (eager or deferred) evaluation, shared by the windowed
statistics (private)."""

from __future__ import annotations

import math
from collections import deque
from itertools import islice
from typing import Any

from .base import Statistic, check_int


class _LazyWindow(Statistic):
    """The last ``window`` finite values, summarised eagerly while read every step, lazily
    otherwise.

    ``_buf`` holds the summarised window (its first ``_synced`` values, at most ``window``)
    followed by the values that arrived since. Adaptive evaluation: while results are read after
    every update (the usual pattern of a rule evaluated each step), ``update`` advances the
    summaries at once (O(1) or O(log window)); when nobody reads, ``update`` only appends, and
    the next read brings the summaries up to date in ``_sync()``, replaying the new values in
    arrival order (and dropping the values that leave the window). Both paths do the same
    arithmetic in the same order: answers do not depend on when they are read.

    Memory is bounded: if more than ``window`` values arrive between two reads, the oldest are
    dropped so that at most ``2 * window`` values are kept, and the summaries are rebuilt from
    the window on the next read (same answers up to rounding, within each statistic's accuracy
    guarantee). The state (``to_state`` / pickle) includes the unsummarised values, so a restored
    copy continues exactly like the original.
    """

    __slots__ = ("window", "_buf", "_synced", "_limit", "_read")

    def __init__(self, window: int, minimum: int = 1):
        self.window = check_int("window", window, minimum)
        self.n_skipped = 0
        self._buf: deque[float] = deque()
        self._synced = 0  # values at the front of _buf already summarised; -1: rebuild
        self._limit = 2 * self.window
        self._read = False  # a result was read since the last update (see update)

    def update(self, x: float) -> None:
        if type(x) is not float:
            try:
                x = float(x)
            except (TypeError, ValueError, OverflowError):
                x = math.nan
        if x - x != 0.0:
            self.n_skipped += 1
            return
        buf = self._buf
        buf.append(x)
        if len(buf) > self._limit:
            self._trim()

    def _push(self, x: float) -> None:
        """``update`` for an already checked finite float."""
        buf = self._buf
        buf.append(x)
        if len(buf) > self._limit:
            self._trim()

    def _trim(self) -> None:
        """Too many values since the last read: keep the window, rebuild on the next read."""
        buf = self._buf
        while len(buf) > self.window:
            buf.popleft()
        self._synced = -1

    def _new_values(self) -> list[float]:
        """The values not summarised yet (``_synced >= 0``)."""
        buf = self._buf
        p = len(buf) - self._synced
        if p <= 64:  # deque indexing near the right end is O(1); islice would walk the window
            return [buf[i] for i in range(-p, 0)]
        return list(buf)[self._synced :]

    def _front(self, size: int) -> list[float]:
        """The first ``size`` values of ``_buf`` (the window at a step of a replay)."""
        return list(islice(self._buf, size))

    def _sync(self) -> None:  # pragma: no cover - overridden
        self._synced = len(self._buf)

    @property
    def n(self) -> int:
        """Number of values in the window."""
        n = len(self._buf)
        return n if n < self.window else self.window

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump_window(self) -> dict[str, Any]:
        """The window and the values not summarised yet, exactly."""
        return {"buf": list(self._buf), "synced": self._synced}

    def _load_window(self, state: dict[str, Any]) -> None:
        self._buf = deque(state["buf"])
        self._synced = int(state.get("synced", len(self._buf)))
