"""The native view of the step at hand (native/src/view.rs) gives exactly what its Python
reference gives (streams.run.PyStepView): whether the metrics are all finite, the moments of
the per-sample arrays and the statistics read from them, the names of the non-finite metrics
and the test of a non-finite check (which look at nothing when every metric is finite).

Like tests/unit/test_native_logic.py, these fail (they do not skip) when the native module is
missing, unless RLWATCH_NATIVE=0 says the pure core is wanted: CI builds it.
"""
from __future__ import annotations

import math
import random

import pytest

from tests.unit._core import PURE_ASKED  # noqa: E402

if PURE_ASKED:
    pytest.skip("RLWATCH_NATIVE=0: the pure core was asked for", allow_module_level=True)

import streams._native as native  # noqa: E402 - an ImportError here fails the run, as it should

from streams.run import PyStepView, RunState  # noqa: E402

STATS = ["mean", "std", "skewness", "bimodality", "max", "median", "p99", "tail_mass",
         "frac_at_cap", "ratio_to_start", "tail_over_median"]
ODD = [math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0, -0.0, 5e-324]


def _same(a, b) -> bool:
    return a == b or (a != a and b != b)


def _metrics(rnd: random.Random) -> dict:
    n = rnd.randrange(0, 12)
    out = {}
    for i in range(n):
        out[f"m{i}"] = rnd.choice(ODD) if rnd.random() < 0.15 else rnd.uniform(-1e3, 1e3)
    return out


def _dists(rnd: random.Random) -> dict:
    out = {}
    for name in ("reward", "response_length", "kl"):
        if rnd.random() < 0.7:
            n = rnd.choice([0, 1, 2, 3, 4, 7, 64])
            xs = [rnd.gauss(0, 1) if rnd.random() < 0.5 else float(rnd.randrange(3)) for _ in range(n)]
            if xs and rnd.random() < 0.2:
                xs[rnd.randrange(n)] = rnd.choice(ODD)
            out[name] = xs
    return out


def test_the_native_view_reads_a_step_as_its_reference_does():
    rnd = random.Random(5)
    nat, ref = native.StepView(), PyStepView()
    readers = [(native_r, py_r) for name in ("reward", "response_length", "kl", "missing")
               for stat in STATS for cap in (None, 0.5, 1.0)
               for native_r, py_r in [(nat.dist_stat(name, stat, cap), ref.dist_stat(name, stat, cap))]]
    nonfinite, compared = 0, 0
    for _ in range(400):
        metrics, dists = _metrics(rnd), _dists(rnd)
        nat.set(metrics, dists)
        ref.set(metrics, dists)
        assert nat.finite() is ref.finite()
        nonfinite += not ref.finite()
        for name in ("reward", "response_length", "kl", "missing"):
            a, b = nat.moments(name), ref.moments(name)
            assert (a is None) is (b is None) and (a is None or (a.n == b.n and _same(a.mean, b.mean)))
            assert a is None or nat.moments(name) is a       # worked out once per step
        for native_r, py_r in rnd.sample(readers, 20):
            x, y = native_r(), py_r()
            assert type(x) is float and _same(x, y), (x, y)
            compared += x == x
    assert nonfinite > 40 and compared > 2000


def test_the_sum_that_overflows_reads_not_finite_as_the_reference_says():
    nat, ref = native.StepView(), PyStepView()
    for metrics in ({"a": 1e308, "b": 1e308}, {"a": 1e308, "b": -1e308}, {"a": 3, "b": 1.5},
                    {}, {"a": True, "b": 0.5}):
        nat.set(metrics, {})
        ref.set(metrics, {})
        assert nat.finite() is ref.finite()


def test_the_view_forgets_the_last_step_when_set():
    nat = native.StepView()
    read = nat.dist_stat("reward", "mean", None)
    nat.set({"a": math.nan}, {"reward": [1.0, 2.0, 3.0]})
    first = nat.moments("reward")
    assert not nat.finite() and read() == 2.0
    nat.set({"a": 1.0}, {"reward": [5.0]})
    assert nat.finite() and read() == 5.0 and nat.moments("reward") is not first
    nat.set({}, {})
    assert nat.finite() and math.isnan(read()) and nat.moments("reward") is None


