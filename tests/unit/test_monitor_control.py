"""producers.monitor.Monitor + producers.control.CommandInbox, in process (no Kafka, no Redis):
pause blocks the training thread until resume, stop raises, adjust calls back, acks are
reported, and forged commands are rejected."""

from __future__ import annotations

import json
import threading
import time

import pytest

from producers import Monitor, TrainingStopped
from producers.control import CommandInbox
from contract.commands import Command, RunControl
from contract.events import parse_event
from streams.processor import Pipeline
from tests.unit._core import firing, rlhf_pack
from tests.support.transports import RecordingTransport

WAIT = 10.0
RUN = "ppo-8b-a"


def command(action, params=None, secret=None, run_id=RUN, **kw) -> Command:
    return Command(run_id=run_id, action=action, params=params or {}, ts=time.time(),
                   reason=f"test {action}", issuer="test", **kw).signed(secret)


@pytest.fixture
def rig():
    """A Monitor with a fake transport and an in-process inbox; acks collected."""
    made = []

    def build(secret=None, **kw):
        inbox = CommandInbox(RUN, rank=0, secret=secret)
        acks: list[dict] = []
        inbox.on_ack = acks.append
        transport = RecordingTransport()
        mon = Monitor(RUN, redis=False, transport=transport, inbox=inbox, heartbeat_seconds=0,
                      **kw)
        made.append(mon)
        return mon, inbox, acks, transport

    yield build
    for mon in made:
        mon.control.close()  # releases a thread still blocked in a pause
        mon.close(timeout=2.0)


def in_thread(fn):
    """Run fn in a thread; the outcome ('returned' or the exception) lands in the dict."""
    out: dict = {}
    started = threading.Event()

    def target():
        started.set()
        try:
            fn()
            out["result"] = "returned"
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["result"] = exc

    th = threading.Thread(target=target, daemon=True)
    th.start()
    started.wait(WAIT)
    return th, out


def test_step_boundary_is_a_no_op_without_commands(rig):
    mon, inbox, acks, _ = rig()
    th, out = in_thread(mon.step_boundary)
    th.join(WAIT)
    assert out["result"] == "returned" and acks == [] and mon.state == "running"


def test_pause_blocks_step_boundary_until_resume(rig):
    mon, inbox, acks, _ = rig()
    pause = command("pause")
    inbox.deliver_command(pause)
    assert mon.state == "paused"
    th, out = in_thread(mon.step_boundary)
    th.join(0.3)
    assert th.is_alive(), "step_boundary returned while the run was paused"
    assert "result" not in out
    assert [(a["action"], a["status"], a["command_id"]) for a in acks] == [
        ("pause", "applied", pause.id)]

    resume = command("resume")
    inbox.deliver_command(resume)
    th.join(WAIT)
    assert not th.is_alive() and out["result"] == "returned"
    assert mon.state == "running"
    assert [(a["action"], a["status"]) for a in acks] == [("pause", "applied"),
                                                          ("resume", "applied")]
    assert all(a["run_id"] == RUN and a["rank"] == 0 and a["type"] == "ack" for a in acks)
    # the next boundary does not block again
    th, out = in_thread(mon.step_boundary)
    th.join(WAIT)
    assert out["result"] == "returned"


def test_stop_raises_training_stopped_with_the_reason(rig):
    mon, inbox, acks, _ = rig()
    inbox.deliver_command(command("stop"))
    with pytest.raises(TrainingStopped, match="test stop"):
        mon.step_boundary()
    assert [(a["action"], a["status"]) for a in acks] == [("stop", "applied")]
    # a stopped run stays stopped: resume does not revive it
    inbox.deliver_command(command("resume"))
    assert mon.state == "stopped"


def test_stop_while_paused_releases_the_blocked_thread_with_training_stopped(rig):
    mon, inbox, acks, _ = rig()
    inbox.deliver_command(command("pause"))
    th, out = in_thread(mon.step_boundary)
    th.join(0.2)
    assert th.is_alive()
    inbox.deliver_command(command("stop"))
    th.join(WAIT)
    assert isinstance(out.get("result"), TrainingStopped)


def test_adjust_calls_on_adjust_with_params_and_acks(rig):
    calls = []
    mon, inbox, acks, _ = rig(on_adjust=lambda params, cmd: calls.append((params, cmd.id)))
    adj = command("adjust", {"beta": 1.5, "lr": 0.5})
    inbox.deliver_command(adj)
    mon.step_boundary()
    assert calls == [({"beta": 1.5, "lr": 0.5}, adj.id)]
    assert [(a["action"], a["status"], a["command_id"]) for a in acks] == [
        ("adjust", "applied", adj.id)]
    assert mon.applied == [adj]
    # the same command delivered twice (e.g. state replay on reconnect) is applied once
    inbox.deliver_command(adj)
    mon.step_boundary()
    assert len(calls) == 1


