"""Streaming change detectors for rlwatch (pure: no I/O, no clock, no broker imports).

The signals the rules read live in :mod:`streams.signals` (step windows shared between rules);
this package keeps the two level-shift detectors, CUSUM and Page-Hinkley, over a tiny base
(:mod:`streams.stats.base`): ``update(x)`` ignores non-finite values, ``get()`` returns NaN
while undefined, and ``to_state()`` / ``from_state()`` round-trip through strict JSON.
"""

from .base import Stateful, Statistic, registered_types, stat_from_state
from .cusum import Cusum
from .page_hinkley import PageHinkley

__all__ = [
    "Cusum",
    "PageHinkley",
    "Stateful",
    "Statistic",
    "registered_types",
    "stat_from_state",
]
