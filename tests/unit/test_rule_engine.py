"""rules.engine through the Pipeline: the kl_above_target tiers, targets, overrides, rollback.

Events are built with parse_event (the real entry point) and fed to streams.processor.Pipeline
with the built-in pack, as `rlwatch replay` and the worker do.
"""

from __future__ import annotations

import pytest

from alerts.actions import commands_for
from rules.engine import RuleEngine, render
from rules.schema import Override
from streams.processor import Pipeline
from tests.unit._core import (
    checkpoint_event,
    feed_series,
    firing,
    only_rules,
    resolved,
    rlhf_pack,
)

TARGET = 0.05           # the pack's default KL target
YELLOW = 1.5 * TARGET   # 0.075
RED = 2.5 * TARGET      # 0.125
CAP = 0.2


def kl_alerts(values, run_id="run-a", pack=None, **extra):
    p = Pipeline(pack or rlhf_pack())
    return [a for a in feed_series(p, run_id, "kl/mean", values, **extra)
            if a.rule == "kl_above_target"]


# -- yellow: > 1.5 x target for 5 consecutive steps ------------------------------------------

def test_yellow_after_exactly_five_consecutive_steps_above_1_5x_target():
    values = [0.02] * 20 + [0.08] * 10   # 0.08: above 0.075, below 0.125
    alerts = kl_alerts(values)
    y = firing(alerts, severity="yellow")
    assert len(y) == 1
    assert y[0].step == 24 and y[0].onset_step == 20   # steps 20..24 = 5 steps
    assert y[0].threshold == pytest.approx(YELLOW)
    assert y[0].value == pytest.approx(0.08)
    assert y[0].actions == ["notify", "adjust"] and y[0].adjust == {"beta": 1.5}
    assert not firing(alerts, severity="red") and not firing(alerts, severity="black")


def test_four_steps_above_do_not_fire_yellow():
    alerts = kl_alerts([0.02] * 20 + [0.08] * 4 + [0.02] * 10)
    assert not firing(alerts)


def test_a_dip_restarts_the_yellow_count():
    values = [0.02] * 10 + [0.08] * 4 + [0.05] + [0.08] * 5
    y = firing(kl_alerts(values), severity="yellow")
    assert [(a.step, a.onset_step) for a in y] == [(19, 15)]


def test_at_exactly_the_threshold_nothing_fires():
    assert not firing(kl_alerts([0.02] * 5 + [YELLOW] * 10))


# -- red: the level (2 of the last 3 points) > 2.5 x target, held over 3 steps ---------------

def test_single_spike_above_2_5x_target_is_an_info_notice_not_red():
    alerts = kl_alerts([0.02] * 10 + [0.13] + [0.02] * 5)
    assert not firing(alerts, severity="red")
    info = firing(alerts, severity="info")
    assert [a.step for a in info] == [10] and info[0].actions == ["notify"]


def test_two_isolated_points_over_the_red_line_do_not_pause():
    values = [0.02] * 10 + [0.13, 0.02, 0.13] + [0.02] * 3
    assert not firing(kl_alerts(values), severity="red")


def test_red_once_the_level_held_over_the_line_for_three_steps():
    values = [0.02] * 10 + [0.13, 0.02, 0.13, 0.13, 0.13] + [0.02] * 3
    red = firing(kl_alerts(values), severity="red")
    assert len(red) == 1 and red[0].step == 14 and red[0].onset_step == 12
    assert red[0].actions == ["pause", "snapshot"]
    assert red[0].threshold == pytest.approx(RED)
    assert red[0].rule == "kl_above_target" and red[0].run_id == "run-a"


def test_red_on_the_third_step_of_the_level_and_not_black_below_cap():
    values = [0.02] * 10 + [0.15] * 6
    alerts = kl_alerts(values)
    red = firing(alerts, severity="red")
    assert [a.step for a in red] == [13]
    assert not firing(alerts, severity="black")
    assert "beta" in red[0].diagnosis


# -- black: over the absolute cap, rollback to the newest checkpoint before the onset ---------

