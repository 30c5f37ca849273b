"""Tests of the metric simulator (producers/sim/)."""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

try:
    import producers  # noqa: F401
except ImportError:  # running plain `pytest` without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from producers.sim import (  # noqa: E402
    FAULT_ALGOS,
    FAULT_DESCRIPTIONS,
    FAULTS,
    HEALTHY_FEATURES,
    Range,
    SimConfig,
    Simulator,
    effective_algo,
    simulate,
)
from contract.events import parse_event  # noqa: E402
from tests.support.paths import FAILURE_MODES  # noqa: E402

def _catalog_ids():
    """The ids of the rule catalog (failure-modes.md), in its order."""
    return re.findall(r"^\| `([a-z_0-9]+)` \|", FAILURE_MODES.read_text(), re.M)


CATALOG_IDS = _catalog_ids()

PPO_METRICS = (
    "reward/mean", "reward/std", "kl/mean", "kl/token_max", "kl/token_p99", "kl/beta", "kl/ppo",
    "ppo/epoch", "entropy/mean", "loss/policy", "loss/value", "value/mean", "value/std",
    "returns/mean", "returns/std", "returns/abs_max", "advantages/mean", "advantages/std",
    "ppo/clip_frac", "value/clip_frac", "response/length_mean", "response/length_max",
    "response/truncated_frac", "response/eos_frac", "grad_norm/actor", "grad_norm/critic",
    "update_ratio/actor", "update_ratio/critic", "lr/actor", "lr/critic",
    "gpu/mem_allocated_gb", "judge/score",
)
CRITIC_METRICS = ("loss/value", "value/mean", "value/std", "returns/mean", "grad_norm/critic",
                  "value/clip_frac", "update_ratio/critic", "lr/critic")

ONSET = 300


def _steps(events, rank=0):
    return [e for e in events if e["kind"] == "step" and e.get("rank", 0) == rank]


def _series(events, name):
    return np.array([e["metrics"][name] for e in _steps(events)], dtype=float)


_CACHE: dict = {}


def _run(fault, steps, **kw):
    key = (fault, steps, json.dumps(kw, sort_keys=True))
    if key not in _CACHE:
        cfg = SimConfig(run_id=f"t-{fault}", fault=fault, **kw)
        _CACHE[key] = list(simulate(cfg, steps))
    return _CACHE[key]


# ----------------------------------------------------------------------------------------------
# API surface


def test_fault_table_covers_the_catalog():
    assert len(CATALOG_IDS) >= 42   # the catalog was read
    assert list(FAULTS)[0] == "healthy"
    assert set(FAULTS) == {"healthy", *CATALOG_IDS}
    assert set(FAULT_ALGOS) == set(FAULTS) == set(FAULT_DESCRIPTIONS)
    for fid, row in FAULTS.items():
        assert row.id == fid
        assert row.algos and set(row.algos) <= {"ppo", "grpo", "dpo"}, fid
        assert row.clock in ("steps", "lr", "critic", "kl"), fid
        assert row.magnitude is None or isinstance(row.magnitude, Range), fid
        assert 0 <= row.onset[0] <= row.onset[1], fid
        assert FAULT_DESCRIPTIONS[fid], fid
        assert effective_algo("ppo", fid) in FAULT_ALGOS[fid]
    # all-or-nothing faults are few and named
    assert {f for f, r in FAULTS.items() if r.magnitude is None} == {
        "healthy", "kl_zero", "param_hash_mismatch", "run_stalled", "dead_reward"}


def test_algo_fallbacks():
    assert Simulator(SimConfig("a", fault="grpo_zero_variance")).algo == "grpo"
    assert Simulator(SimConfig("a", fault="dpo_saturation")).algo == "dpo"
    assert Simulator(SimConfig("a", fault="dpo_chosen_decline")).algo == "dpo"
    assert Simulator(SimConfig("a", fault="dead_reward")).algo == "grpo"
    assert Simulator(SimConfig("a", algo="grpo", fault="value_shift")).algo == "ppo"
    assert Simulator(SimConfig("a", algo="grpo", fault="kl_above_target")).algo == "grpo"
    assert Simulator(SimConfig("a", algo="dpo", fault="entropy_blowup")).algo == "ppo"
    assert Simulator(SimConfig("a", fault="rank_outlier")).world_size >= 3
    for bad in (dict(fault="no_such_fault"), dict(algo="a2c"), dict(log_every=0),
                dict(magnitude=1.5), dict(magnitude=-0.1), dict(healthy_variant="sunny"),
                dict(onset=-1)):
        with pytest.raises(ValueError):
            Simulator(SimConfig("a", **bad))


def test_onset_and_magnitude_are_drawn_by_the_seed():
    sims = [Simulator(SimConfig(f"run-{seed}", fault="kl_rising", seed=seed)) for seed in range(40)]
    lo, hi = FAULTS["kl_rising"].onset
    onsets = [s.onset for s in sims]
    mags = [s.magnitude for s in sims]
    assert all(lo <= o <= hi for o in onsets) and len(set(onsets)) > 20
    assert all(0.0 <= q <= 1.0 for q in mags) and min(mags) < 0.2 and max(mags) > 0.8
    rng = FAULTS["kl_rising"].magnitude
    for s in sims:
        assert s.size == pytest.approx(rng.at(s.magnitude))
        assert min(rng.mild, rng.strong) <= s.size <= max(rng.mild, rng.strong)
    # the draw depends on the seed and the fault, not on the run id
    again = Simulator(SimConfig("another-name", fault="kl_rising", seed=7))
    assert (again.onset, again.magnitude) == (sims[7].onset, sims[7].magnitude)
    # explicit values win; the ends of the range are its mildest and strongest sizes
    s0 = Simulator(SimConfig("a", fault="entropy_collapse", onset=123, magnitude=0.0))
    s1 = Simulator(SimConfig("a", fault="entropy_collapse", magnitude=1.0))
    assert s0.onset == 123
    assert (s0.size, s1.size) == (FAULTS["entropy_collapse"].magnitude.mild,
                                  FAULTS["entropy_collapse"].magnitude.strong)
    t = s0.truth()
    assert t["fault"] == "entropy_collapse" and t["onset"] == 123 and t["magnitude"] == 0.0
    assert t["size_unit"] == FAULTS["entropy_collapse"].magnitude.what
    # an all-or-nothing fault has no magnitude; dead_reward starts with the run by default
    dead = Simulator(SimConfig("a", fault="dead_reward", seed=5))
    assert dead.magnitude is None and dead.size is None and dead.onset == 0


