"""alerts.matchers: one matcher syntax for routes, inhibition, enforcement and silences."""

from __future__ import annotations

import pytest

from alerts.matchers import Matchers, field_value, parse_matcher_args
from tests.unit.alerts._helpers import alert


def m(spec) -> Matchers:
    return Matchers.parse(spec)


def test_empty_matches_everything():
    assert m({}).matches(alert()) and m(None).matches(alert())


@pytest.mark.parametrize("spec, expected", [
    ({"run": "ppo-*"}, True),
    ({"run": "exp-*"}, False),
    ({"run_id": "ppo-8b-a"}, True),
    ({"rule": ["nan_inf", "kl_*"]}, True),
    ({"rule": ["nan_inf", "entropy_*"]}, False),
    ({"rule": "!kl_*"}, False),
    ({"rule": ["!nan_inf"]}, True),
    ({"severity": "red", "state": "firing"}, True),
    ({"severity": ">=red"}, True),
    ({"severity": ">red"}, False),
    ({"severity": "<black"}, True),
    ({"severity": "<=orange"}, False),
    ({"severity": ["yellow", "orange"]}, False),
    ({"metric": ""}, True),           # absent reads as the empty string
    ({"team": "rl"}, True),           # a label
    ({"labels.team": "rl"}, True),
    ({"team": "infra"}, False),
    ({"rank": "3"}, False),
])
def test_patterns(spec, expected):
    a = alert(labels={"team": "rl"})
    assert m(spec).matches(a) is expected


def test_rank_and_missing_label_values():
    assert field_value(alert(rank=3), "rank") == "3"
    assert field_value(alert(), "rank") == ""
    assert field_value(alert(), "nope") == ""
    assert m({"rank": 3}).matches(alert(rank=3))


@pytest.mark.parametrize("bad", [{"severity": "crimson"}, {"severity": ">=crimson"}, {"run": []},
                                 {"run": {"a": 1}}, {"": "x"}, "severity=red"])
def test_bad_matchers_are_refused_with_a_reason(bad):
    with pytest.raises(ValueError):
        Matchers.parse(bad)


def test_command_line_form():
    assert parse_matcher_args(["run=exp-*", "severity=>=red", "rule!=kl_*", "rule!=nan_inf"]) == {
        "run": ["exp-*"], "severity": [">=red"], "rule": ["!kl_*", "!nan_inf"]}
    with pytest.raises(ValueError, match="name=pattern"):
        parse_matcher_args(["exp-*"])
    with pytest.raises(ValueError, match="crimson"):
        parse_matcher_args(["severity=crimson"])
