"""The native signal bank (streams._native, built from native/ in Rust) gives the numbers of the
pure one (streams.signals.PyBank, the reference) bit for bit: every reader of every signal at
every step, on random streams with gaps, NaN/inf, constant stretches and long runs, read at
irregular steps; the same run states; the same alerts through the whole pipeline.

The native module must be built for these tests (scripts/install.sh builds it; CI too): they
fail when it is missing, unless RLWATCH_NATIVE=0 is set (the pure core on purpose)."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rules.schema import MIN_POINTS, READY_POINTS
from streams import signals
from streams.signals import PyBank

from tests.unit._core import PURE_ASKED  # noqa: E402

if PURE_ASKED:
    pytest.skip("RLWATCH_NATIVE=0: the pure core was asked for", allow_module_level=True)

try:
    from streams._native import Bank as NativeBank
except ImportError as e:   # a broken build must not pass silently
    raise AssertionError(
        f"streams._native is not built ({e}): run `pip install -e .` with a Rust toolchain "
        "(scripts/install.sh), or set RLWATCH_NATIVE=0 to test the pure core only") from e

SIGNALS = ("value", "ema", "cycle_rise", "follow_z", "start", "ratio_to_start", "start_z", "gain_t",
           "noise_ratio", "ratio_to_start_max", "delta", "shift_z", "level_ratio", "shift_rel",
           "range_pos", "level_to_max", "ratio_to_max", "over_max_z", "shift_dz", "jump_dz", "jump_t", "shift_gain", "drawdown_gain", "median",
           "min", "max", "range", "mean", "std", "trend_z", "trend_tau", "slope", "ratio_to_median", "zscore",
           "robust_z", "rel_drop", "rel_rise", "flat_range", "rel_trend", "trend_gain", "level_change",
           "sign_flip_rate", "diff_ratio", "autocorr")


def test_every_signal_of_the_pure_bank_is_ported():
    import inspect
    src = inspect.getsource(signals._signal_reader)
    named = {s for s in SIGNALS if f'"{s}"' in src}
    assert named == set(SIGNALS)
    assert set(MIN_POINTS) == set(SIGNALS)


def test_the_native_bank_is_the_one_in_use():
    assert signals.CORE == "native" and signals.Bank is NativeBank
    assert signals.core_note() is None


# -- the comparison ----------------------------------------------------------------------------

def same(a, b) -> bool:
    """Equal bit for bit (any NaN equals any NaN: the reference's NaNs carry no meaning)."""
    if isinstance(a, float) and isinstance(b, float):
        if a != a or b != b:
            return a != a and b != b
        return struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


def call(read):
    try:
        return read()
    except Exception as e:   # what the pure bank raises (or numpy warns, as an error under
        return type(e).__name__   # pytest), the native one must raise too


def canon(state) -> str:
    """A state as JSON text (what a run state becomes): floats by repr, so 0.0 != -0.0."""
    return json.dumps(state, sort_keys=True, allow_nan=True)


def spec(sig, window, smooth, min_steps, *, second="c", ready=None, points=None, ramp=None,
         ramp_steps=None):
    return ("m", sig, window, smooth, second if sig in ("cycle_rise", "follow_z") else None,
            min_steps, MIN_POINTS[sig] if points is None else points,
            READY_POINTS[sig] if ready is None else ready, ramp, ramp_steps)


class Pair:
    """The pure and the native bank, compiled with the same readers, fed the same steps."""

    def __init__(self, specs):
        self.banks = (PyBank(), NativeBank())
        self.specs = list(specs)
        self.readers = [[b.metric(*s) for s in self.specs] for b in self.banks]
        # readers are shared for the same key, as in the pure bank
        assert self.banks[1].metric(*self.specs[0]) is self.readers[1][0]

    def update(self, step, metrics):
        for b in self.banks:
            b.update(step, dict(metrics))

    def check(self, which=None, where=""):
        py, nat = self.readers
        for i in (range(len(self.specs)) if which is None else which):
            a, b = call(py[i]), call(nat[i])
            assert same(a, b), f"{self.specs[i]} {where}: pure {a!r}, native {b!r}"

    def check_state(self, where=""):
        sp, sn = (b.to_state() for b in self.banks)
        assert canon(sp) == canon(sn), where
        assert self.banks[0].smoothed() == self.banks[1].smoothed(), where
        assert self.banks[0].version == self.banks[1].version
        assert self.banks[0].step == self.banks[1].step


def ramp_value(rng: random.Random, i: int, rise: int) -> float:
    """A learning rate: a warm-up over ``rise`` points, then a decay; now and then a restart
    above the old high, a value that only rounds up, a tiny rate or a NaN."""
    r = rng.random()
    if r < 0.02:
        return math.nan
    if r < 0.03:
        return 1e-4 * (1 + 1e-7)          # above the high by less than a millionth
    if r < 0.035:
        return 2e-4 if rng.random() < 0.5 else 0.0
    return 1e-4 * (i / rise if i < rise else max(0.0, 1.0 - (i - rise) / 5000))


def stream(rng: random.Random, n: int, *, gaps=True, specials=True, flat=True):
    """(step, metrics) of a metric "m", a sawtooth "c" (an update cycle, a second metric) and a
    learning rate "r" that warms up (the ramp of after_warmup_of)."""
    step, level, cyc = rng.randrange(0, 50), rng.uniform(-5, 5), 0.0
    rise = rng.randrange(1, 300)
    out = []
    for i in range(n):
        r = rng.random()
        if gaps and r < 0.05:
            step += rng.randrange(2, 12)
        elif gaps and r < 0.06:
            step += rng.randrange(30, 400)     # longer than most windows: everything evicted
        elif gaps and r < 0.065:
            step -= rng.randrange(0, 3)        # a repeated or older step
        else:
            step += 1
        if rng.random() < 0.02:
            level += rng.gauss(0, 3)           # a shift
        x = level + rng.gauss(0, 0.3) + (0.01 * i if rng.random() < 0.3 else 0.0)
        r = rng.random()
        if flat and 0.3 < (i % 97) / 97 < 0.45:
            x = round(level, 1)                # a constant stretch: ties everywhere
        if specials and r < 0.02:
            x = rng.choice([math.nan, math.inf, -math.inf])
        elif specials and r < 0.03:
            x = rng.choice([0.0, -0.0, 1e-300, -1e12, 1e12])
        cyc = 0.0 if rng.random() < 0.1 else cyc + 1.0
        metrics = {"m": x, "c": cyc if rng.random() > 0.03 else math.nan,
                   "r": ramp_value(rng, i, rise)}
        if rng.random() < 0.05:
            del metrics["m"]                   # not logged at this step
        if rng.random() < 0.05:
            del metrics["c"]
        if rng.random() < 0.2:
            del metrics["r"]                   # a rate logged less often
        out.append((step, metrics))
    return out


ALL_SPECS = [spec(sig, w, sm, ms)
             for sig in SIGNALS
             for w in (5, 8, 20, 64)
             for sm in (None, 3)
             for ms in (0, 12)] + [
    # a long EMA: gaps of more than 10 steps meet its floor (an average over at least 5 points)
    spec(sig, w, 50, 0) for sig in SIGNALS for w in (8, 64)] + [
    # the warm-up counted from the end of a learning rate's ramp; "x" is never logged; the
    # steps past the ramp given apart from the run's (after_warmup_steps), longer or shorter
    spec(sig, w, None, ms, ramp=ramp, ramp_steps=rs)
    for sig in SIGNALS
    for w in (8, 64)
    for ms, rs in ((12, None), (100, None), (100, 20), (0, 30))
    for ramp in ("r", "x")]


def run_pair(pair: Pair, events, rng: random.Random, *, read_p=0.7, state_every=0):
    n = len(pair.specs)
    for i, (step, metrics) in enumerate(events):
        pair.update(step, metrics)
        if rng.random() < read_p:
            which = [j for j in range(n) if rng.random() < read_p]
            pair.check(which, where=f"event {i} step {step}")
            if rng.random() < 0.2:      # a second read at the same version: the memo
                pair.check(which, where=f"event {i} step {step} (again)")
        if state_every and i % state_every == state_every - 1:
            pair.check_state(where=f"event {i}")
    pair.check(where="end")
    pair.check_state(where="end")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_signal_long_seeded_streams(seed):
    rng = random.Random(seed)
    pair = Pair(ALL_SPECS)
    run_pair(pair, stream(rng, 1500), rng, state_every=250)


def test_every_signal_read_at_every_step_without_specials():
    rng = random.Random(7)
    pair = Pair(ALL_SPECS)
    run_pair(pair, stream(rng, 700, specials=False), rng, read_p=1.0)


def test_a_long_clean_run_with_every_step_logged():
    """No gaps, no NaN: windows fill and slide, the every-128-points re-summing happens."""
    rng = random.Random(11)
    specs = [spec(sig, w, sm, 0) for sig in SIGNALS for w in (20, 300) for sm in (None, 7)]
    pair = Pair(specs)
    run_pair(pair, stream(rng, 2000, gaps=False, specials=False, flat=False), rng, read_p=0.5)


@pytest.mark.parametrize("seed", [4, 5])
def test_gain_signals_of_a_metric_first_watched_mid_training(seed):
    """A run first watched at step 500 (resumed, or a monitor attached late): the gain
    signals count at least half its start's level as its gain (Track.gain_unit), alike in
    both banks, through shifts, gaps, non-finite values and a state written on the way."""
    rng = random.Random(seed)
    events = [(step + 500, metrics) for step, metrics in stream(rng, 900)]
    specs = [spec(sig, w, sm, ms) for sig in ("shift_gain", "drawdown_gain", "trend_gain")
             for w in (8, 64, 300) for sm in (None, 3) for ms in (0, 12)]
    pair = Pair(specs)
    run_pair(pair, events, rng, read_p=0.8, state_every=150)


@pytest.mark.parametrize("seed", [8, 9])
def test_every_signal_of_a_metric_on_a_lattice(seed):
    """A reward of one group of four answers a step takes values a quarter apart, mostly
    repeated: the robust scales' floor (the smallest deviation that is not 0, the data's
    resolution) reads alike in both banks, with and without NaN and infinities among them."""
    rng = random.Random(seed)

    def on_lattice(metrics):
        x = metrics.get("m")
        if x is not None and math.isfinite(x):
            metrics["m"] = round(x * 4) / 4 if abs(x) < 1e6 else x
        return metrics

    events = [(step, on_lattice(m)) for step, m in stream(rng, 1200)]
    pair = Pair(ALL_SPECS)
    run_pair(pair, events, rng, read_p=0.8, state_every=300)


def test_extreme_magnitudes_give_the_same_numbers_or_the_same_errors():
    rng = random.Random(5)
    events = []
    for i in range(400):
        x = rng.choice([1e300, -1e300, 1e-310, 5e-324, 1e154, -1e160, 0.0, -0.0,
                        rng.gauss(0, 1e200), rng.gauss(0, 1)])
        events.append((i, {"m": x, "c": float(i % 7)}))
    pair = Pair(ALL_SPECS)
    run_pair(pair, events, rng, read_p=0.8)


@st.composite
def cases(draw):
    sigs = draw(st.lists(st.sampled_from(SIGNALS), min_size=1, max_size=4))
    specs = []
    for sig in sigs:
        specs.append(spec(sig, draw(st.sampled_from([1, 2, 3, 5, 6, 10, 25, 40])),
                          draw(st.sampled_from([None, 1, 2, 5])),
                          draw(st.sampled_from([0, 1, 3, 8])),
                          ready=draw(st.sampled_from([None, 0, 1, 6])),
                          points=draw(st.sampled_from([None, 0, 1, 4, 13])),
                          ramp=draw(st.sampled_from([None, None, "r", "c"])),
                          ramp_steps=draw(st.sampled_from([None, None, 2, 9]))))
    value = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        st.floats(-10, 10), st.sampled_from([0.0, -0.0, 1.0, 2.5, -1.0]),
        st.integers(-3, 3).map(float))
    n = draw(st.integers(1, 160))
    steps, s = [], draw(st.integers(0, 5))
    for _ in range(n):
        s += draw(st.sampled_from([1, 1, 1, 1, 2, 3, 0, 7, 30]))
        steps.append(s)
    events = []
    for step in steps:
        m = {}
        if draw(st.booleans()) or draw(st.booleans()):
            m["m"] = draw(value)
        if draw(st.booleans()):
            m["c"] = draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, math.nan]))
        if draw(st.booleans()):
            m["r"] = draw(st.sampled_from([0.0, 1e-5, 2e-5, 3e-5, 3e-5 * (1 + 1e-7), -1.0,
                                           math.nan, math.inf]))
        events.append((step, m))
    reads = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return specs, events, reads


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases())
def test_random_streams_hypothesis(case):
    specs, events, reads = case
    pair = Pair(specs)
    for i, ((step, metrics), read) in enumerate(zip(events, reads)):
        pair.update(step, metrics)
        if read:
            pair.check(where=f"event {i} step {step}")
    pair.check(where="end")
    pair.check_state(where="end")


