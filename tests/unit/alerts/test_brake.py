"""The brake's lane in process: a control channel that fails is tried again until it takes the
command, the alarm goes out once (straight to the receivers) and resolves when the brake lands;
runs wait for no other run; an unacknowledged brake is re-sent, signed anew, and a worker
acknowledges it again; the stored state counts only for its signed command; the broker's log
gate and the store's health log one line per change of state."""

from __future__ import annotations

import asyncio
import logging

from alerts.control import MemoryControl, trusted
from alerts.dispatch import Dispatcher
from alerts.escalation import MemoryAcks
from alerts.retry import RetryPolicy
from contract.commands import Command, RunControl
from producers.control import CommandInbox
from streams.broker_log import BrokerLogGate
from tests.unit.alerts._helpers import Clock, Recording, alert, run

SECRET = "unit-secret"


class FlakyControl(MemoryControl):
    """Refuses ``down`` sends (Redis away), then works."""

    def __init__(self, down: int):
        super().__init__()
        self.down, self.tries = down, 0

    async def send(self, cmd):
        self.tries += 1
        if self.down > 0:
            self.down -= 1
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379")
        return await super().send(cmd)


def rig(control, clock=None, **kw):
    clock = clock or Clock()
    notifiers = [Recording("slack"), Recording("hook")]
    d = Dispatcher(notifiers, control, clock=clock, secret=SECRET, acks=MemoryAcks(control, SECRET),
                   brake_retry=RetryPolicy(base=0.001, cap=0.002), **kw)

    async def sleep(seconds):      # each retry moves the clock on by a second
        clock.advance(1.0)
        await asyncio.sleep(0)

    d.brakes.sleep = sleep
    return d, clock, {n.name: n for n in notifiers}


def test_a_brake_is_retried_until_the_channel_takes_it_and_the_alarm_goes_out_once(caplog):
    control = FlakyControl(down=25)
    d, clock, n = rig(control, unreachable_after=10)

    async def go():
        out = await d.handle(alert(actions=["pause"]))
        await d.idle()
        return out

    with caplog.at_level(logging.WARNING):
        out = run(go())
    assert [c.action for c in out.commands] == ["pause"] and control.tries == 26
    assert run(control.status("ppo-8b-a")).state == "paused"
    alarms = [(a.rule, a.severity, a.state) for a, _ in n["hook"].sent if a.rule == "control_unreachable"]
    assert alarms == [("control_unreachable", "black", "firing"), ("control_unreachable", "black", "resolved")]
    assert len([r for r in caplog.records if "cannot send pause" in r.getMessage()]) == 1


def test_one_run_waiting_for_the_channel_holds_back_no_other_runs_brake():
    class OneRunDown(MemoryControl):
        async def send(self, cmd):
            if cmd.run_id == "stuck":
                raise ConnectionError("down for this key")
            return await super().send(cmd)

    control = OneRunDown()
    d = Dispatcher([Recording("hook")], control, clock=Clock(), secret=SECRET)
    done: list[str] = []

    async def go():
        d.brake_later(alert(run_id="stuck", actions=["pause"]), lambda: done.append("stuck"))
        d.brake_later(alert(run_id="fine", actions=["pause"]), lambda: done.append("fine"))
        for _ in range(50):
            await asyncio.sleep(0.01)
            if done:
                break
        state = (await control.status("fine")).state
        await d.brakes.close()
        return state

    assert run(go()) == "paused" and done == ["fine"]


def test_one_runs_brakes_apply_in_order():
    control = MemoryControl()
    d = Dispatcher([Recording("hook")], control, clock=Clock(), secret=SECRET)
    order: list[str] = []

    async def go():
        d.brake_later(alert(actions=["stop"], rule="nan_inf", severity="black"), lambda: order.append("stop"))
        d.brake_later(alert(actions=["pause"]), lambda: order.append("pause"))
        await asyncio.sleep(0.05)

    run(go())
    assert order == ["stop", "pause"] and [e["action"] for e in control.audit["ppo-8b-a"]] == ["stop", "pause"]


