"""Lazy rolling window shared by the windowed statistics (private)."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from .base import Statistic, check_int


class _LazyWindow(Statistic):
    """The last ``window`` finite values, with O(1) ``update`` and work deferred to reads.

    ``update`` appends to a bounded deque and remembers the value that fell out (``_gone``);
    subclasses bring their summaries up to date in ``_sync()`` when a result is asked for,
    replaying the pending values in arrival order, so the result is the same as if every update
    had been processed eagerly: answers do not depend on when they are read. Exception: if
    ``window`` or more updates arrive between two reads, the values that left are no longer all
    kept and the summaries are rebuilt from the window instead (same answers up to rounding,
    within each statistic's accuracy guarantee). Memory: at most ``window`` values in the deque
    and ``window`` pending removals. The state (``to_state``/pickle) includes the pending
    changes, so a restored copy continues exactly like the original.
    """

    __slots__ = ("window", "_buf", "_gone", "_pending")

    def __init__(self, window: int, minimum: int = 1):
        self.window = check_int("window", window, minimum)
        self.n_skipped = 0
        self._buf: deque[float] = deque(maxlen=self.window)
        self._gone: list[float] = []  # values that left the window since the last sync
        self._pending = 0  # values appended since the last sync (capped at window)

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
        p = self._pending
        if p < self.window:
            if len(buf) == self.window:
                self._gone.append(buf[0])
            self._pending = p + 1
        buf.append(x)

    def _push(self, x: float) -> None:
        """``update`` for an already checked finite float."""
        buf = self._buf
        p = self._pending
        if p < self.window:
            if len(buf) == self.window:
                self._gone.append(buf[0])
            self._pending = p + 1
        buf.append(x)

    def _window_at(self, gi: int, i: int) -> list[float]:
        """During a replay: the window just after the new value ``buf[i]`` (``i`` negative)
        was added, when ``gi`` values of ``_gone`` have left it."""
        buf = self._buf
        return self._gone[gi:] + [buf[j] for j in range(len(buf) + i + 1)]

    def _dump_window(self) -> dict[str, Any]:
        """The window and the pending (not yet summarised) changes, exactly."""
        return {"buf": list(self._buf), "gone": list(self._gone), "pending": self._pending}

    def _load_window(self, state: dict[str, Any]) -> None:
        self._buf.clear()
        self._buf.extend(state["buf"])
        self._gone = list(state.get("gone", []))
        self._pending = int(state.get("pending", 0))

    def _sync(self) -> None:  # pragma: no cover - overridden
        self._gone.clear()
        self._pending = 0

    @property
    def n(self) -> int:
        """Number of values in the window."""
        return len(self._buf)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}
