"""An adjust's ``at_most``: a run is sent a tier's adjust that many times, so a condition that
wavers about its line does not compound the factors without end (the language, the alerts,
the commands, a restored run, and a rollback)."""

from __future__ import annotations

import json
import textwrap

import pytest

from alerts.actions import commands_for
from rules.loader import RuleFileError, load_pack_text
from streams.processor import Pipeline
from tests.unit._core import firing, step_event

RULE = """
    rules:
      - id: kl_high
        params: {cap: 0.2}
        tiers:
          - severity: yellow
            when: {metric: kl/mean, above: cap}
            %s
            actions: [notify, %s]
"""


def load(action: str, extra: str = ""):
    return load_pack_text(textwrap.dedent(RULE % (extra or "for: 1", action)).lstrip("\n"), "mine.yaml")


#: KL over its line for 2 steps, under it for 2, four times: four firings of one tier
WAVERING = ([0.05] * 3 + ([0.3] * 2 + [0.05] * 2) * 4)


def feed(p: Pipeline, values, start: int = 0, run: str = "r", **extra) -> list:
    out = []
    for i, v in enumerate(values):
        ev = step_event(run, start + i, {"kl/mean": v}, **extra)
        out += p.feed(ev, ev.ts)
    return out


def test_the_adjust_is_sent_at_most_so_many_times_then_the_alert_says_it_was_not():
    alerts = firing(feed(Pipeline(load("{adjust: {beta: 1.5}, at_most: 2}")), WAVERING), "kl_high")
    assert len(alerts) == 4
    assert [a.adjust for a in alerts] == [{"beta": 1.5}, {"beta": 1.5}, {}, {}]
    assert ["adjust" in a.actions for a in alerts] == [True, True, False, False]
    assert "not adjusted again (beta x1.5)" in alerts[2].summary
    assert "2 times already" in alerts[2].summary
    assert "not adjusted again" not in alerts[1].summary
    # what reaches the run: two beta commands, then none
    sent = [[c.action for c in commands_for(a, a.ts, key=f"k{i}")] for i, a in enumerate(alerts)]
    assert sent == [["adjust"], ["adjust"], [], []]


def test_without_at_most_every_firing_sends_its_adjust():
    alerts = firing(feed(Pipeline(load("{adjust: {beta: 1.5}}")), WAVERING), "kl_high")
    assert [a.adjust for a in alerts] == [{"beta": 1.5}] * 4


def test_an_escalation_counts_as_a_firing_that_adjusts():
    pack = load("{adjust: {beta: 1.5}, at_most: 1}", "escalate_after: 5")
    alerts = firing(feed(Pipeline(pack), [0.05] * 3 + [0.3] * 10), "kl_high")
    assert [(a.severity, a.adjust) for a in alerts] == [("yellow", {"beta": 1.5}), ("orange", {})]
    assert "not adjusted again" in alerts[1].summary


def test_a_restored_run_remembers_how_many_adjusts_it_was_sent():
    pack = load("{adjust: {beta: 1.5}, at_most: 2}")
    p = Pipeline(pack)
    first = firing(feed(p, WAVERING[:11]), "kl_high")          # two firings
    assert [a.adjust for a in first] == [{"beta": 1.5}] * 2
    st = p.runs["r"]
    p.runs["r"] = type(st).from_state(json.loads(json.dumps(st.to_state())), p.processor.resolve)
    later = firing(feed(p, WAVERING[11:], start=11), "kl_high")
    assert [a.adjust for a in later] == [{}, {}]


def test_the_count_starts_again_after_a_rollback():
    p = Pipeline(load("{adjust: {beta: 1.5}, at_most: 2}"))
    assert [a.adjust for a in firing(feed(p, WAVERING), "kl_high")] == [{"beta": 1.5}, {"beta": 1.5}, {}, {}]
    # the run rolled back to its checkpoint of step 5 (the SDK tags its events with the
    # generation): the beta it runs with is the checkpoint's again
    again = firing(feed(p, [0.05] * 3 + [0.3] * 2, start=6, tags={"generation": "1"}), "kl_high")
    assert [a.adjust for a in again] == [{"beta": 1.5}]


