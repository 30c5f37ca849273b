"""The brake under crashes, outages, slow receivers and attack, on the real stack: real Apache
Kafka, real redis-server (a private one where a test kills it), real `rlwatch worker`
processes, training loops with the SDK's Monitor, and the local HTTP recorder standing in for
Slack and the webhook. Each test is one drill of issue 14; timeouts and leases are shrunk so
each takes seconds (worker start-ups aside)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid

import pytest
import redis as redis_sync

from alerts.control import RedisControl
from alerts.factory import build_dispatcher
from contract.alert import Alert
from contract.commands import Command, RunControl, audit_key, channel, state_key
from contract.settings import Settings
from producers import Monitor, TrainingStopped
from tests.integration.conftest import worker_env
from tests.support.control import apply_command
from tests.support.http_recorder import start_recorder
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.integration

SECRET = "drill-" + uuid.uuid4().hex[:8]


def until(cond, timeout: float, what: str, every: float = 0.05, worker=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(every)
    tail = ("\nthe worker's last lines:\n" + "\n".join(worker.lines[-60:])) if worker is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")


class Trainer:
    """A training loop as the README shows it, in a thread; ``red`` turns its KL bad."""

    def __init__(self, run_id: str, kafka: str, topic: str, redis_url: str):
        self.run_id = run_id
        self.mon = Monitor(run_id, kafka=kafka, redis=redis_url, topic=topic, control_secret=SECRET,
                           heartbeat_seconds=0)
        self.red = threading.Event()
        self.halt = threading.Event()
        self.step = -1
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name=f"train-{run_id}", daemon=True)

    def start(self) -> Trainer:
        assert self.mon.control.wait_ready(10)
        self.thread.start()
        return self

    def _run(self):
        try:
            for step in range(100_000):
                if self.halt.is_set():
                    return
                self.mon.step_boundary()
                self.step = step
                # red above 2.5 x 0.05, once the run's first 5 steps set where it started (a run
                # over its KL line from its first steps has a setup to check and is not braked)
                kl = 0.15 if self.red.is_set() and step >= 5 else 0.02
                self.mon.log(step, {"kl/mean": kl, "reward/mean": 0.5 + 0.001 * step, "entropy/mean": 2.0})
                time.sleep(0.05)
        except TrainingStopped:
            self.stopped = True

    @property
    def paused(self) -> bool:
        return self.mon.state == "paused"

    def close(self):
        self.halt.set()
        self.mon.control.close()          # releases a loop blocked in a pause
        self.thread.join(5)
        self.mon.close(2)


@pytest.fixture
def trainers():
    made: list[Trainer] = []

    def make(*args) -> Trainer:
        t = Trainer(*args)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def fast(env: dict, **extra) -> dict:
    """Drill settings: short ticks and timeouts, signed commands."""
    env.update({"RLWATCH_DELIVERY_TICK_SECONDS": "0.5", "RLWATCH_BRAKE_ALARM_SECONDS": "2",
                "RLWATCH_BRAKE_RESEND_SECONDS": "1", "RLWATCH_ACK_TIMEOUT": "30",
                "RLWATCH_CONTROL_SECRET": SECRET, **extra})
    return env


def firing(rec, path: str, rule: str = "kl_above_target") -> dict[str, int]:
    """The most firing notices of ``rule`` any one tier of a run got at ``path``, per run (1 when
    each alert arrived once)."""
    seen: dict[tuple[str, str], int] = {}
    for r in rec.on(path):
        for run, severity, got_rule, state in _alerts_in(r):
            if got_rule == rule and state == "firing":
                seen[(run, severity)] = seen.get((run, severity), 0) + 1
    out: dict[str, int] = {}
    for (run, _), n in seen.items():
        out[run] = max(out.get(run, 0), n)
    return out


def _alerts_in(r) -> list[tuple[str, str, str, str]]:
    """(run, tier, rule, state) of each alert in a webhook body or a Slack message."""
    body = r.json()
    if "rule" in body:
        return [(body["run_id"], body["severity"], body["rule"], body["state"])]
    out = []
    for line in str(body.get("text", "")).splitlines():   # Slack: "[RED] run step N rule: ..."
        m = re.match(r"\[([A-Z]+)\] (\S+) step \d+ ([^:\s]+):", line)
        if m:
            tier = m.group(1).lower()
            out.append((m.group(2), tier, m.group(3), "resolved" if tier == "resolved" else "firing"))
    return out


# -- 1 and 2: kill -9 between reading an alert and pulling the brake; a quick restart ----------

@pytest.mark.parametrize("crash_at", ["alerted", "publishing"])
def test_a_worker_killed_before_braking_leaves_the_pause_to_its_successor(services, recorder, start_worker,
                                                                          trainers, tmp_path, crash_at):
    """The worker dies before anything acted on the red alert: right after it published it
    ("alerted"), or after it processed the events that raised it and before it sent anything
    ("publishing": whatever it wrote by then is in Kafka). Either way its successor pauses the
    run: from the alert's copy on the topic, or by raising the alert again."""
    sid = uuid.uuid4().hex[:8]
    marker = tmp_path / "crashed"
    env = fast(worker_env(services, sid, recorder), RLWATCH_CRASH_AT=crash_at, RLWATCH_CRASH_ONCE=str(marker))
    first = start_worker(env)
    run = trainers(f"drill-kill-{sid}", services["kafka"], env["RLWATCH_EVENTS_TOPIC"], services["redis"]).start()
    run.red.set()
    until(lambda: first.proc.poll() is not None, 90, "the worker to die at the crash point")
    assert first.proc.returncode == -9 and marker.exists()
    assert not run.paused, "the brake was pulled before the crash point"
    t0 = time.time()
    second = start_worker(env)       # same app and host: same slot, same group instance id
    ready = time.time() - t0
    # a loaded machine (CI) may take a while to recover the table and read the topics again
    try:
        until(lambda: run.paused, 120, "the restarted worker to pause the run", worker=second)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_post_mortem(run, env, services, first)}") from None
    print(f"\nkill -9 -> restarted worker ready {ready:.1f}s, run paused {time.time() - t0:.1f}s after restart")
    # the restarted worker took the dead one's place in the group, it did not wait beside it
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=services["kafka"])
    try:
        group = admin.describe_groups([env["RLWATCH_APP_ID"]])[env["RLWATCH_APP_ID"]]
        assert len(group["members"]) == 1, [m["member_id"] for m in group["members"]]
    finally:
        admin.close()
    assert second.proc.poll() is None
    # the alert itself was delivered once, by the successor
    recorder.wait_for("/hook", lambda r: r.json().get("run_id") == run.run_id)
    time.sleep(1.0)
    assert firing(recorder, "/hook") == {run.run_id: 1}