def test_black_over_cap_with_stop_and_rollback_to_checkpoint_before_onset():
    p = Pipeline(rlhf_pack())
    alerts = []
    values = [0.02] * 30 + [0.3] * 6
    for step, v in enumerate(values):
        if step in (10, 25):
            ck = checkpoint_event("run-a", step, f"/ckpt/step-{step}")
            alerts += p.feed(ck, ck.ts)
        alerts += feed_series(p, "run-a", "kl/mean", [v], start=step)
        if step == 34:  # saved after the onset: not a healthy checkpoint
            ck = checkpoint_event("run-a", step, "/ckpt/step-34")
            alerts += p.feed(ck, ck.ts)
    black = firing(alerts, "kl_above_target", "black")
    assert len(black) == 1
    b = black[0]
    assert b.step == 33 and b.onset_step == 31
    assert b.threshold == pytest.approx(CAP)
    assert b.actions[:2] == ["stop", "rollback"]
    assert b.rollback_to == {"step": 25, "checkpoint": "/ckpt/step-25"}
    cmds = {c.action: c for c in commands_for(b, now=0.0)}
    assert cmds["rollback"].params == {"to_step": 25, "checkpoint": "/ckpt/step-25"}
    assert "stop" in cmds and "pause" not in cmds


def test_checkpoints_reported_out_of_order_still_give_the_newest_before_onset():
    p = Pipeline(rlhf_pack())
    for step, path in ((20, "/c/20"), (5, "/c/5"), (12, "/c/12")):
        ck = checkpoint_event("run-a", step, path, ts=1.0)
        p.feed(ck, 1.0)
    alerts = feed_series(p, "run-a", "kl/mean", [0.02] * 25 + [0.5] * 5)
    b = firing(alerts, "kl_above_target", "black")[0]
    assert b.rollback_to == {"step": 20, "checkpoint": "/c/20"}


def test_black_without_any_checkpoint_has_no_rollback_target():
    b = firing(kl_alerts([0.02] * 10 + [0.4] * 5), severity="black")[0]
    assert b.rollback_to is None
    assert [c.action for c in commands_for(b, now=0.0)] == ["stop", "snapshot"]


# -- resolution ----------------------------------------------------------------------------

def test_recovery_emits_resolved_for_each_fired_tier_with_the_same_fingerprint():
    values = [0.02] * 10 + [0.3] * 8 + [0.02] * 12
    alerts = kl_alerts(values)
    fired = {a.severity: a for a in firing(alerts)}
    assert set(fired) == {"info", "yellow", "red", "black"}
    done = {a.severity: a for a in resolved(alerts)}
    assert set(done) == {"info", "yellow", "red", "black"}
    for sev in fired:
        assert done[sev].fingerprint == fired[sev].fingerprint
        assert done[sev].step > fired[sev].step
        assert done[sev].actions == []
        assert done[sev].onset_step == fired[sev].onset_step
    # black follows the 3-step median: back under after two low steps; red keeps firing over
    # 3 steps of recovery (a paused run is not told "resolved" by one good point)
    assert done["black"].step == 19 and done["red"].step == 22
    # yellow keeps firing for 5 steps of recovery, resolves at the 6th
    assert done["yellow"].step == 23
    # the jump itself was the info notice; nothing fires twice for one incident
    assert done["info"].step == 11
    assert len(firing(alerts)) == 4


def test_every_alert_has_the_contract_required_fields():
    for a in kl_alerts([0.02] * 10 + [0.3] * 8 + [0.02] * 12):
        assert a.rule and a.severity in ("info", "yellow", "orange", "red", "black")
        assert a.state in ("firing", "resolved") and a.run_id == "run-a"
        assert isinstance(a.step, int) and a.fingerprint


# -- per-run targets ---------------------------------------------------------------------------

