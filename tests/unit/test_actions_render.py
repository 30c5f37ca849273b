"""alerts.actions (alert -> commands), alerts.render (text, Slack), contract.commands (HMAC)."""

from __future__ import annotations

import pytest

from alerts.actions import Enforcement, commands_for
from alerts.render import TIER_COLOURS, slack_blocks, text
from contract.alert import SEVERITIES, Alert
from contract.commands import Command, next_state


def alert(**kw) -> Alert:
    base = dict(rule="kl_above_target", severity="red", state="firing", run_id="ppo-8b-a",
                step=1204, onset_step=1200, value=0.131, threshold=0.125,
                actions=["pause", "snapshot"], summary="Mean KL 0.131 above 0.125",
                diagnosis="Probably: beta too small.")
    base.update(kw)
    return Alert(**base)


def actions_of(cmds):
    return [c.action for c in cmds]


# -- commands_for -----------------------------------------------------------------------------

def test_pause_and_snapshot_become_commands_for_the_run():
    cmds = commands_for(alert(), now=123.0)
    assert actions_of(cmds) == ["pause", "snapshot"]
    for c in cmds:
        assert c.run_id == "ppo-8b-a" and c.ts == 123.0
        assert c.rule == "kl_above_target" and c.severity == "red" and c.step == 1204
        assert "kl_above_target" in c.reason and c.issuer == "rule:kl_above_target"


def test_notify_is_never_a_command():
    assert commands_for(alert(actions=["notify"]), now=0.0) == []


def test_advisory_actions_become_no_command():
    a = alert(actions=["notify", "adjust", "pause", "snapshot"], adjust={"beta": 1.5})
    assert actions_of(commands_for(a, 0.0)) == ["pause", "adjust", "snapshot"]
    assert actions_of(commands_for(a, 0.0, Enforcement.parse("adjust"))) == ["pause", "snapshot"]
    assert actions_of(commands_for(a, 0.0, Enforcement.parse("adjust, pause"))) == ["snapshot"]
    assert commands_for(a, 0.0, Enforcement.parse("all")) == []


def test_enforcement_parse_rejects_unknown_names():
    with pytest.raises(ValueError, match="nuke"):
        Enforcement.parse("pause,nuke")
    assert Enforcement.parse(None) == Enforcement() and Enforcement.parse("") == Enforcement()


def test_stop_supersedes_pause_and_comes_first():
    a = alert(severity="black", actions=["snapshot", "pause", "stop"])
    assert actions_of(commands_for(a, 0.0)) == ["stop", "snapshot"]


def test_rollback_without_checkpoint_gives_no_command():
    a = alert(severity="black", actions=["stop", "rollback"], rollback_to=None)
    assert actions_of(commands_for(a, 0.0)) == ["stop"]


def test_rollback_with_checkpoint_names_it():
    a = alert(severity="black", actions=["stop", "rollback"],
              rollback_to={"step": 1100, "checkpoint": "s3://ckpt/1100"})
    cmds = commands_for(a, 0.0)
    assert actions_of(cmds) == ["stop", "rollback"]
    assert cmds[1].params == {"to_step": 1100, "checkpoint": "s3://ckpt/1100"}


def test_adjust_carries_the_factors_and_is_skipped_without_any():
    a = alert(severity="yellow", actions=["notify", "adjust"], adjust={"beta": 1.5, "lr": 0.5})
    [cmd] = commands_for(a, 0.0)
    assert cmd.action == "adjust" and cmd.params == {"beta": 1.5, "lr": 0.5}
    assert commands_for(alert(actions=["adjust"], adjust={}), 0.0) == []


def test_resolved_alerts_send_nothing():
    assert commands_for(alert(state="resolved"), 0.0) == []


def test_commands_are_signed_when_a_secret_is_given():
    cmds = commands_for(alert(), 0.0, secret="s3cret")
    assert cmds and all(c.signature and c.verify("s3cret") for c in cmds)
    assert all(c.signature is None for c in commands_for(alert(), 0.0))