def _post_mortem(run: Trainer, env: dict, services: dict, first) -> str:
    """What a failed crash drill needs explained: the dead worker's last lines, the run's control
    state and audit in Redis, what its Monitor refused, and the alerts on the alerts topic."""
    from kafka import KafkaConsumer

    out = ["the dead worker's last lines:", *[ln for ln in first.lines if not ln.startswith(("|", "+"))][-25:]]
    r = redis_sync.Redis.from_url(services["redis"])
    try:
        out.append(f"control state: {r.get(state_key(run.run_id))!r}")
        out += [f"audit: {fields}" for _, fields in r.xrange(audit_key(run.run_id))]
    finally:
        r.close()
    out.append(f"monitor: state {run.mon.state}, refusals {run.mon.control.refusals}, step {run.step}")
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=services["kafka"])
    try:
        group = env["RLWATCH_APP_ID"]
        if hasattr(admin, "list_group_offsets"):          # kafka-python 3 renamed it
            offsets = admin.list_group_offsets(group).get(group, {})
        else:
            offsets = admin.list_consumer_group_offsets(group)
        out += [f"committed {tp.topic} p{tp.partition}: {om.offset}" for tp, om in sorted(offsets.items())]
    finally:
        admin.close()
    consumer = KafkaConsumer(env["RLWATCH_ALERTS_TOPIC"], bootstrap_servers=services["kafka"],
                             auto_offset_reset="earliest", consumer_timeout_ms=3000)
    try:
        for m in consumer:
            a = json.loads(m.value)
            out.append(f"alerts topic p{m.partition}@{m.offset}: {a.get('severity')} {a.get('rule')} "
                       f"{a.get('state')} step {a.get('step')} actions {a.get('actions')}")
    finally:
        consumer.close()
    return "\n".join(out)


# -- 3: Redis killed while runs go red -----------------------------------------------------------

