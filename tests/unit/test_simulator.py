"""Tests of the metric simulator (producers/simulator.py)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

try:
    import producers  # noqa: F401
except ImportError:  # running plain `pytest` without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from producers.simulator import (  # noqa: E402
    FAULT_ALGOS,
    FAULTS,
    SimConfig,
    Simulator,
    effective_algo,
    simulate,
)
from contract.events import parse_event  # noqa: E402

CATALOG_IDS = (
    "kl_above_target", "kl_rising", "kl_zero", "token_kl_spike", "tool_words", "entropy_collapse",
    "reward_spike", "reward_oscillation", "reward_periodic", "reward_collapse",
    "reward_degradation", "reward_shape", "length_hacking", "truncation_rising", "length_shape",
    "reward_length_corr", "reward_quality_divergence", "value_loss_divergence", "nan_inf",
    "value_shift", "clip_frac_high", "clip_frac_low", "aggressive_update", "kl_cycle_delta",
    "grad_norm_anomaly", "update_ratio", "rank_outlier", "param_hash_mismatch",
    "category_imbalance", "prompt_extreme_reward", "stagnation", "gpu_memory_spike",
    "run_stalled", "rm_overfit", "dpo_saturation", "grpo_zero_variance", "degenerate_text",
)

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
    key = (fault, steps, tuple(sorted(kw.items())))
    if key not in _CACHE:
        cfg = SimConfig(run_id=f"t-{fault}", fault=fault, **kw)
        _CACHE[key] = list(simulate(cfg, steps))
    return _CACHE[key]


# ----------------------------------------------------------------------------------------------
# API surface


def test_fault_names_cover_the_catalog():
    assert FAULTS[0] == "healthy"
    assert len(set(FAULTS)) == len(FAULTS)
    for fid in CATALOG_IDS:
        assert fid in FAULTS, fid
    assert set(FAULT_ALGOS) == set(FAULTS)
    for fault in FAULTS:
        assert FAULT_ALGOS[fault], fault
        assert effective_algo("ppo", fault) in FAULT_ALGOS[fault]


def test_algo_fallbacks():
    assert Simulator(SimConfig("a", fault="grpo_zero_variance")).algo == "grpo"
    assert Simulator(SimConfig("a", fault="dpo_saturation")).algo == "dpo"
    assert Simulator(SimConfig("a", algo="grpo", fault="value_shift")).algo == "ppo"
    assert Simulator(SimConfig("a", algo="grpo", fault="kl_above_target")).algo == "grpo"
    assert Simulator(SimConfig("a", fault="rank_outlier")).world_size >= 2
    with pytest.raises(ValueError):
        Simulator(SimConfig("a", fault="no_such_fault"))
    with pytest.raises(ValueError):
        Simulator(SimConfig("a", algo="a2c"))


def test_determinism():
    cfg = dict(run_id="det", fault="reward_collapse", onset=40, world_size=3, seed=7,
               samples_every=5, checkpoint_every=20)
    a = json.dumps(list(simulate(SimConfig(**cfg), 120)))
    b = json.dumps(list(simulate(SimConfig(**cfg), 120)))
    assert a == b
    c = json.dumps(list(simulate(SimConfig(**{**cfg, "seed": 8}), 120)))
    assert a != c
    # NaN runs are deterministic too (compare through JSON, where NaN == NaN)
    cfg_nan = dict(run_id="det-nan", fault="nan_inf", onset=30)
    assert json.dumps(list(simulate(SimConfig(**cfg_nan), 60))) == json.dumps(
        list(simulate(SimConfig(**cfg_nan), 60)))


@pytest.mark.parametrize("fault", FAULTS)
def test_every_fault_emits_valid_events(fault):
    onset = 30
    cfg = SimConfig(run_id=f"v-{fault}", fault=fault, onset=onset, world_size=2,
                    samples_every=5, checkpoint_every=25)
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
        assert "dpo/pref_prob" in r0["metrics"]
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
    detect, kw = KEY_FAULTS[fault]
    ev = _run(fault, ONSET + 151, onset=ONSET, **kw)
    hits = detect(ev)
    assert not [t for t in hits if t < ONSET], f"{fault} fired before its onset"
    first = _first(hits)
    assert first is not None, f"{fault} never crossed its threshold"
    assert first <= ONSET + 150
    # the healthy run does not cross the same threshold
    healthy = _run("healthy", ONSET + 151, **kw)
    assert detect(healthy) == []


def test_nan_at_onset():
    ev = _run("nan_inf", ONSET + 151, onset=ONSET)
    assert _nonfinite(ev)[0] == ONSET


def test_reward_collapse_mean_rises_while_std_collapses():
    ev = _run("reward_collapse", ONSET + 151, onset=ONSET)
    r = _series(ev, "reward/mean")
    assert r[ONSET + 100:ONSET + 150].mean() > r[ONSET - 50:ONSET].mean() + 0.3


def test_value_loss_divergence_variants_say_whether_returns_are_abnormal():
    normal = _run("value_loss_divergence", ONSET + 151, onset=ONSET)
    abnormal = list(simulate(SimConfig("vl-data", fault="value_loss_divergence", onset=ONSET,
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
    ev = _run("tool_words", ONSET + 101, onset=ONSET)
    before = [max(Counter(s["token_kl_argmax"] for s in e["samples"]).values())
              for e in _samples(ev, 0, ONSET)]
    after = [Counter(s["token_kl_argmax"] for s in e["samples"]).most_common(1)[0]
             for e in _samples(ev, ONSET + 50, ONSET + 101)]
    assert max(before) <= 2
    assert all(tok == "Certainly" and n >= 5 for tok, n in after)

    ev = _run("degenerate_text", ONSET + 101, onset=ONSET)

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
    ev = _run("prompt_extreme_reward", ONSET + 101, onset=ONSET)
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

    ev = _run("kl_cycle_delta", ONSET + 101, onset=ONSET)
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
    ev = _run("grpo_zero_variance", ONSET + 101, onset=ONSET)
    fz = _series(ev, "reward/frac_zero_std")
    assert fz[:ONSET].max() < 0.5 and fz[ONSET + 60:].min() > 0.8
    ev = _run("dpo_saturation", ONSET + 101, onset=ONSET)
    pp = _series(ev, "dpo/pref_prob")
    assert pp[:ONSET].max() < 0.99 and pp[ONSET + 80:].min() > 0.99
    ev = _run("rm_overfit", ONSET + 151, onset=ONSET)
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
        sim = Simulator(SimConfig("adj", fault="kl_above_target", onset=100))
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
                              fault_params={"redevelop_after": 150}))
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
    ev = _run("stagnation", 900, onset=200)
    r = _series(ev, "reward/mean")
    k = _series(ev, "kl/mean")
    beta = _series(ev, "kl/beta")
    assert beta[400:].min() > 5 * beta[:200].max()  # beta far too high
    assert abs(r[800:900].mean() - r[300:400].mean()) < 0.02 * abs(r[300:400].mean())
    assert abs(k[800:900].mean() - k[300:400].mean()) < 0.05 * k[300:400].mean()
    assert k[300:].mean() < 0.6 * k[100:200].mean()