# -- states --------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", ["pure->native", "native->pure"])
def test_a_state_written_by_one_bank_continues_in_the_other(direction):
    rng = random.Random(3)
    events = stream(rng, 900)
    first, rest = events[:500], events[500:]
    src_cls, dst_cls = (PyBank, NativeBank) if direction == "pure->native" else (NativeBank, PyBank)

    def compiled(cls):
        b = cls()
        return b, [b.metric(*s) for s in ALL_SPECS]

    src, _ = compiled(src_cls)
    ref, ref_readers = compiled(PyBank)          # the pure bank that never restarted
    for step, m in first:
        src.update(step, dict(m))
        ref.update(step, dict(m))
    # through JSON, as a run state is written and read back
    state = json.loads(json.dumps(src.to_state()))
    dst, dst_readers = compiled(dst_cls)
    dst.load(state)
    dst.step = src.step
    ref2, ref2_readers = compiled(PyBank)        # the pure bank restarted from the same state
    ref2.load(json.loads(json.dumps(ref.to_state())))
    ref2.step = ref.step
    assert canon(dst.to_state()) == canon(ref2.to_state())
    for i, (step, m) in enumerate(rest):
        dst.update(step, dict(m))
        ref2.update(step, dict(m))
        for s, a, b in zip(ALL_SPECS, ref2_readers, dst_readers):
            x, y = call(a), call(b)
            assert same(x, y), f"{s} event {i}: pure {x!r}, {direction} {y!r}"
    assert canon(dst.to_state()) == canon(ref2.to_state())


