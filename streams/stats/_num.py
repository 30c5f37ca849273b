"""Numerical helpers shared by the change detectors (private)."""

from __future__ import annotations


def scale_floor(center: float) -> float:
    """The documented floor on a z-score's scale: ``max(1e-12, 1e-9 * |center|)``."""
    return max(1e-12, 1e-9 * abs(center))
