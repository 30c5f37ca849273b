"""A keyed, bounded store of statistics created on first use."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from .base import Stateful, check_int, stat_from_state

__all__ = ["SeriesStore"]

Key = tuple  # a tuple of str / int, e.g. (rank, metric, spec)


def _check_key(key: Any) -> tuple:
    if not isinstance(key, tuple):
        raise TypeError(f"SeriesStore keys are tuples of str/int, got {type(key).__name__}")
    for part in key:
        if isinstance(part, bool) or not isinstance(part, (str, int)):
            raise TypeError(f"SeriesStore key parts must be str or int, got {part!r} in {key!r}")
    return key


class SeriesStore:
    """Statistics per key, created lazily by ``factory(key)`` on first access.

    * Bounded: at most ``max_keys`` keys; touching a key makes it most recent and creating one
      beyond the bound evicts the least recently used (counted in ``evicted``).
    * ``clear()`` drops everything (e.g. when a run ends); ``drop_prefix(prefix)`` drops the
      keys that start with ``prefix`` (e.g. ``(run_id,)``) and returns how many.
    * ``to_state()`` is plain JSON data (keys as lists, in LRU order, each statistic's own
      state); ``from_state(state, factory)`` rebuilds it (the factory is code, not state).

    Examples
    --------
    >>> from streams.stats import EMA
    >>> store = SeriesStore(lambda key: EMA(alpha=0.5), max_keys=2)
    >>> store[("run1", "loss")].update(1.0)
    >>> store[("run1", "kl")].update(2.0)
    >>> store[("run2", "loss")].update(3.0)   # evicts the least recently used key
    >>> list(store.keys()), store.evicted
    ([('run1', 'kl'), ('run2', 'loss')], 1)
    """

    def __init__(self, factory: Callable[[tuple], Stateful], max_keys: int = 100_000):
        if not callable(factory):
            raise ValueError("factory must be callable")
        self.factory = factory
        self.max_keys = check_int("max_keys", max_keys, 1)
        self.evicted = 0
        self._items: OrderedDict[tuple, Stateful] = OrderedDict()

    def get(self, key: tuple) -> Stateful:
        """The statistic for ``key``, created on first use (and marked most recently used)."""
        items = self._items
        stat = items.get(key)
        if stat is not None:
            items.move_to_end(key)
            return stat
        stat = self.factory(_check_key(key))
        items[key] = stat
        if len(items) > self.max_keys:
            items.popitem(last=False)
            self.evicted += 1
        return stat

    __getitem__ = get

    def peek(self, key: tuple) -> Stateful | None:
        """The statistic for ``key`` if present; neither creates nor touches it."""
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple]:
        return iter(list(self._items))

    def keys(self) -> list[tuple]:
        return list(self._items)

    def items(self) -> list[tuple[tuple, Stateful]]:
        return list(self._items.items())

    def pop(self, key: tuple) -> Stateful | None:
        return self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()

    def drop_prefix(self, prefix: tuple) -> int:
        """Remove every key starting with ``prefix``; return how many were removed."""
        k = len(prefix)
        doomed = [key for key in self._items if key[:k] == prefix]
        for key in doomed:
            del self._items[key]
        return len(doomed)

    def to_state(self) -> dict[str, Any]:
        return {
            "type": "SeriesStore",
            "max_keys": self.max_keys,
            "evicted": self.evicted,
            "items": [[list(key), stat.to_state()] for key, stat in self._items.items()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], factory: Callable[[tuple], Stateful]) -> SeriesStore:
        if not isinstance(state, dict) or state.get("type") != "SeriesStore":
            raise ValueError("not a SeriesStore state")
        store = cls(factory, max_keys=state["max_keys"])
        store.evicted = int(state["evicted"])
        for key, stat_state in state["items"]:
            store._items[_check_key(tuple(key))] = stat_from_state(stat_state)
        return store

    def __repr__(self) -> str:
        return f"SeriesStore({len(self)} keys, max_keys={self.max_keys}, evicted={self.evicted})"
