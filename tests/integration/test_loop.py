"""The whole loop on real Kafka and real Redis: a Monitor publishes a KL blow-up, a real
`rlwatch worker` (Faust) raises the red alert, the pause reaches the same Monitor through Redis
and its next step blocks until `rlwatch resume`; Slack and the webhook receive the alert; a
malformed event lands in the dead-letter topic while processing goes on."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer

from producers import Monitor, TrainingStopped
from tests.integration.conftest import ROOT, worker_env

pytestmark = pytest.mark.integration


class TrainingLoop:
    """A fake trainer that calls the SDK exactly as the README shows, in its own thread."""

    def __init__(self, mon: Monitor, kl_at, checkpoint_every: int = 0):
        self.mon, self.kl_at, self.checkpoint_every = mon, kl_at, checkpoint_every
        self.step = -1
        self.stopped: TrainingStopped | None = None
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.faulty_since: float | None = None

    def run(self):
        try:
            for step in range(10_000):
                if self.halt.is_set():
                    return
                self.mon.step_boundary()
                self.step = step
                kl = self.kl_at(step)
                if kl > 0.1 and self.faulty_since is None:
                    self.faulty_since = time.time()
                self.mon.log(step, {"kl/mean": kl, "reward/mean": 0.5 + 0.001 * step,
                                    "entropy/mean": 2.0})
                if self.checkpoint_every and step % self.checkpoint_every == 0:
                    self.mon.log_checkpoint(step, f"/ckpt/{self.mon.run_id}/step-{step}")
                time.sleep(0.05)
        except TrainingStopped as exc:
            self.stopped = exc


def wait_paused(mon: Monitor, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while mon.state != "paused" and time.time() < deadline:
        time.sleep(0.02)
    assert mon.state == "paused", "the pause never reached the worker"


def alerts_on(topic: str, services, seconds: float, until=lambda alert: False) -> list[dict]:
    """The alerts on ``topic`` from its beginning: all of them once none came for ``seconds``,
    or those up to the first for which ``until`` holds."""
    consumer = KafkaConsumer(topic, bootstrap_servers=services["kafka"],
                             auto_offset_reset="earliest", consumer_timeout_ms=int(seconds * 1000),
                             group_id=f"alerts-reader-{uuid.uuid4().hex}")
    out = []
    try:
        for msg in consumer:
            out.append(json.loads(msg.value))
            if until(out[-1]):
                break
    finally:
        consumer.close()
    return out


def rlwatch(*args, env):
    return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_kl_blowup_pauses_the_worker_until_resume(services, recorder, start_worker, session_id):
    env = worker_env(services, session_id, recorder)
    start_worker(env)
    run_id = f"it-kl-{uuid.uuid4().hex[:6]}"
    mon = Monitor(run_id, kafka=services["kafka"], redis=services["redis"],
                  topic=env["RLWATCH_EVENTS_TOPIC"], heartbeat_seconds=0)
    assert mon.control.wait_ready(10) and mon.control.connected
    loop = TrainingLoop(mon, lambda s: 0.02 if s < 20 else 0.15)   # red: > 2.5 x 0.05
    loop.thread.start()
    try:
        wait_paused(mon)
        latency = time.time() - loop.faulty_since
        print(f"\nfirst faulty step published -> pause seen by the worker: {latency:.2f}s")

        # the training loop is blocked at its next step boundary
        time.sleep(1.0)
        held = loop.step
        time.sleep(2.0)
        assert loop.step == held, "the training loop kept stepping while paused"
        assert held >= 20

        status = rlwatch("status", run_id, env=env)
        assert f"{run_id}: paused" in status.stdout
        assert "kl_above_target" in status.stdout

        out = rlwatch("resume", run_id, "--reason", "checked it", env=env)
        assert out.returncode == 0, out.stderr
        deadline = time.time() + 20
        while loop.step == held and time.time() < deadline:
            time.sleep(0.05)
        assert loop.step > held, "the loop did not continue after resume"

        # the alert reached Slack (webhook and bot) and the generic webhook
        hook = recorder.wait_for("/hook", lambda r: r.json()["severity"] == "red")[0]
        alert = hook.json()
        assert alert["rule"] == "kl_above_target" and alert["run_id"] == run_id
        assert alert["state"] == "firing" and "pause" in alert["actions"]
        assert alert["threshold"] == pytest.approx(0.125)
        sig = "sha256=" + hmac.new(b"hook-secret", hook.body, hashlib.sha256).hexdigest()
        assert hook.headers["X-Rlwatch-Signature"] == sig
        slack = recorder.wait_for("/slack/webhook", lambda r: run_id in r.body.decode())
        assert "kl_above_target" in json.dumps(slack[0].json())
        bot = recorder.wait_for("/api/chat.postMessage", lambda r: run_id in r.body.decode())
        assert bot[0].headers.get("Authorization") == "Bearer test-bot-token"

        # the worker acknowledged pause and resume in the audit history
        status = rlwatch("status", run_id, env=env)
        assert "ack   pause" in status.stdout and "ack   resume" in status.stdout
    finally:
        loop.halt.set()
        loop.thread.join(timeout=5)
        mon.close()


def test_an_operator_rolls_a_paused_run_back_before_the_alert_and_raises_beta(services, recorder,
                                                                             start_worker, session_id):
    """After the red KL pause: `rlwatch rollback RUN`, naming no checkpoint, sends the newest one
    the run reported before the alert's onset (the worker's fleet record says which);
    `rlwatch adjust RUN beta=2` sends the factor. The paused script applies both at once and
    stays paused; `rlwatch status RUN` shows them applied, and the run trains on after resume."""
    env = worker_env(services, session_id, recorder)
    start_worker(env)
    run_id = f"it-rb-{uuid.uuid4().hex[:6]}"
    calls: list[tuple[str, dict]] = []
    mon = Monitor(run_id, kafka=services["kafka"], redis=services["redis"],
                  topic=env["RLWATCH_EVENTS_TOPIC"], heartbeat_seconds=0,
                  on_rollback=lambda p, c: calls.append(("rollback", p)),
                  on_adjust=lambda p, c: calls.append(("adjust", p)))
    assert mon.control.wait_ready(10) and mon.control.connected
    loop = TrainingLoop(mon, lambda s: 0.02 if s < 20 else 0.15, checkpoint_every=4)
    loop.thread.start()
    try:
        wait_paused(mon)

        def red_alert():
            out = rlwatch("status", run_id, "--json", env=env)
            assert out.returncode == 0, out.stderr
            alerts = (json.loads(out.stdout).get("summary") or {}).get("open_alerts") or []
            return next((a for a in alerts if a["severity"] == "red" and a.get("rollback_to")), None)

        deadline = time.time() + 20
        while (red := red_alert()) is None and time.time() < deadline:
            time.sleep(0.2)
        assert red is not None, "the fleet record never showed the red alert with its checkpoint"
        want = (red["onset_step"] - 1) // 4 * 4        # the newest checkpoint before the onset
        assert red["rollback_to"] == {"step": want, "checkpoint": f"/ckpt/{run_id}/step-{want}"}

        out = rlwatch("rollback", run_id, "--dry-run", env=env)
        assert out.returncode == 0 and f"would roll back to step {want} (/ckpt/{run_id}/step-{want}: " \
               f"the newest checkpoint before" in out.stdout and "nothing sent" in out.stdout, out
        out = rlwatch("rollback", run_id, "--reason", "back to before the KL climb", env=env)
        assert out.returncode == 0, out.stderr
        assert f"rollback to step {want} (/ckpt/{run_id}/step-{want}: the newest checkpoint before " \
               f"the onset of its red alert kl_above_target (step {red['onset_step']}))" in out.stdout
        assert f"{run_id} answered: applied (rank 0)" in out.stdout      # at once: it is paused
        out = rlwatch("adjust", run_id, "beta=2", "--reason", "KL climbed", env=env)
        assert out.returncode == 0 and f"{run_id} answered: applied (rank 0)" in out.stdout, out
        deadline = time.time() + 20
        while len(calls) < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert calls == [("rollback", {"to_step": want, "checkpoint": f"/ckpt/{run_id}/step-{want}"}),
                         ("adjust", {"beta": 2.0})]
        held = loop.step
        time.sleep(1.0)
        assert mon.state == "paused" and loop.step == held, "a one-shot command ended the pause"

        deadline = time.time() + 20
        while time.time() < deadline:
            status = rlwatch("status", run_id, env=env).stdout
            if "ack   rollback applied" in status and "ack   adjust   applied" in status:
                break
            time.sleep(0.2)
        assert "ack   rollback applied" in status and "ack   adjust   applied" in status, status
        assert "[beta=2.0]" in status and f"[to_step={want} checkpoint=/ckpt/{run_id}/step-{want}]" in status
        assert "KL thresholds: yellow 0.075, red 0.125, black 0.2" in status, status
        [listed] = [ln for ln in status.splitlines() if ln.startswith("  checkpoints: ")]
        assert f"step {want} /ckpt/{run_id}/step-{want}" in listed, status

        assert rlwatch("resume", run_id, "--reason", "rolled back", env=env).returncode == 0
        deadline = time.time() + 20
        while loop.step == held and time.time() < deadline:
            time.sleep(0.05)
        assert loop.step > held, "the loop did not continue after resume"
    finally:
        loop.halt.set()
        loop.thread.join(timeout=5)
        mon.close()


def test_malformed_events_go_to_the_dlq_and_processing_continues(services, recorder, start_worker,
                                                                session_id):
    env = worker_env(services, session_id, recorder)
    start_worker(env)
    topic, dlq = env["RLWATCH_EVENTS_TOPIC"], env["RLWATCH_DLQ_TOPIC"]
    producer = KafkaProducer(bootstrap_servers=services["kafka"])
    bad = [b"{not json", json.dumps({"schema": 1, "kind": "step", "step": 3}).encode(),
           json.dumps({"schema": 1, "kind": "step", "run_id": "x", "step": -4}).encode()]
    for raw in bad:
        producer.send(topic, key=b"bad", value=raw)
    # then a valid run whose NaN must still be caught (processing continued)
    run_id = f"it-nan-{uuid.uuid4().hex[:6]}"
    mon = Monitor(run_id, kafka=services["kafka"], redis=services["redis"], topic=topic,
                  heartbeat_seconds=0)
    producer.flush()
    try:
        for step in range(3):
            mon.log(step, {"loss/value": 1.0 if step < 2 else float("nan")})
        mon.flush(10)
        consumer = KafkaConsumer(dlq, bootstrap_servers=services["kafka"], auto_offset_reset="earliest",
                                 consumer_timeout_ms=30_000, group_id=f"dlq-reader-{uuid.uuid4().hex}")
        reasons = []
        for msg in consumer:
            reasons.append(json.loads(msg.value)["reason"])
            if len(reasons) >= 3:
                break
        consumer.close()
        assert any(r.startswith("bad JSON") for r in reasons), reasons
        assert "missing required field 'run_id'" in reasons, reasons
        assert any("step" in r and "greater than or equal to 0" in r for r in reasons), reasons

        hook = recorder.wait_for("/hook", lambda r: r.json()["run_id"] == run_id)
        alert = hook[0].json()
        assert alert["rule"] == "nan_inf" and alert["severity"] == "black"
        # the stop reaches the worker: its next step boundary raises TrainingStopped
        deadline = time.time() + 20
        while mon.state != "stopped" and time.time() < deadline:
            time.sleep(0.05)
        with pytest.raises(TrainingStopped):
            mon.step_boundary()
    finally:
        mon.close()
        producer.close()


@pytest.mark.parametrize("fault", [None, "drop-recovery-fetch"])
def test_a_restarted_worker_resumes_the_run_state(services, recorder, start_worker, session_id,
                                                  fault):
    """Three steps over the yellow line before a restart and two after make the five that
    `kl_above_target` needs: only a worker that resumed the run's state raises it.

    With the drill ``drop-recovery-fetch`` the restarted worker loses the first fetch of its
    table's recovery (the records reach neither the table nor the recovery's queue). Faust's
    recovery would wait for them for ever, the worker's runs unjudged; the worker reads the quiet
    partition again and goes on."""
    env = worker_env(services, f"{session_id}r{'f' if fault else ''}", recorder)
    first = start_worker(env)
    run_id = f"it-restart-{uuid.uuid4().hex[:6]}"
    mon = Monitor(run_id, kafka=services["kafka"], redis=False, topic=env["RLWATCH_EVENTS_TOPIC"],
                  heartbeat_seconds=0)
    try:
        for step in range(3):
            mon.log(step, {"kl/mean": 0.09})       # yellow line: 1.5 x 0.05 = 0.075
        assert mon.flush(10)
        time.sleep(5)                              # processed, state flushed, offsets committed
        first.stop()
        assert not recorder.on("/hook"), "nothing should have fired after three steps"
        second = start_worker(dict(env, RLWATCH_FAULT=fault) if fault else env)
        if fault:
            assert second.wait_for("reading them again", 5)
        for step in range(3, 5):
            mon.log(step, {"kl/mean": 0.09})
        assert mon.flush(10)
        hook = recorder.wait_for("/hook", lambda r: r.json()["run_id"] == run_id, timeout=30)
        alert = hook[0].json()
        assert (alert["rule"], alert["severity"]) == ("kl_above_target", "yellow")
        assert alert["onset_step"] == 0 and alert["step"] == 4
    finally:
        mon.close()


def test_the_worker_timer_finds_a_silent_run_and_spares_a_live_one(services, start_worker, session_id):
    """The liveness timer (streams.liveness) through a real worker: a run whose last step is
    older than run_stalled's 300 s is stalled at the next tick; a run that speaks is not."""
    env = worker_env(services, session_id)
    start_worker(env)
    topic, alerts_topic = env["RLWATCH_EVENTS_TOPIC"], env["RLWATCH_ALERTS_TOPIC"]
    silent, live = f"it-silent-{uuid.uuid4().hex[:6]}", f"it-live-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=services["kafka"])
    now = time.time()
    for step in range(3):
        for run_id, ts in ((silent, now - 400 + step), (live, now + step - 3)):
            producer.send(topic, key=run_id.encode(), value=json.dumps(
                {"schema": 1, "kind": "step", "run_id": run_id, "step": step, "ts": ts,
                 "metrics": {"kl/mean": 0.02}}).encode())
    producer.flush()
    seen = [(a["run_id"], a["rule"], a["state"]) for a in alerts_on(
        alerts_topic, services, 45, until=lambda a: (a["run_id"], a["rule"]) == (silent, "run_stalled"))]
    assert (silent, "run_stalled", "firing") in seen
    assert not any(run_id == live for run_id, _, _ in seen)