def test_target_tag_changes_the_thresholds_for_that_run_only():
    values = [0.02] * 5 + [0.06] * 10  # above 2.5 x 0.02 but below 1.5 x 0.05
    tagged = kl_alerts(values, run_id="strict", tags={"target.kl": "0.02"})
    y = firing(tagged, severity="yellow")
    assert [a.step for a in y] == [9]
    assert y[0].threshold == pytest.approx(0.03)
    assert [a.step for a in firing(tagged, severity="red")] == [8]  # 2 of 3 above 0.05, 3 steps
    assert firing(tagged, severity="red")[0].threshold == pytest.approx(0.05)
    assert not firing(kl_alerts(values, run_id="default"))


def test_runs_of_one_processor_keep_the_thresholds_of_their_own_targets():
    """The processor shares a run's planned rules only with runs of the same overrides,
    targets and preset: a run that reported no target keeps the defaults beside one that did,
    and a second run with the same target gets that target's thresholds."""
    p = Pipeline(rlhf_pack())
    values = [0.02] * 5 + [0.06] * 10   # above 2.5 x 0.02 but below 1.5 x 0.05
    strict = feed_series(p, "strict", "kl/mean", values, tags={"target.kl": "0.02"})
    default = feed_series(p, "default", "kl/mean", values)
    strict_too = feed_series(p, "strict-too", "kl/mean", values, tags={"target.kl": "0.02"})
    assert [a.threshold for a in firing(strict, "kl_above_target", "yellow")] == [pytest.approx(0.03)]
    assert not firing(default, "kl_above_target")
    assert [(a.step, a.threshold) for a in firing(strict_too, "kl_above_target")] == \
        [(a.step, a.threshold) for a in firing(strict, "kl_above_target")]


def test_a_run_over_the_kl_line_from_its_first_steps_is_notified_never_braked():
    """A stage-2 run whose reference is the base model has its KL over the line from step 0:
    a setup to check (yellow, with the beta nudge), not a divergence under way. The same KL
    reached from under the line brakes."""
    p = Pipeline(rlhf_pack())
    offset = feed_series(p, "offset", "kl/mean", [0.5, 0.7, 0.4, 0.6, 0.5] * 6)
    risen = feed_series(p, "risen", "kl/mean", [0.02] * 10 + [0.5] * 20)
    assert [a.severity for a in firing(offset, "kl_above_target")] == ["yellow"]
    assert {"red", "black"} <= {a.severity for a in firing(risen, "kl_above_target")}
    # the offset run diverging from where it started (3 x its first steps) is braked
    diverged = feed_series(p, "offset", "kl/mean", [2.0] * 10, start=30)
    assert {"red", "black"} <= {a.severity for a in firing(diverged, "kl_above_target")}


def test_target_tag_on_the_first_event_only_still_applies_later():
    p = Pipeline(rlhf_pack())
    alerts = feed_series(p, "r", "kl/mean", [0.02], tags={"target.kl": "0.2"})
    alerts += feed_series(p, "r", "kl/mean", [0.02] * 4 + [0.4] * 6, start=1)
    # with target 0.2: red at 0.5 and yellow at 0.3 -> 0.4 is yellow only, and over the 0.2
    # cap it is not stopped either: a stop needs the level over the red line too (under the
    # default target of 0.05, 0.4 is red and black)
    assert [a.severity for a in firing(alerts, "kl_above_target")] == ["yellow"]
    assert firing(alerts, severity="yellow")[0].threshold == pytest.approx(0.3)
    alerts = feed_series(p, "r", "kl/mean", [0.6] * 5, start=11)
    assert {"red", "black"} <= {a.severity for a in firing(alerts, "kl_above_target")}
    assert firing(alerts, severity="black")[0].step == 14   # the median over the line at 12, held


def test_unparseable_target_tag_is_ignored():
    alerts = kl_alerts([0.02] * 5 + [0.08] * 6, tags={"target.kl": "lots"})
    assert firing(alerts, severity="yellow")[0].threshold == pytest.approx(YELLOW)


# -- pack overrides ----------------------------------------------------------------------------

def with_overrides(*ovs):
    pack = rlhf_pack()
    return pack.model_copy(update={"overrides": [*pack.overrides, *ovs]})