def test_load_without_json_keeps_the_same_state():
    """RunState.bind hands a bank's to_state straight to a new bank's load (no JSON)."""
    rng = random.Random(9)
    pair = Pair(ALL_SPECS)
    for step, m in stream(rng, 400):
        pair.update(step, m)
    again = Pair(ALL_SPECS)
    for b, old in zip(again.banks, pair.banks):
        b.load(old.to_state())
        b.step = old.step
    again.check_state()
    again.check()
    for step, m in stream(rng, 200):
        again.update(step, m)
        again.check()
    again.check_state()


def test_the_tracks_are_visible_as_in_the_pure_bank():
    pair = Pair([spec("value", None, 5, 0), spec("ema", 10, None, 0)])
    for s in range(30):
        pair.update(s, {"m": float(s % 4)})
    py, nat = (b.tracks for b in pair.banks)
    assert set(py) == set(nat) == {("m", 5), ("m", None)}
    for k in py:
        assert list(py[k].values) == list(nat[k].values)
        assert same(py[k].smoothed(), nat[k].smoothed())
    assert pair.banks[1].by_metric and not NativeBank().by_metric


# -- the whole pipeline ----------------------------------------------------------------------

def test_the_fleet_gives_the_same_alerts_with_either_bank(monkeypatch):
    import sys
    from pathlib import Path

    import streams.run
    from contract.events import parse_event
    from rules.loader import load_pack
    from streams.processor import Pipeline

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from bench_fleet_replay import fleet_lines

    lines = fleet_lines(6, 160)
    pack = load_pack("rlhf")
    out = {}
    for name, cls in (("pure", PyBank), ("native", NativeBank)):
        monkeypatch.setattr(streams.run, "Bank", cls)
        pipe = Pipeline(pack)
        alerts = []
        for raw in lines:
            ev = parse_event(raw, 0.0)
            alerts += [json.dumps(a.model_dump(), sort_keys=True, default=repr)
                       for a in pipe.feed(ev, ev.ts)]
        out[name] = alerts
        states = {r: canon(st.to_state()) for r, st in pipe.runs.items()}
        out[name + " states"] = states
    assert out["pure"], "the fleet raises alerts"
    assert out["native"] == out["pure"]
    assert out["native states"] == out["pure states"]


