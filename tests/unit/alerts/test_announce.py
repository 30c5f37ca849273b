"""An operator's command told to the run's receivers (alerts.operator.operator_notice,
alerts.announce.Announcer): who sent what and why, routed as a worker routes alerts, each
receiver's failure reported to the operator and left in the outbox for the workers to retry, a
silence of the run obeyed; the console, Alertmanager and PagerDuty left out."""

from __future__ import annotations

import asyncio

from alerts.announce import Announcer
from alerts.notifiers import ConsoleNotifier, DeliveryError
from alerts.operator import OPERATOR_RULE, operator_notice, say_sent
from alerts.render import slack_blocks, text
from alerts.routes_file import load_routes_text
from contract.commands import Command
from tests.unit.alerts._helpers import T0, Recording, run


def _cmd(action="pause", **kw) -> Command:
    kw.setdefault("reason", "KL blew up, looking at samples")
    kw.setdefault("issuer", "cli:oncall")
    return Command(run_id="exp-7", action=action, ts=T0, **kw)


def test_the_notice_says_who_sent_what_why_and_where_the_run_is_now():
    cmd = _cmd()
    a = operator_notice(cmd, "paused", T0 + 1, step=412)
    assert (a.rule, a.severity, a.state, a.run_id, a.step) == (OPERATOR_RULE, "info", "firing", "exp-7", 412)
    assert a.summary == "run exp-7: pause sent by cli:oncall: KL blew up, looking at samples; the run is paused"
    assert a.actions == []          # a notice: nothing acts on it (no brake, no snapshot)
    assert a.labels == {"command": "pause", "command_id": cmd.id, "issuer": "cli:oncall",
                        "run_state": "paused"}
    assert a.ts == T0 + 1


def test_each_command_s_notice_has_its_own_identity():
    """A receiver that drops repeats by identity (a webhook's Idempotency-Key is built from the
    fingerprint) must not drop the second pause of a run as a repeat of the first."""
    first, second = _cmd(), _cmd()
    a, b = operator_notice(first, "paused", T0), operator_notice(second, "paused", T0)
    assert a.fingerprint != b.fingerprint
    assert operator_notice(first, "paused", T0 + 5, step=3).fingerprint == a.fingerprint   # the same command
    assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0


def test_one_shot_commands_say_what_they_carry_and_that_the_script_applies_them_later():
    adj = operator_notice(_cmd("adjust", params={"beta": 1.5, "lr": 0.5}), "paused", T0)
    assert "adjust beta=1.5, lr=0.5 sent by cli:oncall" in adj.summary
    assert adj.summary.endswith("the run is paused (the script applies it at its next step boundary)")
    rb = operator_notice(_cmd("rollback", params={"to_step": 120, "checkpoint": "/ck/120"}), "paused", T0,
                         why="the newest checkpoint before the onset of its red alert kl_spike (step 130)")
    assert ("rollback to step 120 (/ck/120: the newest checkpoint before the onset of its red alert "
            "kl_spike (step 130)) sent by cli:oncall") in rb.summary
    # an unknown step (no worker has seen the run) is step 0, never a negative or missing one
    assert operator_notice(_cmd(), "paused", T0, step=None).step == 0


def test_say_sent_is_what_the_cli_prints():
    assert say_sent(_cmd("stop")) == "stop"
    assert say_sent(_cmd("adjust", params={"beta": 2.0})) == "adjust beta=2"
    assert say_sent(_cmd("rollback", params={"to_step": 3, "checkpoint": "/c"}), "as given") == \
        "rollback to step 3 (/c: as given)"


def test_slack_shows_a_command_by_hand_not_a_tier_and_a_threshold():
    a = operator_notice(_cmd(), "paused", T0, step=412)
    fallback, head, att = slack_blocks(a, [])
    assert head[0]["text"]["text"] == "ℹ️ PAUSE by hand — exp-7"
    fields = [f["text"] for f in att[0]["blocks"][0]["fields"]]
    assert fields == ["*Run*\n`exp-7`", "*Now*\npaused", "*Sent by*\ncli:oncall", "*Last step seen*\n412"]
    context = att[0]["blocks"][-1]["elements"][0]["text"]
    assert "sent by hand" in context and a.labels["command_id"] in context
    assert "monitor did" not in context
    assert fallback == text(a, []) and "pause sent by cli:oncall" in fallback