def test_log_range_interpolates_geometrically():
    r = Range("x", 0.1, 0.001, log=True)
    assert r.at(0.0) == pytest.approx(0.1) and r.at(1.0) == pytest.approx(0.001)
    assert r.at(0.5) == pytest.approx(0.01)
    assert Range("y", 140.0, 40.0).at(0.5) == pytest.approx(90.0)


def test_the_simulator_reads_no_clock():
    root = Path(__file__).resolve().parents[2] / "producers" / "sim"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in ("time", "datetime")], path


def test_determinism():
    cfg = dict(run_id="det", fault="reward_collapse", onset=40, world_size=3, seed=7,
               samples_every=5, checkpoint_every=20)
    a = json.dumps(list(simulate(SimConfig(**cfg), 120)))
    b = json.dumps(list(simulate(SimConfig(**cfg), 120)))
    assert a == b
    c = json.dumps(list(simulate(SimConfig(**{**cfg, "seed": 8}), 120)))
    assert a != c
    # drawn onsets, magnitudes and healthy features are part of it
    cfg_var = dict(run_id="det-var", fault="reward_crash", seed=4, healthy_variant="all")
    assert json.dumps(list(simulate(SimConfig(**cfg_var), 300))) == json.dumps(
        list(simulate(SimConfig(**cfg_var), 300)))
    # NaN runs are deterministic too (compare through JSON, where NaN == NaN)
    cfg_nan = dict(run_id="det-nan", fault="nan_inf", onset=30)
    assert json.dumps(list(simulate(SimConfig(**cfg_nan), 60))) == json.dumps(
        list(simulate(SimConfig(**cfg_nan), 60)))


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_fault_emits_valid_events(fault):
    onset = 30
    cfg = SimConfig(run_id=f"v-{fault}", fault=fault, onset=onset, world_size=2,
                    samples_every=5, checkpoint_every=25, healthy_variant="all")
    sim = Simulator(cfg)
    events = []
    for s in range(90):
        events.extend(sim.step(s, 1_764_500_000.0 + 2.0 * s))
    assert events
    for e in events:
        ev = parse_event(e, received_at=0.0)  # raises EventError when invalid
        assert ev.run_id == cfg.run_id
        assert e["schema"] == 1
    kinds = Counter(e["kind"] for e in events)
    assert kinds["step"] >= onset * sim.world_size
    assert kinds["checkpoint"] >= 2
    if sim.algo != "dpo":
        assert kinds["samples"] >= 6
        sample_ev = next(e for e in events if e["kind"] == "samples")
        assert len(sample_ev["samples"]) == 8
        for smp in sample_ev["samples"]:
            for k in ("prompt_id", "prompt", "response", "reward", "length", "truncated",
                      "category", "kl", "token_kl_max", "token_kl_argmax"):
                assert k in smp
    # every step has one event per rank; rank 0 carries tags/hashes/groups
    per_step = Counter(e["step"] for e in events if e["kind"] == "step")
    for s in range(onset):
        assert per_step[s] == sim.world_size
    r0 = _steps(events)[0]
    assert r0["tags"]["algo"] == sim.algo
    assert r0["hashes"]["actor"].startswith("sha256:")
    if sim.algo == "ppo":
        for k in PPO_METRICS:
            assert k in r0["metrics"], k
        assert set(r0["groups"]["reward/mean"]) == {"safety", "knowledge", "creative"}
        assert len(r0["dists"]["reward"]) == 64 and len(r0["dists"]["response_length"]) == 64
    elif sim.algo == "grpo":
        assert "reward/frac_zero_std" in r0["metrics"]
        for k in CRITIC_METRICS:
            assert k not in r0["metrics"], k
    else:
        for k in ("dpo/pref_prob", "dpo/margin", "dpo/chosen_reward", "dpo/rejected_reward",
                  "dpo/accuracy", "loss/policy", "grad_norm/actor", "lr/actor"):
            assert k in r0["metrics"], k
    # hashes agree across ranks, except for the hash-mismatch fault after its onset
    by_step: dict[int, set] = {}
    for e in events:
        if e["kind"] == "step":
            by_step.setdefault(e["step"], set()).add(e["hashes"]["actor"])
    for s, hs in by_step.items():
        if fault == "param_hash_mismatch" and s >= onset:
            assert len(hs) == 2
        else:
            assert len(hs) == 1, (fault, s)
    # before the onset nothing is non-finite
    for e in events:
        if e["kind"] == "step" and e["step"] < onset:
            assert all(math.isfinite(v) for v in e["metrics"].values()), (fault, e["step"])


# ----------------------------------------------------------------------------------------------
# healthy runs stay in the healthy bands


def _assert_entropy_never_halves(ent, window=200):
    for t in range(1, len(ent)):
        lo = max(0, t - window)
        assert ent[t] >= 0.5 * ent[lo:t].max(), t


def _assert_not_flat(events, window=500):
    r = _series(events, "reward/mean")
    k = _series(events, "kl/mean")
    for t in range(window + 100, len(r) + 1, 50):
        r_now, r_then = r[t - 100:t].mean(), r[t - window - 100:t - window].mean()
        k_now, k_then = k[t - 100:t].mean(), k[t - window - 100:t - window].mean()
        flat_r = abs(r_now - r_then) < 0.01 * abs(r_then)
        flat_k = abs(k_now - k_then) < 0.01 * abs(k_then)
        assert not (flat_r and flat_k), t


