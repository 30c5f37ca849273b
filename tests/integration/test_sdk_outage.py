"""The SDK against real Apache Kafka and real Redis.

1. A broker outage in the middle of a run costs the training loop no time (every ``log`` call
   returns fast) and, once the broker is back, exactly the newest ``buffer_size`` events arrive,
   once each, with one heartbeat that reports exactly how many were dropped.
   The outage is real: ``scripts/kafka.sh stop`` / ``start`` on a broker of this test's own
   (same script, its own port and data directory), so that stopping it does not pull the
   shared broker on 9092 from under anything else running on this machine.
2. pause / resume / adjust / stop published with ``RedisControl`` reach a training loop that
   runs the TRL callback (``RlwatchCallback`` in a real ``transformers`` CallbackHandler).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition

from alerts.control import RedisControl
from producers import Monitor
from contract.commands import Command

pytestmark = pytest.mark.integration


def consume(bootstrap: str, topic: str, idle_ms: int = 3000) -> list[dict]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=idle_ms)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        assert parts, f"topic {topic} does not exist"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        return [json.loads(m.value) for m in consumer]
    finally:
        consumer.close()


def test_broker_outage_costs_no_training_time_and_reports_exact_drops(broker):
    n, b = 500, 120
    topic = f"rlwatch.it.outage.{uuid.uuid4().hex[:8]}"
    mon = Monitor(f"outage-{uuid.uuid4().hex[:6]}", kafka=broker.bootstrap, redis=False, topic=topic,
                  buffer_size=b, heartbeat_seconds=0)
    try:
        # the run is connected and publishing when the broker goes away
        mon.log(0, {"kl/mean": 0.01})
        assert mon.flush(60), "the warm-up event never reached the broker"
        try:
            broker.stop()
            slowest = 0.0
            pc = time.perf_counter
            for step in range(1, n + 1):
                t0 = pc()
                mon.log(step, {"kl/mean": 0.01, "reward/mean": float(step)})
                slowest = max(slowest, pc() - t0)
            assert slowest < 0.050, f"a log() call took {slowest * 1e3:.1f} ms during the outage"
            # the sender tries in the background, fails, and keeps the newest b events
            deadline = time.time() + 40
            while not (mon.sender.failures >= 1 and mon.dropped >= n - b) and time.time() < deadline:
                time.sleep(0.05)
            assert mon.sender.failures >= 1, "the sender never noticed the outage"
            assert mon.dropped == n - b, f"{mon.dropped} dropped, expected {n - b}"
        finally:
            broker.start()
        assert mon.flush(90), "the buffered events were not delivered after the broker came back"
    finally:
        mon.close(timeout=20)   # also flushes what the Kafka client itself may still hold
    events = consume(broker.bootstrap, topic)
    steps = sorted(e["step"] for e in events if e["kind"] == "step")
    # the heartbeat that reports the drops (close() sends a last one, without drops)
    heartbeats = [e for e in events if e["kind"] == "heartbeat" and e.get("dropped_events")]
    assert steps == [0] + list(range(n - b + 1, n + 1)), (
        f"{len(steps)} step events ({len(set(steps))} distinct), expected the warm-up plus exactly "
        f"the newest {b} of {n}, once each")
    assert len(heartbeats) == 1 and heartbeats[0]["dropped_events"] == n - b, heartbeats


# -- control through the TRL callback, real Redis ----------------------------------------------------

def apply(redis_url: str, run_id: str, action: str, params: dict | None = None) -> None:
    async def go():
        control = RedisControl(redis_url)
        try:
            await control.apply(Command(run_id=run_id, action=action, params=params or {},
                                        ts=time.time(), reason=f"it {action}", issuer="test"))
        finally:
            await control.close()

    asyncio.run(go())


class TrainerLoop:
    """A Trainer-shaped loop: the real CallbackHandler calls the callbacks as Trainer does."""

    def __init__(self, handler, args):
        from transformers import TrainerControl, TrainerState

        self.handler, self.args = handler, args
        self.state, self.control = TrainerState(max_steps=100_000), TrainerControl()
        self.saved_at: list[int] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        h, a, s = self.handler, self.args, self.state
        try:
            self.control = h.on_train_begin(a, s, self.control)
            while s.global_step < 2_000:
                self.control = h.on_step_begin(a, s, self.control)
                time.sleep(0.01)                       # the training step
                s.global_step += 1
                self.control = h.on_step_end(a, s, self.control)
                self.control = h.on_log(a, s, self.control, {"kl": 0.01, "reward": 1.0})
                if self.control.should_save:
                    self.saved_at.append(s.global_step)
                    self.control = h.on_save(a, s, self.control)
                if self.control.should_training_stop:
                    break
            self.control = h.on_train_end(a, s, self.control)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc


def wait_for(cond, timeout=15.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_trl_callback_obeys_pause_resume_adjust_stop_over_redis(services, tmp_path):
    import redis
    from transformers import TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    from producers.integrations.trl import RlwatchCallback

    class Optimizer:
        param_groups = [{"lr": 1e-5}]

    class GRPOTrainer:
        beta = 0.04

    url = services["redis"]
    run_id = f"it-trl-{uuid.uuid4().hex[:6]}"
    optimizer, trainer = Optimizer(), GRPOTrainer()
    mon = Monitor(run_id, kafka=False, redis=url, heartbeat_seconds=0)
    assert mon.control.wait_ready(10) and mon.control.connected
    cb = RlwatchCallback(mon, trainer=trainer)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no")
    loop = TrainerLoop(CallbackHandler([DefaultFlowCallback(), cb], None, None, optimizer, None), args)
    r = redis.Redis.from_url(url)
    try:
        loop.thread.start()
        wait_for(lambda: loop.state.global_step >= 5, what="the loop to run")

        apply(url, run_id, "pause")
        wait_for(lambda: mon.state == "paused", what="the pause to reach the worker")
        time.sleep(0.3)
        held = loop.state.global_step
        time.sleep(1.0)
        assert loop.state.global_step == held, "the trainer kept stepping while paused"

        apply(url, run_id, "adjust", {"lr": 0.5, "beta": 2.0})
        apply(url, run_id, "resume")
        wait_for(lambda: loop.state.global_step > held + 3, what="the loop to resume")
        assert optimizer.param_groups[0]["lr"] == pytest.approx(5e-6)
        assert trainer.beta == pytest.approx(0.08)

        apply(url, run_id, "stop")
        loop.thread.join(15)
        assert not loop.thread.is_alive(), "the trainer did not stop"
        assert loop.error is None, f"the callback raised into the trainer: {loop.error!r}"
        assert loop.control.should_training_stop and loop.saved_at == [loop.state.global_step]
        assert cb.stopped is not None and "it stop" in str(cb.stopped)

        def acks():
            return {json.loads(v)["action"]: json.loads(v)["status"]
                    for v in r.hgetall(f"rlwatch:acks:{run_id}").values()}

        wait_for(lambda: set(acks()) == {"pause", "resume", "adjust", "stop"}, what="the acks in Redis")
        assert set(acks().values()) == {"applied"}, acks()
    finally:
        mon.control.close()           # releases a loop still blocked in a pause
        loop.thread.join(5)
        mon.close(2.0)
        for key in (f"rlwatch:run:{run_id}:state", f"rlwatch:audit:{run_id}", f"rlwatch:acks:{run_id}"):
            r.delete(key)
        r.srem("rlwatch:runs", run_id)
        r.close()


def test_a_monitor_delivers_its_steps_without_warnings_from_the_kafka_client(services, caplog):
    """Nothing of the Kafka client's in a training log: kafka-python 3 warned, at every start,
    that it turned its idempotent producer off (it needs acks=all; the SDK sends with acks=1)."""
    import logging

    caplog.set_level(logging.INFO)
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"rlwatch.it-sdk.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=services["kafka"])
    try:                # as a deployment has it: the worker made the events topic
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    caplog.clear()
    run_id = f"it-sdk-{uuid.uuid4().hex[:6]}"
    mon = Monitor(run_id, kafka=services["kafka"], redis=services["redis"], topic=topic, heartbeat_seconds=0)
    try:
        for step in range(3):
            mon.log(step, {"kl/mean": 0.02, "reward/mean": 0.5})
    finally:
        mon.close(10)
    got = [e for e in consume(services["kafka"], topic) if e.get("kind") == "step"]
    assert [e["step"] for e in got] == [0, 1, 2]
    # (kafka-python 3 also warns when one of its own tasks ran long, "ran for 0.259s (>0.100s
    # threshold)": the host's load, a busy test machine's two cores, not the SDK's settings)
    noisy = [f"{r.name}: {r.getMessage()}" for r in caplog.records
             if r.name.startswith("kafka") and r.levelno >= logging.WARNING
             and not re.search(r"ran for [\d.]+s \(>[\d.]+s threshold\)", r.getMessage())]
    assert noisy == []
