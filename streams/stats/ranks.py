"""Comparisons across the ranks (workers) of one training step (pure functions).

>>> rank_summary({0: 1.0, 1: 1.2, 2: 0.9, 3: 5.0})["argmax_rank"]
3
>>> rank_outliers({0: 1.0, 1: 1.2, 2: 0.9, 3: 5.0}, factor=3.0)
[3]
>>> hash_mismatch({0: "ab", 1: "ab", 2: "cd"})
[2]
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from ._num import sorted_median

__all__ = ["hash_mismatch", "rank_outliers", "rank_summary"]


def _finite_items(values: dict[int, float]) -> list[tuple[int, float]]:
    out = []
    for r, v in values.items():
        try:
            f = float(v)
        except (TypeError, ValueError, OverflowError):
            continue
        if math.isfinite(f):
            out.append((r, f))
    return out


def rank_summary(values: dict[int, float]) -> dict[str, Any]:
    """``{"median", "max", "max_over_median", "argmax_rank", "n", "n_nonfinite"}`` over the
    finite per-rank values.

    ``max_over_median`` is ``max / median`` for a positive median; ``inf`` if the median is 0
    and the max positive; NaN if both are 0, the median is negative, or there are no values.
    ``argmax_rank`` is the rank holding the max (lowest rank on ties), ``None`` when empty.
    """
    items = _finite_items(values)
    n_bad = len(values) - len(items)
    if not items:
        return {
            "median": math.nan,
            "max": math.nan,
            "max_over_median": math.nan,
            "argmax_rank": None,
            "n": 0,
            "n_nonfinite": n_bad,
        }
    med = sorted_median(sorted(v for _, v in items))
    arg, mx = min(items, key=lambda rv: (-rv[1], rv[0]))
    if med > 0:
        ratio = mx / med
    elif med == 0 and mx > 0:
        ratio = math.inf
    else:
        ratio = math.nan
    return {
        "median": med,
        "max": mx,
        "max_over_median": ratio,
        "argmax_rank": arg,
        "n": len(items),
        "n_nonfinite": n_bad,
    }


def rank_outliers(values: dict[int, float], factor: float = 3.0) -> list[int]:
    """Ranks whose value exceeds ``factor x median`` of the finite values (sorted list).

    * Median 0: every rank with a positive value is an outlier (e.g. one rank reporting NaN
      counts while the others report none).
    * Negative median: the ratio has no meaning; nothing is flagged on value grounds.
    * Non-finite values (NaN, +Inf, -Inf) are always reported: a rank that diverged is the
      outlier one looks for.
    """
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor!r}")
    items = _finite_items(values)
    finite_ranks = {r for r, _ in items}
    out = {r for r in values if r not in finite_ranks}
    if items:
        med = sorted_median(sorted(v for _, v in items))
        if med >= 0:
            thr = factor * med
            out.update(r for r, v in items if v > thr)
    return sorted(out)


def hash_mismatch(hashes: dict[int, str], reference_rank: int = 0) -> list[int]:
    """Ranks whose hash differs from ``reference_rank``'s (sorted list).

    If the reference rank did not report, the most common hash is the reference (ties go to
    the hash of the lowest rank holding one of the tied hashes)."""
    if not hashes:
        return []
    if reference_rank in hashes:
        ref = hashes[reference_rank]
    else:
        counts = Counter(hashes.values())
        top = max(counts.values())
        ref = next(hashes[r] for r in sorted(hashes) if counts[hashes[r]] == top)
    return sorted(r for r, h in hashes.items() if h != ref)
