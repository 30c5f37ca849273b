"""Control-channel edges against real Redis: a relaunched run is not killed by an old stop;
an operator can clear a stop; the SDK never logs the Redis password."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from producers import Monitor, TrainingStopped
from contract.commands import Command
from tests.support.control import apply_command

pytestmark = pytest.mark.integration


def test_a_relaunched_run_ignores_a_stop_from_before_it_started(services):
    run = f"relaunch-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], Command(run_id=run, action="stop", ts=time.time(), reason="old"))
    time.sleep(0.05)
    mon = Monitor(run, kafka=False, redis=services["redis"], heartbeat_seconds=0)
    try:
        assert mon.control.wait_ready(10) and mon.control.connected
        mon.step_boundary()          # not stopped by the previous incarnation's stop
        assert mon.state == "running"
        apply_command(services["redis"], Command(run_id=run, action="stop", ts=time.time(), reason="now"))
        deadline = time.time() + 10
        while mon.state != "stopped" and time.time() < deadline:
            time.sleep(0.02)
        with pytest.raises(TrainingStopped):
            mon.step_boundary()      # a stop issued while it runs still stops it
    finally:
        mon.close()


def test_an_operator_resume_clears_a_stop(services):
    run = f"clear-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], Command(run_id=run, action="stop", ts=time.time()))
    state = apply_command(services["redis"], Command(run_id=run, action="resume", ts=time.time()))
    assert state.state == "running"


def test_the_sdk_does_not_log_the_redis_password(services, caplog):
    url = services["redis"].replace("redis://", "redis://:s3cret-pw@")
    caplog.set_level(logging.DEBUG)
    mon = Monitor(f"pw-{uuid.uuid4().hex[:6]}", kafka=False, redis=url, heartbeat_seconds=0)
    try:
        mon.control.wait_ready(10)
        time.sleep(1.5)
    finally:
        mon.close()
    assert "s3cret-pw" not in caplog.text


def test_an_adjust_sent_while_the_worker_was_away_is_applied_when_it_connects(services):
    run = f"away-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], Command(run_id=run, action="adjust", params={"beta": 1.5},
                                      ts=time.time(), reason="kl rising"))
    got = []
    # the worker started (its first reading of the clock says) before the command, but connects
    # only now
    started = [time.time() - 30]
    mon = Monitor(run, kafka=False, redis=services["redis"], heartbeat_seconds=0,
                  clock=lambda: started.pop() if started else time.time(),
                  on_adjust=lambda params, cmd: got.append(params))
    try:
        assert mon.control.wait_ready(10)
        deadline = time.time() + 5
        while not got and time.time() < deadline:
            mon.step_boundary()
            time.sleep(0.02)
        assert got == [{"beta": 1.5}]
    finally:
        mon.close()