def test_runs_that_go_red_while_redis_is_down_are_paused_when_it_returns(services, recorder, start_worker,
                                                                         trainers, tmp_path):
    sid = uuid.uuid4().hex[:8]
    rs = RedisServer(tmp_path).start()
    try:
        env = fast(worker_env(services, sid, recorder), RLWATCH_REDIS=rs.url)
        worker = start_worker(env)
        topic = env["RLWATCH_EVENTS_TOPIC"]
        before, a, b, after = (trainers(f"drill-redis-{n}-{sid}", services["kafka"], topic, rs.url).start()
                               for n in ("before", "a", "b", "after"))
        # a run that goes red with Redis up: paused, notified through the outbox
        before.red.set()
        until(lambda: before.paused, 30, "the first pause")
        recorder.wait_for("/hook", lambda r: r.json().get("run_id") == before.run_id)

        rs.kill()                                               # a crash: its data is gone too
        a.red.set()
        b.red.set()
        # the alerts go straight to the receivers; the brakes that cannot land raise the alarm
        for t in (a, b):
            recorder.wait_for("/hook", lambda r, t=t: r.json().get("run_id") == t.run_id
                              and r.json().get("rule") == "kl_above_target", timeout=30)
            recorder.wait_for("/hook", lambda r, t=t: r.json().get("run_id") == t.run_id
                              and r.json().get("rule") == "control_unreachable"
                              and r.json().get("state") == "firing", timeout=30)
        assert not a.paused and not b.paused

        rs.start()                                              # back, empty, on the same port
        until(lambda: a.paused and b.paused, 30, "the pauses after Redis returned")
        for t in (a, b):   # the alarm resolves when its brake lands
            recorder.wait_for("/hook", lambda r, t=t: r.json().get("run_id") == t.run_id
                              and r.json().get("rule") == "control_unreachable"
                              and r.json().get("state") == "resolved", timeout=30)
        # delivery goes on through the outbox (a pooled connection from before does not stall it)
        after.red.set()
        until(lambda: after.paused, 30, "a pause after the outage")
        recorder.wait_for("/hook", lambda r: r.json().get("run_id") == after.run_id, timeout=30)
        time.sleep(2.0)
        runs = {t.run_id: 1 for t in (before, a, b, after)}
        assert firing(recorder, "/hook") == runs, "a notification was lost or sent twice"
        assert firing(recorder, "/slack/webhook") == runs
        alarms = firing(recorder, "/hook", "control_unreachable")
        assert {a.run_id, b.run_id} <= set(alarms) and set(alarms.values()) == {1}, alarms
        assert before.paused, "the pause from before the outage did not hold"
    finally:
        worker.stop()
        rs.stop()


def test_a_worker_killed_while_its_brake_waits_for_redis_leaves_the_brake_to_its_successor(
        services, recorder, start_worker, trainers, tmp_path):
    # the alert's copy on the alerts topic is acknowledged only once its brake has landed: a
    # worker that dies while Redis is down (the brake pulled on its fast path, still retrying)
    # leaves the alert unacknowledged, and its successor pulls the brake from the topic
    sid = uuid.uuid4().hex[:8]
    rs = RedisServer(tmp_path).start()
    try:
        env = fast(worker_env(services, sid, recorder), RLWATCH_REDIS=rs.url)
        first = start_worker(env)
        run = trainers(f"drill-wait-{sid}", services["kafka"], env["RLWATCH_EVENTS_TOPIC"], rs.url).start()
        rs.kill()
        run.red.set()
        # the alert went out (straight to the receivers) and its brake could not land
        recorder.wait_for("/hook", lambda r: r.json().get("run_id") == run.run_id
                          and r.json().get("rule") == "control_unreachable"
                          and r.json().get("state") == "firing", timeout=60)
        time.sleep(6.0)          # commits of the events and the run's state (every 2.8 s) went by
        assert not run.paused
        first.proc.kill()
        first.proc.wait(10)
        rs.start()               # back, empty
        second = start_worker(env)
        until(lambda: run.paused, 120, "the successor to pull the brake from the alerts topic", worker=second)
    finally:
        rs.stop()


# -- 4: a hanging Slack holds back no brake ------------------------------------------------------

