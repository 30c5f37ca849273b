"""The native per-sample statistics and compiled conditions (native/src/dists.rs, logic.rs)
give exactly what their Python references give (streams/run.py, rules/compile.py).

Like tests/unit/test_native_bank.py, these fail (they do not skip) when the native module is
missing, unless RLWATCH_NATIVE=0 says the pure core is wanted: CI builds it.
"""
from __future__ import annotations

import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit._core import PURE_ASKED  # noqa: E402

if PURE_ASKED:
    pytest.skip("RLWATCH_NATIVE=0: the pure core was asked for", allow_module_level=True)

import streams._native as native  # noqa: E402 - an ImportError here fails the run, as it should


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def test_the_native_module_is_built_and_in_use():
    import streams.run
    import streams.signals

    assert streams.signals.CORE == "native", streams.signals.core_note()
    assert streams.run.spearman is native.spearman
    assert streams.run._native_join is native.join


# -- per-sample statistics ----------------------------------------------------------------------

SPECIAL = [0.0, -0.0, 1.0, 2.5, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324]
values = st.one_of(st.sampled_from(SPECIAL), st.integers(-3, 3).map(float),
                   st.floats(allow_nan=True, allow_infinity=True, width=64))


@settings(max_examples=600, deadline=None)
@given(st.lists(values, max_size=70), st.lists(values, max_size=70), st.booleans())
def test_spearman_is_the_python_one_number_for_number(x, y, same_length):
    from streams.run import py_spearman

    if same_length:
        y = (y + x)[:len(x)] if len(y) < len(x) else y[:len(x)]
    assert _same(native.spearman(x, y), py_spearman(x, y))


@settings(max_examples=600, deadline=None)
@given(st.lists(values, max_size=70))
def test_moments_are_the_python_ones_number_for_number(xs):
    import streams.run as run

    assert run.Moments is native.Moments
    ref = run._Moments(list(xs))
    got = native.Moments(list(xs))
    assert got.n == ref.n
    assert got.xs == ref.xs or (got.xs != got.xs)   # the finite values, in order
    for cap in (1.0, 0.0, -0.0, math.nan, None, 1e300, xs[0] if xs else 2.0):
        for stat in ("mean", "ratio_to_start", "std", "skewness", "bimodality", "max", "median",
                     "p99", "tail_mass", "frac_at_cap", "tail_over_median"):
            assert _same(got.value(stat, cap), ref.value(stat, cap)), (stat, cap)
    if ref.n == 0:   # an empty dist reads NaN whatever is asked (as the Python does)
        assert _same(got.value("no_such_stat", None), math.nan)
        return
    for m in (got, ref):
        with pytest.raises(ValueError, match="unknown dist stat"):
            m.value("no_such_stat", None)


@pytest.mark.parametrize("xs", [
    [1e103, -1e103, 3e103, 7.0],          # m2 ** 1.5 overflows: Python raises, both read NaN
    [1e-160, 2e-160, -3e-160, 0.0, 5e-161],   # m2 * m2 underflows to 0: a division by zero
    [1e200, 1e200, -1e200, 3.0],          # the squares overflow to inf
    [2.0, 2.0, 2.0, 2.0],                 # no spread: no shape
    [1.0, 2.0, 3.0], [1.0, 2.0], [5.0],
    [0.0, -0.0, 0.0, -0.0, 1.0],          # signed zeros keep their order when sorted
])
def test_moments_at_the_edges_of_the_float_range(xs):
    import streams.run as run

    ref, got = run._Moments(list(xs)), native.Moments(list(xs))
    for stat in ("std", "skewness", "bimodality", "median", "p99", "max"):
        a, b = got.value(stat, None), ref.value(stat, None)
        assert _same(a, b) and math.copysign(1, a) == math.copysign(1, b), (stat, a, b)


def test_spearman_ranks_ties_in_order_of_appearance():
    # 0.0 and -0.0 are equal: ranked by where they appear, as Python's stable sort does
    x = [0.0, -0.0, 1.0, 0.0, 2.0]
    y = [1.0, 2.0, 3.0, 4.0, 5.0]
    from streams.run import py_spearman

    assert native.spearman(x, y) == py_spearman(x, y)
    assert math.isnan(native.spearman([1.0, 1.0, 1.0], y[:3]))     # constant: undefined
    assert math.isnan(native.spearman(x, y[:4]))                    # lengths differ


