"""Waits in seconds or in training steps (``30``, ``"5m"``, ``"20 steps"``), as routes and
silences write them. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Interval", "NO_WAIT", "parse_interval"]


@dataclass(frozen=True)
class Interval:
    """A wait in seconds (``unit="s"``) or in training steps (``unit="steps"``)."""

    value: float
    unit: Literal["s", "steps"] = "s"

    @property
    def zero(self) -> bool:
        return self.value <= 0

    def __str__(self) -> str:
        return f"{self.value:g} steps" if self.unit == "steps" else f"{self.value:g}s"


_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60,
          "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}


def parse_interval(value: Any) -> Interval:
    """``30`` / ``"30s"`` / ``"5m"`` / ``"2h"`` (seconds) or ``"50 steps"``.

    >>> parse_interval("5m"), parse_interval("20 steps"), parse_interval(0)
    (Interval(value=300.0, unit='s'), Interval(value=20.0, unit='steps'), Interval(value=0.0, unit='s'))
    """
    if isinstance(value, Interval):
        return value
    if isinstance(value, bool):
        raise ValueError("an interval is a number of seconds or a string like '5m' or '20 steps'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"an interval cannot be negative, got {value}")
        return Interval(float(value))
    if not isinstance(value, str):
        raise ValueError(f"an interval is a number or a string, got {type(value).__name__}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value.lower())
    if not m:
        raise ValueError(f"cannot read interval {value!r} (examples: 30, '30s', '5m', '2h', '20 steps')")
    n, unit = float(m.group(1)), m.group(2)
    if unit in ("step", "steps"):
        return Interval(n, "steps")
    if unit == "":
        return Interval(n)
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r} in interval {value!r} (s, m, h, d or steps)")
    return Interval(n * _UNITS[unit])


NO_WAIT = Interval(0.0)
