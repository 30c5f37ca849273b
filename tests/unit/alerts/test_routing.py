"""alerts.routing and its neighbours: the routing tree (route.go semantics), the routes file's
validation, grouping clocks, inhibition and per-run enforcement. Pure: no Redis, no clock."""

from __future__ import annotations

import pytest

from alerts.matchers import Matchers
from alerts.grouping import GroupClock, due, group_key, repeat_due
from alerts.inhibition import DEFAULT_INHIBIT_RULES, InhibitRule, inhibited_by
from alerts.intervals import Interval, parse_interval
from alerts.routes_file import RoutesFileError, load_routes, load_routes_text
from alerts.routing import Routing
from tests.unit.alerts._helpers import T0, alert

FAKE_BOT = "xox" + "b-"   # a bot-token prefix, built so no literal looks like a real token

RECEIVERS = ["console", "slack-webhook", "webhook", "pagerduty"]

TREE = """
route:
  receiver: slack-webhook
  group_by: [run]
  group_interval: 5m
  routes:
    - match: {severity: ">=red"}
      receiver: pagerduty
      continue: true
      routes:
        - match: {rule: nan_inf}
          receiver: [pagerduty, webhook]
          repeat_interval: 1h
    - match: {run: "exp-*"}
      receiver: webhook
      group_wait: 20 steps
    - match: {run: "exp-*"}
      receiver: console
"""


def targets(routing, **kw):
    return [(r.id, name) for r, name in routing.targets(alert(**kw))]


def test_default_config_sends_everything_everywhere_at_once():
    r = Routing.default(RECEIVERS)
    for sev in ("info", "yellow", "black"):
        assert [n for _, n in r.targets(alert(severity=sev))] == RECEIVERS
    assert r.inhibit_rules == ()
    root = r.root
    assert root.group_wait.zero and root.group_interval.zero and root.repeat_interval.zero


def test_first_matching_child_wins_unless_continue():
    r = load_routes_text(TREE, RECEIVERS)
    # red on a ppo run: pagerduty (continue) then no other sibling matches -> only pagerduty
    assert targets(r, severity="red") == [("root.0", "pagerduty")]
    # red on an exp run: pagerduty (continue) and then the first exp route; not the second
    assert targets(r, severity="red", run_id="exp-3") == [("root.0", "pagerduty"), ("root.1", "webhook")]
    # yellow on an exp run: the exp route only
    assert targets(r, severity="yellow", run_id="exp-3") == [("root.1", "webhook")]
    # yellow on a ppo run: no child matches -> the root takes it
    assert targets(r, severity="yellow") == [("root", "slack-webhook")]
    # the deepest match wins; a receiver reached twice counts once
    assert targets(r, severity="black", rule="nan_inf") == [("root.0.0", "pagerduty"), ("root.0.0", "webhook")]


def test_children_inherit_what_they_do_not_set():
    r = load_routes_text(TREE, RECEIVERS)
    nan = r.routes_by_id["root.0.0"]
    assert nan.group_by == ("run",) and nan.group_interval == Interval(300.0)
    assert nan.repeat_interval == Interval(3600.0)
    assert r.routes_by_id["root.0"].repeat_interval.zero
    exp = r.routes_by_id["root.1"]
    assert exp.group_wait == Interval(20.0, "steps") and exp.group_interval == Interval(300.0)


def test_root_without_receiver_means_every_configured_receiver():
    r = load_routes_text("route: {group_by: [run]}", RECEIVERS)
    assert [n for _, n in r.targets(alert())] == RECEIVERS


def test_file_defined_receivers_and_env_expansion(monkeypatch):
    monkeypatch.setenv("ONCALL_TOKEN", FAKE_BOT + "oncall")
    r = load_routes_text("""
receivers:
  - {name: oncall, type: slack_bot, channel: "#oncall", token: "${ONCALL_TOKEN}"}
route:
  receiver: oncall
""", RECEIVERS)
    assert r.receivers[0].token == FAKE_BOT + "oncall"
    assert [n for _, n in r.targets(alert())] == ["oncall"]