def test_per_sample_arrays_are_read_from_lists_and_other_sequences_alike():
    x, y = [0.5, 2, -1.0, 3.25], [1.0, 0.0, 2.0, 5.0]       # an integer among the floats
    assert native.spearman(tuple(x), tuple(y)) == native.spearman(x, y)
    assert native.Moments(tuple(x)).value("std", None) == native.Moments(x).value("std", None)
    with pytest.raises(TypeError):
        native.spearman([1.0, "a", 2.0], y[:3])


def test_items_other_than_floats_are_read_as_their_float():
    # exact floats are read straight; anything else as its float() (a subclass, an object with
    # __float__, a bool), in the same place
    class Sub(float):
        pass

    class Number:
        def __init__(self, v):
            self.v = v

        def __float__(self):
            return self.v

    y = [1.0, 0.0, 2.0, 5.0, 4.0]
    odd = [Sub(0.5), True, Number(-1.0), 3.25, Number(7.0)]
    plain = [0.5, 1.0, -1.0, 3.25, 7.0]
    assert native.spearman(odd, y) == native.spearman(plain, y)
    assert native.Moments(odd).value("mean", None) == native.Moments(plain).value("mean", None)

    # an item's __float__ that shortens the list: what is left of it is read, as PyO3 reads it
    xs: list = []

    class Shrinks:
        def __float__(self):
            del xs[3:]
            return 2.0

    xs.extend([1.0, Shrinks(), 3.0, 4.0, 5.0])
    assert native.Moments(xs).value("mean", None) == 2.0


# -- compiled conditions ------------------------------------------------------------------------

def _python_and_native(kind, thr, stream):
    """A reader over a native bank, compared natively and by the Python closure."""
    from rules.compile import _compare_value

    bank = native.Bank()
    read = bank.metric("m", "value", 1, None, None, 1, 1, 1)
    nat, _ = _compare_value(read, kind, thr, "m")

    class Plain:      # the same reader without its native test: the Python closure
        def __call__(self):
            return read()
    py, _ = _compare_value(Plain(), kind, thr, "m")
    assert type(nat).__name__ == "Compare" and type(py).__name__ == "function"
    out = []
    for step, x in enumerate(stream):
        bank.update(step, {"m": x})
        bank.step = step
        out.append((nat(), py()))
    return out


@pytest.mark.parametrize("kind", ["above", "below", "abs_above"])
def test_native_comparisons_give_the_python_verdicts(kind):
    stream = [0.5, 1.0, 1.5, -2.0, math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0000001]
    for nat, py in _python_and_native(kind, 1.0, stream):
        assert nat is py      # True, False or None: the same object
    # NaN is undecided; +inf holds for above/abs_above; the threshold itself does not hold
    got = dict(zip(stream[:4], [p for p, _ in _python_and_native(kind, 1.0, stream)]))
    if kind == "above":
        assert got == {0.5: False, 1.0: False, 1.5: True, -2.0: False}
    elif kind == "abs_above":
        assert got[-2.0] is True


class _Fixed:
    """A Python test giving fixed verdicts, counting its calls."""

    def __init__(self, verdicts):
        self.verdicts, self.calls = list(verdicts), 0

    def __call__(self):
        v = self.verdicts[self.calls % len(self.verdicts)]
        self.calls += 1
        return v


def _native_test(verdict):
    """A native Compare that gives ``verdict`` (True, False or None) on the bank's step."""
    bank = native.Bank()
    read = bank.metric("m", "value", 1, None, None, 1, 1, 1)
    bank.update(0, {"m": {True: 2.0, False: 0.0, None: math.nan}[verdict]})
    bank.step = 0
    return read.compare("above", 1.0)


@pytest.mark.parametrize("seed", range(40))
def test_native_all_any_not_give_the_python_verdicts_and_stop_where_it_stops(seed):
    rng = random.Random(seed)
    verdicts = [rng.choice([True, False, None]) for _ in range(rng.randint(1, 5))]
    natives = [rng.random() < 0.6 for _ in verdicts]
    if not any(natives):
        natives[0] = True

    def make():
        return [_native_test(v) if n else _Fixed([v]) for v, n in zip(verdicts, natives)]
    from rules.compile import all_of, any_of, not_of

    for op, ref in (("all", all_of), ("any", any_of)):
        a, b = make(), make()
        node = native.join(op, a)
        assert node() is ref(b)(), (op, verdicts, natives)
        # the Python branches after the one that decided are not called
        assert [t.calls for t in a if isinstance(t, _Fixed)] == [t.calls for t in b if isinstance(t, _Fixed)]
    inner = native.join("all", make())
    assert native.join("not", [inner])() is not_of(all_of(make()))()


