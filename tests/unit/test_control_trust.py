"""What a training worker obeys (producers.control.CommandInbox, in process): only signed
commands of its own run, issued since it started, fresh, never an older state change; a run's
state comes from such commands only, never from a bare ``state`` field; a brake that arrives
again is acknowledged again."""

from __future__ import annotations

import json

from contract.commands import Command, RunControl, ack_signature
from producers.control import CommandInbox

RUN = "ppo-trust"
SECRET = "right-key"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def inbox(secret: str | None = SECRET, clock: Clock | None = None) -> tuple[CommandInbox, list[dict], Clock]:
    clock = clock or Clock()
    box = CommandInbox(RUN, secret=secret, clock=clock)
    acks: list[dict] = []
    box.on_ack = acks.append
    return box, acks, clock


def cmd(action: str, ts: float, secret: str | None = SECRET, run_id: str = RUN, **kw) -> Command:
    return Command(run_id=run_id, action=action, ts=ts, reason="test", **kw).signed(secret)


def test_an_unsigned_state_message_is_refused_even_with_a_secret_set():
    box, _, _ = inbox()
    box.deliver_message(json.dumps({"run_id": RUN, "state": "stopped"}))
    box.deliver_message(json.dumps({"run_id": RUN, "state": "paused", "command": None}))
    assert box.state == "running" and box.rejected == 2


def test_a_state_message_counts_only_for_its_signed_command_not_its_state_field():
    box, _, clock = inbox()
    # "stopped", carrying a validly signed resume: the resume is what counts
    msg = RunControl(run_id=RUN, state="stopped", command=cmd("resume", clock.t + 1))
    box.deliver_message(msg.model_dump_json())
    assert box.state == "running"
    msg = RunControl(run_id=RUN, state="stopped", command=cmd("pause", clock.t + 2))
    box.deliver_message(msg.model_dump_json())
    assert box.state == "paused"


def test_without_a_secret_a_bare_state_message_is_still_refused():
    box, _, _ = inbox(secret=None)
    box.deliver_message(json.dumps({"run_id": RUN, "state": "stopped"}))
    assert box.state == "running"


def test_a_command_for_another_run_is_refused():
    box, _, clock = inbox()
    box.deliver_command(cmd("stop", clock.t + 1, run_id="someone-else"))
    assert box.state == "running" and box.rejected == 1


def test_a_planted_state_key_is_not_adopted():
    box, _, clock = inbox()
    box.deliver_state(RunControl(run_id=RUN, state="paused"))                    # no command
    box.deliver_state(RunControl(run_id=RUN, state="stopped",
                                 command=cmd("stop", clock.t + 1, secret="forged")))
    # a genuine signed pause of this run, issued before this process started (copied from the
    # audit log into the state key): not adopted either
    box.deliver_state(RunControl(run_id=RUN, state="paused", command=cmd("pause", clock.t - 600)))
    assert box.state == "running" and box.rejected == 3


def test_a_stored_pause_issued_since_the_start_is_applied():
    box, acks, clock = inbox()
    clock.t += 30
    box.deliver_state(RunControl(run_id=RUN, state="paused", command=cmd("pause", clock.t - 10)))
    assert box.state == "paused"


def test_a_signed_command_replayed_after_a_restart_is_refused():
    first, _, clock = inbox()
    pause = cmd("pause", clock.t + 5)
    clock.t += 5
    first.deliver_command(pause)
    assert first.state == "paused"
    clock.t += 60                                # the worker restarts a minute later
    second, _, _ = inbox(clock=clock)
    second.deliver_command(pause)                # the same signed message, replayed live
    second.deliver_state(RunControl(run_id=RUN, state="paused", command=pause))
    assert second.state == "running" and second.rejected == 2


def test_a_stale_or_future_command_is_refused_and_an_old_state_change_cannot_undo_a_newer_one():
    box, _, clock = inbox()
    clock.t += 1000
    box.deliver_command(cmd("pause", clock.t - 400))           # issued after start, sent long ago
    box.deliver_command(cmd("pause", clock.t + 3600))          # from the future
    assert box.state == "running" and box.rejected == 2
    pause, resume = cmd("pause", clock.t - 20), cmd("resume", clock.t - 10)
    box.deliver_command(pause)
    box.deliver_command(resume)
    assert box.state == "running"
    box.deliver_command(cmd("pause", clock.t - 15))            # older than the resume applied
    assert box.state == "running" and box.rejected == 3


def test_a_brake_re_sent_with_a_new_sent_time_is_applied_once_and_acknowledged_again():
    box, acks, clock = inbox()
    pause = cmd("pause", clock.t + 1)
    clock.t += 1
    box.deliver_command(pause)
    box.ack(box.state_command, "applied", "paused at step 7")
    clock.t += 400                                             # long after: re-sent, re-signed
    box.deliver_command(pause.signed(SECRET, sent=clock.t))
    assert box.state == "paused"
    assert [(a["command_id"], a["status"]) for a in acks] == [(pause.id, "applied")] * 2
    assert all(a["signature"] == ack_signature(a, SECRET) for a in acks)
    # a forged re-send of the same id is not acknowledged
    box.deliver_command(pause.model_copy(update={"sent": clock.t, "signature": "0" * 64}))
    assert len(acks) == 2


def test_a_flood_of_forgeries_logs_a_few_lines_only(caplog):
    box, _, clock = inbox()
    for i in range(500):
        box.deliver_command(cmd("stop", clock.t + 1, secret=f"guess-{i}"))
    assert box.rejected == 500 and box.state == "running"
    assert len([r for r in caplog.records if r.name == "rlwatch.producers"]) <= 3


def test_closing_a_paused_monitor_lets_the_training_thread_go():
    import threading

    from producers import Monitor
    from tests.support.transports import RecordingTransport

    box, _, clock = inbox()
    mon = Monitor(RUN, redis=False, transport=RecordingTransport(), inbox=box, heartbeat_seconds=0, clock=clock)
    box.deliver_command(cmd("pause", clock.t + 1))
    th = threading.Thread(target=mon.step_boundary, daemon=True)
    th.start()
    th.join(0.3)
    assert th.is_alive()                          # paused
    mon.close(1)
    th.join(2)
    assert not th.is_alive(), "step_boundary kept the thread after the monitor closed"