def test_override_params_raise_the_cap_for_matching_runs_only():
    pack = with_overrides(Override(runs="exp-*", params={"kl_above_target": {"cap": 0.5}}))
    values = [0.02] * 10 + [0.3] * 4
    exp = kl_alerts(values, run_id="exp-7", pack=pack)
    prod = kl_alerts(values, run_id="prod-1", pack=pack)
    assert {a.severity for a in firing(exp)} == {"info", "red"}
    assert {a.severity for a in firing(prod)} == {"info", "red", "black"}


def test_override_targets_apply_by_glob():
    pack = with_overrides(Override(runs="ppo-8b-*", targets={"kl": 0.1}))
    values = [0.02] * 10 + [0.16] * 6   # > 2.5 x 0.05, < 2.5 x 0.1
    matched = kl_alerts(values, run_id="ppo-8b-a", pack=pack)
    other = kl_alerts(values, run_id="ppo-70b-a", pack=pack)
    assert {a.severity for a in firing(matched)} == {"yellow"}
    assert firing(matched)[0].threshold == pytest.approx(0.15)
    assert "red" in {a.severity for a in firing(other)}
    assert "red" in {a.severity for a in firing(other)}


def test_override_disable_silences_a_rule_for_matching_runs():
    pack = with_overrides(Override(runs="quiet-*", disable=["kl_above_target", "nan_inf"]))
    values = [0.02] * 10 + [0.5] * 6 + ["NaN"]
    assert kl_alerts(values, run_id="quiet-1", pack=pack) == []
    p = Pipeline(pack)
    assert not [a for a in feed_series(p, "quiet-1", "kl/mean", values) if a.state == "firing"
                and a.rule in ("kl_above_target", "nan_inf")]
    assert firing(kl_alerts(values, run_id="loud-1", pack=pack))


def test_reported_target_overrides_pack_override_target():
    pack = with_overrides(Override(runs="*", targets={"kl": 0.1}))
    alerts = kl_alerts([0.02] * 5 + [0.04] * 6, pack=pack, tags={"target.kl": "0.02"})
    assert firing(alerts, severity="yellow")[0].threshold == pytest.approx(0.03)


def test_for_run_resolves_targets_disable_and_params():
    pack = with_overrides(Override(runs="a*", targets={"kl": 0.3}, disable=["stagnation"],
                                   params={"kl_above_target": {"cap": 0.9}}))
    engine = RuleEngine(pack)
    rr = engine.for_run("abc", {"kl": 0.07})
    assert rr.targets["kl"] == 0.07
    assert "stagnation" not in {r.id for r in rr.rules}
    assert rr.params["kl_above_target"]["cap"] == 0.9
    rr2 = engine.for_run("zzz")
    assert rr2.targets["kl"] == 0.05 and "stagnation" in {r.id for r in rr2.rules}
    assert rr2.params["kl_above_target"]["cap"] == 0.2


def test_disabled_rule_in_the_pack_never_fires():
    pack = rlhf_pack()
    rules = [r.model_copy(update={"enabled": False}) if r.id == "kl_above_target" else r
             for r in pack.rules]
    p = pack.model_copy(update={"rules": rules})
    assert kl_alerts([0.02] * 5 + [0.5] * 8, pack=p) == []


def test_only_the_kl_rule_pack_gives_the_same_kl_alerts_as_the_full_pack():
    values = [0.02] * 10 + [0.3] * 8 + [0.02] * 12
    full = [(a.severity, a.state, a.step) for a in kl_alerts(values)]
    small = [(a.severity, a.state, a.step)
             for a in kl_alerts(values, pack=only_rules("kl_above_target"))]
    assert full == small


# -- summaries ---------------------------------------------------------------------------------

def test_summary_is_rendered_with_numbers_and_onset():
    y = firing(kl_alerts([0.02] * 20 + [0.08] * 5), severity="yellow")[0]
    assert "0.08" in y.summary and "0.075" in y.summary and "20" in y.summary
    assert "{" not in y.summary


def test_render_never_raises():
    assert render("{value:.3g} / {missing} / {threshold:.2f}", value=None, threshold=float("nan")) \
        == "n/a / {missing} / NaN"
    assert render("{value:.3g}", value="text") == "text"
    assert render("{", value=1) == "{"
