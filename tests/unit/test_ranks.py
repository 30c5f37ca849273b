"""The cross-rank buffer (streams/ranks.py): what the cross-rank rules compare, and the native
buffer (native/src/ranks.rs) giving exactly what the Python reference gives.

Like tests/unit/test_native_logic.py, the native comparisons fail (they do not skip) when the
native module is missing, unless RLWATCH_NATIVE=0 says the pure core is wanted: CI builds it.
"""
from __future__ import annotations

import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.ranks import PyRankBuffer
from tests.unit._core import needs_native


STATS = ("max_over_median", "max", "median", "held_over_median")


def _native():
    import streams._native as native   # an ImportError here fails the test, as it should
    return native.RankBuffer


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# -- the reference, on its own ---------------------------------------------------------------------

def test_a_step_is_compared_once_every_rank_is_in():
    b = PyRankBuffer(8)
    b.track("grad_norm/actor")
    assert b.take(5, 0, {"grad_norm/actor": 1.0, "loss": 2.0}, {"actor": "a"}, 3) == []
    assert b.take(5, 2, {"grad_norm/actor": 9.0}, {"actor": "b"}, 3) == []
    assert b.take(5, 1, {"grad_norm/actor": 2.0}, {"actor": "a"}, 3) == [5]
    b.open(5)
    assert b.rank_stat("grad_norm/actor", "max_over_median")() == (4.5, 2)
    assert b.rank_stat("grad_norm/actor", "max")() == (9.0, 2)
    assert b.rank_stat("grad_norm/actor", "median")() == (2.0, None)
    assert b.hash_mismatch("actor")() == [2]
    assert len(b) == 0      # the step left the buffer
    b.close()
    assert b.rank_stat("grad_norm/actor", "max")()[1] is None


def test_only_the_tracked_metrics_are_kept_and_a_missed_step_is_given_up_on():
    b = PyRankBuffer(2)
    b.track("m")
    b.take(1, 0, {"m": 1.0, "other": 3.0}, {}, 2)
    assert b.to_state() == {"1": {"0": {"m": {"m": 1.0}, "h": {}}}}
    b.take(2, 0, {"m": 1.0}, {}, 2)
    # a third step waiting: the oldest (rank 1 never sent it) is given up on
    assert b.take(3, 0, {"m": 1.0}, {}, 2) == [1]
    # ... and with the new step complete, both, in order
    b.open(1)
    assert b.take(4, 0, {}, {}, 1) == [2, 4]


def test_fewer_than_two_finite_values_read_nothing():
    b = PyRankBuffer(8)
    b.track("m")
    b.take(1, 0, {"m": math.nan}, {}, 3)
    b.take(1, 1, {"m": 2.0}, {}, 3)
    b.take(1, 2, {}, {}, 3)
    b.open(1)
    v, r = b.rank_stat("m", "max")()
    assert v != v and r is None
    assert b.hash_mismatch("actor")() is None


def _steps(buf, rows, world=4, first=1):
    """Each row the ranks' values of one step, which is then compared; held_over_median's
    readings, step by step."""
    read = buf.rank_stat("g", "held_over_median")
    out = []
    for i, row in enumerate(rows):
        step = first + i
        for rank, v in enumerate(row):
            buf.take(step, rank, {"g": v}, {}, world)
        buf.open(step)
        out.append(read())
    buf.close()
    return out


def test_a_rank_held_over_the_line_reads_over_and_ranks_taking_turns_do_not():
    b = PyRankBuffer(8)
    b.track("g")
    # rank 2 at 4 x the median at two of three steps: its middle ratio is 4 from the third on
    got = _steps(b, [[1.0, 1.0, 4.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 4.0, 1.0],
                     [1.0, 1.0, 4.0, 1.0]])
    assert all(v != v and r is None for v, r in got[:2])     # nan until three ratios
    assert got[2] == (4.0, 2) and got[3] == (4.0, 2)
    # each rank over the line once in turn: max_over_median is 4 at every step, this is 1
    b = PyRankBuffer(8)
    b.track("g")
    turns = [[4.0 if r == s % 4 else 1.0 for r in range(4)] for s in range(8)]
    assert [v for v, _ in _steps(b, turns)[2:]] == [1.0] * 6


def test_held_ratios_survive_a_restart_and_go_with_the_run():
    b = PyRankBuffer(8)
    b.track("g")
    _steps(b, [[1.0, 5.0, 1.0, 1.0]] * 2)
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(b.held_state()))
    assert state == {"g": {"0": [1.0, 1.0], "1": [5.0, 5.0], "2": [1.0, 1.0], "3": [1.0, 1.0]}}
    again = PyRankBuffer(8)
    again.track("g")
    again.rank_stat("g", "held_over_median")       # (a run binds its readers, then loads)
    again.load_held(state)
    assert _steps(again, [[1.0, 5.0, 1.0, 1.0]], first=3) == [(5.0, 1)]
    again.clear()                                  # a relaunch: the ratios start over
    v, r = _steps(again, [[1.0, 5.0, 1.0, 1.0]], first=4)[0]
    assert v != v and r is None


def test_an_unknown_statistic_is_refused():
    with pytest.raises(ValueError, match="unknown rank statistic"):
        PyRankBuffer(8).rank_stat("m", "mean")