def test_healthy_ppo_2000_steps_stays_in_bands():
    target = 0.1
    ev = _run("healthy", 2000, kl_target=target, world_size=2)
    steps = _steps(ev)
    assert len(steps) == 2000
    for e in steps:
        m = e["metrics"]
        assert all(math.isfinite(v) for v in m.values()), e["step"]
        assert m["kl/mean"] < 1.5 * target
        assert 0.05 <= m["ppo/clip_frac"] <= 0.35
        assert 1e-3 <= m["update_ratio/actor"] <= 1e-1
        assert 1e-3 <= m["update_ratio/critic"] <= 1e-1
        assert m["kl/token_max"] < 10
        assert m["response/truncated_frac"] < 0.05
        assert m["value/mean"] > 0  # no sign change
    _assert_entropy_never_halves(_series(ev, "entropy/mean"))
    kl = _series(ev, "kl/mean")
    assert kl[200:].min() > 1e-3  # never ~0
    r = _series(ev, "reward/mean")
    assert r[-100:].mean() > r[:100].mean() + 0.5  # it learns
    _assert_not_flat(ev)
    # reward std does not collapse, value loss never spikes 10x its recent median
    rs = _series(ev, "reward/std")
    assert rs.min() > 0.5 * np.median(rs[:100])
    vl = _series(ev, "loss/value")
    for t in range(50, len(vl)):
        assert vl[t] < 10 * np.median(vl[t - 50:t])
    # ranks agree: no rank's grad norm is 3x the median
    by_step: dict[int, list] = {}
    for e in ev:
        if e["kind"] == "step":
            by_step.setdefault(e["step"], []).append(e["metrics"]["grad_norm/actor"])
    for s, g in by_step.items():
        assert max(g) < 3 * np.median(g), s


def test_healthy_grpo_1000_steps_stays_in_bands():
    target = 0.1
    ev = _run("healthy", 1000, algo="grpo", kl_target=target)
    steps = _steps(ev)
    assert len(steps) == 1000
    above = 0
    for e in steps:
        m = e["metrics"]
        assert all(math.isfinite(v) for v in m.values()), e["step"]
        assert "loss/value" not in m and "value/mean" not in m
        assert m["kl/mean"] < 2.0 * target  # rare single-step spikes allowed
        assert 0.05 <= m["ppo/clip_frac"] <= 0.35
        assert 1e-3 <= m["update_ratio/actor"] <= 1e-1
        assert m["kl/token_max"] < 10
        assert m["reward/frac_zero_std"] < 0.5
    kl = _series(ev, "kl/mean")
    for t in range(1, len(kl)):  # never two steps in a row above 1.5x target
        above = above + 1 if kl[t] > 1.5 * target else 0
        assert above < 2
    assert 0.01 < np.median(kl[200:]) < target
    _assert_entropy_never_halves(_series(ev, "entropy/mean"))
    r = _series(ev, "reward/mean")
    assert r[-100:].mean() > r[:100].mean() + 0.2


def test_healthy_dpo():
    ev = _run("healthy", 600, algo="dpo")
    m = [e["metrics"] for e in _steps(ev)]
    assert all(x["dpo/pref_prob"] < 0.99 for x in m)
    assert not any(x["rm/train_acc"] > 0.95 and x["rm/val_acc"] < 0.70 for x in m)


# ----------------------------------------------------------------------------------------------
# faults cross the catalog's thresholds within 150 steps of the onset, not before


def _first(cond_steps):
    return min(cond_steps) if cond_steps else None


def _kl_above(ev, target=0.1):
    kl = _series(ev, "kl/mean")
    hits = []
    run = 0
    for t, v in enumerate(kl):
        run = run + 1 if v > 1.5 * target else 0
        if run >= 5:
            hits.append(t)
    return hits


def _entropy_halved(ev):
    ent = _series(ev, "entropy/mean")
    return [t for t in range(1, len(ent)) if ent[t] < 0.5 * ent[max(0, t - 200):t].max()]


def _reward_std_collapsed(ev):
    rs = _series(ev, "reward/std")
    base = np.median(rs[ONSET - 100:ONSET])
    return [t for t in range(len(rs)) if rs[t] < 0.1 * base]


def _nonfinite(ev):
    out = []
    for e in _steps(ev):
        m = e["metrics"]
        if any(not math.isfinite(m.get(k, 0.0)) for k in ("loss/value", "grad_norm/actor")):
            out.append(e["step"])
    return out


def _rank_outlier(ev):
    by_step: dict[int, list] = {}
    for e in ev:
        if e["kind"] == "step":
            by_step.setdefault(e["step"], []).append(e["metrics"]["grad_norm/actor"])
    return [s for s, g in by_step.items() if max(g) > 3 * np.median(g)]


def _kendall(x):
    x = np.asarray(x)
    d = np.sign(x[None, :] - x[:, None])
    n = len(x)
    return d[np.triu_indices(n, 1)].sum() / (n * (n - 1) / 2)


def _length_growth(ev, window=60):
    L = _series(ev, "response/length_mean")
    r = _series(ev, "reward/mean")
    hits = []
    for t in range(window, len(L)):
        w = L[t - window:t]
        grew = w[-10:].mean() > 1.25 * w[:10].mean()
        reward_ok = r[t - 10:t].mean() >= r[t - window:t - window + 10].mean() - 0.05
        if grew and reward_ok and _kendall(w) > 0.5:
            hits.append(t)
    return hits


def _value_loss_spike(ev):
    vl = _series(ev, "loss/value")
    return [t for t in range(100, len(vl)) if vl[t] > 10 * np.median(vl[t - 100:t])]


KEY_FAULTS = {
    "kl_above_target": (_kl_above, {}),
    "entropy_collapse": (_entropy_halved, {}),
    "reward_collapse": (_reward_std_collapsed, {}),
    "nan_inf": (_nonfinite, {}),
    "rank_outlier": (_rank_outlier, {"world_size": 4}),
    "length_hacking": (_length_growth, {}),
    "value_loss_divergence": (_value_loss_spike, {}),
}