def test_join_leaves_pure_python_tests_to_python_and_refuses_nonsense():
    assert native.join("all", [_Fixed([True]), _Fixed([False])]) is None
    with pytest.raises(ValueError):
        native.join("xor", [_native_test(True)])
    with pytest.raises(ValueError):
        native.join("not", [_native_test(True), _native_test(False)])
    with pytest.raises(ValueError):
        native.Bank().metric("m", "value", 1, None, None, 1, 1, 1).compare("around", 1.0)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**12), st.floats(allow_nan=True, allow_infinity=True,
                                                            width=64)), max_size=40),
       st.booleans(), st.integers(-5, 10**12), st.integers(0, 5))
def test_a_series_is_the_python_one_number_for_number(pts, ordered, edge, keep):
    from streams.run import PySeries

    if ordered:
        pts = sorted(pts)
    nat, ref = native.Series([[s, v] for s, v in pts]), PySeries([[s, v] for s, v in pts])
    for a, b in ((nat, ref), (native.Series(), PySeries())):
        if a is not nat:      # the same points appended one by one
            for s, v in pts:
                a.append(s, v)
                b.append(s, v)
        assert _same(a.slope(), b.slope())
        for after in (-1, edge):
            (ssa, na), (ssb, nb) = a.curvature(after), b.curvature(after)
            assert _same(ssa, ssb) and na == nb
        assert len(a) == len(b) and a.span() == b.span() and _same(a.last(), b.last())
        assert str(a.to_list()) == str(b.to_list())    # (NaN != NaN: compare as text)
        # a worker writes the points as MessagePack: msgspec's bytes of the same list
        assert a.to_msgpack() == b.to_msgpack() == msgspec.msgpack.encode(b.to_list())
        a.trim(edge, keep)
        b.trim(edge, keep)
        assert str(a.to_list()) == str(b.to_list())
        assert _same(a.slope(), b.slope())


def test_a_series_of_a_line_and_its_edges():
    points = [[s, 2.0 + 0.5 * s] for s in range(0, 100, 5)]
    assert native.Series(points).slope() == pytest.approx(0.5)
    assert math.isnan(native.Series(points[:2]).slope())           # under 3 points
    assert math.isnan(native.Series([[3, 1.0]] * 5).slope())       # the steps do not vary
    s = native.Series(points)
    s.trim(50, 3)               # points at steps up to 50 go
    assert s.to_list()[0] == [55, 2.0 + 0.5 * 55] and len(s) == 9 and s.span() == 41
    s.trim(10**9, 3)            # never fewer than 3
    assert len(s) == 3 and s.last() == 2.0 + 0.5 * 95
    assert math.isnan(native.Series().last()) and native.Series().span() == 0
    assert s.curvature(-1) == (0.0, 1)              # a straight line: no scatter; 3 points, 1 triple
    bumpy = native.Series([[0, 1.0], [1, 2.0], [2, 1.0], [3, 2.0]])
    assert bumpy.curvature(-1) == (8.0, 2)          # second differences -2 and +2
    assert bumpy.curvature(2) == (4.0, 1)           # only the points logged after step 2
    assert native.Series([(1, 2.0), [2, 3]]).to_list() == [[1, 2.0], [2, 3.0]]   # as a state loads
    with pytest.raises(TypeError):
        native.Series([["one", 2.0]])


@pytest.mark.parametrize("seed", range(40))
def test_a_group_step_is_the_python_one_number_for_number(seed):
    """update_group against py_update_group (streams.run), step after step of random category
    values (NaN and infinities among them, categories coming and going, more than the limit):
    the same series, point for point, and the same gap."""
    from streams.run import PySeries, py_update_group

    rng = random.Random(seed)
    limit = rng.choice([2, 3, 64])
    window = rng.choice([1, 3, 10])
    keep = rng.choice([1, 3, 5])
    mine, ref = ({}, native.Series()), ({}, PySeries())
    names = [f"c{i}" for i in range(rng.randint(1, 6))]
    step = 0
    for _ in range(rng.randint(1, 60)):
        step += rng.choice([1, 1, 2, 7])
        cats = {c: rng.choice([*SPECIAL, rng.gauss(0, 1), float(rng.randint(-2, 2))])
                for c in rng.sample(names, rng.randint(0, len(names)))}
        native.update_group(mine[0], mine[1], dict(cats), step, step - window, limit, keep)
        py_update_group(ref[0], ref[1], dict(cats), step, step - window, limit, keep)
        assert list(mine[0]) == list(ref[0])            # the same categories, in the same order
        for c in ref[0]:
            got, want = mine[0][c].to_list(), ref[0][c].to_list()
            assert [p[0] for p in got] == [p[0] for p in want]
            assert all(_same(a[1], b[1]) for a, b in zip(got, want)) and len(got) == len(want)
        assert mine[1].to_list() == ref[1].to_list()