def test_the_announcer_tells_every_receiver_but_the_console_and_reports_failures():
    slack, hook = Recording("slack-webhook"), Recording("webhook")
    hook.fail = DeliveryError("webhook answered 500")
    ann = Announcer([ConsoleNotifier(), slack, hook])
    assert ann.receivers == ["slack-webhook", "webhook"]
    got = run(ann.announce(_cmd(), "paused", step=9, now=T0))
    assert got.sent == ["slack-webhook"]
    assert got.failed == {"webhook": "DeliveryError: webhook answered 500"}
    assert hook.attempts == 1                              # tried once here: the operator is told
    assert got.retrying == []                              # (no outbox: nobody to retry it)
    (alert, done), = slack.sent
    assert (alert.rule, alert.labels["command"], alert.step, done) == (OPERATOR_RULE, "pause", 9, [])


def test_receivers_that_keep_an_alert_open_until_it_resolves_are_not_told():
    """A notice never resolves: Alertmanager would show it active for a day, PagerDuty keep an
    incident open. The real notifiers say which take notices: Slack and webhooks do."""
    from alerts.alertmanager import AlertmanagerNotifier
    from alerts.pagerduty import PagerDutyNotifier
    from alerts.slack import SlackBotNotifier, SlackWebhookNotifier
    from alerts.webhook import WebhookNotifier

    ann = Announcer([ConsoleNotifier(), SlackWebhookNotifier("http://127.0.0.1:9/slack"),
                     SlackBotNotifier("xox" + "b-not-a-token", "#rl"), WebhookNotifier("http://127.0.0.1:9/hook"),
                     AlertmanagerNotifier("http://127.0.0.1:9/am"),
                     PagerDutyNotifier("key", "http://127.0.0.1:9/pd")])
    assert ann.receivers == ["slack-webhook", "slack-bot", "webhook"]
    run(ann.close())


def test_the_announcer_routes_as_the_routes_file_says():
    tree = """
route:
  receiver: slack-webhook
  routes:
    - match: {rule: operator_command, command: adjust}
      receiver: webhook
"""
    slack, hook = Recording("slack-webhook"), Recording("webhook")
    ann = Announcer([slack, hook], load_routes_text(tree, ["slack-webhook", "webhook"]))
    assert run(ann.announce(_cmd("adjust", params={"beta": 2.0}), "running", now=T0)).sent == ["webhook"]
    assert run(ann.announce(_cmd("stop"), "stopped", now=T0)).sent == ["slack-webhook"]
    assert [a.labels["command"] for a, _ in hook.sent] == ["adjust"]
    assert [a.labels["command"] for a, _ in slack.sent] == ["stop"]


def test_a_receiver_that_hangs_is_given_up_on_and_the_others_still_hear():
    class Hanging(Recording):
        async def send(self, alert, done):
            await asyncio.sleep(30)

    quick = Recording("slack-webhook")
    ann = Announcer([Hanging("webhook"), quick], timeout=0.2)
    got = run(ann.announce(_cmd(), "paused", now=T0))
    assert got.sent == ["slack-webhook"]
    assert got.failed == {"webhook": "no answer within 0.2s"}


def test_a_failure_message_does_not_show_a_secret():
    hook = Recording("webhook")
    hook.fail = DeliveryError("POST http://x/hook?token=s3cr3t-token failed")
    ann = Announcer([hook], secrets=["s3cr3t-token"])
    got = run(ann.announce(_cmd(), "paused", now=T0))
    assert got.failed["webhook"] == "DeliveryError: POST http://x/hook?token=*** failed"


