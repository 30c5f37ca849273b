"""rlwatch.rule_tests: promtool-style series notation and rule unit test files."""

from __future__ import annotations

import math
import textwrap

import pytest

from rules.loader import RuleFileError
from rlwatch.rule_tests import expand_series, run_rule_tests


@pytest.mark.parametrize("spec, expected", [
    ("1x3", [1.0, 1.0, 1.0, 1.0]),
    ("0+0.5x2", [0.0, 0.5, 1.0]),
    ("_", [None]),
    ("_x2", [None, None, None]),
    ("1 2 _ 4", [1.0, 2.0, None, 4.0]),
    ("-1+1x2", [-1.0, 0.0, 1.0]),
    ("1-0.25x2", [1.0, 0.75, 0.5]),
    ("-0.5x1", [-0.5, -0.5]),
    ("0.02x2 0.02+0.02x2", [0.02, 0.02, 0.02, 0.02, 0.04, 0.06]),
    ("1e-3", [0.001]),
    ("Inf -Inf", [math.inf, -math.inf]),
])
def test_expand_series_promtool_notation(spec, expected):
    got = expand_series(spec)
    assert len(got) == len(expected), got
    for g, e in zip(got, expected):
        assert (g is None) == (e is None), got
        if e is not None:
            assert g == pytest.approx(e), got


def test_expand_series_nan_and_lists():
    assert math.isnan(expand_series("NaN")[0])
    out = expand_series([1, None, "_", 2.5, "NaN"])
    assert out[:4] == [1.0, None, None, 2.5] and math.isnan(out[4])


def test_expand_series_counts():
    assert len(expand_series("0x99")) == 100
    assert len(expand_series("0+1x9 _x4")) == 15


@pytest.mark.parametrize("spec, expected", [
    ("1e-7x3", [1e-7] * 4),             # a KL of ~0 (kl_zero tests), repeated
    ("1e-3+1e-3x2", [1e-3, 2e-3, 3e-3]),
    ("2.5e+1x1", [25.0, 25.0]),
])
def test_expand_series_scientific_notation_with_repeat(spec, expected):
    assert expand_series(spec) == pytest.approx(expected)


TEST_FILE = """
rules: rlhf
tests:
  - name: KL blow-up pauses
    run_id: t1
    series:
      kl/mean: "0.02x19 0.3x5"
    expect:
      - {rule: kl_above_target, severity: red, step: 23, within: 1}
      - {rule: kl_above_target, severity: black}
    absent: [nan_inf]
  - name: healthy KL stays quiet (wrongly expects an alert)
    series:
      kl/mean: "0.02x29"
    expect:
      - {rule: kl_above_target, severity: yellow}
"""


def test_run_rule_tests_reports_pass_and_fail(tmp_path):
    f = tmp_path / "kl_test.yaml"
    f.write_text(textwrap.dedent(TEST_FILE))
    outcomes = run_rule_tests(f)
    assert [o.name for o in outcomes] == ["KL blow-up pauses",
                                          "healthy KL stays quiet (wrongly expects an alert)"]
    ok, bad = outcomes
    assert ok.passed and ok.problems == []
    assert "kl_above_target/red@23" in ok.fired
    assert not bad.passed
    assert len(bad.problems) == 1
    assert "kl_above_target/yellow" in bad.problems[0] and "nothing" in bad.problems[0]