# -- the native buffer against the reference -------------------------------------------------------

SPECIAL = [0.0, -0.0, 1.0, 2.5, math.nan, math.inf, -math.inf, 1e308, 5e-324, 3.0, 3.0]
values = st.one_of(st.sampled_from(SPECIAL),
                   st.floats(allow_nan=True, allow_infinity=True, width=64))
HASHES = (None, "h1", "h1", "h2")


def _ops(seed: int, n: int):
    rnd = random.Random(seed)
    ops = []
    for _ in range(n):
        roll = rnd.random()
        if roll < 0.75:
            step = rnd.randint(0, 12)
            metrics = {m: rnd.choice(SPECIAL + [rnd.gauss(0, 1)]) for m in ("a", "b", "c")
                       if rnd.random() < 0.8}
            h = rnd.choice(HASHES)
            ref = {"ref": "x"} if rnd.random() < 0.5 else {}
            hashes = {} if h is None else {"actor": h, **ref}
            ops.append(("take", step, rnd.randint(0, 4), metrics, hashes, rnd.randint(1, 4)))
        elif roll < 0.9:
            ops.append(("open", rnd.randint(0, 12)))
        elif roll < 0.95:
            ops.append(("close",))
        elif roll < 0.97:
            ops.append(("clear",))
        else:
            ops.append(("roundtrip",))
    return ops


def _read_step(step, rank, metrics, hashes, world):
    """The step as ``read_rank_step`` reads it from its JSON (None when it declines it: rank 0,
    a value that is not finite)."""
    import json

    from streams._native import read_rank_step
    return read_rank_step(json.dumps({"schema": 1, "kind": "step", "run_id": "r", "rank": rank,
                                      "world_size": world, "step": step, "metrics": metrics,
                                      "hashes": hashes}).encode())


def _play(buf, ops, read_steps: bool = False) -> list:
    """``read_steps``: the native buffer takes each step ``read_rank_step`` reads as the worker
    gives it (``take_step``, its hashes kept in the event's bytes)."""
    buf.track("a")
    buf.track("b")
    readers = [buf.rank_stat(m, s) for m in ("a", "b", "z") for s in STATS]
    readers += [buf.hash_mismatch("actor"), buf.hash_mismatch("ref")]
    trace = []
    for op in ops:
        if op[0] == "take":
            read = _read_step(*op[1:]) if read_steps else None
            trace.append(buf.take(*op[1:]) if read is None else buf.take_step(read, op[-1]))
        elif op[0] == "open":
            buf.open(op[1])
            trace.append([r() for r in readers])
            trace.append([r() for r in readers])      # read again: the same (memo)
        elif op[0] == "roundtrip":
            state = msgspec.json.decode(msgspec.json.encode(buf.to_state()))
            held = msgspec.msgpack.decode(msgspec.msgpack.encode(buf.held_state()))
            buf.load(state)
            buf.load_held(held)
        else:
            getattr(buf, op[0])()
        trace.append((len(buf), msgspec.json.encode(buf.to_state()),
                      msgspec.msgpack.encode(buf.held_state())))
    return trace


@needs_native
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("max_pending", [1, 3, 8])
def test_the_native_buffer_gives_what_the_reference_gives(seed, max_pending):
    ops = _ops(seed, 400)
    want = _play(PyRankBuffer(max_pending), ops)
    for read_steps in (False, True):
        got = _play(_native()(max_pending), ops, read_steps)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert _same(g, w), (read_steps, i, g, w)
    read = sum(op[0] == "take" and _read_step(*op[1:]) is not None for op in ops)
    assert read > 50          # (most of the others have a value that is not finite, or rank 0)


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), values), min_size=0, max_size=9))
def test_native_rank_statistics_are_the_references_number_for_number(rank_values):
    bufs = [PyRankBuffer(8), _native()(8)]
    out = []
    for b in bufs:
        b.track("m")
        for rank, v in rank_values:
            b.take(3, rank, {"m": v}, {"actor": str(rank % 2)}, 99)
        b.open(3)
        out.append([b.rank_stat("m", s)() for s in STATS] + [b.hash_mismatch("actor")()])
    assert _same(out[0], out[1]), out


@needs_native
def test_a_state_of_the_reference_loads_into_the_native_buffer_and_back():
    py = PyRankBuffer(8)
    py.track("a")
    for rank in (2, 0, 1):
        py.take(7, rank, {"a": float(rank), "x": 1.0}, {"actor": "h"}, 4)
    py.take(8, 0, {"a": math.inf}, {}, 4)
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(py.to_state()))   # the worker's table
    nat = _native()(8)
    nat.load(state)
    assert nat.to_state() == py.to_state()
    assert list(nat.to_state()["7"]) == ["2", "0", "1"]      # the ranks in the order they came
    with pytest.raises(ValueError):
        nat.load({"seven": {}})
    with pytest.raises(ValueError, match="unknown rank statistic"):
        nat.rank_stat("a", "mean")


def test_the_run_uses_the_native_buffer_with_the_native_core():
    import streams.ranks
    import streams.signals

    if streams.signals.CORE == "native":
        assert streams.ranks.RankBuffer is _native()
    else:
        assert streams.ranks.RankBuffer is PyRankBuffer
