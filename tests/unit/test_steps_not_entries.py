"""Steps, not entries: windows, `for`, warm-ups and trend spans count training steps, so the
same fault logged every 1, 5 or 10 steps fires the same rule, and a run with 40 logged points
still gets every rule."""

from __future__ import annotations

import textwrap

import pytest

from contract.alert import severity_rank
from contract.events import parse_event
from producers.sim import SimConfig, effective_algo, simulate
from rules.loader import load_pack_text
from streams.processor import Pipeline
from tests.unit._core import T0, firing, rlhf_pack

ONSET = 300

# fault -> (tier it reaches, steps after the onset) whatever the logging interval
FAULTS = {
    # kl_rising is orange above the yellow line (1.5 x target), after kl_above_target's yellow
    "kl_above_target": ("red", 120), "kl_rising": ("orange", 150), "kl_zero": ("black", 30),
    # entropy_collapse pauses once the entropy is under 0.3 of its warm-up (a healthy run
    # sharpens to 0.4 of it): this mild collapse gets there 200-220 steps in, at every interval
    "entropy_collapse": ("red", 230), "reward_collapse": ("red", 120),
    "reward_degradation": ("orange", 200), "length_hacking": ("orange", 120),
    "grad_norm_anomaly": ("orange", 80), "value_shift": ("red", 80),
    "clip_frac_high": ("red", 60), "truncation_rising": ("yellow", 80),
    "gpu_memory_spike": ("orange", 80), "reward_spike": ("orange", 30),
}


def fired_on(fault: str, every: int, steps: int = ONSET + 240) -> list:
    cfg = SimConfig(run_id=f"s-{fault}-{every}", fault=fault, onset=ONSET, seed=3, log_every=every,
                    algo=effective_algo("ppo", fault))
    p = Pipeline(rlhf_pack())
    out = []
    for raw in simulate(cfg, steps):
        ev = parse_event(raw, raw["ts"])
        out += [a for a in p.feed(ev, ev.ts) if a.state == "firing"]
    return out


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_the_same_fault_logged_every_1_5_or_10_steps_fires_the_same_rule(fault):
    tier, delay = FAULTS[fault]
    for every in (1, 5, 10):
        fired = fired_on(fault, every)
        own = [a for a in fired if a.rule == fault
               and severity_rank(a.severity) >= severity_rank(tier)]
        assert own, f"logged every {every}: {fault} never reached {tier}: " \
                    f"{[(a.rule, a.severity, a.step) for a in fired]}"
        assert ONSET - 5 <= min(a.step for a in own) <= ONSET + delay, (every, own[0].step)
        early = [(a.rule, a.severity, a.step) for a in fired
                 if a.step < ONSET - 5 and severity_rank(a.severity) >= 2]
        assert not early, f"logged every {every}: orange or above before the onset: {early}"


def _pack(body: str):
    return load_pack_text(textwrap.dedent(body).lstrip("\n"), "steps.yaml")


def _feed(pack, values_by_step: dict[int, float], metric: str = "m") -> list:
    p = Pipeline(pack)
    out = []
    for step, v in sorted(values_by_step.items()):
        ev = parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": step,
                          "ts": T0 + step, "metrics": {metric: v}}, T0)
        out += p.feed(ev, ev.ts)
    return out


FOR_5 = """
    rules:
      - id: hot
        params: {limit: 1.0}
        tiers:
          - severity: orange
            when: {metric: m, above: limit}
            for: 5
    """


@pytest.mark.parametrize("every, fires_at", [(1, 104), (5, 105), (10, 110)])
def test_for_counts_training_steps_from_the_onset(every, fires_at):
    values = {s: (2.0 if s >= 100 else 0.5) for s in range(0, 200, every)}
    (a,) = firing(_feed(_pack(FOR_5), values), "hot")
    assert (a.onset_step, a.step) == (100, fires_at)


def test_a_window_in_steps_reads_the_points_of_those_steps():
    # median over 3 steps: logged every step it is the last 3 points; logged every 10 steps the
    # window still holds the 3 points a median needs (a one-point spike never makes it)
    pack = _pack("""
        rules:
          - id: med
            params: {limit: 1.0}
            tiers:
              - severity: red
                when: {metric: m, signal: median, window: 3, above: limit}
        """)
    for every in (1, 10):
        spike = {s: (5.0 if s == 100 else 0.5) for s in range(0, 200, every)}
        assert not firing(_feed(pack, spike)), every
        two = {s: (5.0 if s in (100, 100 + every) else 0.5) for s in range(0, 200, every)}
        assert [a.step for a in firing(_feed(pack, two))] == [100 + every]