def test_absent_rule_that_fires_fails_the_case(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text(textwrap.dedent("""
        rules: rlhf
        tests:
          - name: nan must not fire (but does)
            series:
              kl/mean: "0.02x5 NaN 0.02"
            absent: [nan_inf]
        """))
    [o] = run_rule_tests(f)
    assert not o.passed and "nan_inf must not fire" in o.problems[0]


def test_targets_in_a_case_change_the_thresholds(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text(textwrap.dedent("""
        rules: rlhf
        tests:
          - name: strict target
            run_id: strict
            targets: {kl: 0.02}
            series:
              kl/mean: "0.02x4 0.04x6"
            expect:
              - {rule: kl_above_target, severity: yellow, step: 9}
          - name: default target
            series:
              kl/mean: "0.02x4 0.04x6"
            absent: [kl_above_target]
        """))
    assert [o.passed for o in run_rule_tests(f)] == [True, True]


def test_rules_relative_to_the_test_file(tmp_path):
    (tmp_path / "mine.yaml").write_text(textwrap.dedent("""
        pack: mine
        rules:
          - id: loss_high
            tiers:
              - severity: orange
                when: {metric: loss/policy, above: 2}
                for: 2
        """))
    f = tmp_path / "mine_test.yaml"
    f.write_text(textwrap.dedent("""
        rules: mine.yaml
        tests:
          - name: loss fires after 2 steps
            series:
              loss/policy: "1 1 3 3 3"
            expect:
              - {rule: loss_high, severity: orange, step: 3}
        """))
    [o] = run_rule_tests(f)
    assert o.passed, o.problems
    assert o.fired == ["loss_high/orange@3"]


def test_a_case_without_series_fails_with_a_reason(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("rules: rlhf\ntests:\n  - name: empty\n")
    [o] = run_rule_tests(f)
    assert not o.passed and "no series" in o.problems[0]


def test_a_file_without_tests_is_an_error(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("rules: rlhf\n")
    with pytest.raises(RuleFileError):
        run_rule_tests(f)


def test_a_repeated_nan_or_inf_and_a_bad_token_said_by_name():
    got = expand_series("NaNx2 Infx1 1")
    assert [math.isnan(v) for v in got[:3]] == [True] * 3 and got[3:] == [math.inf, math.inf, 1.0]
    with pytest.raises(ValueError, match="series token 'NaN x2'|'x2'"):
        expand_series("1 x2")


def test_absent_names_one_tier_and_a_bad_entry_fails_the_case(tmp_path):
    """`absent: [{rule, severity}]` forbids that tier only; an entry of another shape is a
    problem of the case (it used to match nothing, so the case could never fail)."""
    f = tmp_path / "t.yaml"
    f.write_text(textwrap.dedent("""
        rules: rlhf
        tests:
          - name: a NaN loss is black, not red
            series:
              loss/value: "1x5 NaN"
            absent: [{rule: nan_inf, severity: red}]
          - name: a NaN loss is black (wrongly forbidden)
            series:
              loss/value: "1x5 NaN"
            absent: [{rule: nan_inf, severity: black}]
          - name: a bad entry
            series:
              loss/value: "1x5"
            absent: [{rules: nan_inf}]
          - name: a bad series
            series:
              loss/value: "1x5 oops"
        """))
    ok, black, bad, series = run_rule_tests(f)
    assert ok.passed
    assert not black.passed and "nan_inf/black must not fire" in black.problems[0]
    assert not bad.passed and "neither a rule id nor {rule, severity?, state?}" in bad.problems[0]
    assert not series.passed and "series token 'oops'" in series.problems[0]


def test_a_step_where_nothing_is_logged_sends_no_event(tmp_path):
    """A sparse series is a run that logs sparsely: the steps between its points are not
    events (an empty one used to break a `for:` that counts logged points)."""
    f = tmp_path / "t.yaml"
    f.write_text(textwrap.dedent("""
        rules: rlhf
        tests:
          - name: two logged NaN gradient norms 60 steps apart, every one logged, pause
            series:
              loss/policy: "0.7 _x28 0.7 _x28 0.7 _x28 0.7"
              grad_norm/actor: "1 _x28 NaN _x28 NaN _x28 NaN"
            expect:
              - {rule: nan_inf, severity: red, step: 90}
        """))
    [o] = run_rule_tests(f)
    assert o.passed, o.problems


def test_a_case_can_give_a_group_metrics_categories(tmp_path):
    """``groups:`` feeds per-category values (here with no other metric): a rule on the
    categories fires on them, and a bad group spec or expectation is named, not a crash."""
    (tmp_path / "cats.yaml").write_text(textwrap.dedent("""
        pack: cats
        rules:
          - id: gap_widening
            tiers:
              - severity: yellow
                when: {groups: reward/mean, stat: gap, above: 0.5}
        """))
    f = tmp_path / "cats_test.yaml"
    f.write_text(textwrap.dedent("""
        rules: cats.yaml
        tests:
          - name: the gap between the categories passes 0.5
            groups:
              reward/mean: {math: "0.5+0.03x29", code: "0.5x29"}
            expect:
              - {rule: gap_widening, severity: yellow, step: 20}
          - name: a category without a series
            groups:
              reward/mean: {}
          - name: a category series that is not one
            groups:
              reward/mean: {math: "0.5 lots"}
          - name: an expectation whose step is not a number
            groups:
              reward/mean: {math: "0.5+0.1x9", code: "0.5x9"}
            expect:
              - {rule: gap_widening, step: soon}
        """))
    ok, empty, bad, step = run_rule_tests(f)
    # (a group's trends are worked out every 10 steps: the gap passes 0.5 at step 17)
    assert ok.passed and ok.fired == ["gap_widening/yellow@20"], ok
    assert not empty.passed and "groups:" in empty.problems[0]
    assert not bad.passed and "'lots'" in bad.problems[0]
    assert not step.passed and "whole-number steps" in step.problems[0]


def test_a_case_may_expect_an_alert_to_resolve_or_not_to(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text(textwrap.dedent("""
        rules: rlhf
        tests:
          - name: a KL blow-up resolves once KL is back
            series:
              kl/mean: "0.02x19 0.2x4 0.02x5"
            expect:
              - {rule: kl_above_target, severity: red, state: resolved, step: 29}
          - name: the same, asked never to resolve
            series:
              kl/mean: "0.02x19 0.2x4 0.02x5"
            absent: [{rule: kl_above_target, severity: red, state: resolved}]
          - name: resolving later than it does
            series:
              kl/mean: "0.02x19 0.2x4 0.02x5"
            expect:
              - {rule: kl_above_target, severity: red, state: resolved, step: 31}
          - name: a state that is not one
            series:
              kl/mean: "0.02x5"
            expect:
              - {rule: kl_above_target, state: pending}
            absent: [{rule: kl_above_target, state: gone}]
        """))
    ok, never, late, bad = run_rule_tests(f)
    assert ok.passed, ok.problems
    assert not never.passed and "kl_above_target/red must not resolve" in never.problems[0]
    assert "@29 (resolved)" in never.problems[0]
    assert not late.passed and "resolved at step 31" in late.problems[0]
    assert not bad.passed and len(bad.problems) == 2
    assert "state?" in bad.problems[0] and "firing or resolved" in bad.problems[1]