def test_an_unacknowledged_brake_is_re_sent_signed_anew_and_acknowledged_again():
    control = MemoryControl()
    clock = Clock()
    inbox = CommandInbox("ppo-8b-a", secret=SECRET, clock=clock, started_at=clock.t - 60)
    inbox.on_ack = control.record_ack
    got: list[Command] = []
    control.subscribe("ppo-8b-a", got.append)
    d, _, _ = rig(control, clock=clock, resend_every=5)
    run(d.handle(alert(actions=["pause"], ts=clock.t)))
    run(d.tick(clock.advance(3)))
    assert len(got) == 1                                            # not yet
    run(d.tick(clock.advance(3)))
    assert len(got) == 2 and got[1].id == got[0].id and got[1].sent == clock.t
    assert got[1].verify(SECRET) and got[1].signature != got[0].signature
    # the worker missed the first copy; the second one pauses it, and it acknowledges
    inbox.deliver_command(got[1])
    inbox.ack(inbox.state_command, "applied")
    assert inbox.state == "paused"
    inbox.deliver_command(got[1].signed(SECRET, sent=clock.t + 1))    # and again: acknowledged again
    acks = [e for e in control.audit["ppo-8b-a"] if e.get("type") == "ack"]
    assert [a["status"] for a in acks] == ["applied", "applied"]
    run(d.tick(clock.advance(6)))
    assert len(got) == 2                                            # acknowledged: no more re-sends


def test_a_brake_nobody_acknowledges_is_re_sent_less_and_less_often_and_escalates_once():
    """A run that never answers (no listener, or gone) had its brake published every 5 s for a
    day: now the waits double from 5 s up to the longest (60 s here), across its escalation,
    and end when an operator resumes the run."""
    control = MemoryControl()
    clock = Clock()
    got: list[Command] = []
    control.subscribe("ppo-8b-a", got.append)
    d, _, notifiers = rig(control, clock=clock, resend_every=5, resend_most=60)
    start = clock.t
    run(d.handle(alert(actions=["pause"], ts=clock.t)))
    for _ in range(400):
        run(d.tick(clock.advance(1)))
    sent = [round(c.sent - start) if c.sent is not None else 0 for c in got]
    assert sent == [0, 5, 15, 35, 75, 135, 195, 255, 315, 375], sent
    assert len({c.id for c in got}) == 1 and all(c.verify(SECRET) for c in got)
    escalations = [a for a, _ in notifiers["slack"].sent if a.rule == "control_unacknowledged"]
    assert len(escalations) == 1
    # an operator resumes the run: the brake is settled, and no longer re-sent
    run(control.send(Command(run_id="ppo-8b-a", action="resume", ts=clock.t).signed(SECRET)))
    for _ in range(200):
        run(d.tick(clock.advance(1)))
    assert [c.action for c in got[len(sent):]] == ["resume"]


def test_the_first_re_send_waits_its_time_whatever_the_longest_wait():
    """A longest wait set below the first (a deployment that re-sent every 600 s) keeps the
    first: the brake is re-sent every 600 s, as before the waits grew."""
    control = MemoryControl()
    clock = Clock()
    got: list[Command] = []
    control.subscribe("ppo-8b-a", got.append)
    d, _, _ = rig(control, clock=clock, resend_every=600)
    start = clock.t
    run(d.handle(alert(actions=["pause"], ts=clock.t)))
    for _ in range(130):
        run(d.tick(clock.advance(10)))
    assert [round(c.sent - start) for c in got[1:]] == [600, 1200]


def test_the_stored_state_counts_only_for_its_signed_command():
    pause = Command(run_id="r", action="pause", ts=1.0).signed(SECRET)
    assert trusted("r", RunControl(run_id="r", state="paused", command=pause).model_dump_json(), SECRET).state == "paused"
    for planted in (RunControl(run_id="r", state="stopped"),
                    RunControl(run_id="r", state="stopped", command=pause.model_copy(update={"signature": "0" * 64})),
                    RunControl(run_id="r", state="stopped", command=Command(run_id="other", action="stop", ts=1.0).signed(SECRET))):
        assert trusted("r", planted.model_dump_json(), SECRET).state == "running"
    # a stopped state carrying a signed pause is a paused state
    assert trusted("r", RunControl(run_id="r", state="stopped", command=pause).model_dump_json(), SECRET).state == "paused"