def test_adjust_without_callback_is_acked_as_ignored(rig):
    mon, inbox, acks, _ = rig()
    inbox.deliver_command(command("adjust", {"beta": 2.0}))
    mon.step_boundary()
    assert [(a["action"], a["status"]) for a in acks] == [("adjust", "ignored")]


def test_acknowledgements_carry_the_runs_world_size_so_the_monitor_waits_for_every_rank(rig, monkeypatch):
    mon, inbox, acks, _ = rig(world_size=8)
    inbox.deliver_command(command("adjust", {"beta": 2.0}))
    mon.step_boundary()
    assert [(a["status"], a["rank"], a["world_size"]) for a in acks] == [("ignored", 0, 8)]
    # torchrun's WORLD_SIZE, when the script does not say
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    mon, inbox, acks, _ = rig()
    inbox.deliver_command(command("adjust", {"beta": 2.0}))
    mon.step_boundary()
    assert acks[0]["world_size"] == 4


def test_failing_callback_is_acked_as_failed_not_raised(rig):
    def boom(params, cmd):
        raise RuntimeError("optimizer has no beta")

    mon, inbox, acks, _ = rig(on_adjust=boom)
    inbox.deliver_command(command("adjust", {"beta": 2.0}))
    mon.step_boundary()
    assert [(a["status"], a["detail"]) for a in acks] == [("failed", "optimizer has no beta")]


def test_a_command_without_its_callback_is_answered_ignored(rig):
    mon, inbox, acks, _ = rig(on_adjust=lambda p, c: None)
    for action in ("rollback", "snapshot", "adjust"):
        inbox.deliver_command(command(action, {"to_step": 1, "checkpoint": "/c/1"} if action == "rollback" else {}))
    mon.step_boundary()
    assert [(a["action"], a["status"], a["detail"]) for a in acks] == [
        ("rollback", "ignored", "no on_rollback callback"), ("snapshot", "ignored", "no on_snapshot callback"),
        ("adjust", "applied", "")]


def test_rollback_and_snapshot_callbacks(rig):
    rolled, snaps = [], []
    mon, inbox, acks, _ = rig(on_rollback=lambda p, c: rolled.append(p),
                              on_snapshot=lambda c: snaps.append(c.action))
    mon.log(130, {"kl/mean": 0.5})
    inbox.deliver_command(command("rollback", {"to_step": 100, "checkpoint": "/c/100"}))
    inbox.deliver_command(command("snapshot"))
    mon.step_boundary()
    assert rolled == [{"to_step": 100, "checkpoint": "/c/100"}] and snaps == ["snapshot"]
    # a new generation, and the step gone back to (what its heartbeat says until a step is logged)
    assert mon.tags["generation"] == "1" and mon.last_step == 100
    assert sorted(a["action"] for a in acks if a["status"] == "applied") == ["rollback",
                                                                              "snapshot"]


def test_a_paused_run_applies_rollback_adjust_and_snapshot_at_once_and_stays_paused(rig):
    """The operator looks at a paused run, rolls it back and raises beta before resuming: the
    script's callbacks run while it is paused (the checkpoint loads before the resume), each is
    acknowledged then, and the run stays paused until the resume."""
    calls = []
    mon, inbox, acks, _ = rig(on_adjust=lambda p, c: calls.append(("adjust", p)),
                              on_rollback=lambda p, c: calls.append(("rollback", p)),
                              on_snapshot=lambda c: calls.append(("snapshot", c.params)))
    inbox.deliver_command(command("pause"))
    th, out = in_thread(mon.step_boundary)
    th.join(0.2)
    inbox.deliver_command(command("rollback", {"to_step": 40, "checkpoint": "/c/40"}))
    inbox.deliver_command(command("adjust", {"beta": 2.0}))
    inbox.deliver_command(command("snapshot"))
    deadline = time.time() + WAIT
    while len(calls) < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert calls == [("rollback", {"to_step": 40, "checkpoint": "/c/40"}), ("adjust", {"beta": 2.0}),
                     ("snapshot", {})]
    th.join(0.3)
    assert th.is_alive() and mon.state == "paused", "a one-shot command ended the pause"
    assert [(a["action"], a["status"]) for a in acks] == [
        ("pause", "applied"), ("rollback", "applied"), ("adjust", "applied"), ("snapshot", "applied")]
    inbox.deliver_command(command("resume"))
    th.join(WAIT)
    assert out["result"] == "returned" and acks[-1]["action"] == "resume"
    assert len(calls) == 3