def test_warm_up_min_steps_is_in_steps():
    pack = _pack("""
        rules:
          - id: warm
            params: {limit: 1.0}
            tiers:
              - severity: yellow
                when: {metric: m, above: limit, min_steps: 50}
        """)
    # decided once the metric spans 50 steps: the 50th step logged every step (step 49), the
    # first point at or after it logged every 10 steps (step 50), not the 50th point (step 490)
    for every, first in ((1, 49), (10, 50)):
        values = {s: 2.0 for s in range(0, 600, every)}
        assert [a.step for a in firing(_feed(pack, values))] == [first], every



def test_a_long_smoothing_averages_several_points_of_a_run_whose_steps_count_samples():
    # smooth: 50 is a span of 50 steps; a run that numbers its steps in samples logs 64 steps
    # apart, and an EMA counted in steps alone would be its last point. It averages at least
    # the 2.5 points a run logged every 20 steps has in 50 steps, so two zeros after a long
    # stretch at 1 do not read as a fall under a tenth.
    pack = _pack("""
        rules:
          - id: low
            params: {limit: 0.1}
            tiers:
              - severity: orange
                when: {metric: m, smooth: 50, below: limit}
        """)
    for every in (1, 10, 64):
        dip = {s: (0.0 if 40 * every <= s < 42 * every else 1.0) for s in range(0, 60 * every, every)}
        assert not firing(_feed(pack, dip)), every
        # a fall that holds is read at every interval: under a tenth after 3 points 64 steps
        # apart ((3/7)^3 = 0.079), after 6 points 10 steps apart, 53 steps logged every step
        fall = {s: (0.0 if s >= 40 * every else 1.0) for s in range(0, 120 * every, every)}
        (a,) = firing(_feed(pack, fall))
        assert a.step == {1: 92, 10: 450, 64: 40 * 64 + 2 * 64}[every], (every, a.step)


def test_a_run_with_40_logged_points_gets_every_metric_rule():
    """40 points logged every 25 steps (1,000 steps): every metric rule of the pack gets a
    decided (true or false) value at the end; none is left waiting for more points."""
    pack = rlhf_pack()
    p = Pipeline(pack)
    metrics = {m: 0.5 for m in (
        "kl/mean", "kl/token_max", "kl/token_p99", "kl/ppo", "ppo/epoch", "entropy/mean",
        "reward/mean", "reward/std", "reward/frac_zero_std", "response/length_mean",
        "response/truncated_frac", "response/eos_count", "response/eos_frac", "judge/score",
        "loss/value", "value/std", "value/mean", "ppo/clip_frac", "grad_norm/actor",
        "grad_norm/critic", "update_ratio/actor", "update_ratio/critic", "gpu/mem_allocated_gb",
        "rm/train_acc", "rm/val_acc", "dpo/pref_prob", "kl/beta", "returns/abs_max",
        "returns/std", "dpo/chosen_reward", "dpo/margin", "dpo/accuracy", "lr/actor")}
    import random
    rng = random.Random(1)
    for i in range(40):
        step = i * 25
        ev = parse_event({"schema": 1, "kind": "step", "run_id": "sparse", "step": step,
                          "ts": T0 + step, "metrics": {k: v + rng.gauss(0, 0.01)
                                                       for k, v in metrics.items()}}, T0)
        p.feed(ev, ev.ts)
    st = p.runs["sparse"]
    st.view.set(ev.metrics, {})      # the step at hand, as the run sets it
    undecided = []
    from rules.schema import leaves

    for cr in st.programs[0].rules:
        if cr.trigger != "step" or cr.inputs is None:
            continue
        if any(leaf.metric is None for t in cr.rule.tiers for leaf in leaves(t.when)):
            continue       # reads dists or groups: not in this run
        for ct in cr.tiers:
            if ct.test() is None:
                undecided.append(ct.key)
    assert undecided == []