def test_a_hanging_slack_holds_back_neither_the_brakes_nor_the_webhook(services, start_worker, trainers):
    rec, server = start_recorder()
    rec.hang = ("/slack/", "/api/")                   # both Slack endpoints read and never answer
    try:
        sid = uuid.uuid4().hex[:8]
        env = fast(worker_env(services, sid, rec))
        start_worker(env)
        runs = [trainers(f"drill-hang-{i}-{sid}", services["kafka"], env["RLWATCH_EVENTS_TOPIC"],
                         services["redis"]).start() for i in range(5)]
        for t in runs:
            t.red.set()
        until(lambda: all(t.paused for t in runs), 30, "five pauses")
        held = {p: len([r for r in rec.hung if r.path.startswith(p)]) for p in ("/slack/", "/api/")}
        # every brake landed while Slack still held its very first request of each kind
        assert held["/slack/"] <= 1 and held["/api/"] <= 1, held
        for t in runs:
            rec.wait_for("/hook", lambda r, t=t: r.json().get("run_id") == t.run_id, timeout=15)
        assert not rec.on("/slack/") and not rec.on("/api/"), "Slack answered during the hang"
        rec.release()
        for t in runs:   # Slack gets them once it answers again
            rec.wait_for("/slack/webhook", lambda r, t=t: t.run_id in r.body.decode(), timeout=60)
        assert firing(rec, "/hook") == {t.run_id: 1 for t in runs}
    finally:
        rec.release()
        server.shutdown()


# -- 5, 6, 7: forged, replayed and planted control messages; the audit needs a token ------------

def boundary(mon: Monitor) -> str:
    """What ``step_boundary()`` does: "returned", "blocked" (paused) or "stopped"."""
    out: list[str] = []

    def call():
        try:
            mon.step_boundary()
            out.append("returned")
        except TrainingStopped:
            out.append("stopped")

    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(2.0)
    return out[0] if out else "blocked"


def _cmd(run_id: str, action: str, **kw) -> Command:
    return Command(run_id=run_id, action=action, ts=time.time(), reason="drill", issuer="test", **kw).signed(SECRET)


def test_forged_replayed_and_planted_control_messages_are_refused(services):
    url = services["redis"]
    r = redis_sync.Redis.from_url(url)
    run = f"drill-forge-{uuid.uuid4().hex[:6]}"
    # planted before the run starts: a bare paused state, and a genuine signed pause of an
    # earlier launch copied into the state key
    old_pause = _cmd(run, "pause").model_copy(update={"ts": time.time() - 3600}).signed(SECRET)
    for planted in (RunControl(run_id=run, state="paused"),
                    RunControl(run_id=run, state="paused", command=old_pause)):
        r.set(state_key(run), planted.model_dump_json())
        mon = Monitor(run, kafka=False, redis=url, control_secret=SECRET, heartbeat_seconds=0)
        try:
            assert mon.control.wait_ready(10) and mon.control.connected
            assert boundary(mon) == "returned" and mon.state == "running"
            assert mon.control.rejected >= 1
        finally:
            mon.control.close()
            mon.close()
    r.delete(state_key(run))

    # this process started a minute ago (its first reading of the clock says)
    started = [time.time() - 60]
    mon = Monitor(run, kafka=False, redis=url, control_secret=SECRET, heartbeat_seconds=0,
                  clock=lambda: started.pop() if started else time.time())
    try:
        assert mon.control.wait_ready(10)
        forged = [
            json.dumps({"run_id": run, "state": "stopped"}),                                 # unsigned state
            RunControl(run_id=run, state="stopped", command=_cmd(run, "resume")).model_dump_json(),
            _cmd(run, "stop").model_copy(update={"reason": "edited"}).model_dump_json(),      # tampered
            Command(run_id=run, action="stop", ts=time.time()).model_dump_json(),             # unsigned
            _cmd("someone-else", "stop").model_dump_json(),                                  # another run's
        ]
        for msg in forged:
            r.publish(channel(run), msg)
        time.sleep(0.5)
        assert boundary(mon) == "returned" and mon.state == "running"
        assert mon.control.rejected >= 4
        # a genuine pause (issued ten seconds ago) is obeyed; it is captured on the way (it is in
        # the audit too)
        pause = _cmd(run, "pause").model_copy(update={"ts": time.time() - 10}).signed(SECRET)
        apply_command(url, pause)
        until(lambda: mon.state == "paused", 10, "the genuine pause")
        apply_command(url, _cmd(run, "resume"))
        until(lambda: mon.state == "running", 10, "the resume")
        r.publish(channel(run), pause.model_dump_json())        # replayed while it runs
        time.sleep(0.5)
        assert boundary(mon) == "returned" and mon.state == "running"
    finally:
        mon.control.close()
        mon.close()
    # the run restarts; the captured pause is replayed at the new process, live and stored
    r.set(state_key(run), RunControl(run_id=run, state="paused", command=pause).model_dump_json())
    mon = Monitor(run, kafka=False, redis=url, control_secret=SECRET, heartbeat_seconds=0)
    try:
        assert mon.control.wait_ready(10)
        r.publish(channel(run), pause.model_dump_json())
        time.sleep(0.5)
        assert boundary(mon) == "returned" and mon.state == "running"
    finally:
        mon.control.close()
        mon.close()
        r.close()