@pytest.mark.parametrize("text, message", [
    ("route:\n  receiver: slak\n", ":2: route.receiver: unknown receiver 'slak'"),
    ("route:\n  receiver: console\n  routes:\n    - match: {severity: crimson}\n",
     ":4: route.routes.0.match: severity: unknown severity 'crimson'"),
    ("route:\n  group_wait: 5 fortnights\n", ":2: route.group_wait: unknown unit 'fortnights'"),
    ("route:\n  grouping: [run]\n", ":2: route.grouping: Extra inputs are not permitted"),
    ("enforcement:\n  - runs: exp-*\n    advisory: [pause, nuke]\n", ":3: enforcement.0.advisory: unknown actions nuke"),
    ("receivers:\n  - {name: x, type: pager}\n", ":2: receivers.0.type:"),
    ("receivers:\n  - {name: x, type: webhook, url: '${NOT_SET_ANYWHERE_1}'}\n", "NOT_SET_ANYWHERE_1 is not set"),
    ("route: [\n", "not valid YAML"),
    ("- a\n- b\n", ":1: a routes file is a mapping"),
])
def test_config_errors_name_the_line_and_field(text, message):
    with pytest.raises(RoutesFileError) as exc:
        load_routes_text(text, RECEIVERS, source="routes.yaml")
    assert message in str(exc.value)
    assert str(exc.value).startswith("routes.yaml")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(RoutesFileError, match="no such routes file"):
        load_routes(tmp_path / "nope.yaml", RECEIVERS)


@pytest.mark.parametrize("text, expected", [
    (30, Interval(30.0)), ("30s", Interval(30.0)), ("5m", Interval(300.0)), ("2h", Interval(7200.0)),
    ("1d", Interval(86400.0)), ("20 steps", Interval(20.0, "steps")), ("1step", Interval(1.0, "steps")),
    ("0", Interval(0.0)),
])
def test_intervals(text, expected):
    assert parse_interval(text) == expected


@pytest.mark.parametrize("bad", [-1, True, "soon", "5 fortnights", [5]])
def test_bad_intervals(bad):
    with pytest.raises(ValueError):
        parse_interval(bad)


# -- grouping ---------------------------------------------------------------------------------

def route(**kw):
    spec = "route:\n  receiver: console\n" + "".join(f"  {k}: {v}\n" for k, v in kw.items())
    return load_routes_text(spec, RECEIVERS).root


def test_group_waits_group_wait_first_then_group_interval():
    r = route(group_wait="30s", group_interval="5m")
    clock = GroupClock("root", "ppo-8b-a", created_ts=T0, created_step=100)
    assert due(clock, r) == (T0 + 30, None)
    clock.last_flush_ts, clock.last_flush_step = T0 + 30, 104
    assert due(clock, r) == (T0 + 330, None)


def test_group_waits_in_steps():
    r = route(group_wait="'10 steps'", group_interval="'50 steps'")
    clock = GroupClock("root", "ppo-8b-a", created_ts=T0, created_step=100)
    assert due(clock, r) == (None, 110)
    clock.last_flush_ts, clock.last_flush_step = T0 + 5, 112
    assert due(clock, r) == (None, 162)


def test_no_wait_means_now():
    r = route()
    assert due(GroupClock("root", "r", T0, 1), r) == (T0, None)


def test_repeat_due_in_seconds_and_steps():
    r = route(repeat_interval="1h")
    c = GroupClock("root", "r", T0, 10)
    assert not repeat_due(c, r, T0 + 7200, None)            # never notified: nothing to repeat
    c.last_flush_ts, c.last_flush_step = T0, 10
    assert not repeat_due(c, r, T0 + 3599, None)
    assert repeat_due(c, r, T0 + 3600, None)
    rs = route(repeat_interval="'100 steps'")
    assert not repeat_due(c, rs, T0 + 10**6, 109)
    assert repeat_due(c, rs, T0, 110)
    assert not repeat_due(c, route(), T0 + 10**9, 10**9)   # no repeat_interval: never