def _metric_names(rnd: random.Random) -> list[str] | None:
    if rnd.random() < 0.3:
        return None
    return [f"m{rnd.randrange(14)}" for _ in range(rnd.randrange(0, 5))]


def test_the_native_non_finite_readers_give_what_their_reference_gives():
    rnd = random.Random(11)
    nat, ref = native.StepView(), PyStepView()
    readers = []
    for _ in range(40):
        names = _metric_names(rnd)
        readers.append((nat.nonfinite(names), ref.nonfinite(names), nat.nonfinite_test(names),
                        ref.nonfinite_test(names)))
    found = held = 0
    for _ in range(400):
        metrics = _metrics(rnd)
        if rnd.random() < 0.2:    # names in another order than sorted, a value that is an int
            metrics = dict(reversed(list(metrics.items())), z=rnd.choice([math.nan, 3]))
        nat.set(metrics, {})
        ref.set(metrics, {})
        for n_read, r_read, n_test, r_test in readers:
            got, want = n_read(), r_read()
            assert got == want and type(got) is list
            assert n_test() is r_test() is bool(want)
            found += len(want)
            held += bool(want)
    assert found > 500 and held > 300


def test_the_non_finite_readers_follow_the_step_at_hand():
    nat = native.StepView()
    read, test = nat.nonfinite(None), nat.nonfinite_test(["a"])
    nat.set({"a": 1.0, "b": 2.0}, {})
    assert read() == [] and test() is False
    nat.set({"a": 1.0, "b": math.inf, "c": math.nan}, {})
    assert read() == ["b", "c"] and test() is False      # ("a" is finite)
    nat.set({"a": -math.inf}, {})
    assert read() == ["a"] and test() is True
    nat.set({}, {})
    assert read() == [] and test() is False


def test_a_metric_name_with_a_lone_surrogate_is_read_as_python_reads_it():
    """A name the contract takes (a JSON escape may give a lone surrogate) is no UTF-8 text:
    the native readers keep it as the str it is, in Python's order."""
    nat, ref = native.StepView(), PyStepView()
    metrics = {"b\ud800": math.nan, "a": math.inf, "b": 1.0, "\udfff": -math.inf}
    for view in (nat, ref):
        view.set(metrics, {})
    for names in (None, ["b\ud800", "b"], ["\udfff"]):
        assert nat.nonfinite(names)() == ref.nonfinite(names)()
        assert nat.nonfinite_test(names)() is ref.nonfinite_test(names)() is True
    assert nat.nonfinite(None)() == ["a", "b\ud800", "\udfff"]


def test_the_scan_reads_the_native_non_finite_test_without_a_python_frame():
    """A join of the native test and a Python test is native (rules/compile.py then has no
    Python all/any closure in between), and gives the Python closures' verdicts."""
    from rules.compile import all_of, any_of

    nat = native.StepView()
    test = nat.nonfinite_test(["a"])
    for op, ref in (("all", all_of), ("any", any_of)):
        for other in (lambda: True, lambda: False, lambda: None):
            joined = native.join(op, [test, other])
            assert joined is not None
            for metrics in ({"a": math.nan}, {"a": 1.0}, {"b": math.nan}):
                nat.set(metrics, {})
                assert joined() is ref([test, other])()


def test_a_run_state_on_the_native_core_reads_its_step_through_the_native_view():
    st = RunState("r")
    assert type(st.view) is native.StepView
    st.view.set({"a": math.nan}, {"reward": [1.0, 2.0]})
    assert not st.view.finite() and st.moments("reward").mean == 1.5


GROUP_STATS = ["gap", "gap_slope", "min_slope", "max_slope", "range",
               "gap_slope_z", "min_slope_z", "max_slope_z", "spread_slope_z"]


def _trends(rnd: random.Random) -> tuple:
    slopes = {c: rnd.choice([rnd.uniform(-1, 1), math.nan]) for c in ("a", "b", "c")[:rnd.randrange(4)]}
    finite = [v for v in slopes.values() if v == v]
    return (slopes, rnd.choice([rnd.uniform(-1, 1), math.nan]), rnd.choice([rnd.uniform(0, 2), math.nan]),
            min(finite) if finite else None, max(finite) if finite else None,
            rnd.choice([rnd.uniform(0.5, 50), math.nan]))