def test_a_run_that_hung_while_its_worker_was_down_is_found_stalled_by_the_next_worker(
        services, start_worker, session_id, tmp_path):
    """The worker stops; the run's last step is all it sent. The next worker has nothing new to
    read on the run's partition (its committed offset is the partition's end): it knows the
    partition is read up to now, and finds the run stalled without waiting for a record."""
    pack = tmp_path / "stall.yaml"
    pack.write_text("rules:\n  - id: run_stalled\n    params: {timeout: 15}\n    tiers:\n"
                    "      - severity: orange\n        when: {stalled_seconds: timeout}\n"
                    "        actions: [notify]\n")
    env = worker_env(services, f"{session_id}-hung", RLWATCH_RULES=str(pack))
    topic, alerts_topic = env["RLWATCH_EVENTS_TOPIC"], env["RLWATCH_ALERTS_TOPIC"]
    run_id = f"it-hung-{uuid.uuid4().hex[:6]}"
    first = start_worker(env)                     # (started: it printed Ready)
    producer = KafkaProducer(bootstrap_servers=services["kafka"])
    for step in range(3):
        producer.send(topic, key=run_id.encode(), value=json.dumps(
            {"schema": 1, "kind": "step", "run_id": run_id, "step": step, "ts": time.time(),
             "metrics": {"kl/mean": 0.02}}).encode())
    producer.flush()
    producer.close()
    time.sleep(5)                  # processed, state written, offsets committed
    first.stop()
    assert alerts_on(alerts_topic, services, 2) == []    # (the timeout is 15 s)
    start_worker(env)
    seen = alerts_on(alerts_topic, services, 40,
                     until=lambda a: (a["run_id"], a["rule"]) == (run_id, "run_stalled"))
    assert [(a["run_id"], a["rule"], a["state"]) for a in seen] == [(run_id, "run_stalled", "firing")]