def test_the_pack_adjusts_a_run_at_most_twice_per_tier():
    from rules.loader import load_pack
    for rule in load_pack("rlhf").rules:
        for tier in rule.tiers:
            if tier.adjust_params():
                assert tier.adjust_limit() == 2, (rule.id, tier.severity)


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "two"])
def test_at_most_is_a_count_of_one_or_more(bad):
    with pytest.raises(RuleFileError, match="at_most"):
        load("{adjust: {beta: 1.5}, at_most: %s}" % bad)


def test_the_pack_raises_beta_twice_for_a_kl_hovering_about_its_yellow_line():
    from tests.unit._core import only_rules
    kl = [0.02] * 10 + ([0.09] * 6 + [0.03] * 8) * 4      # target 0.05: yellow over 0.075
    alerts = firing(feed(Pipeline(only_rules("kl_above_target")), kl), "kl_above_target")
    assert [a.severity for a in alerts] == ["yellow"] * 4
    assert [a.adjust for a in alerts] == [{"beta": 1.5}, {"beta": 1.5}, {}, {}]


# -- an adjust's `when` ----------------------------------------------------------------------------

TWO_WAYS = """
    rules:
      - id: steps_off
        params: {high: 0.1, low: 0.001}
        tiers:
          - severity: yellow
            when:
              any:
                - {metric: update_ratio/actor, above: high}
                - {metric: update_ratio/actor, below: low}
            actions:
              - notify
              - adjust: {lr: 0.5}
                when: %s
"""


def two_ways(when: str = "{metric: update_ratio/actor, above: high}"):
    return load_pack_text(textwrap.dedent(TWO_WAYS % when).lstrip("\n"), "mine.yaml")


def feed_ratio(p: Pipeline, values) -> list:
    out = []
    for i, v in enumerate(values):
        ev = step_event("r", i, {"update_ratio/actor": v})
        out += p.feed(ev, ev.ts)
    return out


def test_an_adjust_is_sent_only_when_its_when_holds_as_the_alert_fires():
    [high] = firing(feed_ratio(Pipeline(two_ways()), [0.01] * 3 + [0.5] * 3), "steps_off")
    [low] = firing(feed_ratio(Pipeline(two_ways()), [0.01] * 3 + [0.0001] * 3), "steps_off")
    assert (high.adjust, "adjust" in high.actions) == ({"lr": 0.5}, True)
    assert (low.adjust, "adjust" in low.actions) == ({}, False)
    assert commands_for(low, low.ts, key="k") == []


def test_an_undefined_parameter_in_an_adjust_s_when_is_an_error_at_its_line():
    with pytest.raises(RuleFileError) as info:
        two_ways("{metric: update_ratio/actor, above: hihg}")
    msg = str(info.value)
    assert "mine.yaml:13:" in msg and "'hihg' is not a parameter of rule 'steps_off'" in msg


def test_an_adjust_s_when_reads_the_step_not_ranks():
    with pytest.raises(RuleFileError, match="an adjust's when reads the step's metrics"):
        two_ways("{ranks: grad_norm/actor, stat: max_over_median, above: high}")


def _update_ratio_alerts(ratio: float) -> list:
    from tests.unit._core import only_rules
    p = Pipeline(only_rules("update_ratio"))
    out = []
    for i in range(60):
        ev = step_event("r", i, {"update_ratio/actor": 0.01 if i < 30 else ratio, "lr/actor": 1e-6})
        out += p.feed(ev, ev.ts)
    return firing(out, "update_ratio")


def test_the_pack_halves_the_learning_rate_for_updates_too_large_not_too_small():
    [high] = _update_ratio_alerts(0.5)
    [low] = _update_ratio_alerts(0.0001)
    assert high.adjust == {"lr": 0.5}
    assert low.adjust == {} and "adjust" not in low.actions