@pytest.mark.parametrize("fault", sorted(KEY_FAULTS))
def test_key_fault_crosses_threshold_after_onset(fault):
    """Even the mildest size crosses the catalog's threshold, the strongest no later."""
    detect, kw = KEY_FAULTS[fault]
    first = {}
    for q in (0.0, 1.0):
        ev = _run(fault, ONSET + 301, onset=ONSET, magnitude=q, **kw)
        hits = detect(ev)
        assert not [t for t in hits if t < ONSET], f"{fault} fired before its onset"
        first[q] = _first(hits)
        assert first[q] is not None, f"{fault} at magnitude {q} never crossed its threshold"
    assert first[1.0] <= ONSET + 150
    assert first[1.0] <= first[0.0] <= ONSET + 300
    # the healthy run does not cross the same threshold
    healthy = _run("healthy", ONSET + 301, **kw)
    assert detect(healthy) == []


def test_nan_at_onset():
    ev = _run("nan_inf", ONSET + 151, onset=ONSET, magnitude=0.0)
    assert _nonfinite(ev)[0] == ONSET


def test_reward_collapse_mean_rises_while_std_collapses():
    ev = _run("reward_collapse", ONSET + 151, onset=ONSET, magnitude=0.0)
    r = _series(ev, "reward/mean")
    assert r[ONSET + 100:ONSET + 150].mean() > r[ONSET - 50:ONSET].mean() + 0.3


def test_value_loss_divergence_variants_say_whether_returns_are_abnormal():
    normal = _run("value_loss_divergence", ONSET + 151, onset=ONSET, magnitude=0.0)
    abnormal = list(simulate(SimConfig("vl-data", fault="value_loss_divergence", onset=ONSET,
                                       magnitude=0.0,
                                       fault_params={"returns_abnormal": True}), ONSET + 151))
    for ev, expect_abnormal in ((normal, False), (abnormal, True)):
        assert _value_loss_spike(ev)
        ram = _series(ev, "returns/abs_max")
        ratio = ram[ONSET + 50:].max() / np.median(ram[ONSET - 100:ONSET])
        assert (ratio > 10) == expect_abnormal


# ----------------------------------------------------------------------------------------------
# sample-, rank- and cycle-level faults


def _samples(ev, lo, hi):
    return [e for e in ev if e["kind"] == "samples" and lo <= e["step"] < hi]


def test_tool_words_and_degenerate_text():
    ev = _run("tool_words", ONSET + 101, onset=ONSET, magnitude=1.0)
    before = [max(Counter(s["token_kl_argmax"] for s in e["samples"]).values())
              for e in _samples(ev, 0, ONSET)]
    after = [Counter(s["token_kl_argmax"] for s in e["samples"]).most_common(1)[0]
             for e in _samples(ev, ONSET + 50, ONSET + 101)]
    assert max(before) <= 2
    assert all(tok == "Certainly" and n >= 5 for tok, n in after)

    ev = _run("degenerate_text", ONSET + 101, onset=ONSET, magnitude=1.0)

    def repetition(text):
        w = text.split()
        tri = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
        return 1 - len(set(tri)) / max(1, len(tri))

    rep_before = np.mean([repetition(s["response"]) for e in _samples(ev, 0, ONSET)
                          for s in e["samples"]])
    rep_after = np.mean([repetition(s["response"]) for e in _samples(ev, ONSET + 60, ONSET + 101)
                         for s in e["samples"]])
    assert rep_before < 0.05 and rep_after > 0.5


def test_prompt_extreme_reward():
    ev = _run("prompt_extreme_reward", ONSET + 101, onset=ONSET, magnitude=0.0)
    after = [s for e in _samples(ev, ONSET, ONSET + 101) for s in e["samples"]]
    pid, n = Counter(s["prompt_id"] for s in after).most_common(1)[0]
    assert n >= 5
    rewards = np.array([s["reward"] for s in after])
    extreme = [s["reward"] for s in after if s["prompt_id"] == pid]
    others = rewards[[s["prompt_id"] != pid for s in after]]
    assert min(extreme) > others.mean() + 4 * others.std()
    before = [s["prompt_id"] for e in _samples(ev, 0, ONSET) for s in e["samples"]]
    assert Counter(before).most_common(1)[0][1] <= 3


def test_kl_cycle_delta_sawtooth():
    def max_cycle_delta(ev, lo, hi):
        out, start, last = 0.0, None, None
        for e in _steps(ev):
            m = e["metrics"]
            if last is None or m["ppo/epoch"] <= last:  # a new update cycle starts
                start = m["kl/ppo"]
            last = m["ppo/epoch"]
            if lo <= e["step"] < hi:
                out = max(out, m["kl/ppo"] - start)
        return out

    ev = _run("kl_cycle_delta", ONSET + 101, onset=ONSET, magnitude=0.0)
    assert max_cycle_delta(ev, 0, ONSET) < 0.02
    assert max_cycle_delta(ev, ONSET + 30, ONSET + 101) > 0.02


def test_param_hash_mismatch_on_one_rank():
    ev = _run("param_hash_mismatch", ONSET + 20, onset=ONSET, world_size=4)
    for s in (ONSET - 1, ONSET + 5):
        hs = {e["rank"]: e["hashes"]["actor"] for e in ev if e["kind"] == "step" and e["step"] == s}
        assert len(hs) == 4
        diff = [r for r, h in hs.items() if h != hs[0]]
        assert diff == ([] if s < ONSET else [3])


def test_run_stalled():
    ev = list(simulate(SimConfig("st1", fault="run_stalled", onset=50), 100))
    assert max(e["step"] for e in ev) < 50
    ev = list(simulate(SimConfig("st4", fault="run_stalled", onset=50, world_size=4), 100))
    late = [e for e in ev if e["ts"] >= 1_764_500_000.0 + 2.0 * 50]
    assert late and all(e["kind"] == "heartbeat" for e in late)
    assert {e["rank"] for e in late} == {0, 1, 2}


