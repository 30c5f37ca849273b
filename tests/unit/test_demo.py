"""rlwatch.demo.run_demo: the whole loop in one process pauses the faulty run, leaves the
healthy one alone, and the worker's acknowledgements reach the audit trail."""

from __future__ import annotations

import io

import pytest

from contract.alert import severity_rank
from rlwatch.demo import run_demo


@pytest.fixture(scope="module")
def demo():
    out = io.StringIO()
    result = run_demo(steps=260, onset=80, delay=0.01, pause_hold=0.5, out=out)
    return result, out.getvalue()


def test_the_faulty_run_is_paused_and_the_healthy_one_is_not(demo):
    result, _ = demo
    assert "ppo-kl-blowup" in result.paused_runs
    assert "ppo-healthy" not in result.paused_runs
    # paused after the fault was injected, not before
    assert result.paused_runs["ppo-kl-blowup"] >= 80


def test_the_healthy_run_raises_nothing_orange_or_above(demo):
    result, _ = demo
    loud = [a for a in result.alerts if a.run_id == "ppo-healthy" and a.state == "firing"
            and severity_rank(a.severity) >= severity_rank("orange")]
    assert loud == [], [(a.rule, a.severity, a.step) for a in loud]


def test_the_pause_came_from_a_rule_on_the_faulty_run(demo):
    result, _ = demo
    pauses = [c for c in result.commands if c.action == "pause"]
    assert pauses and all(c.run_id == "ppo-kl-blowup" for c in pauses)
    assert pauses[0].issuer.startswith("rule:") and pauses[0].rule == "kl_above_target"
    fired = [a for a in result.alerts if a.run_id == "ppo-kl-blowup" and a.state == "firing"]
    assert any(a.rule == "kl_above_target" and "pause" in a.actions for a in fired)


def test_the_audit_contains_the_workers_acks(demo):
    result, _ = demo
    audit = result.audit["ppo-kl-blowup"]
    acks = [e for e in audit if e.get("type") == "ack"]
    assert acks
    assert ("pause", "applied") in {(a["action"], a["status"]) for a in acks}
    assert ("resume", "applied") in {(a["action"], a["status"]) for a in acks}
    commanded = {e["id"] for e in audit if e.get("type") == "command"}
    assert {a["command_id"] for a in acks} <= commanded   # every ack answers a known command
    assert not [e for e in result.audit["ppo-healthy"] if e.get("type") == "ack"]


def test_the_operator_resumed_and_both_runs_finished(demo):
    result, _ = demo
    assert result.final_steps == {"ppo-healthy": 259, "ppo-kl-blowup": 259}
    assert any(c.action == "resume" and c.run_id == "ppo-kl-blowup" for c in result.commands)


def test_the_console_shows_the_alert_and_the_pause(demo):
    _, text = demo
    assert "kl_above_target" in text
    assert "PAUSED" in text and "ppo-kl-blowup" in text
    assert "\033[" not in text   # no colour codes into a non-terminal