def test_the_broker_log_gate_passes_one_line_per_change_of_state(caplog):
    t = [0.0]
    gate = BrokerLogGate(quiet=10, clock=lambda: t[0])
    handler = logging.Handler()
    records: list[logging.LogRecord] = []
    handler.emit = records.append
    handler.addFilter(gate)
    for i in range(3000):                                 # a broker outage, as aiokafka logs it
        rec = logging.LogRecord("aiokafka.consumer.fetcher", logging.ERROR, __file__, 1, "Failed fetch %d", (i,), None)
        handler.handle(rec)
        t[0] += 0.01
    handler.handle(logging.LogRecord("rlwatch.alerts", logging.ERROR, __file__, 1, "ours", (), None))
    handler.handle(logging.LogRecord("mode.redirect", logging.WARNING, __file__, 1, "[RED] printed", (), None))
    handler.handle(logging.LogRecord("aiokafka.conn", logging.INFO, __file__, 1, "connected", (), None))
    assert [r.getMessage() for r in records] == ["Failed fetch 0", "ours", "[RED] printed", "connected"]
    with caplog.at_level(logging.WARNING):
        assert not gate.check()
        t[0] += 11
        assert gate.check()
    assert "2999 line(s) held back" in caplog.text


def test_a_store_outage_logs_one_line_when_it_starts_and_one_when_it_ends(caplog):
    class DownOutbox:
        down = True

    from alerts.outbox import MemoryOutbox

    class Outbox(MemoryOutbox):
        async def take_due(self, *a, **kw):
            if DownOutbox.down:
                raise ConnectionError("Error 111")
            return await super().take_due(*a, **kw)

    d = Dispatcher([Recording("slack")], MemoryControl(), clock=Clock(), outbox=Outbox())
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            run(d.tick())
        DownOutbox.down = False
        run(d.tick())
        run(d.tick())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "unreachable" in lines[0] and "reachable again" in lines[1]


def test_the_brake_thread_pulls_brakes_on_its_own_loop():
    import threading

    from alerts.brake import BrakeLane, BrakeThread

    control = MemoryControl()
    d = Dispatcher([Recording("hook")], control, clock=Clock(), secret=SECRET)
    thread = BrakeThread(lambda: BrakeLane(control, clock=Clock(), secret=SECRET), d.plan).start()
    done = threading.Event()
    try:
        thread.submit(alert(actions=["pause"]), done.set)
        assert done.wait(5)
        assert run(control.status("ppo-8b-a")).state == "paused"
        assert thread.lane is not None and threading.current_thread() is not thread._thread
    finally:
        thread.stop()


def test_an_alert_that_commands_nothing_is_done_at_once_without_waking_the_brake_thread():
    import threading

    from alerts.brake import BrakeLane, BrakeThread

    control = MemoryControl()
    d = Dispatcher([Recording("hook")], control, clock=Clock(), secret=SECRET)
    planned: list[str] = []

    def plan(a):
        planned.append(threading.current_thread().name)
        return d.plan(a)

    thread = BrakeThread(lambda: BrakeLane(control, clock=Clock(), secret=SECRET), plan).start()
    try:
        for quiet in (alert(actions=["notify"]), alert(actions=[]),
                      alert(state="resolved", actions=["pause"])):
            done_on: list[str] = []
            thread.submit(quiet, lambda: done_on.append(threading.current_thread().name))
            assert done_on == [threading.current_thread().name]      # at once, on the caller's
        braked = threading.Event()
        thread.submit(alert(actions=["notify", "pause"]), braked.set)
        assert braked.wait(5) and run(control.status("ppo-8b-a")).state == "paused"
        assert planned == ["rlwatch-brake"]             # only the alert with a command was planned
    finally:
        thread.stop()


def test_a_lane_sends_a_brake_it_got_taken_once_and_a_successor_sends_it_again():
    # the worker pulls each brake at once and again from the alerts topic: the same process
    # does not go back to Redis for it; a successor (after a crash) has no such memory
    from alerts.brake import BrakeLane

    class Counting(MemoryControl):
        def __init__(self):
            super().__init__()
            self.sends: list[str] = []

        async def send(self, cmd):
            self.sends.append(cmd.action)
            return await super().send(cmd)

    control = Counting()
    d = Dispatcher([Recording("hook")], control, clock=Clock(), secret=SECRET)
    firing = alert(actions=["pause", "snapshot"])
    lane = BrakeLane(control, clock=Clock(), secret=SECRET)
    first = run(lane.pull(d.plan(firing)))
    again = run(lane.pull(d.plan(firing)))
    assert [c.action for c in first] == ["pause", "snapshot"] and again == []
    assert control.sends == ["pause", "snapshot"]
    successor = BrakeLane(control, clock=Clock(), secret=SECRET)
    assert run(successor.pull(d.plan(firing))) == []          # applied before: published again only
    assert control.sends == ["pause", "snapshot"] * 2
    assert run(control.status("ppo-8b-a")).state == "paused"
