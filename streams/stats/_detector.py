"""Shared base of the change detectors (:class:`.Cusum`, :class:`.PageHinkley`) (private)."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import Statistic


class _ChangeDetector(Statistic):
    """A detector that raises ``detected`` for the update that triggers an alarm and restarts.

    ``get()`` is 1.0 on the update of an alarm, else 0.0; ``change_count`` counts the alarms and
    ``last_direction`` is +1 (up) or -1 (down) for the latest one. Subclasses implement
    ``_restart()`` (forget the current regime) and ``_add(x)``, which starts with
    ``self.detected = False`` and calls ``self._alarm(direction)`` on an alarm. The private
    state in ``_STATE`` (key ``"n"`` <-> attribute ``_n``, ...) is saved after the three public
    counters.
    """

    __slots__ = ("change_count", "detected", "last_direction")

    #: keys of the private state, each stored in the attribute ``"_" + key``
    _STATE: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.n_skipped = 0
        self.detected = False
        self.change_count = 0
        self.last_direction = 0
        self._restart()

    def _restart(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _alarm(self, direction: int) -> None:
        self.detected = True
        self.change_count += 1
        self.last_direction = direction
        self._restart()

    def get(self) -> float:
        return 1.0 if self.detected else 0.0

    def _dump(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "detected": self.detected,
            "change_count": self.change_count,
            "last_direction": self.last_direction,
        }
        for key in self._STATE:
            d[key] = getattr(self, "_" + key)
        return d

    def _load(self, state: dict[str, Any]) -> None:
        self.detected = bool(state["detected"])
        self.change_count = state["change_count"]
        self.last_direction = state["last_direction"]
        for key in self._STATE:
            setattr(self, "_" + key, state[key])