def test_the_autocorrelation_of_periodic_runs_is_the_same_to_the_last_bit():
    """reward_periodic's signal (a window of 160) on rewards that swing with periods of 3 to 40
    steps, with noise, a drift and a shift: the native autocorrelation gives the pure one's
    number at every step it is read."""
    rng = random.Random(21)
    specs = [spec("autocorr", w, sm, 0) for w in (20, 160) for sm in (None, 5)]
    for period in (3, 7, 12, 40):
        pair = Pair(specs)
        events = []
        for i in range(600):
            x = math.sin(2 * math.pi * i / period) * 0.4 + rng.gauss(0, 0.2) + 0.001 * i
            if i > 400:
                x += 2.0
            events.append((i, {"m": x, "c": float(i % 5)}))
        run_pair(pair, events, rng, read_p=1.0)
        assert any(call(r) > 0.5 for r in pair.readers[0]), f"period {period}: no peak found"


@pytest.mark.parametrize("offset", [0, 100, 200, 60_000, 70_000, 2**32 - 300, 2**40])
def test_the_native_bank_writes_its_state_as_msgspec_would(offset):
    """The worker writes each rank's statistics with Bank.to_msgpack() (no Python objects built):
    the bytes must be msgspec's MessagePack of to_state(), whatever the values (NaN, infinities,
    collecting and frozen baselines, EMAs, cycles, cached autocorrelations) and wherever the steps
    fall on the boundaries of MessagePack's integer forms."""
    import msgspec

    rng = random.Random(offset + 5)
    pair = Pair(ALL_SPECS)
    checked = 0
    for i, (step, m) in enumerate(stream(rng, 700)):
        pair.update(step + offset, m)
        if i in (0, 3, 40, 150, 400, 699):
            for b in pair.banks:
                got = b.to_msgpack()
                assert got == msgspec.msgpack.encode(b.to_state()), (type(b).__name__, i)
            assert msgspec.msgpack.decode(pair.banks[1].to_msgpack()) == msgspec.msgpack.decode(
                pair.banks[0].to_msgpack())
            checked += 1
    assert checked == 6
    assert b'\xcb' in pair.banks[1].to_msgpack()       # floats as float64, as msgspec writes them


@pytest.mark.parametrize("seed", [4, 5])
def test_a_bank_taken_back_to_a_checkpoint_reads_alike_in_both_cores(seed):
    """A run gone back to a checkpoint (rollback, resume) loads its statistics without the
    points after it (signals.rewind_state) into freshly compiled banks: both cores read the same
    from there, and go on alike."""
    rng = random.Random(seed)
    events = stream(rng, 1200)
    pair = Pair(ALL_SPECS)
    run_pair(pair, events[:800], rng, read_p=0.3)
    last = events[780][0] - 25
    state = signals.rewind_state(pair.banks[0].to_state(), last)
    assert all(s <= last for _, _, t in state["tracks"] for s in t["steps"])
    back = Pair(ALL_SPECS)
    for b in back.banks:
        b.load(state)
    back.check(where="after the rewind")
    back.check_state(where="after the rewind")
    run_pair(back, [(last + 1 + i, m) for i, (_, m) in enumerate(events[800:])], rng)