@pytest.mark.parametrize("lane", ["1", "0"], ids=["batch lane", "Faust's agent path"])
def test_a_worker_behind_on_its_backlog_does_not_find_a_run_stalled_that_spoke_later(
        services, start_worker, session_id, tmp_path, lane):
    """A worker that starts behind (a restart, a rebalance) reads a backlog: a run's old steps,
    sent 400 s ago, then its latest step a second ago. While it reads the old ones its liveness
    timer (every 0.25 s here) must judge the run as of what it has read, not the wall clock: the
    run spoke a second ago, it is not stalled (before, a tick in the middle of the backlog found
    it silent for 400 s and raised a false run_stalled). The other run, silent since then, is.
    Both ways a worker reads events: its batch lane, and Faust's agent path (lane off)."""
    env = worker_env(services, f"{session_id}-lag{lane}", RLWATCH_TICK_SECONDS="0.25",
                     RLWATCH_BATCH_LANE=lane)
    topic, alerts_topic = env["RLWATCH_EVENTS_TOPIC"], env["RLWATCH_ALERTS_TOPIC"]
    live, silent = f"it-lag-{uuid.uuid4().hex[:6]}", f"it-lag-silent-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=services["kafka"], linger_ms=20,
                             batch_size=1 << 20)
    then = time.time() - 400
    backlog = 40_000               # seconds of reading: several ticks
    for step in range(backlog):
        for run_id in (live, silent) if step < 3 else (live,):
            producer.send(topic, key=run_id.encode(), timestamp_ms=int((then + step * 1e-4) * 1000),
                          value=json.dumps({"schema": 1, "kind": "step", "run_id": run_id,
                                            "step": step, "ts": then + step * 1e-4,
                                            "metrics": {"kl/mean": 0.02}}).encode())
    producer.send(topic, key=live.encode(), value=json.dumps(
        {"schema": 1, "kind": "step", "run_id": live, "step": backlog, "ts": time.time() - 1,
         "metrics": {"kl/mean": 0.02}}).encode())
    producer.flush()
    producer.close()
    worker = start_worker(env)
    worker.wait_for("caught up on every partition", 120)
    stalled = [(a["run_id"], a["state"]) for a in alerts_on(
        alerts_topic, services, 30, until=lambda a: (a["run_id"], a["rule"]) == (silent, "run_stalled"))
        if a["rule"] == "run_stalled"]
    assert stalled == [(silent, "firing")]