def test_grpo_zero_variance_and_dpo_saturation():
    ev = _run("grpo_zero_variance", ONSET + 101, onset=ONSET, magnitude=1.0)
    fz = _series(ev, "reward/frac_zero_std")
    assert fz[:ONSET].max() < 0.5 and fz[ONSET + 60:].min() > 0.8
    ev = _run("dpo_saturation", ONSET + 101, onset=ONSET, magnitude=0.0)
    pp = _series(ev, "dpo/pref_prob")
    assert pp[:ONSET].max() < 0.99 and pp[ONSET + 80:].min() > 0.99
    ev = _run("rm_overfit", ONSET + 151, onset=ONSET, magnitude=0.0)
    st = [e["metrics"] for e in _steps(ev)]
    both = [i for i, m in enumerate(st) if m["rm/train_acc"] > 0.95 and m["rm/val_acc"] < 0.70]
    assert both and min(both) >= ONSET and min(both) <= ONSET + 150


# ----------------------------------------------------------------------------------------------
# control: adjust and rollback


def _kl_after(sim, start, n, adjust=None):
    if adjust:
        sim.apply_adjust(adjust)
    out = []
    for s in range(start, start + n):
        ev = sim.step(s, 1_764_500_000.0 + 2.0 * s)
        out.append(ev[0]["metrics"]["kl/mean"])
    return np.array(out)


def test_adjust_beta_lowers_kl():
    def prefix():
        sim = Simulator(SimConfig("adj", fault="kl_above_target", onset=100, magnitude=0.45))
        _kl_after(sim, 0, 170)
        return sim

    base = _kl_after(prefix(), 170, 100)
    sim = prefix()
    adj = _kl_after(sim, 170, 100, adjust={"beta": 2})
    assert sim.beta_factor == 2.0
    assert adj.mean() < 0.75 * base.mean()
    assert adj[-20:].mean() < base[-20:].mean() * 0.5
    # and KL actually recedes after the stronger penalty bites
    assert adj[-10:].mean() < adj[:10].mean()


def test_adjust_lr_slows_learning_and_update_ratio():
    def run(adjust):
        sim = Simulator(SimConfig("adj-lr", fault="length_hacking", onset=100))
        out = []
        for s in range(300):
            if s == 100 and adjust:
                sim.apply_adjust(adjust)
            out.append(sim.step(s, float(s))[0]["metrics"])
        return out

    base, slow = run(None), run({"lr": 0.5})
    assert slow[-1]["lr/actor"] == pytest.approx(0.5 * base[-1]["lr/actor"])
    assert np.mean([m["update_ratio/actor"] for m in slow[200:]]) < 0.7 * np.mean(
        [m["update_ratio/actor"] for m in base[200:]])
    grow_base = np.mean([m["response/length_mean"] for m in base[250:]])
    grow_slow = np.mean([m["response/length_mean"] for m in slow[250:]])
    assert grow_slow < grow_base
    Simulator(SimConfig("x")).apply_adjust({"unknown": 3.0, "beta": "bad"})  # ignored


def test_rollback_resets_the_fault():
    sim = Simulator(SimConfig("rb", fault="kl_above_target", onset=100, checkpoint_every=50,
                              magnitude=0.45, fault_params={"redevelop_after": 150}))
    before = _kl_after(sim, 0, 200)
    assert before[190:].mean() > 0.15
    sim.rollback(100)
    after = _kl_after(sim, 101, 100)
    assert after.max() < 0.1  # restored: healthy again
    assert np.allclose(after[:5].mean(), before[95:100].mean(), rtol=0.5)
    later = _kl_after(sim, 201, 200)
    assert later[-20:].mean() > 0.15  # the fault re-develops after redevelop_after steps
    # never again
    sim2 = Simulator(SimConfig("rb2", fault="nan_inf", onset=60,
                               fault_params={"redevelop_after": None}))
    for s in range(70):
        sim2.step(s, float(s))
    sim2.rollback(50)
    for s in range(51, 400):
        m = sim2.step(s, float(s))[0]["metrics"]
        assert all(math.isfinite(v) for v in m.values())


def test_stagnation_freezes_reward_and_kl():
    ev = _run("stagnation", 900, onset=200, magnitude=1.0)
    r = _series(ev, "reward/mean")
    k = _series(ev, "kl/mean")
    beta = _series(ev, "kl/beta")
    assert beta[400:].min() > 5 * beta[:200].max()  # beta far too high
    assert abs(r[800:900].mean() - r[300:400].mean()) < 0.02 * abs(r[300:400].mean())
    assert abs(k[800:900].mean() - k[300:400].mean()) < 0.05 * k[300:400].mean()
    assert k[300:].mean() < 0.6 * k[100:200].mean()


# ----------------------------------------------------------------------------------------------
# magnitudes: the strongest size of every fault is stronger than the mildest, in the quantity
# its catalog entry names (same seed and run id, so both runs share their noise)

M_ONSET = 100


def _mean(ev, name, lo, hi):
    return float(np.nanmean(_series(ev, name)[lo:hi]))


def _sample_list(ev, lo):
    return [s for e in ev if e["kind"] == "samples" and e["step"] >= lo for s in e["samples"]]


def _dists(ev, name, lo):
    return [np.array(e["dists"][name], dtype=float) for e in _steps(ev)
            if e["step"] >= lo and "dists" in e]


def _share_above(ev, name, lo, level):
    return float(np.mean(np.concatenate(_dists(ev, name, lo)) > level))