def test_the_audit_history_needs_the_operator_token(services):
    import urllib.error
    import urllib.request

    from web.fleet import Fleet
    from web.server import WebServer

    run = f"drill-audit-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], _cmd(run, "pause"))
    server = WebServer(Fleet(), "127.0.0.1", 0, control_factory=lambda: RedisControl(services["redis"]),
                       token="operator-token").start()
    try:
        url = f"{server.url}api/run/audit?run={run}"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 401 and b"signature" not in err.value.read()
        req = urllib.request.Request(url, headers={"X-RLWatch-Token": "operator-token"})
        got = json.loads(urllib.request.urlopen(req, timeout=5).read())
        assert got["state"] == "paused" and got["history"][0]["signature"]
    finally:
        server.stop()


# -- 11: two applications on one Redis ------------------------------------------------------------

def test_two_applications_sharing_a_redis_never_handle_each_others_brakes_or_outbox(services):
    rec_a, srv_a = start_recorder()
    rec_b, srv_b = start_recorder()
    rec_a.fail_next = [500] * 3
    run = f"drill-xapp-{uuid.uuid4().hex[:6]}"
    sid = uuid.uuid4().hex[:6]

    def settings(app: str, rec) -> Settings:
        return Settings(redis=services["redis"], app_id=f"drill-{app}-{sid}", webhook_url=f"{rec.url}/hook",
                        control_secret=SECRET, ack_timeout=0.5)

    async def go():
        a, b = build_dispatcher(settings("a", rec_a)), build_dispatcher(settings("b", rec_b))
        try:
            out = await a.handle(Alert(rule="kl_above_target", severity="red", state="firing", run_id=run,
                                       step=50, onset_step=45, actions=["pause"], summary="KL high",
                                       ts=time.time()))
            assert out.commands and "webhook" in out.failed        # A's webhook is down: queued
            await asyncio.sleep(0.7)                                # nobody acknowledges the pause
            b_escalated = await b.check_acks()
            await b.tick()
            b_pending = await b.outbox.pending()
            a_escalated = await a.check_acks()
            return b_escalated, b_pending, a_escalated, await a.outbox.pending("webhook")
        finally:
            await a.close()
            await b.close()

    try:
        b_escalated, b_pending, a_escalated, a_pending = asyncio.run(go())
        assert b_escalated == [] and b_pending == 0 and not rec_b.on("/hook")
        assert [e.alert.rule for e in a_escalated] == ["control_unacknowledged"] and a_pending >= 1
    finally:
        srv_a.shutdown()
        srv_b.shutdown()


# -- 12: a broker outage logs a line when it starts and one when it ends --------------------------

def test_a_broker_outage_logs_one_line_per_change_of_state(broker, start_worker):
    sid = uuid.uuid4().hex[:8]
    env = fast(worker_env({"kafka": broker.bootstrap, "redis": "redis://127.0.0.1:6379/0"}, sid))
    worker = start_worker(env)
    mark = len(worker.lines)
    broker.stop()
    try:
        time.sleep(8)
        during = worker.lines[mark:]
    finally:
        broker.start()
    noisy = [line for line in during if "WARNING" in line or "ERROR" in line or "Traceback" in line]
    print(f"\n{len(during)} lines during an 8 s outage, {len(noisy)} warnings or errors")
    assert len(noisy) <= 6, f"{len(noisy)} lines:\n" + "\n".join(noisy[:20])
    worker.wait_for("quiet for", 60)                  # and one line when it is over
    assert worker.proc.poll() is None