def test_a_group_step_refuses_a_series_of_another_kind():
    with pytest.raises(TypeError):
        native.update_group({"a": [1, 2]}, native.Series(), {"a": 1.0}, 1, 0, 64, 5)


# -- the scan of a rule list's tiers (rules.engine.evaluate) -----------------------------------

@pytest.mark.parametrize("rank", [None, 3])
@pytest.mark.parametrize("seed", range(30))
def test_the_native_scan_gives_the_alerts_and_states_of_the_python_loop(seed, rank):
    """evaluate() with the native Scan and with its Python loop, over the same tiers (native and
    Python tests, every verdict) and steps: the same alerts, the same states, every test read
    once per step in both. For a rank's own rules (``rank``) the states are keyed with the
    rank: another rank's state of the same tier is left alone."""
    from rules.compile import CompiledRule, CompiledTier, RuleList
    from rules.engine import evaluate
    from rules.schema import Rule
    from rules.state import AlertState

    rng = random.Random(seed)
    steps = 30
    pattern = [[rng.choice([True, True, False, None]) for _ in range(steps)] for _ in range(6)]

    def build():
        rules = RuleList()
        for i, verdicts in enumerate(pattern):
            rule = Rule.model_validate({"id": f"r{i}", "tiers": [
                {"severity": "orange", "when": {"metric": "m", "above": 1.0},
                 "for": rng.choice([1, 2]), "keep_firing_for": rng.choice([0, 3])}]})
            test = _Fixed(verdicts)
            tier = CompiledTier(rule.tiers[0], f"r{i}/orange/", test,
                                lambda: (None, 1.0, 0.5, "m", None, None))
            rules.append(CompiledRule(rule, i, {}, [tier], [], frozenset({"m"}), "step"))
        return rules

    state = rng.getstate()
    other = {"r1/orange/5": AlertState(status="pending", onset_step=0)}
    py_rules, py_states, py_out = build(), dict(other), []
    rng.setstate(state)
    nat_rules, nat_states, nat_out = build(), dict(other), []
    for step in range(steps):
        py_out += evaluate("run", py_rules, {}, py_states, step=step, ts=float(step), rank=rank)
        nat_out += evaluate("run", nat_rules, {}, nat_states, step=step, ts=float(step), rank=rank,
                            scanner=native.Scan)
        assert {k: v.to_state() for k, v in nat_states.items()} == \
               {k: v.to_state() for k, v in py_states.items()}
        assert nat_states["r1/orange/5"] is other["r1/orange/5"]
    assert [a.model_dump() for a in nat_out] == [a.model_dump() for a in py_out]
    assert any(a.state == "firing" for a in py_out)        # the case is not empty
    assert {a.rank for a in nat_out} == {rank}
    assert nat_rules._scan[1] == ("" if rank is None else "3")     # (the native scan read them)
    assert [cr.tiers[0].test.calls for cr in nat_rules] == [steps] * 6


class _Log(list):
    """The names of the Python tests read, in order; ``round`` picks each one's verdict."""

    def __init__(self):
        super().__init__()
        self.round, self.made = 0, 0


class _Logged:
    """A Python test whose verdict depends on the log's round, writing its name per read."""

    def __init__(self, verdicts, log):
        log.made += 1
        self.name, self.verdicts, self.log = f"t{log.made}", verdicts, log

    def __call__(self):
        self.log.append(self.name)
        return self.verdicts[self.log.round % len(self.verdicts)]


def _random_tree(rng, log, depth=0):
    """A random test: a native all/any/not over native comparisons, logged Python tests and
    further joins (a join of Python tests only is left to Python, as rules.compile leaves it)."""
    if depth >= 3 or rng.random() < 0.3:
        if rng.random() < 0.5:
            return _native_test(rng.choice([True, False, None]))
        return _Logged([rng.choice([True, False, None]) for _ in range(3)], log)
    op = rng.choice(["all", "any", "not"])
    n = 1 if op == "not" else rng.randint(1, 4)
    branches = [_random_tree(rng, log, depth + 1) for _ in range(n)]
    node = native.join(op, branches)
    return node if node is not None else branches[0]