def test_a_failed_notice_is_left_for_the_workers_to_retry_once():
    """With the worker's outbox, the operator hears of the failure at once and a worker's timer
    sends the notice when the receiver is back, once; a receiver that refused it for good (a
    revoked token) is not retried."""
    from alerts.control import MemoryControl
    from alerts.dispatch import Dispatcher
    from alerts.notifiers import PermanentDeliveryError
    from alerts.outbox import MemoryOutbox
    from tests.unit.alerts._helpers import Clock

    outbox = MemoryOutbox()
    slack, hook = Recording("slack-webhook"), Recording("webhook")
    clock = Clock(T0 - 60)
    worker = Dispatcher([slack, hook], MemoryControl(), clock=clock, outbox=outbox)
    run(worker.tick())                                     # (it says which receivers it sends to)
    slack.fail = DeliveryError("Slack answered 503")
    hook.fail = PermanentDeliveryError("webhook answered 410")
    got = run(Announcer([slack, hook], outbox=outbox).announce(_cmd(), "paused", step=9, now=T0))
    assert got.sent == [] and sorted(got.failed) == ["slack-webhook", "webhook"]
    assert got.retrying == ["slack-webhook"] and got.unqueued == {}
    slack.fail = hook.fail = None
    clock.t = T0
    run(worker.tick(clock.advance(0.5)))
    assert slack.sent == []                                # not before its retry is due
    for _ in range(4):
        run(worker.tick(clock.advance(5)))
    assert [(a.rule, a.labels["command"], a.step) for a, _ in slack.sent] == [(OPERATOR_RULE, "pause", 9)]
    assert hook.sent == []


def test_a_silence_that_matches_the_notice_mutes_it():
    from alerts.silences import MemorySilences, Silence

    silences = MemorySilences()
    run(silences.add(Silence(id="quiet-exp7", matchers={"run": "exp-7"}, starts_at=T0 - 1, ends_at=T0 + 60)))
    slack = Recording("slack-webhook")
    ann = Announcer([slack], silences=silences)
    got = run(ann.announce(_cmd(), "paused", now=T0))
    assert got.sent == [] and got.silenced == {"slack-webhook": "silence quiet-exp7"}
    assert slack.sent == []
    other = Command(run_id="exp-8", action="pause", ts=T0, issuer="cli:oncall")
    assert run(ann.announce(other, "paused", now=T0)).sent == ["slack-webhook"]
    assert run(ann.announce(_cmd(), "paused", now=T0 + 120)).sent == ["slack-webhook"]   # expired


def _worker(outbox, *names, at=T0 - 60):
    """A monitor worker sending to ``names`` on ``outbox``, its timer ticked once at ``at``."""
    from alerts.control import MemoryControl
    from alerts.dispatch import Dispatcher
    from tests.unit.alerts._helpers import Clock

    clock = Clock(at)
    worker = Dispatcher([Recording(n) for n in names], MemoryControl(), clock=clock, outbox=outbox)
    run(worker.tick())
    return worker, clock


def test_a_failed_notice_is_kept_only_for_a_receiver_a_worker_sends_to_and_the_operator_hears_why(caplog):
    """The operator's shell has a webhook the workers do not: were its notice queued, no worker
    would ever send it, nor bury it, and the operator would read "a worker retries it". It is
    not queued, and the answer says why; the receiver the workers share is queued as before."""
    import logging

    from alerts.outbox import MemoryOutbox

    outbox = MemoryOutbox()
    _worker(outbox, "slack-webhook")
    slack, hook = Recording("slack-webhook"), Recording("webhook")
    slack.fail = DeliveryError("Slack answered 503")
    hook.fail = DeliveryError("connection refused")
    with caplog.at_level(logging.ERROR):
        got = run(Announcer([slack, hook], outbox=outbox).announce(_cmd(), "paused", now=T0))
    assert got.failed == {"slack-webhook": "DeliveryError: Slack answered 503",
                          "webhook": "DeliveryError: connection refused"}
    assert got.retrying == ["slack-webhook"]
    assert got.unqueued == {"webhook": "no monitor worker sends to webhook (it is configured only here): "
                                       "not kept for a retry"}
    assert run(outbox.pending("slack-webhook")) == 1 and run(outbox.pending("webhook")) == 0
    assert "not kept for a retry" in caplog.text

    # an hour on, no worker has said what it sends to (none is running): nothing is kept
    got = run(Announcer([slack], outbox=outbox).announce(_cmd(), "paused", now=T0 + 3600))
    assert got.retrying == [] and run(outbox.pending("slack-webhook")) == 1     # (the first notice)
    assert got.unqueued == {"slack-webhook": "no monitor worker is running to send to slack-webhook "
                                             "(none seen in the last 5 minutes): not kept for a retry"}


