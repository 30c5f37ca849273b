"""Seeds, per-step noise and the small curve helpers the simulator is written in."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

__all__ = ["AR", "Noise", "ramp", "seed_int", "sig", "unit"]


def ramp(p: float, tau: float) -> float:
    """0 before ``p = 0``, then ``1 - exp(-p / tau)``: settling with time constant ``tau``."""
    return 1.0 - math.exp(-p / tau) if p > 0 else 0.0


def sig(x: float) -> float:
    """The logistic function, without overflow."""
    if x < -60:
        return 0.0
    if x > 60:
        return 1.0
    return 1.0 / (1.0 + math.exp(-x))


def seed_int(*parts: Any) -> int:
    """A 64-bit integer from any parts (stable across runs and machines)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little")


def unit(*parts: Any) -> float:
    """A number in [0, 1) from any parts: the seeded draw of onsets, magnitudes and features."""
    return seed_int(*parts) / 2.0 ** 64


class Noise:
    """Standard normals of one step, drawn in one block (cheap) and handed out in order."""

    __slots__ = ("_z", "_i", "rng")

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._z = rng.standard_normal(96).tolist()
        self._i = 0

    def g(self) -> float:
        if self._i >= len(self._z):
            self._z = self.rng.standard_normal(96).tolist()
            self._i = 0
        v = self._z[self._i]
        self._i += 1
        return v

    def u(self) -> float:
        """Uniform(0, 1)."""
        return 0.5 * (1.0 + math.erf(self.g() / math.sqrt(2.0)))


#: Slow AR(1) wander of the latent quantities: name -> (phi, stationary std).
AR: dict[str, tuple[float, float]] = {
    "reward": (0.92, 0.018),
    "kl": (0.95, 0.05),
    "entropy": (0.97, 0.010),
    "length": (0.95, 0.012),
    "value": (0.9, 0.012),
    "vloss": (0.9, 0.10),
    "grad": (0.85, 0.10),
    "judge": (0.8, 0.006),
    "clip": (0.8, 0.06),
    "margin": (0.9, 0.05),
    "chosen": (0.9, 0.04),
    "mem": (0.95, 0.05),
    "acc": (0.9, 0.008),
}
