"""Pure streaming statistics for rlwatch (no I/O, no clock, no broker imports).

One small class per statistic over a tiny base (:mod:`streams.stats.base`): ``update(x)``
ignores non-finite values, ``get()`` returns NaN while undefined, and ``to_state()`` /
``from_state()`` round-trip through strict JSON. Stateless helpers for one step's per-sample
arrays live in :mod:`.distribution`, for comparisons across ranks in :mod:`.ranks`.
"""

from ._num import theil_sen
from .autocorrelation import Autocorrelation, acf
from .base import Stateful, Statistic, registered_types, stat_from_state
from .correlation import RollingCorrelation
from .cusum import Cusum
from .ddsketch import DDSketch
from .distribution import (
    bimodality_coefficient,
    frac_at_cap,
    histogram,
    kurtosis_excess,
    quantiles,
    rankdata,
    skewness,
    spearman,
    tail_mass,
)
from .ema import EMA
from .flatline import Flatline
from .groups import GroupTrends
from .mann_kendall import MannKendall
from .page_hinkley import PageHinkley
from .ranks import hash_mismatch, rank_outliers, rank_summary
from .relative import RelativeDrop, RelativeRise
from .rolling_mad import RollingMAD
from .rolling_mean import RollingMean
from .rolling_minmax import RollingMax, RollingMin
from .rolling_quantile import RollingMedian, RollingQuantile
from .rolling_var import RollingStd, RollingVar
from .series import SeriesStore
from .sign_flip import SignFlipRate
from .warmup import WarmupBaseline
from .zscore import RobustZ, ZScore

__all__ = [
    "EMA",
    "Autocorrelation",
    "Cusum",
    "DDSketch",
    "Flatline",
    "GroupTrends",
    "MannKendall",
    "PageHinkley",
    "RelativeDrop",
    "RelativeRise",
    "RobustZ",
    "RollingCorrelation",
    "RollingMAD",
    "RollingMax",
    "RollingMean",
    "RollingMedian",
    "RollingMin",
    "RollingQuantile",
    "RollingStd",
    "RollingVar",
    "SeriesStore",
    "SignFlipRate",
    "Stateful",
    "Statistic",
    "WarmupBaseline",
    "ZScore",
    "acf",
    "bimodality_coefficient",
    "frac_at_cap",
    "hash_mismatch",
    "histogram",
    "kurtosis_excess",
    "quantiles",
    "rank_outliers",
    "rank_summary",
    "rankdata",
    "registered_types",
    "skewness",
    "spearman",
    "stat_from_state",
    "tail_mass",
    "theil_sen",
]
