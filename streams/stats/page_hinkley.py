"""Page-Hinkley change detector."""

from __future__ import annotations

from typing import Any

from ._detector import _ChangeDetector
from .base import check_float, check_int

__all__ = ["PageHinkley"]

_DIRECTIONS = ("both", "up", "down")


class PageHinkley(_ChangeDetector):
    """Page-Hinkley test for a change in the mean (as in River's ``drift.PageHinkley``).

    With ``mean_t`` the running mean since the last reset and ``dev_t = x_t - mean_t``:

    * up:   ``U_t = sum(dev - delta)``, alarm when ``U_t - min(U) > threshold``;
    * down: ``D_t = sum(dev + delta)``, alarm when ``max(D) - D_t > threshold``.

    No alarm before ``min_instances`` values since the last reset. On an alarm ``detected`` is
    True for that update (``get()`` = 1.0, else 0.0), ``change_count`` increments,
    ``last_direction`` is +1 (up) or -1 (down), and the detector resets and starts learning the
    new regime from the next value. ``delta`` and ``threshold`` are in the units of ``x``.

    Examples
    --------
    >>> ph = PageHinkley(delta=0.005, threshold=5.0, min_instances=10)
    >>> for i in range(200):
    ...     ph.update(0.0 if i < 100 else 1.0)
    ...     if ph.detected:
    ...         print("change at", i, "direction", ph.last_direction)
    change at 105 direction 1
    """

    __slots__ = (
        "delta",
        "threshold",
        "direction",
        "min_instances",
        "_n",
        "_mean",
        "_up",
        "_up_min",
        "_down",
        "_down_max",
    )
    _STATE = ("n", "mean", "up", "up_min", "down", "down_max")

    def __init__(
        self,
        delta: float = 0.005,
        threshold: float = 50.0,
        direction: str = "both",
        min_instances: int = 30,
    ):
        self.delta = check_float("delta", delta, low=0.0)
        self.threshold = check_float("threshold", threshold, low=0.0, low_open=True)
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}")
        self.direction = direction
        self.min_instances = check_int("min_instances", min_instances, 1)
        super().__init__()

    def _restart(self) -> None:
        self._n = 0
        self._mean = 0.0
        self._up = 0.0
        self._up_min = 0.0
        self._down = 0.0
        self._down_max = 0.0

    def _add(self, x: float) -> None:
        self.detected = False
        n = self._n + 1
        self._n = n
        mean = self._mean + (x - self._mean) / n
        self._mean = mean
        dev = x - mean
        hit = 0
        if self.direction != "down":
            u = self._up + dev - self.delta
            self._up = u
            if u < self._up_min:
                self._up_min = u
            if u - self._up_min > self.threshold:
                hit = 1
        if self.direction != "up":
            d = self._down + dev + self.delta
            self._down = d
            if d > self._down_max:
                self._down_max = d
            if self._down_max - d > self.threshold:
                hit = -1
        if hit and n >= self.min_instances:
            self._alarm(hit)

    def _params(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "threshold": self.threshold,
            "direction": self.direction,
            "min_instances": self.min_instances,
        }