@pytest.mark.parametrize("seed", range(40))
def test_the_scan_reads_nested_tests_as_the_tree_does_in_the_same_order(seed):
    """The scan lays every tier's test out flat: the verdicts, and which Python branches are
    read in what order (where an all/any stops), are those of calling each tier's tree."""
    rng = random.Random(seed)
    log = _Log()
    tests = [_random_tree(rng, log) for _ in range(rng.randint(1, 6))]
    keys = [f"k{i}/" for i in range(len(tests))]
    scan = native.Scan(tests, keys)
    states = dict.fromkeys(keys, object())      # every tier named, whatever its verdict
    for log.round in range(3):
        log.clear()
        got = scan(states)
        read_by_scan = list(log)
        log.clear()
        assert got == [(i, t()) for i, t in enumerate(tests)]
        assert read_by_scan == list(log)


def test_the_scan_reads_native_tests_and_names_tiers_with_a_state():
    tests = [_native_test(True), _native_test(False), _Fixed([None]), _native_test(None),
             _Fixed([True])]
    keys = ["a/", "b/", "c/", "d/", "e/"]
    scan = native.Scan(tests, keys)
    assert scan({}) == [(0, True), (4, True)]
    assert scan({"b/": object(), "c/": object()}) == [(0, True), (1, False), (2, None), (4, True)]
    with pytest.raises(ValueError):
        native.Scan(tests, keys[:2])


@pytest.mark.parametrize("kind", ["above", "below", "abs_above"])
@pytest.mark.parametrize("first", [False, True])
def test_the_native_test_of_a_python_reader_gives_the_python_verdicts(kind, first):
    """compare_call (dists, groups, ranks, samples: readers answered in Python) against the
    closures of rules.compile, value by value, and as a branch of a native all/any/Scan."""
    from rules.compile import _compare_pair, _compare_value

    stream = [0.5, 1.0, 1.5, -2.0, -1.0, math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0000001]
    box = [0.0]
    if first:
        def read():
            return box[0], "detail"
        py, _ = _compare_pair(read, kind, 1.0, "m", lambda d: d)
    else:
        def read():
            return box[0]
        py, _ = _compare_value(read, kind, 1.0, "m")
    nat = native.compare_call(read, kind, 1.0, first)
    both = native.join("all", [nat, _Fixed([True])])
    for x in stream:
        box[0] = x
        assert nat() is py(), x
        assert both() is py(), x
        assert native.Scan([nat], ["k/"])({"k/": 1}) == [(0, py())]
    with pytest.raises(ValueError):
        native.compare_call(read, "around", 1.0, first)


def test_compiled_conditions_on_python_readers_are_native_when_the_core_is():
    """A run's compiled dist, group and rank conditions are native tests (no Python closure
    between the tier and its reader), and their all/any native nodes."""
    from rules.loader import load_pack
    from streams.processor import Pipeline

    state = Pipeline(load_pack("rlhf")).state("r")
    program = state.program(0)
    kinds = {cr.rule.id: type(cr.tiers[0].test).__name__ for cr in program.rules}
    assert kinds["length_shape"] == "Node"          # any of three dist conditions
    assert kinds["rank_outlier"] == "CallCompare"   # a cross-rank reader
    assert kinds["category_imbalance"] == "Node"    # all of three group conditions


@pytest.mark.parametrize("holder", ["compare_call", "join", "join_of_python", "scan"])
def test_a_cycle_through_a_native_test_is_collected(holder):
    """A compiled test holds its Python reader, and the reader reads the run that holds the
    test: the collector must see the native object's references to free the cycle."""
    import gc
    import weakref

    class Run:
        pass

    def reader_of(run):         # the reader's own cell holds the run, as a compiled rule's
        return lambda: run.value

    run = Run()
    run.value = 2.0
    read = reader_of(run)
    call = native.compare_call(read, "above", 1.0, False)
    test = {"compare_call": lambda: call,
            "join": lambda: native.join("all", [call, _native_test(True)]),
            "join_of_python": lambda: native.join("any", [_native_test(False), read]),
            "scan": lambda: native.Scan([call], ["k/"])}[holder]()
    run.test = test
    gone = weakref.ref(run)
    del run, read, call, test
    gc.collect()
    assert gone() is None