def test_when_it_cannot_read_what_the_workers_send_to_the_notice_is_kept_as_before(caplog):
    import logging

    from alerts.outbox import MemoryOutbox

    class Unreadable(MemoryOutbox):
        async def receivers_seen(self):
            raise ConnectionError("Redis at 10.0.0.1:6379 unreachable")

    outbox = Unreadable()
    hook = Recording("webhook")
    hook.fail = DeliveryError("webhook answered 502")
    with caplog.at_level(logging.ERROR):
        got = run(Announcer([hook], outbox=outbox).announce(_cmd(), "paused", now=T0))
    assert got.retrying == ["webhook"] and got.unqueued == {}
    assert run(outbox.pending("webhook")) == 1
    assert "could not read which receivers the monitor workers send to" in caplog.text


def test_a_worker_says_which_receivers_it_sends_to_at_most_every_half_minute():
    from alerts.delivery import NOTE_EVERY
    from alerts.outbox import MemoryOutbox

    notes: list = []

    class Counting(MemoryOutbox):
        async def note_receivers(self, receivers, now):
            notes.append((sorted(receivers), now))
            await super().note_receivers(receivers, now)

    outbox = Counting()
    worker, clock = _worker(outbox, "slack-webhook", "webhook", at=T0)
    for _ in range(20):                  # a tick every 2 s for 40 s
        run(worker.tick(clock.advance(2)))
    assert notes == [(["slack-webhook", "webhook"], T0), (["slack-webhook", "webhook"], T0 + NOTE_EVERY)]
    assert run(outbox.receivers_seen()) == {"slack-webhook": T0 + NOTE_EVERY, "webhook": T0 + NOTE_EVERY}


def test_notices_kept_for_a_receiver_no_worker_sends_to_are_named_once_and_buried_when_old(caplog):
    """Kept by an older version (or for a receiver since removed from the workers): no worker
    would ever send them. A worker names the receiver in its log, once, and dead-letters its
    items once an hour old; a receiver another worker sends to is left to that worker."""
    import logging

    from alerts.delivery import notice_item
    from alerts.operator import operator_notice
    from alerts.outbox import MemoryOutbox

    outbox = MemoryOutbox()
    for name in ("webhook", "pager"):
        run(outbox.enqueue(notice_item(operator_notice(_cmd(), "paused", T0), name, T0, T0 + 1, attempts=1)))
    worker, clock = _worker(outbox, "slack-webhook", at=T0)
    with caplog.at_level(logging.ERROR):
        for _ in range(70):                                     # a tick a minute for 70 minutes
            run(outbox.note_receivers(["pager"], clock.t))      # (another worker sends to "pager")
            run(worker.tick(clock.advance(60)))
            if clock.t < T0 + 3600:
                assert run(outbox.pending("webhook")) == 1      # not before it is an hour old
    assert run(outbox.pending("webhook")) == 0
    (dead,) = run(outbox.dead("webhook"))
    assert dead.last_error == "no monitor worker sends to webhook"
    assert run(outbox.pending("pager")) == 1 and run(outbox.dead("pager")) == []
    told = [r.getMessage() for r in caplog.records if "wait in the outbox for webhook" in r.getMessage()]
    assert len(told) == 1 and "no monitor worker sends to" in told[0]
    assert "pager" not in caplog.text
    assert any("dead-lettered 1 notification(s) for webhook" in r.getMessage() for r in caplog.records)
    # "pager", no longer noted by anyone, is forgotten a day later; this worker's own stays
    from alerts.delivery import FORGET_AFTER

    later = clock.t + FORGET_AFTER + 1
    run(outbox.note_receivers(["slack-webhook"], later))
    run(worker.drainer.bury_strays(later))
    assert set(run(outbox.receivers_seen())) == {"slack-webhook"}