def test_after_a_rebalance_a_worker_does_not_find_the_runs_it_gave_away_stalled(
        services, start_worker, session_id, tmp_path):
    """Two workers share the runs after a rebalance. The first one's table held the states it
    wrote for the partitions it gave away (Faust's in-memory store keeps them): its liveness
    timer must leave those runs alone, they go on at the other worker and the copies left here
    look silent (before, they raised false run_stalled alerts), and it lets go of them."""
    pack = tmp_path / "stall.yaml"
    pack.write_text("rules:\n  - id: run_stalled\n    params: {timeout: 12}\n    tiers:\n"
                    "      - severity: orange\n        when: {stalled_seconds: timeout}\n"
                    "        actions: [notify]\n")
    env = worker_env(services, f"{session_id}-rb", RLWATCH_RULES=str(pack))
    first = start_worker(env)
    topic, alerts_topic = env["RLWATCH_EVENTS_TOPIC"], env["RLWATCH_ALERTS_TOPIC"]
    from streams.app import PARTITIONS, partition_of
    runs, per = [], dict.fromkeys(range(PARTITIONS), 0)    # three runs in every partition
    while len(runs) < 3 * PARTITIONS:
        run_id = f"it-rb-{uuid.uuid4().hex[:8]}"
        if per[partition_of(run_id, PARTITIONS)] < 3:
            per[partition_of(run_id, PARTITIONS)] += 1
            runs.append(run_id)
    producer = KafkaProducer(bootstrap_servers=services["kafka"])
    halt = threading.Event()

    sent = [0]                 # steps sent for every run

    def training():            # every run steps twice a second, all along
        while not halt.is_set():
            for run_id in runs:
                producer.send(topic, key=run_id.encode(), value=json.dumps(
                    {"schema": 1, "kind": "step", "run_id": run_id, "step": sent[0],
                     "ts": time.time(), "metrics": {"kl/mean": 0.02}}).encode())
            producer.flush()
            sent[0] += 1
            time.sleep(0.5)

    thread = threading.Thread(target=training, daemon=True)
    thread.start()
    try:
        time.sleep(6)          # the first worker owns every run, and has written them
        second = start_worker(env)      # the second takes half the partitions
        time.sleep(30)         # more than the timeout after the rebalance
    finally:
        halt.set()
        thread.join(timeout=5)
    stalled = [(a["run_id"], a["state"]) for a in alerts_on(alerts_topic, services, 5)
               if a["rule"] == "run_stalled"]
    assert stalled == []
    # the first worker let go of the states it had written for the runs it gave away, and of
    # those only: every run's state counted every step it sent, across the rebalance (a state
    # dropped by mistake would have started over)
    gone = first.wait_for("run states of partitions now at another worker", 10)
    dropped = int(gone.split("let go of ")[1].split()[0])
    assert 0 < dropped < len(runs) and dropped % 3 == 0     # whole partitions' runs
    from streams.fleet_store import FleetStore

    async def counts():
        store = FleetStore.from_url(services["redis"], env["RLWATCH_APP_ID"])
        try:
            deadline = time.time() + 20
            while True:
                got = await store.get_many(runs)
                have = {r: (got.get(r) or {}).get("summary", {}) for r in runs}
                if all(h.get("last_step") == sent[0] - 1 for h in have.values()) or time.time() > deadline:
                    return have
                await asyncio.sleep(0.5)
        finally:
            await store.close()

    have = asyncio.run(counts())

    def logs() -> str:      # what each worker said (a slow host's failure is explained there)
        quiet = ("|", "+")
        return "\n".join(f"-- worker {i}:\n" + "\n".join([ln for ln in w.lines if not ln.startswith(quiet)][-30:])
                         for i, w in enumerate((first, second), 1))
    assert {r: h.get("last_step") for r, h in have.items()} == {r: sent[0] - 1 for r in runs}, logs()
    assert all(h["events"] >= sent[0] for h in have.values()), {r: h["events"] for r, h in have.items()}


