"""Rolling window with adaptive (eager or deferred) evaluation, shared by the windowed
statistics (private)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

from .base import Statistic, as_float, check_int


class _LazyWindow(Statistic):
    """The last ``window`` finite values, summarised eagerly while read every step, lazily
    otherwise.

    ``_buf`` holds the summarised window (its first ``_synced`` values, at most ``window``)
    followed by the values that arrived since. Adaptive evaluation: while results are read after
    every update (the usual pattern of a rule evaluated each step), ``update`` advances the
    summaries at once (O(1) or O(log window)); when nobody reads, ``update`` only appends, and
    the next read brings the summaries up to date in ``_sync()``, replaying the new values in
    arrival order (and dropping the values that leave the window). Both paths go through the
    subclass's one incremental ``_step``, so they do the same arithmetic in the same order:
    answers do not depend on when they are read. Subclasses implement ``_step`` and
    ``_rebuild``, and call ``_ready()`` before reading their summaries.

    Memory is bounded: if more than ``window`` values arrive between two reads, the oldest are
    dropped so that at most ``2 * window`` values are kept, and the summaries are rebuilt from
    the window on the next read (same answers up to rounding, within each statistic's accuracy
    guarantee). The state (``to_state`` / pickle) includes the unsummarised values, so a restored
    copy continues exactly like the original.
    """

    __slots__ = ("window", "_buf", "_synced", "_limit", "_read")
    _per_class = ("update", "_push", "_step", "_ready", "get")

    def __init__(self, window: int, minimum: int = 1):
        self.window = check_int("window", window, minimum)
        self.n_skipped = 0
        self._buf: deque[float] = deque()
        self._synced = 0  # values at the front of _buf already summarised; -1: rebuild
        self._limit = 2 * self.window
        self._read = False  # a result was read since the last update (see update)

    def update(self, x: float) -> None:
        # Statistic.update with _add inlined (this is the hot path of every windowed statistic)
        if type(x) is not float:
            x = as_float(x)
        if x - x != 0.0:
            self.n_skipped += 1
            return
        buf = self._buf
        buf.append(x)
        n = len(buf)
        if self._read and n - 1 == self._synced:  # read after every update: advance now
            self._read = False
            self._synced = self._step(x, n - 1)
        elif n > self._limit:
            self._trim()

    #: ``update`` for a value already known to be a finite float (the check is then a no-op)
    _push = update

    # -- to be provided by subclasses ---------------------------------------------------------
    def _step(self, x: float, size: int) -> int:  # pragma: no cover - abstract
        """Add ``x`` to summaries of the first ``size`` values of ``_buf``; if ``size`` is the
        full window, drop the oldest (``_buf.popleft()``) from them. Return the new size. The
        one incremental step, used by both the eager and the deferred path."""
        raise NotImplementedError

    def _rebuild(self) -> None:  # pragma: no cover - abstract
        """Summaries from scratch, from ``_buf`` (which then holds exactly the window)."""
        raise NotImplementedError

    # -- shared mechanics ---------------------------------------------------------------------
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

    def _front(self, size: int) -> Sequence[float]:
        """The first ``size`` values of ``_buf`` (the window at a step of a replay)."""
        buf = self._buf
        return buf if len(buf) == size else list(islice(buf, size))

    def _sync(self) -> None:
        """Bring the summaries up to date: replay the new values, or rebuild from the window."""
        buf = self._buf
        size = self._synced
        if size < 0:  # values were dropped unseen: rebuild from the window
            while len(buf) > self.window:
                buf.popleft()
            self._rebuild()
        elif len(buf) > size:
            step = self._step
            for x in self._new_values():
                size = step(x, size)
        self._synced = len(buf)

    def _ready(self) -> None:
        """Before a read: note it (see ``update``) and bring the summaries up to date."""
        self._read = True
        if len(self._buf) != self._synced:
            self._sync()

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


class _CachedWindow(Statistic):
    """The last ``window`` finite values in a bounded deque, summarised on demand.

    For statistics computed from the whole window at once (with numpy, on read): subclasses
    implement ``_calc()``, returning a tuple whose first item is ``get()``; the tuple is cached
    until the next update.
    """

    __slots__ = ("_buf", "_cache", "window")

    def __init__(self, window: int, minimum: int):
        self.window = check_int("window", window, minimum)
        self.n_skipped = 0
        self._buf: deque[float] = deque(maxlen=self.window)
        self._cache: tuple[Any, ...] | None = None

    def _add(self, x: float) -> None:
        self._buf.append(x)
        self._cache = None

    def _calc(self) -> tuple[Any, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _compute(self) -> tuple[Any, ...]:
        c = self._cache
        if c is None:
            c = self._cache = self._calc()
        return c

    def get(self) -> float:
        return self._compute()[0]

    @property
    def n(self) -> int:
        return len(self._buf)

    def _params(self) -> dict[str, Any]:
        return {"window": self.window}

    def _dump(self) -> dict[str, Any]:
        return {"buf": list(self._buf)}

    def _load(self, state: dict[str, Any]) -> None:
        self._buf = deque(state["buf"], maxlen=self.window)