# -- render ----------------------------------------------------------------------------------

@pytest.mark.parametrize("severity", SEVERITIES)
def test_slack_attachment_has_the_tier_colour(severity):
    fallback, blocks, attachments = slack_blocks(alert(severity=severity))
    assert attachments[0]["color"] == TIER_COLOURS[severity]
    assert severity.upper() in blocks[0]["text"]["text"]
    assert "kl_above_target" in blocks[0]["text"]["text"]
    assert "ppo-8b-a" in fallback


def test_tier_colours_are_distinct():
    assert len(set(TIER_COLOURS.values())) == len(SEVERITIES)


def test_resolved_is_green_and_says_resolved():
    fallback, blocks, attachments = slack_blocks(alert(state="resolved", severity="black"))
    colour = attachments[0]["color"].lstrip("#")
    r, g, b = (int(colour[i:i + 2], 16) for i in (0, 2, 4))
    assert g > r and g > b, f"resolved colour #{colour} is not green"
    assert attachments[0]["color"] not in TIER_COLOURS.values()
    assert "RESOLVED" in blocks[0]["text"]["text"]
    assert fallback.startswith("[RESOLVED]")
    # no diagnosis block for a resolved alert
    texts = [b.get("text", {}).get("text", "") for b in attachments[0]["blocks"]]
    assert not any("Probably" in t for t in texts)


def test_firing_slack_message_has_diagnosis_value_and_what_was_done():
    _, _, attachments = slack_blocks(alert(), done=["pause", "snapshot"])
    blob = str(attachments)
    assert "Probably: beta too small." in blob
    assert "0.131" in blob and "0.125" in blob
    assert "pause, snapshot" in blob


def test_text_line():
    line = text(alert(rank=3), done=["pause"])
    assert line == ("[RED] ppo-8b-a rank 3 step 1204 kl_above_target: "
                    "Mean KL 0.131 above 0.125 -> pause")


# -- command signing -------------------------------------------------------------------------

def cmd(**kw) -> Command:
    base = dict(run_id="ppo-8b-a", action="adjust", params={"beta": 1.5}, ts=1764500000.0,
                reason="KL high", issuer="rule:kl_above_target")
    base.update(kw)
    return Command(**base)


def test_signed_command_verifies_and_survives_json_transport():
    c = cmd().signed("key-1")
    assert c.signature and c.verify("key-1")
    again = Command.model_validate_json(c.model_dump_json())
    assert again.verify("key-1")


def test_forged_signature_is_rejected():
    assert not cmd().signed("attacker-key").verify("key-1")
    forged = cmd().model_copy(update={"signature": "0" * 64})
    assert not forged.verify("key-1")


def test_tampered_params_are_rejected():
    c = cmd().signed("key-1")
    tampered = c.model_copy(update={"params": {"beta": 0.01}})
    assert not tampered.verify("key-1")
    retargeted = c.model_copy(update={"run_id": "other-run"})
    assert not retargeted.verify("key-1")
    escalated = c.model_copy(update={"action": "stop"})
    assert not escalated.verify("key-1")


def test_unsigned_command_needs_no_secret_but_fails_with_one():
    c = cmd()
    assert c.verify(None) and c.verify("")
    assert not c.verify("key-1")


def test_bytes_and_str_secrets_are_equivalent():
    assert cmd().signed(b"key-1").verify("key-1")


def test_unknown_action_is_refused():
    with pytest.raises(ValueError):
        cmd(action="reboot")


def test_next_state():
    assert next_state("running", "pause") == "paused"
    assert next_state("paused", "resume") == "running"
    assert next_state("running", "stop") == "stopped"
    assert next_state("stopped", "pause") == "stopped"
    assert next_state("stopped", "resume") == "running"   # an operator relaunching the run
    assert next_state("paused", "adjust") == "paused"