def test_the_native_group_reader_gives_what_its_reference_gives():
    rnd = random.Random(9)
    nat, ref = native.StepView(), PyStepView()
    keys = ["reward/mean|100", "reward/mean|50", "kl|100"]
    readers = [(k, s, nat.group_stat(k, s), ref.group_stat(k, s)) for k in keys for s in GROUP_STATS]
    decided = 0
    for _ in range(300):
        nat.set({}, {})
        ref.set({}, {})
        for k in keys:
            if rnd.random() < 0.6:
                t = _trends(rnd)
                nat.set_group(k, t)
                ref.set_group(k, t)
        for k, s, a, b in readers:
            (va, da), (vb, db) = a(), b()
            assert _same(va, vb) and type(va) is float and da is db, (k, s, va, vb)
            decided += va == va
    assert decided > 1000
    nat.set({}, {})
    assert math.isnan(readers[0][2]()[0]) and readers[0][2]()[1] is None    # forgotten at set


def test_a_group_has_its_trends_set_at_each_step_it_is_in():
    """The run works out a group's trends at every step that has it (not when a rule first
    reads them): a rule reads the same numbers whatever other conditions were read first."""
    from contract.events import parse_event
    from rules.loader import load_pack
    from streams.processor import Processor

    proc = Processor(load_pack("rlhf"))
    st = proc.new_state("g")
    seen = []
    st.view = type("Spy", (), {"__getattr__": lambda self, name: getattr(inner, name),
                              "set_group": lambda self, k, t: (seen.append(k), inner.set_group(k, t))})()
    inner = native.StepView()
    for step in range(30):
        ev = {"schema": 1, "kind": "step", "run_id": "g", "step": step, "ts": 1.0 + step,
              "metrics": {"reward/mean": 0.1}, "groups": {"reward/mean": {"a": 0.1 * step, "b": 0.2}}}
        proc.process(st, parse_event(ev, 1.0 + step), 1.0 + step)
    assert len(seen) == 30 and set(seen) == {k for k in st.groups}


@pytest.mark.parametrize("kind", ["above", "below", "abs_above"])
def test_the_scan_reads_the_view_readers_straight_with_the_verdicts_of_a_call(kind):
    """The rule scan reads a compared dist or group reader of the view and a non-finite test
    straight (native/src/logic.rs: Flat::Dist, Group, NonFinite), not through Python's call
    protocol: alone, in a join and in a scan, each gives the verdict of the Python closures of
    rules/compile.py over the same reader called as a Python object, step after step."""
    from rules.compile import _compare_pair, _compare_value

    rnd = random.Random(11)
    view = native.StepView()
    cases = []
    for name in ("reward", "response_length", "missing"):
        for stat in STATS:
            for thr in (0.0, 0.5, 1.0):
                reader = view.dist_stat(name, stat, 0.5)
                py, _ = _compare_value(reader, kind, thr, name)
                cases.append((py, native.compare_call(reader, kind, thr, False)))
    for key in ("reward/mean|100", "kl|100"):
        for stat in GROUP_STATS:
            for thr in (-0.2, 0.0, 0.3):
                reader = view.group_stat(key, stat)
                py, _ = _compare_pair(reader, kind, thr, key, lambda d: d)
                cases.append((py, native.compare_call(reader, kind, thr, True)))
    for names in (None, ["m1", "m2"], ["nowhere"]):
        test = view.nonfinite_test(names)
        cases.append((lambda t=test: bool(t()), test))
    scan = native.Scan([nat for _, nat in cases], [f"k{i}/" for i in range(len(cases))])
    named = {f"k{i}/": 1 for i in range(len(cases))}
    seen = set()
    for _ in range(120):
        view.set(_metrics(rnd), _dists(rnd))
        for k in ("reward/mean|100", "kl|100"):
            if rnd.random() < 0.7:
                view.set_group(k, _trends(rnd))
        want = [py() for py, _ in cases]
        assert scan(named) == list(enumerate(want))
        for (py, nat), w in zip(cases, want):
            joined = native.join("all", [nat, lambda: True])
            assert joined() is w
            seen.add(w)
    assert seen == {True, False, None}
