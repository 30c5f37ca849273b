"""The pure pieces around delivery: silences, the ack check, sink payloads (Alertmanager,
PagerDuty), rendering of advisory actions, redaction, backoff, incident snapshots, settings."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from alerts.alertmanager import am_alert
from alerts.escalation import SentCommand, confirmed_of, escalation_alert, overdue_commands
from alerts.outbox import OutboxItem, item_id
from alerts.retry import backoff
from alerts.pagerduty import pd_event
from alerts.redact import guarded_logger, redact, safe_url
from alerts.render import slack_batch, slack_blocks
from alerts.silences import Silence, parse_duration, silenced_by
from contract.commands import Command, RunControl
from contract.events import parse_event
from contract.settings import Settings
from streams.snapshot import SnapshotRecorder, attach_snapshot, build_snapshot
from tests.unit.alerts._helpers import T0, alert

FAKE_BOT = "xox" + "b-"   # a bot-token prefix, built so no literal looks like a real token

# -- silences ---------------------------------------------------------------------------------


def test_silence_matches_while_active_only():
    s = Silence(matchers={"run": "ppo-*", "rule": "kl_*"}, starts_at=T0, ends_at=T0 + 60)
    assert silenced_by(alert(), [s], T0 + 1) == s
    assert silenced_by(alert(), [s], T0 - 1) is None and s.state(T0 - 1) == "pending"
    assert silenced_by(alert(), [s], T0 + 60) is None and s.state(T0 + 60) == "expired"
    assert silenced_by(alert(rule="nan_inf"), [s], T0 + 1) is None


def test_a_silence_needs_matchers_and_a_duration():
    with pytest.raises(ValueError, match="at least one matcher"):
        Silence(matchers={}, starts_at=T0, ends_at=T0 + 1)
    with pytest.raises(ValueError):
        Silence(matchers={"severity": "crimson"}, starts_at=T0, ends_at=T0 + 1)
    assert parse_duration("2h") == 7200 and parse_duration("90") == 90
    for bad in ("0", "10 steps", "soon"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# -- unacknowledged brakes ----------------------------------------------------------------------

def sent(i="c1", run="r", action="pause", ts=T0, severity="red"):
    return SentCommand(i, run, action, ts, "kl_above_target", severity, 120)


def test_overdue_is_a_function_of_sent_acks_and_now():
    a, b, c = sent("a"), sent("b", ts=T0 + 30), sent("c", run="r2")
    overdue, done = overdue_commands([a, b, c], acked={"c"}, now=T0 + 60, timeout=60)
    assert overdue == [a] and done == [c]
    overdue, _ = overdue_commands([a, b], acked=set(), now=T0 + 90, timeout=60)
    assert overdue == [a, b]


def test_a_later_resume_or_stop_settles_a_pause():
    a = sent("a")
    resume = Command(run_id="r", action="resume", ts=T0 + 10, issuer="cli:oncall")
    ctl = {"r": RunControl(run_id="r", state="running", command=resume)}
    overdue, done = overdue_commands([a], set(), T0 + 100, 60, ctl)
    assert overdue == [] and done == [a]
    older = {"r": RunControl(run_id="r", state="running", command=resume.model_copy(update={"ts": T0 - 5}))}
    assert overdue_commands([a], set(), T0 + 100, 60, older)[0] == [a]


def test_acknowledged_brakes_are_confirmed_unless_a_stop_made_their_answer_moot():
    """An applied brake is told as holding; a pause that a stopped process answered "ignored"
    is not told (the stop is the news), but the same answer on a run not stopped is."""
    a, b = sent("a"), sent("b", ts=T0 + 20)
    applied = {"command_id": "a", "status": "applied", "rank": 0}
    ignored = {"command_id": "b", "status": "ignored", "detail": "this process was stopped", "rank": 0}
    acked = {"a": applied, "b": ignored}
    stop = Command(run_id="r", action="stop", ts=T0 + 10, issuer="rlwatch", rule="kl_above_target")
    stopped = {"r": RunControl(run_id="r", state="stopped", command=stop)}
    assert confirmed_of([a, b], acked, stopped) == [(a, applied)]
    paused = {"r": RunControl(run_id="r", state="paused", command=Command(id="a", run_id="r", action="pause", ts=T0))}
    assert confirmed_of([a, b], acked, paused) == [(a, applied), (b, ignored)]
    assert confirmed_of([a, b], {}, paused) == []


def test_a_brake_acknowledgement_says_what_each_rank_answered():
    from alerts.notices import acknowledged_notice
    from alerts.render import slack_blocks

    ok = {r: {"status": "applied", "rank": r, "ts": T0 + 2.0} for r in range(8)}
    stop = SentCommand("c1", "r", "stop", T0, "nan_inf", "black", 50, "stop")
    n = acknowledged_notice(stop, ok, T0 + 3)
    assert n.summary == "run r: the stop for nan_inf (black) holds: ranks 0-7 acknowledged it 2.0s after it was sent; the run is stopped"
    assert (n.labels["ack_ranks"], n.labels["ack_status"], n.labels["run_state"], n.value) == ("0-7", "applied", "stopped", 2.0)
    _, head, attachments = slack_blocks(n)
    assert head[0]["text"]["text"] == "✅ STOP holds — r"
    assert {"type": "mrkdwn", "text": "*Acknowledged by*\nranks 0-7 after 2s"} in attachments[0]["blocks"][0]["fields"]
    mixed = {**ok, 5: {"status": "failed", "detail": "stuck in a collective", "rank": 5, "ts": T0 + 2.0}}
    pause = SentCommand("c1", "r", "pause", T0, "kl_spike", None, None, "pause")
    m = acknowledged_notice(pause, mixed, T0 + 3)
    assert m.summary == ("run r: the pause for kl_spike: the run answered failed (rank 5): stuck in a collective; "
                         "applied (ranks 0-4, 6-7)")
    assert (m.labels["ack_status"], m.labels["run_state"]) == ("failed", "")
    assert slack_blocks(m)[1][0]["text"]["text"] == "⚠️ PAUSE answered — r"
    # a worker clock far ahead of the monitor's is not believed: the time the monitor saw it
    skewed = acknowledged_notice(pause, {0: {"status": "applied", "rank": 0, "ts": T0 + 900}}, T0 + 4)
    assert "acknowledged it within 4s" in skewed.summary and skewed.labels["ack_ranks"] == "0"
    other = SentCommand("c2", "r", "stop", T0)
    assert n.fingerprint == m.fingerprint != acknowledged_notice(other, ok, T0 + 3).fingerprint


def test_the_ranks_that_did_not_answer_are_named_and_the_brake_is_not_said_to_hold():
    from alerts.escalation import complete
    from alerts.notices import acknowledged_notice
    from alerts.render import slack_blocks

    pause = SentCommand("c1", "r", "pause", T0, "kl_spike", "red", 40, "pause")
    seven = {r: {"status": "applied", "rank": r, "world_size": 8, "ts": T0 + 1.0} for r in range(8) if r != 5}
    # told when all eight answered, or once the timeout passed
    assert not complete(pause, seven, T0 + 10, 60)
    assert complete(pause, seven, T0 + 60, 60)
    assert complete(pause, {**seven, 5: {"status": "applied", "rank": 5, "world_size": 8}}, T0 + 2, 60)
    assert complete(pause, {0: {"status": "applied", "rank": 0}}, T0 + 2, 60)     # size unknown: the first
    assert complete(pause, {0: {"status": "applied", "rank": 0, "world_size": 10**9}}, T0 + 2, 60)  # not believed
    n = acknowledged_notice(pause, seven, T0 + 61)
    assert n.summary == ("run r: the pause for kl_spike (red) holds on 7 of 8 ranks: ranks 0-4, 6-7 acknowledged it "
                         "1.0s after it was sent; rank 5 did not answer within 61s")
    assert (n.labels["ack_status"], n.labels["ack_world"], n.labels["ack_silent"], n.labels["run_state"]) == \
        ("partial", "8", "5", "")
    _, head, attachments = slack_blocks(n)
    assert head[0]["text"]["text"] == "⚠️ PAUSE holds on some ranks — r"
    assert {"type": "mrkdwn", "text": "*Acknowledged by*\nranks 0-4, 6-7 of 8 after 1s\n*Silent:* rank 5"} in \
        attachments[0]["blocks"][0]["fields"]
    # a rank that failed is said first, the silent ones after
    failed = {**seven, 0: {"status": "failed", "detail": "boom", "rank": 0, "world_size": 8, "ts": T0 + 1.0}}
    f = acknowledged_notice(pause, failed, T0 + 61)
    assert f.summary.endswith("answered failed (rank 0): boom; applied (ranks 1-4, 6-7); rank 5 did not answer within 61s")
    assert f.labels["ack_status"] == "failed"


def test_a_rules_adjust_or_rollback_is_told_applied_or_not():
    """The alert said the monitor adjusted the run; a script without on_adjust did nothing."""
    from alerts.notices import acknowledged_notice
    from alerts.render import slack_blocks

    adjust = SentCommand.of(Command(id="a1", run_id="r", action="adjust", ts=T0, rule="kl_rising",
                                    severity="orange", step=300, params={"beta": 1.5}))
    ignored = {r: {"status": "ignored", "detail": "no on_adjust callback", "rank": r, "ts": T0 + 4} for r in (0, 1)}
    n = acknowledged_notice(adjust, ignored, T0 + 5)
    assert n.summary == ("run r: the adjust beta=1.5 for kl_rising (orange): the run answered ignored (ranks 0-1): "
                         "no on_adjust callback")
    assert (n.labels["command"], n.labels["ack_status"], n.labels["run_state"]) == ("adjust", "ignored", "")
    assert slack_blocks(n)[1][0]["text"]["text"] == "⚠️ ADJUST not applied — r"
    rollback = SentCommand.of(Command(id="b1", run_id="r", action="rollback", ts=T0, rule="nan_inf",
                                      params={"to_step": 120, "checkpoint": "/ck/120"}))
    done = acknowledged_notice(rollback, {0: {"status": "applied", "rank": 0, "ts": T0 + 1}}, T0 + 2)
    assert done.summary == ("run r: the rollback to step 120 (/ck/120) for nan_inf was applied: "
                            "rank 0 acknowledged it 1.0s after it was sent")
    assert slack_blocks(done)[1][0]["text"]["text"] == "✅ ROLLBACK applied — r"


def test_escalation_alert_goes_one_tier_up_and_names_run_and_command():
    e = escalation_alert(sent(severity="red"), 60, T0 + 61)
    assert (e.rule, e.severity, e.state, e.run_id) == ("control_unacknowledged", "black", "firing", "r")
    assert "pause" in e.summary and "r" in e.summary and e.labels["command_id"] == "c1"
    assert escalation_alert(sent(severity="orange"), 60, T0).severity == "red"
    assert escalation_alert(sent(severity="black"), 60, T0).severity == "black"
    res = escalation_alert(sent(severity="red"), 60, T0 + 100, state="resolved")
    assert res.fingerprint == e.fingerprint and res.onset_step == e.onset_step


# -- sinks ------------------------------------------------------------------------------------

def test_alertmanager_payload():
    a = alert(labels={"team": "rl"}, rank=2).model_copy(update={"incident": "inc-1"})
    p = am_alert(a, ["pause"], now=T0, generator_url="http://dash/run?run={run_id}")
    assert p["labels"] == {"alertname": "kl_above_target", "severity": "red", "run_id": "ppo-8b-a",
                           "source": "rlwatch", "rank": "2", "team": "rl"}
    assert p["annotations"]["summary"] == "Mean KL 0.131 above 0.125"
    assert p["annotations"]["description"].startswith("Probably")
    assert p["annotations"]["actions_taken"] == "pause" and p["annotations"]["incident"] == "inc-1"
    assert p["startsAt"] == "2025-11-30T10:53:20.000Z" and p["endsAt"] > p["startsAt"]
    assert p["generatorURL"] == "http://dash/run?run=ppo-8b-a"
    r = am_alert(alert(state="resolved"), [], now=T0)
    assert r["endsAt"] == r["startsAt"] and "generatorURL" not in r


def test_pagerduty_event():
    t = pd_event(alert(), ["pause"], "RKEY", now=T0)
    assert t["routing_key"] == "RKEY" and t["event_action"] == "trigger"
    assert t["dedup_key"] == alert().fingerprint
    assert t["payload"]["severity"] == "error" and t["payload"]["source"] == "ppo-8b-a"
    assert "Mean KL" in t["payload"]["summary"] and t["payload"]["custom_details"]["actions_taken"] == ["pause"]
    assert pd_event(alert(severity="black"), [], "K", now=T0)["payload"]["severity"] == "critical"
    r = pd_event(alert(state="resolved"), [], "RKEY", now=T0)
    assert r == {"routing_key": "RKEY", "dedup_key": alert().fingerprint, "event_action": "resolve"}


def test_slack_says_what_stayed_advisory_and_where_the_snapshot_is():
    a = alert().model_copy(update={"actions_advisory": ["stop"], "incident": "inc-9"})
    _, _, att = slack_blocks(a, ["pause"])
    blob = str(att)
    assert "advisory, not enforced for this run: stop" in blob and "rlwatch incidents show inc-9" in blob


def test_slack_batch_is_one_message():
    fallback, blocks, att = slack_batch([alert(), alert(rule="nan_inf", severity="black")], [["pause"], []])
    assert "2 alerts" in blocks[0]["text"]["text"] and len(att) == 2
    assert fallback.count("\n") == 1


# -- redaction --------------------------------------------------------------------------------

def test_redact_masks_secrets_passwords_hooks_and_tokens():
    text = ("https://hooks.slack.com/" + "services/T1/B2/zzTOPsecret redis://:pw@h:6379 "
            "Bearer abc.def " + FAKE_BOT + "123-456 key=ROUTINGKEY1")
    out = redact(text, ["ROUTINGKEY1"])
    for secret in ("zzTOPsecret", ":pw@", "abc.def", FAKE_BOT + "123", "ROUTINGKEY1"):
        assert secret not in out
    assert safe_url("https://hooks.slack.com/" + "services/T1/B2/x?token=y") == "https://hooks.slack.com"


def test_guarded_logger_redacts_and_is_quiet_below_warning(caplog):
    log = guarded_logger("test-sink", ["S3CR3T-value"])
    with caplog.at_level(logging.DEBUG):
        log.info("retrying POST https://x/S3CR3T-value")
        log.warning("failed POST https://x/S3CR3T-value")
    assert "S3CR3T-value" not in caplog.text and "failed POST" in caplog.text
    assert "retrying" not in caplog.text


def test_backoff_and_item_ids():
    assert [backoff(n, 2.0, 10.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 10.0]
    assert item_id("slack", "k") == item_id("slack", "k") != item_id("hook", "k") != item_id("slack", "k", "repeat:1")


def test_an_outbox_item_is_stored_as_its_fields_and_read_back_whole():
    """The stored text of an item is every field in order (what workers of every version read),
    and reading it gives the item back; the list it holds is not shared with the text read."""
    item = OutboxItem(item_id("slack", "k"), "slack", "g", "k", "run-\u00e9", '{"step": 7, "x": "\\"q\\""}',
                      ["pause"], enqueued=1.5, next_try=2.25, due_step=9, attempts=2,
                      last_error="timeout", variant="repeat:1")
    text = item.to_json()
    assert text == json.dumps(dataclasses.asdict(item), separators=(",", ":"))
    assert list(json.loads(text)) == [f.name for f in dataclasses.fields(OutboxItem)]
    back = OutboxItem.from_json(text)
    assert back == item and back.done is not item.done and back.step == 7


# -- incident snapshots -------------------------------------------------------------------------

def ev(**kw):
    return parse_event({"schema": 1, **kw}, T0)


def test_snapshot_keeps_the_window_the_offending_and_the_stable_samples():
    rec = SnapshotRecorder(steps=500)
    for step in range(200):
        for rank in (0, 1):
            kl = 0.02 if step < 152 else 0.2
            rec.observe(ev(kind="step", run_id="r", rank=rank, step=step, metrics={"kl/mean": kl + rank * 1e-3},
                           batch_ids=[f"b{step}-{rank}"]))
        if step % 10 == 0:
            rec.observe(ev(kind="samples", run_id="r", step=step, samples=[
                {"prompt_id": f"p{step}", "response": "x" * 5000, "reward": 1.0 if step < 152 else 9.0}]))
    a = alert(run_id="r", step=160, onset_step=152, metric="kl/mean", actions=["pause", "snapshot"])
    snap = build_snapshot(a, rec, before=10, after=5)
    steps = [w["step"] for w in snap["window"]["steps"]]
    assert steps[0] == 142 and steps[-1] == 160 and len(steps) == 19
    assert snap["offending"]["step"] == 160 and snap["offending"]["samples"][0]["reward"] == 9.0
    assert snap["last_stable"]["step"] == 150 and snap["last_stable"]["samples"][0]["reward"] == 1.0
    assert snap["last_stable"]["metrics"]["kl/mean"] == pytest.approx(0.02)  # step 151, the last before onset
    assert len(snap["offending"]["samples"][0]["response"]) < 1600          # texts are clipped
    assert snap["ranks"] == {"0": {"value": pytest.approx(0.2), "batch_ids": ["b160-0"]},
                             "1": {"value": pytest.approx(0.201), "batch_ids": ["b160-1"]}}


def test_the_last_stable_step_is_before_the_first_bad_value_when_the_rule_lags():
    """A rule reading a median of 3 that holds for 3 steps has its onset two steps after the
    first bad value: the last stable step is the last one on the healthy side of the line."""
    rec = SnapshotRecorder(steps=500)
    for step in range(60):
        kl = 0.02 if step < 30 else 0.2
        rec.observe(ev(kind="step", run_id="r", step=step, metrics={"kl/mean": kl}))
        if step % 2 == 0:
            rec.observe(ev(kind="samples", run_id="r", step=step, samples=[
                {"prompt_id": f"p{step}", "response": "x", "reward": 1.0 if step < 30 else 9.0}]))
    a = alert(run_id="r", step=36, onset_step=32, metric="kl/mean", value=0.2, threshold=0.125,
              actions=["pause", "snapshot"])
    snap = build_snapshot(a, rec)
    assert snap["last_stable"]["metrics"]["kl/mean"] == pytest.approx(0.02)     # step 29, not 31
    assert snap["last_stable"]["step"] == 28 and snap["last_stable"]["samples"][0]["reward"] == 1.0
    # a threshold on another scale (a signal's z-score) leaves the step before the onset
    z = alert(run_id="r", step=36, onset_step=32, metric="kl/mean", value=8.0, threshold=5.0,
              actions=["pause", "snapshot"])
    assert build_snapshot(z, rec)["last_stable"]["metrics"]["kl/mean"] == pytest.approx(0.2)
    attached = attach_snapshot(a, rec)
    assert attached.snapshot["run_id"] == "r"
    assert attach_snapshot(alert(actions=["pause"]), rec) .model_extra == {}
    assert "snapshot" not in (attach_snapshot(alert(state="resolved"), rec).model_extra or {})


def test_snapshot_recorder_is_bounded_in_runs_and_steps():
    rec = SnapshotRecorder(steps=3, sample_batches=2, max_runs=2)
    for run_id in ("a", "b", "c"):
        for s in range(10):
            rec.observe(ev(kind="step", run_id=run_id, step=s, metrics={"x": 1.0}))
    assert list(rec.runs) == ["b", "c"] and len(rec.runs["c"].steps) == 3
    with pytest.raises(ValueError):
        SnapshotRecorder(steps=0)
    # many ranks do not crowd rank 0's window out
    wide = SnapshotRecorder(steps=10, other_ranks=7)
    for s in range(20):
        for rank in range(8):
            wide.observe(ev(kind="step", run_id="w", rank=rank, step=s, metrics={"x": float(s)}))
    snap = build_snapshot(alert(run_id="w", step=19, onset_step=15), wide)
    assert [w["step"] for w in snap["window"]["steps"]] == list(range(10, 20))
    assert sorted(snap["ranks"]) == [str(r) for r in range(8)]
    # unknown run: an empty but well-formed snapshot
    snap = build_snapshot(alert(run_id="zzz"), rec)
    assert snap["window"]["steps"] == [] and snap["offending"]["samples"] == []


# -- settings: Kafka security passes through, secrets are masked ---------------------------------

def test_kafka_security_reaches_kafka_python_and_faust():
    from streams.app import broker_credentials

    s = Settings(kafka_security_protocol="sasl_ssl", kafka_sasl_mechanism="PLAIN",
                 kafka_sasl_username="svc", kafka_sasl_password="pw")
    assert s.kafka_python_kwargs() == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                       "sasl_plain_username": "svc", "sasl_plain_password": "pw"}
    creds = broker_credentials(s)
    assert creds.username == "svc" and creds.password == "pw" and creds.ssl_context is not None
    assert str(creds.protocol.value) == "SASL_SSL"
    plain = Settings(kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="u", kafka_sasl_password="p")
    assert plain.kafka_python_kwargs()["security_protocol"] == "SASL_PLAINTEXT"
    assert str(broker_credentials(plain).protocol.value) == "SASL_PLAINTEXT"
    ssl_only = Settings(kafka_security_protocol="SSL")
    assert type(broker_credentials(ssl_only)).__name__ == "SSLCredentials"
    assert broker_credentials(Settings()) is None and Settings().kafka_python_kwargs() == {}


def test_settings_describe_masks_secrets_and_url_passwords(monkeypatch):
    monkeypatch.setenv("RLWATCH_REDIS", "rediss://worker:topsecret@redis.internal:6380/0")
    monkeypatch.setenv("RLWATCH_PAGERDUTY_ROUTING_KEY", "R0UTINGKEY")
    monkeypatch.setenv("RLWATCH_KAFKA_SASL_PASSWORD", "kafkapw")
    monkeypatch.setenv("RLWATCH_ACK_TIMEOUT", "15")
    s = Settings.from_env()
    text = str(s.describe())
    for secret in ("topsecret", "R0UTINGKEY", "kafkapw"):
        assert secret not in text
    assert "rediss://worker:***@redis.internal:6380/0" in text and s.ack_timeout == 15.0