def test_a_pause_times_out_on_time_though_commands_woke_it(rig):
    mon, inbox, acks, _ = rig(pause_timeout=0.6, on_adjust=lambda p, c: None)
    inbox.deliver_command(command("pause"))
    start = time.monotonic()
    th, out = in_thread(mon.step_boundary)
    for k in range(12):         # a command every 0.2 s: a timeout that restarted at each wake
        time.sleep(0.2)         # would not end before the last of them (2.4 s) plus 0.6 s
        if not th.is_alive():
            break
        inbox.deliver_command(command("adjust", {"beta": 1.0 + k}))
    th.join(WAIT)
    assert out["result"] == "returned"
    assert time.monotonic() - start < 2.0
    assert ("pause", "timeout") in [(a["action"], a["status"]) for a in acks]


def test_command_signed_with_the_wrong_secret_is_rejected(rig):
    mon, inbox, acks, _ = rig(secret="right")
    inbox.deliver_command(command("stop", secret="wrong"))
    inbox.deliver_command(command("pause"))                 # unsigned
    assert inbox.rejected == 2
    assert mon.state == "running"
    mon.step_boundary()          # neither blocks nor raises
    assert acks == []
    # a correctly signed command is obeyed
    inbox.deliver_command(command("stop", secret="right"))
    with pytest.raises(TrainingStopped):
        mon.step_boundary()


def test_forged_state_message_is_rejected(rig):
    mon, inbox, acks, _ = rig(secret="right")
    forged = RunControl(run_id=RUN, state="stopped", command=command("stop", secret="wrong"))
    inbox.deliver_message(forged.model_dump_json())
    assert mon.state == "running" and inbox.rejected == 1
    good = RunControl(run_id=RUN, state="paused", command=command("pause", secret="right"))
    inbox.deliver_message(good.model_dump_json())
    assert mon.state == "paused"


def test_malformed_control_message_is_ignored(rig):
    mon, inbox, acks, _ = rig()
    inbox.deliver_message(b"{not json")
    inbox.deliver_message(json.dumps({"action": "explode", "run_id": RUN, "ts": 0}))
    assert mon.state == "running"
    mon.step_boundary()


# -- publishing ------------------------------------------------------------------------------

def test_log_publishes_contract_events_that_the_processor_accepts(rig):
    mon, inbox, acks, transport = rig(rank=0, world_size=1, targets={"kl": 0.02},
                                      tags={"algo": "ppo"})
    for step in range(12):
        mon.step_boundary()
        mon.log(step, {"kl/mean": 0.02 if step < 5 else 0.04, "reward/mean": 1.0},
                dists={"reward": [1.0, 2.0]}, hashes={"actor": "sha256:x"})
    mon.log_checkpoint(4, "/ckpt/4")
    mon.log_samples(11, [{"prompt_id": "p", "response": "hi", "reward": 1.0}])
    assert mon.flush(WAIT)
    events = transport.events()
    assert [e["kind"] for e in events] == ["step"] * 12 + ["checkpoint", "samples"]
    assert {k for k, _ in transport.items} == {RUN.encode()}
    first = events[0]
    assert first["schema"] == 1 and first["run_id"] == RUN and first["rank"] == 0
    assert first["tags"] == {"algo": "ppo", "target.kl": "0.02"}
    # the events parse and the per-run target reaches the rules
    p = Pipeline(rlhf_pack())
    alerts = []
    for _, raw in transport.items:
        e = parse_event(raw, 0.0)
        alerts += p.feed(e, e.ts)
    y = firing(alerts, "kl_above_target", "yellow")
    assert y and y[0].threshold == pytest.approx(0.03)


def test_log_with_nan_is_published_as_contract_string(rig):
    mon, inbox, acks, transport = rig()
    mon.log(0, {"loss/value": float("nan"), "x": float("inf")})
    assert mon.flush(WAIT)
    [e] = transport.events()
    assert e["metrics"] == {"loss/value": "NaN", "x": "Infinity"}


def test_monitor_rejects_a_bad_run_id():
    with pytest.raises(ValueError):
        Monitor("has space", kafka=False, redis=False)


def test_monitor_without_any_side_is_inert():
    with Monitor("solo", kafka=False, redis=False) as mon:
        mon.log(0, {"kl/mean": 0.1})
        mon.step_boundary()
        assert mon.state == "running" and mon.dropped == 0