def test_group_key_uses_the_route_and_group_by_values():
    r = load_routes_text(TREE, RECEIVERS)
    a, b = alert(rule="kl_above_target"), alert(rule="entropy_collapse")
    assert group_key(r.root, a) == group_key(r.root, b) == "root|run=ppo-8b-a"
    assert group_key(r.root, alert(run_id="ppo-2")) != group_key(r.root, a)


# -- inhibition -------------------------------------------------------------------------------

def test_black_or_red_mutes_lower_tiers_of_the_same_run():
    red = alert(severity="red", rule="kl_above_target")
    black = alert(severity="black", rule="nan_inf")
    yellow = alert(severity="yellow", rule="entropy_collapse")
    other_run = alert(severity="yellow", run_id="ppo-other")
    rules = DEFAULT_INHIBIT_RULES
    assert inhibited_by(yellow, [red], rules) == red
    assert inhibited_by(red, [black], rules) == black
    assert inhibited_by(red, [red.model_copy(update={"rule": "x", "fingerprint": "f2"})], rules) is None  # same tier
    assert inhibited_by(other_run, [red, black], rules) is None
    assert inhibited_by(black, [red], rules) is None
    assert inhibited_by(yellow, [], rules) is None
    # only firing sources mute, and only firing targets are muted
    assert inhibited_by(yellow, [red.model_copy(update={"state": "resolved"})], rules) is None
    assert inhibited_by(yellow.model_copy(update={"state": "resolved"}), [red], rules) is None


def test_an_alert_never_inhibits_itself():
    rule = InhibitRule(Matchers.parse({}), Matchers.parse({}), ("run",))
    a = alert()
    assert inhibited_by(a, [a], [rule]) is None


def test_configured_inhibit_rules_replace_the_defaults():
    r = load_routes_text("""
route: {receiver: console}
inhibit_rules:
  - source: {rule: nan_inf}
    target: {rule: "!nan_inf"}
    equal: [run, rank]
""", RECEIVERS)
    nan = alert(rule="nan_inf", severity="black", rank=1)
    assert inhibited_by(alert(rule="kl_above_target", rank=1), [nan], r.inhibit_rules) == nan
    assert inhibited_by(alert(rule="kl_above_target", rank=2), [nan], r.inhibit_rules) is None
    assert inhibited_by(alert(severity="yellow"), [alert(severity="black")], r.inhibit_rules) is None
    assert load_routes_text("route: {receiver: console}", RECEIVERS).inhibit_rules == DEFAULT_INHIBIT_RULES
    assert load_routes_text("route: {receiver: console}\ninhibit_rules: []", RECEIVERS).inhibit_rules == ()


# -- per-run enforcement ------------------------------------------------------------------------

def test_enforcement_is_decided_per_run_and_rule():
    r = load_routes_text("""
route: {receiver: console}
enforcement:
  - runs: "exp-*"
    rules: "kl_*"
    advisory: [pause]
  - runs: ["exp-*", "sweep-*"]
    advisory: all
  - runs: "prod-*"
    advisory: none
""", RECEIVERS, advisory=frozenset({"adjust"}))
    p = r.policy
    assert p.advisory_for("exp-1", "kl_above_target") == {"pause"}
    assert p.advisory_for("exp-1", "nan_inf") == {"pause", "stop", "rollback", "adjust", "snapshot"}
    assert p.advisory_for("sweep-4", "kl_above_target") == {"pause", "stop", "rollback", "adjust", "snapshot"}
    assert p.advisory_for("prod-1", "nan_inf") == frozenset()
    assert p.advisory_for("ppo-8b-a", "nan_inf") == {"adjust"}     # no entry: RLWATCH_ADVISORY


def test_ack_timeout_from_file_or_default():
    assert load_routes_text("ack_timeout: 15", RECEIVERS).ack_timeout == 15
    assert load_routes_text("{}", RECEIVERS, ack_timeout=42).ack_timeout == 42
    with pytest.raises(RoutesFileError, match="ack_timeout"):
        load_routes_text("ack_timeout: -1", RECEIVERS)