def _spearman(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def _repetition(text):
    w = text.split()
    tri = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
    return 1 - len(set(tri)) / max(1, len(tri))


def _rank_ratio(ev, lo):
    bad = [e["metrics"]["grad_norm/actor"] for e in ev
           if e["kind"] == "step" and e["rank"] == 3 and e["step"] >= lo]
    good = [e["metrics"]["grad_norm/actor"] for e in ev
            if e["kind"] == "step" and e["rank"] == 0 and e["step"] >= lo]
    return float(np.mean(bad) / np.mean(good))


def _cycle_delta(ev, lo):
    kp, ep = _series(ev, "kl/ppo")[lo:], _series(ev, "ppo/epoch")[lo:]
    return float(max(kp[i] - kp[i - int(ep[i])] for i in range(8, len(kp))))


O = M_ONSET
# fault -> (extra SimConfig arguments, measure of the trace: larger = stronger)
MEASURES = {
    "kl_above_target": ({}, lambda ev: _mean(ev, "kl/mean", O + 60, O + 120)),
    "kl_rising": ({}, lambda ev: _mean(ev, "kl/mean", O + 60, O + 120)),
    "token_kl_spike": ({}, lambda ev: _mean(ev, "kl/token_max", O + 80, O + 150)),
    "tool_words": ({}, lambda ev: np.mean([s["token_kl_argmax"] == "Certainly"
                                           for s in _sample_list(ev, O + 60)])),
    "entropy_collapse": ({}, lambda ev: -_mean(ev, "entropy/mean", O + 60, O + 120)),
    "reward_spike": ({}, lambda ev: _mean(ev, "reward/mean", O + 15, O + 40)),
    "reward_oscillation": ({}, lambda ev: np.std(np.diff(
        _series(ev, "reward/mean")[O + 50:O + 150]))),
    "reward_periodic": ({}, lambda ev: np.std(_series(ev, "reward/mean")[O + 60:O + 160])),
    "reward_collapse": ({}, lambda ev: -_mean(ev, "reward/std", O + 100, O + 150)),
    "reward_degradation": ({}, lambda ev: -_mean(ev, "reward/mean", O + 120, O + 200)),
    "reward_shape": ({}, lambda ev: _share_above(ev, "reward", O + 60, 3.0)),
    "length_hacking": ({}, lambda ev: _mean(ev, "response/length_mean", O + 100, O + 150)),
    "truncation_rising": ({}, lambda ev: _mean(ev, "response/truncated_frac", O + 100, O + 200)),
    "length_shape": ({}, lambda ev: _share_above(ev, "response_length", O + 60, 600)),
    "reward_length_corr": ({}, lambda ev: np.mean([
        _spearman(r, n) for r, n in zip(_dists(ev, "reward", O + 80),
                                        _dists(ev, "response_length", O + 80))])),
    "reward_quality_divergence": ({}, lambda ev: -_mean(ev, "judge/score", O + 100, O + 200)),
    "value_loss_divergence": ({}, lambda ev: math.log(_mean(ev, "loss/value", O + 40, O + 60))),
    "nan_inf": ({"fault_params": {"where": "grad_norm"}}, lambda ev: float(np.sum(
        ~np.isfinite(_series(ev, "grad_norm/actor"))))),
    "value_shift": ({}, lambda ev: _mean(ev, "value/std", O + 60, O + 120)),
    "clip_frac_high": ({}, lambda ev: _mean(ev, "ppo/clip_frac", O + 40, O + 100)),
    "clip_frac_low": ({}, lambda ev: -_mean(ev, "ppo/clip_frac", O + 50, O + 150)),
    "aggressive_update": ({}, lambda ev: _mean(ev, "ppo/clip_frac", O + 60, O + 120)),
    "kl_cycle_delta": ({}, lambda ev: _cycle_delta(ev, O + 30)),
    "grad_norm_anomaly": ({}, lambda ev: math.log(np.median(
        _series(ev, "grad_norm/actor")[O + 40:O + 60]))),
    "update_ratio": ({}, lambda ev: _mean(ev, "update_ratio/actor", O + 60, O + 120)),
    "rank_outlier": ({"world_size": 4}, lambda ev: _rank_ratio(ev, O + 40)),
    "category_imbalance": ({}, lambda ev: np.mean([
        e["groups"]["reward/mean"]["creative"] - e["groups"]["reward/mean"]["safety"]
        for e in _steps(ev)[O + 100:]])),
    "prompt_extreme_reward": ({}, lambda ev: max(s["reward"] for s in _sample_list(ev, O))),
    "stagnation": ({}, lambda ev: _mean(ev, "kl/beta", O + 50, O + 100)),
    "gpu_memory_spike": ({}, lambda ev: _mean(ev, "gpu/mem_allocated_gb", O + 60, O + 100)),
    "rm_overfit": ({}, lambda ev: -_mean(ev, "rm/val_acc", O + 80, O + 150)),
    "dpo_saturation": ({}, lambda ev: _mean(ev, "dpo/margin", O + 80, O + 150)),
    "grpo_zero_variance": ({}, lambda ev: _mean(ev, "reward/frac_zero_std", O + 60, O + 150)),
    "degenerate_text": ({}, lambda ev: np.mean([_repetition(s["response"])
                                                for s in _sample_list(ev, O + 60)])),
    "entropy_blowup": ({}, lambda ev: _mean(ev, "entropy/mean", O + 40, O + 60)),
    "reward_crash": ({}, lambda ev: -_mean(ev, "reward/mean", O + 10, O + 100)),
    "dpo_chosen_decline": ({}, lambda ev: -_mean(ev, "dpo/chosen_reward", O + 100, O + 150)),
    "proxy_divergence": ({}, lambda ev: _mean(ev, "reward/mean", O + 100, O + 200)),
}


def test_every_fault_with_a_range_has_a_measure():
    assert set(MEASURES) == {f for f, row in FAULTS.items() if row.magnitude is not None}


@pytest.mark.parametrize("fault", sorted(MEASURES))
def test_magnitude_one_is_stronger_than_zero(fault):
    kw, measure = MEASURES[fault]
    mild = measure(_run(fault, O + 201, onset=O, magnitude=0.0, **kw))
    strong = measure(_run(fault, O + 201, onset=O, magnitude=1.0, **kw))
    assert strong > mild, (fault, mild, strong)
    # the mildest is still a fault (where a healthy run has the quantity at all)
    if fault != "rm_overfit":
        healthy = measure(_run("healthy", O + 201, algo=effective_algo("ppo", fault), **kw))
        assert mild > healthy, (fault, healthy, mild)


# ----------------------------------------------------------------------------------------------
# the new catalog entries, at their mildest


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_entropy_blowup_rises_several_fold_while_the_reward_crashes(algo):
    ev = _run("entropy_blowup", ONSET + 101, onset=ONSET, algo=algo, magnitude=0.0)
    ent, r = _series(ev, "entropy/mean"), _series(ev, "reward/mean")
    before = ent[ONSET - 50:ONSET].mean()
    assert ent[:ONSET].max() < 1.3 * before
    assert ent[ONSET + 40] > 2.5 * before       # several-fold within a few dozen steps
    floor = 0.0 if algo == "grpo" else -0.5
    r_before = r[ONSET - 50:ONSET].mean()
    assert r[ONSET + 20:ONSET + 100].mean() < floor + 0.5 * (r_before - floor)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_reward_crash_drops_within_two_steps_and_stays_down(algo):
    ev = _run("reward_crash", ONSET + 151, onset=ONSET, algo=algo, magnitude=0.0)
    r = _series(ev, "reward/mean")
    before = r[ONSET - 50:ONSET]
    step_sd = np.std(np.diff(r[ONSET - 150:ONSET]))
    assert r[ONSET + 2] < before.mean() - 5 * step_sd          # abrupt: within 2 logged points
    assert r[ONSET + 2:ONSET + 150].max() < before.min()       # and it stays down
    strong = _series(_run("reward_crash", ONSET + 151, onset=ONSET, algo="grpo",
                          magnitude=1.0), "reward/mean")
    if algo == "grpo":
        assert strong[ONSET + 5:ONSET + 150].mean() < 0.05     # GRPO: down to ~0


def test_dead_reward_is_exactly_zero_while_the_learning_rate_runs():
    ev = _run("dead_reward", 60)
    steps = _steps(ev)
    assert len(steps) == 60
    for e in steps:
        m = e["metrics"]
        for k in ("reward/mean", "reward/std", "kl/mean", "grad_norm/actor"):
            assert m[k] == 0.0, (k, e["step"])
        assert m["reward/frac_zero_std"] == 1.0
        assert set(e["dists"]["reward"]) == {0.0}
    lr = _series(ev, "lr/actor")
    assert lr[0] > 0 and lr[19] > 3 * lr[0] and np.all(np.diff(lr) >= 0)   # it warms up
    assert np.std(_series(ev, "entropy/mean")) > 0                          # sampling goes on
    assert {s["reward"] for s in _sample_list(ev, 0)} == {0.0}


def test_dpo_chosen_reward_falls_while_the_margin_grows():
    ev = _run("dpo_chosen_decline", ONSET + 151, onset=ONSET, magnitude=0.0)
    chosen, margin = _series(ev, "dpo/chosen_reward"), _series(ev, "dpo/margin")
    assert chosen[ONSET + 100:].mean() < chosen[ONSET - 50:ONSET].mean() - 0.3
    assert margin[ONSET + 100:].mean() > margin[ONSET - 50:ONSET].mean() + 0.1
    rejected = _series(ev, "dpo/rejected_reward")
    assert np.allclose(chosen - rejected, margin)
    healthy = _run("healthy", 800, algo="dpo")   # a healthy chosen reward does not fall so
    hc = _series(healthy, "dpo/chosen_reward")
    assert hc[700:].mean() > hc[200:300].mean() - 0.1


@pytest.mark.parametrize("q", [0.0, 1.0])
def test_proxy_divergence_reward_climbs_while_the_judge_does_not(q):
    ev = _run("proxy_divergence", ONSET + 201, onset=ONSET, magnitude=q)
    r, j = _series(ev, "reward/mean"), _series(ev, "judge/score")
    assert r[ONSET + 150:].mean() > r[ONSET - 50:ONSET].mean() + 0.2
    j_before, j_after = j[ONSET - 50:ONSET].mean(), j[ONSET + 150:].mean()
    if q == 0.0:
        assert abs(j_after - j_before) < 0.03       # flat
    else:
        assert j_after < j_before - 0.05            # falls


@pytest.mark.parametrize("algo", ["ppo", "dpo"])
def test_nan_inf_skipped_steps_have_a_finite_loss(algo):
    ev = _run("nan_inf", ONSET + 301, onset=ONSET, algo=algo, magnitude=1.0,
              fault_params={"where": "grad_norm"})
    g = _series(ev, "grad_norm/actor")
    bad = [t for t in range(len(g)) if not math.isfinite(g[t])]
    assert bad[0] == ONSET and len(bad) >= 5
    assert all(b - a > 1 for a, b in zip(bad, bad[1:]))     # isolated: never two in a row
    assert np.all(np.isfinite(_series(ev, "loss/policy")))
    # the default: the loss itself turns non-finite, for good
    ev = _run("nan_inf", ONSET + 11, onset=ONSET, algo=algo)
    loss = _series(ev, "loss/policy")
    assert np.all(np.isfinite(loss[:ONSET])) and not np.any(np.isfinite(loss[ONSET:]))


# ----------------------------------------------------------------------------------------------
# log_every: sparse runs, as real runs log


@pytest.mark.parametrize("fault", ["healthy", "kl_above_target", "reward_oscillation",
                                   "nan_inf", "rank_outlier", "run_stalled"])
def test_log_every_thins_the_events_without_changing_them(fault):
    cfg = dict(run_id=f"le-{fault}", fault=fault, onset=60, world_size=3, samples_every=10,
               checkpoint_every=50, seed=2, healthy_variant="all")
    full = list(simulate(SimConfig(**cfg), 200))
    thin = list(simulate(SimConfig(**cfg, log_every=5), 200))
    kept = [e for e in full if e["kind"] in ("checkpoint", "heartbeat") or e["step"] % 5 == 0]
    assert json.dumps(thin) == json.dumps(kept)
    logged = {e["step"] for e in thin if e["kind"] == "step"}
    assert logged and all(s % 5 == 0 for s in logged)
    assert len(logged) == len({e["step"] for e in full if e["kind"] == "step"}) // 5
    if fault != "run_stalled":   # a stalled run stops checkpointing too
        assert {e["step"] for e in thin if e["kind"] == "checkpoint"} == {0, 50, 100, 150}


def test_a_run_of_forty_logged_points():
    ev = list(simulate(SimConfig("sparse", fault="entropy_blowup", onset=200, log_every=10,
                                 magnitude=0.0), 400))
    steps = _steps(ev)
    assert [e["step"] for e in steps] == list(range(0, 400, 10))
    ent = np.array([e["metrics"]["entropy/mean"] for e in steps])
    assert ent[24] > 2.5 * ent[15:20].mean()    # step 240 against steps 150-190


# ----------------------------------------------------------------------------------------------
# healthy variety


def test_healthy_variant_selects_features():
    assert Simulator(SimConfig("h")).healthy_features == ()
    assert Simulator(SimConfig("h", healthy_variant="plain")).healthy_features == ()
    assert Simulator(SimConfig("h", healthy_variant="all")).healthy_features == tuple(
        sorted(HEALTHY_FEATURES))
    assert Simulator(SimConfig("h", healthy_variant="spikes,lr_warmup")).healthy_features == (
        "lr_warmup", "spikes")
    assert Simulator(SimConfig("h", healthy_variant=("value_fit",))).healthy_features == (
        "value_fit",)
    drawn = [Simulator(SimConfig("h", seed=s, healthy_variant="random")).healthy_features
             for s in range(40)]
    assert drawn == [Simulator(SimConfig("x", seed=s, healthy_variant="random")).healthy_features
                     for s in range(40)]                  # by the seed, not the run id
    for feature in HEALTHY_FEATURES:
        share = np.mean([feature in d for d in drawn])
        assert 0.2 < share < 0.8, feature


def test_lr_warmup_rises_from_zero():
    sim = Simulator(SimConfig("w", seed=1, healthy_variant="lr_warmup"))
    steps = [sim.step(s, float(s))[0]["metrics"] for s in range(300)]
    lr = np.array([m["lr/actor"] for m in steps])
    w = sim._bg.warmup_steps
    assert 50 <= w <= 200
    assert lr[0] < 0.03 * lr[-1]
    assert np.all(np.diff(lr[:w]) > 0) and np.allclose(lr[w:], lr[-1])
    assert steps[0]["update_ratio/actor"] < 1e-3 < steps[w + 10]["update_ratio/actor"]
    plain = _series(_run("healthy", 300), "lr/actor")
    assert plain[0] == pytest.approx(0.2 * plain[-1])


def test_value_fit_moves_value_mean_and_std_early():
    for seed in range(4):
        ev = list(simulate(SimConfig("v", seed=seed, healthy_variant="value_fit"), 400))
        vm, rm = _series(ev, "value/mean"), _series(ev, "returns/mean")
        vs, rs = _series(ev, "value/std"), _series(ev, "returns/std")
        early, late = slice(0, 5), slice(250, 400)
        assert np.mean(np.abs(vm[early] - rm[early])) > 0.5 * abs(rm[early].mean())
        assert np.mean(np.abs(vm[late] - rm[late])) < 0.1 * abs(rm[late].mean())
        ratio_early, ratio_late = vs[early].mean() / rs[early].mean(), vs[late].mean() / rs[
            late].mean()
        assert ratio_early < 0.3 or ratio_early > 1.8    # far too narrow or far too wide
        assert 0.6 < ratio_late < 1.1
        assert vm[250:].min() > 0                        # fitted: the sign of the returns


def test_spikes_last_one_step():
    ev = _run("healthy", 1000, algo="grpo", healthy_variant="spikes", seed=4)
    sim = Simulator(SimConfig("t-healthy", algo="grpo", healthy_variant="spikes", seed=4))
    for kind, name in (("kl", "kl/mean"), ("reward", "reward/mean"), ("grad", "grad_norm/actor")):
        x = _series(ev, name)
        at = [s for s in range(1, 999) if sim._bg.spike(kind, s)]
        assert len(at) == 4, kind                           # one per 250 steps
        for s in at:
            around = np.median(np.abs(np.diff(x[max(1, s - 30):s - 1])))
            jump, back = abs(x[s] - x[s - 1]), abs(x[s + 1] - x[s - 1])
            assert jump > 4 * around and back < 0.5 * jump, (kind, s)


def test_low_entropy_drifts_slowly_and_never_halves():
    for algo in ("ppo", "grpo"):
        ev = _run("healthy", 2000, algo=algo, healthy_variant="low_entropy_drift", seed=1)
        ent = _series(ev, "entropy/mean")
        assert ent[:100].mean() < 0.55
        assert ent[-200:].mean() < 0.8 * ent[:200].mean()   # drifting down
        _assert_entropy_never_halves(ent)


def test_kl_grows_from_zero_in_the_first_half():
    for algo in ("ppo", "grpo"):
        ev = _run("healthy", 1600, algo=algo, healthy_variant="kl_from_zero", seed=2)
        kl = _series(ev, "kl/mean")
        assert kl[:10].mean() < 0.01
        assert kl[700:800].mean() > 1.5 * kl[100:200].mean()   # still growing past step 200
        assert 0.4 * 0.1 < np.median(kl[800:]) < 0.1            # toward the target, below it


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_every_healthy_feature_at_once_stays_healthy(algo):
    target = 0.1
    ev = _run("healthy", 1500, algo=algo, healthy_variant="all", seed=3)
    sim = Simulator(SimConfig("t-healthy", algo=algo, healthy_variant="all", seed=3))
    spikes = {s for s in range(1500) if sim._bg.spike("kl", s)}
    for e in _steps(ev):
        m = e["metrics"]
        assert all(math.isfinite(v) for v in m.values()), e["step"]
        if e["step"] not in spikes:
            assert m["kl/mean"] <= 1.8 * target
    _assert_entropy_never_halves(_series(ev, "entropy/mean"))
    r = _series(ev, "reward/mean")
    assert r[-100:].mean() > r[:100].mean() + 0.2
    if algo == "ppo":   # fitted; a KL spike's penalty can take one step's returns below 0
        vm = _series(ev, "value/mean")
        assert min(vm[s] for s in range(300, 1500) if s not in spikes) > 0
