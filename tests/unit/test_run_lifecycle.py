"""A run's end and an alert's end read true: a run that closed its monitor is finished, not
stalled; a resolved alert does not repeat its firing text."""

from __future__ import annotations

from contract.events import parse_event
from streams.processor import Pipeline
from tests.unit._core import T0, only_rules


def ev(run, step, kind="step", ts=None, **extra):
    raw = {"schema": 1, "kind": kind, "run_id": run, "step": step,
           "ts": T0 + step if ts is None else ts}
    raw.update(extra)
    return parse_event(raw, T0)


def test_a_run_that_closed_its_monitor_is_not_reported_stalled():
    p = Pipeline(only_rules("run_stalled"))
    for s in range(5):
        p.feed(ev("done", s, metrics={"kl/mean": 0.01}), T0 + s)
    p.feed(ev("done", 4, kind="heartbeat", final=True), T0 + 5)
    assert p.tick(T0 + 5 + 3600) == []
    # a stalled run (no final heartbeat) still is
    for s in range(5):
        p.feed(ev("hung", s, metrics={"kl/mean": 0.01}), T0 + s)
    stalled = p.tick(T0 + 5 + 3600)
    assert [(a.run_id, a.rule, a.state) for a in stalled] == [("hung", "run_stalled", "firing")]


def test_a_closed_run_that_speaks_again_is_watched_again():
    p = Pipeline(only_rules("run_stalled"))
    p.feed(ev("r", 1, metrics={"kl/mean": 0.01}), T0 + 1)
    p.feed(ev("r", 1, kind="heartbeat", final=True), T0 + 2)
    p.feed(ev("r", 2, metrics={"kl/mean": 0.01}), T0 + 3)
    assert [a.rule for a in p.tick(T0 + 3 + 3600)] == ["run_stalled"]


def test_the_closed_flag_survives_a_worker_restart():
    p = Pipeline(only_rules("run_stalled"))
    p.feed(ev("r", 1, metrics={"kl/mean": 0.01}), T0 + 1)
    p.feed(ev("r", 1, kind="heartbeat", final=True), T0 + 2)
    restored = p.processor.load_state(p.runs["r"].to_state())
    assert p.processor.tick(restored, T0 + 3600) == []


def test_a_resolved_alert_says_it_is_back_under_its_threshold():
    p = Pipeline(only_rules("run_stalled"))
    p.feed(ev("r", 1, metrics={"kl/mean": 0.01}), T0 + 1)
    fired = p.tick(T0 + 3600)
    assert [a.state for a in fired] == ["firing"]
    back = p.feed(ev("r", 2, metrics={"kl/mean": 0.01}, ts=T0 + 3601), T0 + 3601)
    back += p.tick(T0 + 3602)
    resolved = [a for a in back if a.state == "resolved"]
    assert resolved, back
    text = resolved[0].summary
    assert "back under the orange threshold" in text and "fired at step" in text
    assert "above" not in text and text != fired[0].summary


# -- runs that log their framework's own names ---------------------------------------------------

def _grpo_step(run, step, kl):
    # TRL GRPOTrainer's names, as a training script logs them without the SDK's mapping
    return ev(run, step, metrics={"kl": kl, "reward": 0.5, "reward_std": 0.3,
                                  "frac_reward_zero_std": 0.1, "entropy": 0.4,
                                  "completions/clipped_ratio": 0.02})


def test_a_run_logging_trl_grpo_names_is_watched_with_that_preset():
    p = Pipeline(only_rules("kl_above_target"))
    alerts = []
    for s in range(40):
        alerts += p.feed(_grpo_step("g", s, 0.02 if s < 20 else 3.0), T0 + s)
    st = p.runs["g"]
    assert st.preset == "trl-grpo"
    assert "kl/mean" in st.latest_metrics and "kl" not in st.latest_metrics
    # the preset's scale applies: its black cap, not the pack default
    black = [a for a in alerts if a.rule == "kl_above_target" and a.severity == "black"]
    assert black and black[0].threshold == 0.5
    restored = p.processor.load_state(st.to_state())
    assert restored.preset == "trl-grpo"


def test_canonical_names_are_left_alone():
    p = Pipeline(only_rules("kl_above_target"))
    for s in range(10):
        p.feed(ev("c", s, metrics={"kl/mean": 0.01, "reward/mean": 0.3}), T0 + s)
    assert p.runs["c"].preset is None


def test_a_restart_does_not_look_for_a_framework_again():
    """A run whose first steps named no framework keeps its names after a worker restart, as
    it does without one: the restored state remembers the steps already looked at."""
    def steps(feed, lo, hi):
        for s in range(lo, hi):
            feed(ev("c", s, metrics={"kl/mean": 0.01, "reward/mean": 0.3}) if s < 6
                 else _grpo_step("c", s, 0.02), T0 + s)

    kept = Pipeline(only_rules("kl_above_target"))
    steps(kept.feed, 0, 10)
    restarted = Pipeline(only_rules("kl_above_target"))
    steps(restarted.feed, 0, 6)
    restarted.runs["c"] = restarted.processor.load_state(restarted.runs["c"].to_state())
    steps(restarted.feed, 6, 10)
    assert kept.runs["c"].preset is None
    assert restarted.runs["c"].preset is None
    assert restarted.runs["c"].latest_metrics == kept.runs["c"].latest_metrics


def test_a_state_without_the_count_of_tries_looks_again():
    """A state written by an older worker (no count) is read as before: the tries start over."""
    p = Pipeline(only_rules("kl_above_target"))
    for s in range(6):
        p.feed(ev("c", s, metrics={"kl/mean": 0.01}), T0 + s)
    state = p.runs["c"].to_state()
    assert state["preset_tries"] == 5
    del state["preset_tries"]
    p.runs["c"] = p.processor.load_state(state)
    p.feed(_grpo_step("c", 6, 0.02), T0 + 6)
    assert p.runs["c"].preset == "trl-grpo"
