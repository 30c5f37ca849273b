"""Shared strategies and exact references for the streams.stats tests.

References use ``fractions.Fraction`` (exact rational arithmetic on the floats) wherever the
float result is expected to be close to the exact one, so that adversarial inputs (1e300,
1e-300, cancellation) are judged against the truth and not against another float algorithm.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def hsettings(max_examples: int):
    """Modest hypothesis settings (no example database on disk). For a longer hunt set
    ``STATS_TEST_SCALE=20`` in the environment (multiplies every ``max_examples``)."""
    return settings(
        max_examples=max_examples * int(os.environ.get("STATS_TEST_SCALE", "1")),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


NAN = math.nan
INF = math.inf

SPECIAL = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    1e300,
    -1e300,
    1e-300,
    -1e-300,
    5e-324,
    1e-320,
    1.7e308,
    -1.7e308,
    1e20,
    -1e20,
    1e8 + 0.5,
]

ordinary = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
finite = st.one_of(
    ordinary,
    ordinary,
    st.sampled_from(SPECIAL),
    st.floats(allow_nan=False, allow_infinity=False),
)
nonfinite = st.sampled_from([NAN, INF, -INF])
value = st.one_of(finite, finite, finite, nonfinite)


@st.composite
def series(draw, max_size: int = 40, values=value):
    """Random series mixing: arbitrary values, constant runs, offset + small noise, ramps."""
    kind = draw(st.integers(0, 4))
    if kind <= 1:
        return draw(st.lists(values, max_size=max_size))
    n = draw(st.integers(0, max_size))
    if kind == 2:  # constant, with occasional non-finite
        v = draw(values.filter(math.isfinite))
        return [draw(st.sampled_from([v, v, v, v, NAN, INF])) for _ in range(n)]
    if kind == 3:  # large offset, small noise (cancellation-prone)
        base = draw(st.sampled_from([1e8, -1e8, 1e12, 1e-8, 1e200, 1e-200]))
        return [base * (1.0 + draw(st.integers(-5, 5)) * 1e-9) for _ in range(n)]
    # ramp / spike
    step = draw(st.sampled_from([1.0, -0.5, 1e-3, 1e100]))
    spike = draw(st.sampled_from([1e20, 1e300, -1e300, 0.0]))
    out = [i * step for i in range(n)]
    if n:
        out[draw(st.integers(0, n - 1))] = spike
    return out


def finite_only(xs):
    return [x for x in xs if isinstance(x, float) and math.isfinite(x)]


def F(x: float) -> Fraction:
    return Fraction(x)


def to_float(q: Fraction) -> float:
    """Correctly rounded float of a Fraction (+/-inf on overflow)."""
    try:
        return float(q)
    except OverflowError:
        return INF if q > 0 else -INF


def exact_mean(xs) -> Fraction:
    return sum((F(x) for x in xs), Fraction(0)) / len(xs)


def exact_var(xs, ddof: int = 1) -> Fraction:
    m = exact_mean(xs)
    return sum(((F(x) - m) ** 2 for x in xs), Fraction(0)) / (len(xs) - ddof)


def sqrt_fraction(q: Fraction) -> float:
    """sqrt of a non-negative Fraction, accurate even beyond the float range of q."""
    if q == 0:
        return 0.0
    # q = m * 4^k with m in a comfortable range
    k = (q.numerator.bit_length() - q.denominator.bit_length()) // 2
    m = q / (Fraction(4) ** k) if k >= 0 else q * (Fraction(4) ** (-k))
    try:
        return math.ldexp(math.sqrt(float(m)), k)
    except OverflowError:
        return INF


def close(got: float, want: float, rel: float, abs_: float = 0.0) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    if math.isinf(want):
        return got == want
    if math.isnan(got) or math.isinf(got):
        return False
    return abs(got - want) <= rel * abs(want) + abs_


def same(a: float, b: float) -> bool:
    """Identical answers (NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