def test_a_worker_that_stops_hands_its_runs_to_the_other_workers_at_once(
        services, start_worker, session_id):
    """A worker stopped for good (a scale-down, a drained host) leaves its consumer group: the
    other worker reads its runs' next steps straight away. As a static member it sent no
    LeaveGroup before, so its runs went unwatched until its session timed out (30 s here)."""
    env = worker_env(services, f"{session_id}-lv", RLWATCH_SESSION_TIMEOUT="30")
    first = start_worker(env)
    second = start_worker(env)
    topic = env["RLWATCH_EVENTS_TOPIC"]
    from streams.app import PARTITIONS, partition_of
    from streams.fleet_store import FleetStore
    runs: dict[int, str] = {}                    # a run in every partition
    while len(runs) < PARTITIONS:
        run_id = f"it-lv-{uuid.uuid4().hex[:8]}"
        runs.setdefault(partition_of(run_id, PARTITIONS), run_id)
    producer = KafkaProducer(bootstrap_servers=services["kafka"])

    def step(n: int) -> None:
        for run_id in runs.values():
            producer.send(topic, key=run_id.encode(), value=json.dumps(
                {"schema": 1, "kind": "step", "run_id": run_id, "step": n, "ts": time.time(),
                 "metrics": {"kl/mean": 0.02}}).encode())
        producer.flush()

    async def steps_read(n: int, seconds: float) -> dict[str, int | None]:
        store = FleetStore.from_url(services["redis"], env["RLWATCH_APP_ID"])
        try:
            deadline = time.time() + seconds
            while True:
                got = await store.get_many(list(runs.values()))
                last = {r: ((got.get(r) or {}).get("summary") or {}).get("last_step")
                        for r in runs.values()}
                if all(s == n for s in last.values()) or time.time() > deadline:
                    return last
                await asyncio.sleep(0.2)
        finally:
            await store.close()

    step(0)         # both workers read their runs: each has partitions
    assert set(asyncio.run(steps_read(0, 30)).values()) == {0}
    assert any("generation id 2 " in ln for ln in second.lines), "the second worker never joined"
    second.stop()
    step(1)
    read = asyncio.run(steps_read(1, 8))       # well inside the 30 s session
    assert read == {r: 1 for r in runs.values()}, "\n".join(first.lines[-30:])
    assert any("left group" in ln for ln in second.lines)
