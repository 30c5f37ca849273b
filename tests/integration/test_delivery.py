"""Alert delivery and the brake on real Redis (and, for the whole loop, real Kafka and a real
`rlwatch worker`), with local HTTP servers standing in for Slack, a webhook, Alertmanager and
PagerDuty. The Redis here is a private `redis-server` with `requirepass` (and one with TLS),
started by this module on free ports, so the tests also prove AUTH and TLS URLs work and never
share keys with other suites."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_sync

from alerts.control import RedisControl
from alerts.factory import build_dispatcher
from alerts.outbox import RedisOutbox
from alerts.silences import RedisSilences, Silence
from producers import Monitor
from producers.control import ControlListener
from contract.alert import Alert
from contract.commands import Command, ack_signature, channel
from contract.settings import Settings
from tests.integration.conftest import ROOT, worker_env
from tests.support.http_recorder import start_recorder
from tests.support.ports import free_port

FAKE_BOT = "xox" + "b-"   # a bot-token prefix, built so no literal looks like a real token

pytestmark = pytest.mark.integration

PASSWORD = "rl-test-" + uuid.uuid4().hex[:8]
CONTROL_SECRET = "ctl-" + uuid.uuid4().hex[:8]


# -- a private Redis with AUTH (and one with TLS) ------------------------------------------------

def _start_redis(tmp: Path, *args: str, port: int, tls: bool = False) -> subprocess.Popen:
    exe = shutil.which("redis-server")
    assert exe, "redis-server is not installed (scripts/services.sh install)"
    proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 10
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        assert proc.poll() is None, f"redis-server exited ({'tls' if tls else 'plain'})"
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("redis-server did not open its port")


@pytest.fixture(scope="module")
def auth_redis(tmp_path_factory):
    port = free_port()
    proc = _start_redis(tmp_path_factory.mktemp("redis-auth"), "--port", str(port),
                        "--requirepass", PASSWORD, port=port)
    yield {"url": f"redis://:{PASSWORD}@127.0.0.1:{port}/0", "port": port}
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def redis_url(auth_redis):
    with redis_sync.Redis.from_url(auth_redis["url"]) as r:
        r.flushdb()
    return auth_redis["url"]


@pytest.fixture
def recorders():
    started = []

    def make():
        rec, server = start_recorder()
        started.append(server)
        return rec

    yield make
    for s in started:
        s.shutdown()


def settings(redis_url: str, rec, **kw) -> Settings:
    base = dict(redis=redis_url, slack_webhook=f"{rec.url}/slack/webhook", webhook_url=f"{rec.url}/hook",
                webhook_secret="hook-secret", alertmanager_url=f"{rec.url}/am",
                pagerduty_routing_key="pd-routing-key", pagerduty_url=f"{rec.url}/pd",
                control_secret=CONTROL_SECRET, ack_timeout=60.0)
    base.update(kw)
    return Settings(**base)


def alert(**kw) -> Alert:
    base = dict(rule="kl_above_target", severity="red", state="firing", run_id="ppo-it", step=120,
                onset_step=115, value=0.15, threshold=0.125, actions=["pause"], metric="kl/mean",
                summary="Mean KL 0.15 above 0.125", diagnosis="Probably: beta too small.", ts=time.time())
    base.update(kw)
    return Alert(**base)


def rlwatch(*args, redis_url: str, env_extra: dict | None = None):
    env = {**os.environ, "RLWATCH_REDIS": redis_url, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def bodies(rec, prefix: str) -> list:
    return [r.json() for r in rec.on(prefix)]


# -- the outbox's active alerts, shared by workers ----------------------------------------------

def firing(run: str, severity: str, step: int, state: str = "firing") -> Alert:
    """An alert of the outbox tests (kl_above_target), its summary naming its step."""
    return Alert(rule="kl_above_target", severity=severity, state=state, run_id=run, step=step,
                 summary=f"step {step}")


@contextlib.asynccontextmanager
async def two_workers(redis_url: str):
    """Two workers' outboxes (each on its own Redis client) in one fresh namespace, a client
    and the namespace."""
    a, b = RedisControl(redis_url), RedisControl(redis_url)
    ns = "rlwatch:outbox-test-" + uuid.uuid4().hex[:6]
    try:
        yield RedisOutbox(a.redis, ns), RedisOutbox(b.redis, ns), a.redis, ns
    finally:
        await a.close()
        await b.close()


def test_active_alerts_read_by_one_worker_follow_what_another_wrote(redis_url):
    """Each pass of the outbox reads the firing alerts (inhibition); a worker keeps them parsed
    between passes, and a value another worker changed or removed is read as it now is."""
    from alerts.outbox import ACTIVE_MAX_AGE

    async def go():
        async with two_workers(redis_url) as (mine, theirs, r, ns):
            now = time.time()
            await mine.track(firing("r1", "red", 10), now)
            await mine.track(firing("r2", "yellow", 10), now)
            first = {(x.run_id, x.step) for x in await theirs.active(now)}
            await mine.track(firing("r1", "red", 20), now)          # the same alert, later
            await mine.track(firing("r2", "yellow", 10, "resolved"), now)
            await mine.track(firing("r3", "orange", 5), now - ACTIVE_MAX_AGE - 1)   # stale
            second = {(x.run_id, x.step) for x in await theirs.active(now)}
            left = await r.hlen(ns + ":outbox:active")
            again = await theirs.active(now)
            return first, second, left, again

    first, second, left, again = asyncio.run(go())
    assert first == {("r1", 10), ("r2", 10)}
    assert second == {("r1", 20)} and left == 1            # the stale one was removed from Redis
    assert [(x.run_id, x.step, x.summary) for x in again] == [("r1", 20, "step 20")]


def test_a_runs_firing_alerts_are_read_without_the_rest_of_the_fleet(redis_url):
    """A notification's inhibition reads the firing alerts of its own run: another run's alerts
    are not read, a resolved one leaves its run, a stale one leaves both the run and the fleet."""
    from alerts.outbox import ACTIVE_MAX_AGE

    async def go():
        async with two_workers(redis_url) as (mine, theirs, r, ns):
            now = time.time()
            for run in ("r1", "r2", "r3"):
                await mine.track(firing(run, "red", 10), now)
            await mine.track(firing("r1", "yellow", 11), now)
            await mine.track(firing("r2", "red", 10, "resolved"), now)
            await mine.track(firing("r3", "orange", 12), now - ACTIVE_MAX_AGE - 1)      # stale
            one = sorted((x.run_id, x.severity) for x in await theirs.active(now, ["r1", "r2"]))
            three = sorted((x.run_id, x.severity) for x in await theirs.active(now, ["r3"]))
            fleet = sorted((x.run_id, x.severity) for x in await theirs.active(now))
            left = await r.hlen(ns + ":outbox:active:r3")
            return one, three, fleet, left

    one, three, fleet, left = asyncio.run(go())
    assert one == [("r1", "red"), ("r1", "yellow")]
    assert three == [("r3", "red")] and left == 1        # the stale one left the run's hash too
    assert fleet == [("r1", "red"), ("r1", "yellow"), ("r3", "red")]


def test_alerts_tracked_before_the_per_run_hashes_still_inhibit_their_run(redis_url):
    """An upgrade: alerts an older worker tracked are only in the fleet's hash; a new worker
    copies those still active into their runs' hashes the first time it reads one."""
    red = firing("r-old", "red", 10)

    async def go():
        async with two_workers(redis_url) as (first, later, r, ns):
            fleet = ns + ":outbox:active"
            now = time.time()
            await r.hset(fleet, red.fingerprint, json.dumps({"at": now, "alert": red.to_json()}))
            got = [(x.run_id, x.severity) for x in await first.active(now, ["r-old"])]
            await r.hdel(fleet, red.fingerprint)          # resolved by an old worker
            await r.delete(ns + ":outbox:active:r-old")
            again = await later.active(now, ["r-old"])
            return got, again

    got, again = asyncio.run(go())
    assert got == [("r-old", "red")]
    assert again == []          # gone from the fleet's hash: not copied back


def test_a_runs_newest_step_only_moves_forward_whoever_notes_it(redis_url):
    """Two workers noting alerts of one run out of order (a late resolved one, a replayed one):
    the run's newest step, which step-based repeats count from, never goes back."""
    async def go():
        async with two_workers(redis_url) as (mine, theirs, r, ns):
            now = time.time()
            seen = []
            for box, step, state in ((mine, 10, "firing"), (theirs, 30, "firing"), (mine, 20, "resolved"),
                                     (theirs, 5, "firing"), (mine, 31, "resolved")):
                await box.track(firing("r-steps", "red", step, state), now)
                seen.append(await theirs.run_step("r-steps"))
            return seen, [x.step for x in await mine.active(now)]

    seen, active = asyncio.run(go())
    assert seen == [10, 30, 30, 30, 31]
    assert active == []            # the last alert of that rule resolved it


def test_taking_due_notifications_leases_them_and_forgets_ids_whose_record_is_gone(redis_url):
    """A receiver's lane takes what is due: each taken one is leased (not taken again until the
    lease ends, then taken again if not finished); an id left in the due set without its record
    is dropped, and one held for a step is taken once the step came."""
    from alerts.outbox import OutboxItem

    async def go():
        control = RedisControl(redis_url)
        try:
            ns = "rlwatch:take-" + uuid.uuid4().hex[:6]
            box = RedisOutbox(control.redis, ns)
            now = time.time()
            items = [OutboxItem(f"id-{i}", "slack", "g", f"k{i}", "r-take", "{}", next_try=now - 1,
                                due_step=7 if i == 2 else None) for i in range(3)]
            for it in items:
                assert await box.enqueue(it)
            await control.redis.hdel(ns + ":outbox:items", "id-1")          # a record gone by hand
            first = sorted(it.id for it in await box.take_due("slack", now, lease=30))
            again = await box.take_due("slack", now + 1, lease=30)          # under the lease
            after = sorted(it.id for it in await box.take_due("slack", now + 31, lease=30))
            due = await control.redis.zrange(ns + ":outbox:due:slack", 0, -1)
            held = await control.redis.zrange(ns + ":outbox:steps:r-take", 0, -1)
            return first, again, after, sorted(d.decode() for d in due), held
        finally:
            await control.close()

    first, again, after, due, held = asyncio.run(go())
    assert first == ["id-0", "id-2"] and again == [] and after == ["id-0", "id-2"]
    assert due == ["id-0", "id-2"]          # id-1 left the due set with its record
    assert held == []                       # id-2 no longer waits for its step


# -- Redis AUTH and TLS ---------------------------------------------------------------------------

def test_redis_auth_is_required_and_works_through_every_store(redis_url, auth_redis):
    async def go():
        control = RedisControl(redis_url)
        try:
            cmd = Command(run_id="auth-run", action="pause", ts=time.time()).signed(CONTROL_SECRET)
            assert (await control.apply(cmd)).state == "paused"
            assert await RedisSilences(control.redis).add(
                Silence(matchers={"run": "x"}, starts_at=0, ends_at=time.time() + 60))
            assert await RedisOutbox(control.redis).pending() == 0
        finally:
            await control.close()

        for url in (f"redis://127.0.0.1:{auth_redis['port']}/0",
                    f"redis://:wrong-password@127.0.0.1:{auth_redis['port']}/0"):
            bad = RedisControl(url)
            with pytest.raises(Exception) as exc:
                await bad.status("auth-run")
            assert "auth" in type(exc.value).__name__.lower() or "auth" in str(exc.value).lower()
            await bad.close()

    asyncio.run(go())
    # the worker side reaches the same Redis with the same URL and sees the pause
    listener = ControlListener(redis_url, "auth-run", secret=CONTROL_SECRET)
    try:
        assert listener.wait_ready(5) and listener.connected
        assert listener.state == "paused"
    finally:
        listener.close()


def test_rediss_tls_urls_work(tmp_path):
    def sh(*args):
        subprocess.run(args, check=True, capture_output=True, cwd=tmp_path, timeout=30)

    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
       "-days", "1", "-subj", "/CN=rlwatch-test-ca")
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
       "-subj", "/CN=localhost")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    sh("openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
       "-out", "server.crt", "-days", "1", "-extfile", "san.ext")
    port = free_port()
    proc = _start_redis(tmp_path, "--port", "0", "--tls-port", str(port), "--tls-cert-file", "server.crt",
                        "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt",
                        "--tls-auth-clients", "no", "--requirepass", PASSWORD, port=port, tls=True)
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.crt'}&ssl_cert_reqs=required"
    try:
        async def go():
            control = RedisControl(url)
            try:
                cmd = Command(run_id="tls-run", action="pause", ts=time.time()).signed(CONTROL_SECRET)
                assert (await control.apply(cmd)).state == "paused"
            finally:
                await control.close()
            # without the CA the server's certificate is refused
            untrusted = RedisControl(url.split("?")[0])
            with pytest.raises(Exception):
                await untrusted.status("tls-run")
            await untrusted.close()

        asyncio.run(go())
        listener = ControlListener(url, "tls-run", secret=CONTROL_SECRET)
        try:
            assert listener.wait_ready(5) and listener.connected and listener.state == "paused"
        finally:
            listener.close()
    finally:
        proc.terminate()
        proc.wait(10)


# -- routing, grouping, inhibition, silences -------------------------------------------------------

ROUTES = """
route:
  receiver: slack-webhook
  group_by: [run]
  routes:
    - match: {severity: ">=red"}
      receiver: [pagerduty, alertmanager]
      group_wait: 1s
      continue: true
    - match: {run: "exp-*"}
      receiver: webhook
"""


@pytest.mark.parametrize("grouped", ["seconds", "steps"])
def test_alerts_notified_together_on_redis_get_what_one_at_a_time_got(redis_url, grouped):
    """The worker notifies the alerts waiting together, in one round trip to each store:
    on Redis (its scripts flushed first, as by a restart) the receivers get what they got
    with the alerts notified one at a time, and the incident holds the snapshot."""
    from alerts.control import MemoryControl, redis_client
    from alerts.dispatch import Dispatcher
    from alerts.incidents import RedisIncidents
    from alerts.routes_file import load_routes_text
    from alerts.silences import MemorySilences
    from tests.unit.alerts._helpers import Clock, Recording
    from tests.unit.alerts.test_dispatch import GROUPED, STEP_GROUPED, notified_together_and_alone

    async def make_rig(routes: str):
        r = redis_client(redis_url)
        await r.script_flush()
        ns = f"rlwatch:together-{uuid.uuid4().hex[:8]}"
        clock, notifiers = Clock(), [Recording("slack", batch=True), Recording("hook")]
        d = Dispatcher(notifiers, MemoryControl(), clock=clock,
                       routing=load_routes_text(routes, ["slack", "hook"]), outbox=RedisOutbox(r, ns),
                       silences=MemorySilences(), incidents=RedisIncidents(r, ns))
        return d, clock, {n.name: n for n in notifiers}

    routes = GROUPED if grouped == "seconds" else STEP_GROUPED
    alone, together = asyncio.run(notified_together_and_alone(make_rig, routes))
    assert alone == together
    assert together[1][-1]["slack"] and together[1][-1]["hook"], "nothing was sent"
    assert '"step": 7' in together[2]


def test_a_drain_meanwhile_takes_an_alerts_items_with_the_held_items_they_release_or_neither(redis_url):
    """An alert whose step releases its run's held items queues its own and releases those in
    one transaction: a receiver's pass running meanwhile on another connection takes them all
    together, never the alert's own alone first (a grouped receiver got two messages)."""
    from alerts.control import redis_client
    from alerts.outbox import OutboxItem

    async def go() -> list:
        ns = f"rlwatch:release-{uuid.uuid4().hex[:8]}"
        ours, theirs = redis_client(redis_url), redis_client(redis_url)
        outbox, drain = RedisOutbox(ours, ns), RedisOutbox(theirs, ns)
        firsts = []
        try:
            for k in range(60):
                now, run_id = time.time(), f"run-{k}"
                held = OutboxItem(f"held-{k}", "slack", "g", f"a-{k}", run_id, "{}", [], enqueued=now,
                                  next_try=now + 600, due_step=110)
                await outbox.enqueue_all([held], {}, {run_id: 100}, now)
                mine = OutboxItem(f"mine-{k}", "slack", "g", f"b-{k}", run_id, "{}", [], enqueued=now,
                                  next_try=now)
                took: list = []

                async def taking() -> None:      # a receiver's passes, as fast as they come
                    while not took:
                        got = await drain.take_due("slack", now + 1, lease=30.0)
                        if got:
                            took.append(sorted(i.id for i in got))
                        await asyncio.sleep(0)
                passes = asyncio.ensure_future(taking())
                await asyncio.sleep(0)
                await outbox.enqueue_all([mine], {}, {run_id: 111}, now)
                await asyncio.wait_for(passes, 10)
                firsts.append(took[0])
        finally:
            await ours.aclose()
            await theirs.aclose()
        return firsts

    firsts = asyncio.run(go())
    assert all(f == [f"held-{k}", f"mine-{k}"] for k, f in enumerate(firsts)), \
        [f for f in firsts if len(f) != 2]


def fresh_outbox(redis_url: str, name: str):
    """A Redis client and an outbox of its own (a namespace named after ``name``)."""
    from alerts.control import redis_client

    r = redis_client(redis_url)
    return r, RedisOutbox(r, f"rlwatch:{name}-{uuid.uuid4().hex[:8]}")


def test_items_sent_are_settled_and_their_groups_flush_noted_in_one_round_trip(redis_url):
    """Settling a sent unit takes one round trip, atomic: its items leave the outbox, their marks say
    "sent", and each group's clock notes the flush (the time exactly, the newest step of the
    group's items) with its other fields as they are in Redis, even when another writer changed
    them since this worker read the clock; a group without a clock gets none. A clock written
    in another layout is still noted (read and written whole)."""
    from alerts.grouping import GroupClock
    from alerts.outbox import OutboxItem, item_id
    from tests.support.redis_trips import counting_round_trips

    async def go():
        r, outbox = fresh_outbox(redis_url, "sent")
        now = 1_764_500_123.456789
        try:
            await r.script_flush()            # (as after a restart: the scripts load again)
            items = [OutboxItem(item_id("slack", f"a{k}"), "slack", g, f"a{k}", "run-1",
                                json.dumps({"step": s}), [], enqueued=now, next_try=now)
                     for k, (g, s) in enumerate([("g1", 5), ("g1", 9), ("g2", 4), ("none", 3)])]
            await outbox.enqueue_all(items, {"g1": GroupClock("route-a", "run-1", 100.25, 1),
                                             "g2": GroupClock("route-b", "run-1", 101.5, 2)},
                                     {}, now)
            # another writer changes g2's clock after this worker queued the items
            await outbox.set_clock("g2", GroupClock("route-b", "run-1", 7.125, 3))
            await outbox.sent(items[:1], now)   # (the scripts loaded: count the next one)
            with counting_round_trips() as trips:
                await outbox.sent(items, now + 1)
            clocks = await outbox.clocks()
            marks = [await outbox.outcome("slack", f"a{k}") for k in range(4)]
            pending = await outbox.pending()
            # a clock in another layout (compact JSON, its keys in another order)
            odd = {"last_flush_step": None, "created_step": 1, "last_flush_ts": None,
                   "run_id": "run-2", "created_ts": 50.5, "route": "route-c"}
            await r.hset(outbox.p + "groups", "g3", json.dumps(odd, separators=(",", ":")))
            other = OutboxItem(item_id("slack", "a9"), "slack", "g3", "a9", "run-2",
                               json.dumps({"step": 12}), [], enqueued=now, next_try=now)
            await outbox.sent([other], now + 2)
            # and one whose flush fields are not its last (the usual separators)
            odd = {"route": "route-d", "last_flush_ts": None, "last_flush_step": None,
                   "run_id": "run-3", "created_ts": 60.5, "created_step": 2}
            await r.hset(outbox.p + "groups", "g4", json.dumps(odd))
            fourth = OutboxItem(item_id("slack", "a10"), "slack", "g4", "a10", "run-3",
                                json.dumps({"step": 14}), [], enqueued=now, next_try=now)
            await outbox.sent([fourth], now + 3)
            return (trips[0], clocks, marks, pending, await outbox.clock("g3"),
                    await outbox.clock("g4"))
        finally:
            await r.aclose()

    trips, clocks, marks, pending, g3, g4 = asyncio.run(go())
    assert trips == 1
    assert clocks["g1"] == GroupClock("route-a", "run-1", 100.25, 1, 1_764_500_124.456789, 9)
    assert clocks["g2"] == GroupClock("route-b", "run-1", 7.125, 3, 1_764_500_124.456789, 4)
    assert "none" not in clocks
    assert marks == ["sent"] * 4 and pending == 0
    assert g3 == GroupClock("route-c", "run-2", 50.5, 1, 1_764_500_125.456789, 12)
    assert g4 == GroupClock("route-d", "run-3", 60.5, 2, 1_764_500_126.456789, 14)


def test_an_item_finished_or_buried_leaves_the_outbox_in_one_round_trip_and_says_why(redis_url):
    """A skipped or suppressed item (finish) and one given up on (bury) leave the items, their
    receiver's due set and their run's held items, their marks say why, and a buried item
    lands on the receiver's dead letters with its last error; one round trip each."""
    from alerts.outbox import OutboxItem, item_id
    from tests.support.redis_trips import counting_round_trips

    async def go():
        r, outbox = fresh_outbox(redis_url, "settle")
        now = 1_764_500_000.0
        try:
            items = [OutboxItem(item_id("hook", f"k{k}"), "hook", "g", f"k{k}", "run-9",
                                json.dumps({"step": 3}), [], enqueued=now, next_try=now,
                                due_step=5 if k else None)
                     for k in range(2)]
            await outbox.enqueue_all(items, {}, {}, now)
            await outbox.finish(items[0], "skipped")       # (the script loaded: count the next ones)
            with counting_round_trips() as trips:
                await outbox.bury(items[1], "HTTP 410 gone")
            return (trips[0], [await outbox.outcome("hook", f"k{k}") for k in range(2)],
                    await outbox.pending(), await outbox.dead("hook"),
                    await r.zcard(outbox.p + "steps:run-9"), await r.hlen(outbox.p + "items"))
        finally:
            await r.aclose()

    trips, marks, pending, dead, held, stored = asyncio.run(go())
    assert trips == 1
    assert marks == ["skipped", "dead"] and pending == 0 and held == 0 and stored == 0
    assert [(d.key, d.last_error) for d in dead] == [("k1", "HTTP 410 gone")]


def test_a_new_worker_indexes_an_older_layout_of_firing_alerts_by_run_in_few_round_trips(redis_url):
    """Firing alerts tracked by a version that kept only the fleet's hash are copied into their
    runs' hashes once per process, at the first read by run (a notification's inhibition):
    every run's alerts are found, in one round trip per ``INDEX_RUNS`` runs (it made one per
    run: 1,200 here), with the scripts loaded again when Redis forgot them."""
    from alerts.outbox import INDEX_RUNS
    from contract.alert import Alert
    from tests.support.redis_trips import counting_round_trips

    runs = 1200

    async def go():
        r, outbox = fresh_outbox(redis_url, "index")
        now = 1_764_500_000.0
        try:
            for k in range(runs):
                await outbox.track(Alert(rule="kl_above_target", severity="yellow", state="firing",
                                         run_id=f"run-{k}", step=k, summary="kl"), now)
            # the older layout: the fleet's hash only
            await r.delete(*[outbox.p + f"active:run-{k}" for k in range(runs)])
            await r.script_flush()
            fresh = type(outbox)(r, outbox.p.removesuffix(":outbox:"))     # a new worker's outbox
            with counting_round_trips() as trips:
                found = await fresh.active(now + 1, [f"run-{k}" for k in (0, 599, 1199)])
            again = await fresh.active(now + 1, ["run-42"])
            return trips[0], sorted((a.run_id, a.step) for a in found), [a.step for a in again]
        finally:
            await r.aclose()

    trips, found, again = asyncio.run(go())
    assert found == [("run-0", 0), ("run-1199", 1199), ("run-599", 599)]
    assert again == [42]
    # the fleet's hash, the index (its first round trip sent again after the outbox's five
    # scripts were loaded), the runs' hashes
    assert trips <= 1 + -(-runs // INDEX_RUNS) + (5 + 1) + 1


def test_workers_on_one_redis_take_the_timers_fleet_work_in_turns(redis_url, recorders, tmp_path):
    """Two workers' outboxes on one Redis: one takes the timer's turn per 1.8 s by the callers'
    clocks (a clock behind the last taker's takes it too). Two workers' dispatchers ticking
    half a second apart: the second's tick reads nothing of the fleet (its firing alerts, its
    group clocks, its brakes), only what its own deliveries need."""
    from alerts.control import redis_client
    from alerts.outbox import RedisOutbox
    from tests.support.redis_trips import counting_round_trips

    async def turns():
        r1, one = fresh_outbox(redis_url, "turn")
        r2 = redis_client(redis_url)
        two = RedisOutbox(r2, one.p.removesuffix(":outbox:"))
        now = 1_764_500_000.25
        try:
            return [await one.turn("timer", now, 1.8), await two.turn("timer", now + 0.5, 1.8),
                    await one.turn("timer", now + 1.75, 1.8), await two.turn("timer", now + 1.8, 1.8),
                    await one.turn("timer", now + 1.0, 1.8), await one.turn("other", now + 1.0, 1.8)]
        finally:
            await r1.aclose()
            await r2.aclose()

    assert asyncio.run(turns()) == [True, False, False, True, True, True]

    routes = tmp_path / "routes.yaml"
    routes.write_text("route:\n  receiver: webhook\n  repeat_interval: 4h\n")
    s = settings(redis_url, recorders(), routes=str(routes), app_id=f"turns-{uuid.uuid4().hex[:8]}")

    async def ticks():
        d1, d2 = build_dispatcher(s), build_dispatcher(s)       # two workers, ticking every 2 s
        try:
            await d1.handle(alert())           # a firing alert, its brake not acknowledged
            now = time.time()
            for d in (d1, d2):
                await d.tick(now - 10)     # (their scripts loaded, connections made)
            got = []
            for k in range(3):
                for d, at in ((d1, now + 2 * k), (d2, now + 2 * k + 0.5)):
                    with counting_round_trips() as trips:
                        await d.tick(at)
                    got.append(trips[0])
            return got, len(d1.notifiers)
        finally:
            await d1.close()
            await d2.close()

    (first, second, *rest), receivers = asyncio.run(ticks())
    assert rest == [first, second] * 2
    # the turn, then the worker's own deliveries (each receiver's due items); the fleet's state
    # (group clocks, firing alerts, run steps, the brakes sent, those pending, escalated and
    # the adjusts and rollbacks asked at once, acknowledgements, re-sends: seven round trips)
    # is read by the first alone
    assert second == 1 + receivers and first == second + 7


def test_routes_group_inhibit_and_silence(redis_url, recorders, tmp_path):
    rec = recorders()
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    s = settings(redis_url, rec, routes=str(routes))

    async def go():
        d = build_dispatcher(s)
        try:
            red = await d.handle(alert(rule="kl_above_target", severity="red"))
            assert [c.action for c in red.commands] == ["pause"]
            assert sorted(red.queued) == ["alertmanager", "pagerduty"] and not red.delivered  # group_wait
            await asyncio.sleep(0.2)
            await d.handle(alert(rule="entropy_collapse", severity="red", actions=["pause"]))
            await asyncio.sleep(1.0)
            await d.tick()
            # one Alertmanager request with both alerts of the group; PagerDuty one event each
            [am] = bodies(rec, "/am/api/v2/alerts")
            assert sorted(a["labels"]["alertname"] for a in am) == ["entropy_collapse", "kl_above_target"]
            assert all(a["labels"]["run_id"] == "ppo-it" and a["annotations"]["summary"] for a in am)
            pd = bodies(rec, "/pd/v2/enqueue")
            assert [e["payload"]["severity"] for e in pd] == ["error", "error"]
            assert {e["routing_key"] for e in pd} == {"pd-routing-key"} and {e["event_action"] for e in pd} == {"trigger"}
            assert {e["dedup_key"] for e in pd} == {alert(severity="red").fingerprint,
                                                     alert(rule="entropy_collapse", severity="red").fingerprint}
            # a black alert of the run mutes its red ones from now on (default inhibition)
            await d.handle(alert(rule="nan_inf", severity="black", actions=["stop"], step=121))
            muted = await d.handle(alert(rule="grad_norm_spike", severity="red", actions=[], step=122))
            await asyncio.sleep(1.1)
            await d.tick()
            pd = bodies(rec, "/pd/v2/enqueue")
            assert [e["payload"]["component"] for e in pd][2:] == ["nan_inf"] and pd[2]["payload"]["severity"] == "critical"
            assert "grad_norm_spike" not in json.dumps(bodies(rec, "/am/api/v2/alerts"))
            assert await d.outbox.outcome("pagerduty", "%s:firing:115" % muted.alert.fingerprint) == "inhibited"
            assert not rec.on("/slack/webhook")           # red/black went to their own route only

            # a yellow alert of the same run is inhibited too
            low = await d.handle(alert(rule="entropy_collapse", severity="yellow", actions=["notify"]))
            assert low.suppressed == {"slack-webhook": "inhibited"} and not rec.on("/slack/webhook")
            # a yellow of another run goes to the root receiver at once
            other = await d.handle(alert(rule="entropy_collapse", severity="yellow", run_id="ppo-other",
                                         actions=["notify"]))
            assert other.delivered == ["slack-webhook"]
            assert "entropy_collapse" in rec.on("/slack/webhook")[0].body.decode()
            # exp-* runs go to the webhook, signed
            exp = await d.handle(alert(rule="reward_hacking", severity="orange", run_id="exp-1", actions=[]))
            assert exp.delivered == ["webhook"]
            hook = rec.on("/hook")[0]
            assert hook.headers["X-Rlwatch-Signature"] == "sha256=" + hmac.new(
                b"hook-secret", hook.body, hashlib.sha256).hexdigest()
        finally:
            await d.close()

    asyncio.run(go())

    # a silence from the command line mutes the next exp-1 alert; expiring it lets them through
    out = rlwatch("silence", "add", "run=exp-*", "rule=reward_*", "--duration", "1h", "--comment",
                  "retuning", redis_url=redis_url)
    assert out.returncode == 0, out.stderr
    sid = out.stdout.split()[1]
    listed = rlwatch("silence", "list", redis_url=redis_url)
    assert sid in listed.stdout and "run=exp-*" in listed.stdout and "retuning" in listed.stdout

    async def after(expect: str, step: int):
        d = build_dispatcher(s)
        try:
            got = await d.handle(alert(rule="reward_hacking", severity="orange", run_id="exp-1", actions=[],
                                       step=step, onset_step=step))
            return got.delivered if expect == "delivered" else got.suppressed
        finally:
            await d.close()

    assert asyncio.run(after("suppressed", 300)) == {"webhook": "silenced"}
    assert len(rec.on("/hook")) == 1
    out = rlwatch("silence", "expire", sid[:6], redis_url=redis_url)
    assert out.returncode == 0 and "expired" in out.stdout
    assert asyncio.run(after("delivered", 400)) == ["webhook"]
    assert len(rec.on("/hook")) == 2
    assert sid not in rlwatch("silence", "list", redis_url=redis_url).stdout
    assert sid in rlwatch("silence", "list", "--all", redis_url=redis_url).stdout


# -- dedup across a restart, resolved delivered -------------------------------------------------

def test_a_restarted_worker_never_pages_twice_and_resolved_is_delivered(redis_url, recorders):
    rec = recorders()
    s = settings(redis_url, rec)
    firing, resolved = alert(), alert(state="resolved", actions=[], step=140)

    async def worker(*alerts):
        d = build_dispatcher(s)
        try:
            return [await d.handle(a) for a in alerts]
        finally:
            await d.close()

    [first] = asyncio.run(worker(firing))
    assert sorted(first.delivered) == ["alertmanager", "console", "pagerduty", "slack-webhook", "webhook"]
    again, res = asyncio.run(worker(firing, resolved))            # "the restarted worker"
    assert again.duplicate and not again.commands
    assert sorted(res.delivered) == sorted(first.delivered)
    [res2] = asyncio.run(worker(resolved))                          # "a second worker"
    assert res2.duplicate
    assert [b["state"] for b in bodies(rec, "/hook")] == ["firing", "resolved"]
    assert [e["event_action"] for e in bodies(rec, "/pd/v2/enqueue")] == ["trigger", "resolve"]
    am = bodies(rec, "/am/api/v2/alerts")
    assert len(am) == 2 and am[1][0]["endsAt"] <= am[1][0]["startsAt"] < am[0][0]["endsAt"]
    assert len(rec.on("/slack/webhook")) == 2


def test_a_group_held_for_steps_goes_out_with_the_runs_alert_at_that_step(redis_url, recorders, tmp_path):
    """A group whose wait is counted in steps is held in Redis until an alert of its run at or
    after that step comes: that alert's queueing (one pipelined round trip) releases the group,
    and Alertmanager gets the three alerts in one request."""
    rec = recorders()
    routes = tmp_path / "routes.yaml"
    routes.write_text("route:\n  receiver: alertmanager\n  group_by: [run]\n  group_wait: 10 steps\n")
    s = settings(redis_url, rec, routes=str(routes))

    async def go():
        d = build_dispatcher(s)
        try:
            first = await d.handle(alert(rule="kl_above_target", step=100, onset_step=100))
            assert first.queued == ["alertmanager"] and not first.delivered
            await d.handle(alert(rule="entropy_collapse", step=105, onset_step=105))
            await d.tick()
            assert not rec.on("/am/api/v2/alerts")               # held: step 110 not reached
            last = await d.handle(alert(rule="grad_norm_spike", step=111, onset_step=111))
            assert last.delivered == ["alertmanager"]
        finally:
            await d.close()

    asyncio.run(go())
    [am] = bodies(rec, "/am/api/v2/alerts")
    assert sorted(a["labels"]["alertname"] for a in am) == ["entropy_collapse", "grad_norm_spike",
                                                            "kl_above_target"]


def test_after_a_groups_notification_the_next_waits_its_interval_counted_from_that_step(
        redis_url, recorders, tmp_path):
    """A sent notification moves its group's clock in Redis (last flush, at its step): the
    group's next alert waits ``group_interval`` from there, and a later one releases both."""
    rec = recorders()
    routes = tmp_path / "routes.yaml"
    routes.write_text("route:\n  receiver: alertmanager\n  group_by: [run]\n  group_wait: 0s\n"
                      "  group_interval: 10 steps\n")
    s = settings(redis_url, rec, routes=str(routes))

    async def go():
        d = build_dispatcher(s)
        try:
            first = await d.handle(alert(rule="kl_above_target", step=100, onset_step=100))
            assert first.delivered == ["alertmanager"]
            held = await d.handle(alert(rule="entropy_collapse", step=105, onset_step=105))
            assert held.queued == ["alertmanager"] and not held.delivered    # due at step 110
            last = await d.handle(alert(rule="grad_norm_spike", step=112, onset_step=112))
            assert last.delivered == ["alertmanager"]
        finally:
            await d.close()

    asyncio.run(go())
    sent = [sorted(a["labels"]["alertname"] for a in body) for body in bodies(rec, "/am/api/v2/alerts")]
    assert sent == [["kl_above_target"], ["entropy_collapse", "grad_norm_spike"]]


def test_a_redis_that_forgot_the_outbox_scripts_still_gets_each_notification_once(redis_url, recorders):
    """The dispatcher calls the outbox's scripts by their SHA inside a pipeline; a Redis that
    restarted (or had SCRIPT FLUSH) refuses them, and the pipeline is sent again with the
    scripts loaded: nothing lost, nothing twice."""
    rec = recorders()
    s = settings(redis_url, rec)

    async def notify(a: Alert):
        d = build_dispatcher(s)
        try:
            with redis_sync.Redis.from_url(redis_url) as r:
                r.script_flush()
            return await d.handle(a)
        finally:
            await d.close()

    first = asyncio.run(notify(alert()))
    assert sorted(first.delivered) == ["alertmanager", "console", "pagerduty", "slack-webhook", "webhook"]
    again = asyncio.run(notify(alert()))
    assert again.duplicate and not again.delivered
    assert len(bodies(rec, "/hook")) == 1 and len(rec.on("/slack/webhook")) == 1
    res = asyncio.run(notify(alert(state="resolved", actions=[], step=140)))
    assert sorted(res.delivered) == sorted(first.delivered)
    assert [b["state"] for b in bodies(rec, "/hook")] == ["firing", "resolved"]


# -- the outbox: nothing lost, nothing twice --------------------------------------------------------

def test_outbox_keeps_alerts_while_a_receiver_is_down_and_sends_each_once(redis_url, recorders):
    hook_rec, other = recorders(), recorders()
    hook_rec.fail_next = [500] * 7
    s = settings(redis_url, other, webhook_url=f"{hook_rec.url}/hook", slack_webhook=None,
                 alertmanager_url=None, pagerduty_routing_key=None)
    alerts = [alert(rule=f"rule_{i}", step=100 + i, onset_step=100 + i) for i in range(3)]

    async def go():
        d1, d2 = build_dispatcher(s), build_dispatcher(s)        # two workers on one Redis
        for d in (d1, d2):
            d.retry_base, d.retry_cap = 0.2, 1.0
        try:
            first = await d1.handle(alerts[0])
            assert "webhook" in first.failed and first.queued == ["webhook"]
            for a in alerts[1:]:
                await d1.handle(a)
            assert await d1.outbox.pending("webhook") == 3
            deadline = time.time() + 20
            while len(hook_rec.on("/hook")) < 3 and time.time() < deadline:
                await asyncio.gather(d1.tick(), d2.tick())
                await asyncio.sleep(0.1)
            for _ in range(5):                                   # and nothing more afterwards
                await asyncio.gather(d1.tick(), d2.tick())
                await asyncio.sleep(0.1)
            assert await d1.outbox.pending() == 0 and await d1.outbox.dead("webhook") == []
        finally:
            await d1.close()
            await d2.close()

    asyncio.run(go())
    assert hook_rec.fail_next == []                              # it really was down for a while
    got = [r.json()["rule"] for r in hook_rec.on("/hook")]
    assert sorted(got) == ["rule_0", "rule_1", "rule_2"]         # no loss, no duplicate
    keys = [r.headers["Idempotency-Key"] for r in hook_rec.on("/hook")]
    assert len(set(keys)) == 3 and all(k.startswith("webhook:") for k in keys)


# -- Slack: rate limits, threads that survive a restart ---------------------------------------------

def test_slack_rate_limit_is_honoured_and_threads_survive_a_restart(redis_url, recorders):
    rec = recorders()
    s = settings(redis_url, rec, webhook_url=None, alertmanager_url=None, pagerduty_routing_key=None,
                 slack_token=FAKE_BOT + "test-token", slack_channel="#rl-alerts", slack_api_url=f"{rec.url}/api/")

    async def worker(a: Alert):
        d = build_dispatcher(s)
        try:
            return await d.handle(a)
        finally:
            await d.close()

    rec.fail_next = [429]                                       # Retry-After: 1

    async def first_with_retry():
        d = build_dispatcher(s)
        d.retry_base = 0.05                                     # the policy alone would retry at once
        try:
            out = await d.handle(alert(severity="red"))
            await d.tick()                                      # Retry-After not over: not tried again
            tried_early = len(rec.on("/api/chat.postMessage")) + len(rec.on("/slack/webhook"))
            await asyncio.sleep(1.1)
            await d.tick()
            return out, tried_early
        finally:
            await d.close()

    first, tried_early = asyncio.run(first_with_retry())
    assert len(first.failed) == 1 and set(first.failed) <= {"slack-bot", "slack-webhook"}   # one got the 429
    assert tried_early == 1, "the 429's Retry-After was not waited for"
    posts = [r.form_or_json() for r in rec.on("/api/chat.postMessage")]
    assert len(posts) == 1 and not posts[0].get("thread_ts") and len(rec.on("/slack/webhook")) == 1
    # after a restart: the escalation (black) goes in the same thread and to the channel
    asyncio.run(worker(alert(severity="black", step=130)))
    # the resolution of the first alert: a reply in that thread
    asyncio.run(worker(alert(severity="red", state="resolved", actions=[], step=150)))
    posts = [r.form_or_json() for r in rec.on("/api/chat.postMessage")]
    thread = [p.get("thread_ts") for p in posts]
    assert thread[0] is None and thread[1] and thread[1] == thread[2]
    assert str(posts[1].get("reply_broadcast")).lower() == "true" and not posts[2].get("reply_broadcast")
    assert "RESOLVED" in json.dumps(posts[2])
    r = redis_sync.Redis.from_url(redis_url)
    assert r.keys("rlwatch:slack:thread:*")
    r.close()


def test_the_slack_bot_says_in_the_alerts_thread_that_its_pause_holds(redis_url, recorders):
    """A worker's acknowledgement of the pause an alert pulled is posted in that alert's
    thread (not to the channel again: the alert was), at the next check of the brakes."""
    rec = recorders()
    run_id = f"held-{uuid.uuid4().hex[:6]}"
    s = settings(redis_url, rec, slack_webhook=None, webhook_url=None, alertmanager_url=None,
                 pagerduty_routing_key=None, slack_token=FAKE_BOT + "test-token", slack_channel="#rl-alerts",
                 slack_api_url=f"{rec.url}/api/", app_id=f"held-{uuid.uuid4().hex[:6]}")

    async def go():
        d = build_dispatcher(s)
        try:
            out = await d.handle(alert(run_id=run_id, severity="red"))
            (cmd,) = out.commands
            assert await d.check_acks() == []                          # no answer yet: nothing to say
            for rank in (0, 1):       # as the SDK's listener of each rank writes its answer
                ack = {"type": "ack", "command_id": cmd.id, "run_id": run_id, "action": "pause",
                       "status": "applied", "detail": "", "rank": rank, "ts": cmd.ts + 0.3 + 0.1 * rank}
                ack["signature"] = ack_signature(ack, CONTROL_SECRET)
                await d.outbox.redis.xadd(f"rlwatch:audit:{run_id}", {"entry": json.dumps(ack)})
                await d.outbox.redis.hset(f"rlwatch:acks:{run_id}", cmd.id, json.dumps(ack))
            told = await d.check_acks()
            again = await d.check_acks()
            return cmd, told, again
        finally:
            await d.close()

    cmd, told, again = asyncio.run(go())
    assert [(t.alert.rule, t.delivered) for t in told] == [("control_acknowledged", ["slack-bot"])]
    assert again == []
    first, held = (r.form_or_json() for r in rec.on("/api/chat.postMessage"))
    assert not first.get("thread_ts")
    assert held.get("thread_ts") and not held.get("reply_broadcast")
    assert "PAUSE holds" in json.dumps(held, ensure_ascii=False)
    assert "ranks 0-1 acknowledged it 0.4s after it was sent" in held["text"] and cmd.id in json.dumps(held)


# -- secrets stay out of logs, errors and alerts ---------------------------------------------------

def test_secrets_never_reach_the_logs(redis_url, recorders, caplog):
    rec = recorders()
    rec.fail_next = [500] * 100
    secrets = ["T0SECRET/B0SECRET/XXhooksecretXX", "pd-SECRET-routing-key", "HOOKTOKEN99", "hmac-SECRET-abc",
               FAKE_BOT + "SECRET-bot-token", PASSWORD]
    s = settings(redis_url, rec, slack_webhook=f"{rec.url}/services/{secrets[0]}",
                 pagerduty_routing_key=secrets[1], webhook_url=f"{rec.url}/hook?token={secrets[2]}",
                 webhook_secret=secrets[3], slack_token=secrets[4], slack_channel="#c",
                 slack_api_url=f"{rec.url}/api/")

    async def go():
        d = build_dispatcher(s)
        d.retry_base = 0.1
        try:
            out = await d.handle(alert())
            for _ in range(3):
                await asyncio.sleep(0.15)
                await d.tick()
            items = await d.outbox.redis.hgetall("rlwatch:outbox:items")
            return out, b" ".join(items.values()).decode()
        finally:
            await d.close()

    with caplog.at_level(logging.DEBUG):
        logging.getLogger("rlwatch").info("rlwatch worker: %s", s.describe())
        out, stored = asyncio.run(go())
    assert {"slack-webhook", "slack-bot", "webhook", "pagerduty"} <= set(out.failed)
    assert "could not deliver" in caplog.text                    # the failures were logged...
    for secret in secrets:                                       # ...without a single secret
        assert secret not in caplog.text, secret
        assert secret not in json.dumps(out.failed), secret
        assert secret not in stored, secret


# -- the brake: signed commands, acknowledgements, escalation ---------------------------------------

class Trainer:
    """A training loop with the SDK's Monitor on Redis (no Kafka), in its own thread."""

    def __init__(self, run_id: str, redis_url: str):
        self.mon = Monitor(run_id, kafka=False, redis=redis_url, control_secret=CONTROL_SECRET,
                           heartbeat_seconds=0)
        self.step = 0
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.halt.is_set():
            self.mon.step_boundary()
            self.step += 1
            time.sleep(0.02)

    def close(self):
        self.halt.set()
        self.mon.control.close()
        self.thread.join(5)
        self.mon.close(1)


def test_signed_commands_are_obeyed_forged_ones_rejected_and_an_unacknowledged_pause_escalates(
        redis_url, recorders):
    """...and an acknowledged one is told as holding: to the webhook (it takes notices), with
    the rank that answered, at the first check after the answer; not to PagerDuty."""
    rec = recorders()
    s = settings(redis_url, rec, slack_webhook=None, alertmanager_url=None, ack_timeout=1.5)
    trainer = Trainer("brake-acked", redis_url)
    assert trainer.mon.control.wait_ready(5) and trainer.mon.control.connected
    trainer.thread.start()
    r = redis_sync.Redis.from_url(redis_url)
    try:
        # a forged pause (wrong key) and an unsigned one, straight onto the run's channel
        for forged in (Command(run_id="brake-acked", action="pause", ts=time.time()).signed("not-the-key"),
                       Command(run_id="brake-acked", action="stop", ts=time.time())):
            r.publish(channel("brake-acked"), forged.model_dump_json())
        deadline = time.time() + 5
        while trainer.mon.control.rejected < 2 and time.time() < deadline:
            time.sleep(0.02)
        assert trainer.mon.control.rejected == 2 and trainer.mon.state == "running"

        async def go():
            d = build_dispatcher(s)
            try:
                acked = await d.handle(alert(run_id="brake-acked"))          # the trainer is listening
                lost = await d.handle(alert(run_id="brake-lost"))            # nobody is
                assert acked.commands[0].signature and lost.commands[0].signature
                deadline = time.time() + 5
                while trainer.mon.state != "paused" and time.time() < deadline:
                    await asyncio.sleep(0.02)
                assert trainer.mon.state == "paused"
                await asyncio.sleep(1.6)
                first = await d.check_acks()
                escalated = [e for e in first if e.alert.rule == "control_unacknowledged"]
                assert [e.alert.run_id for e in escalated] == ["brake-lost"]
                told = [e for e in first if e.alert.rule == "control_acknowledged"]
                assert [(e.alert.run_id, e.delivered) for e in told] == [("brake-acked", ["webhook"])]
                assert await d.check_acks() == []                               # once
                # an unsigned acknowledgement (not from a worker holding the secret) settles nothing
                cmd_id = lost.commands[0].id
                ack = {"type": "ack", "command_id": cmd_id, "run_id": "brake-lost", "action": "pause",
                       "status": "applied", "rank": 0, "ts": time.time()}
                await d.outbox.redis.hset("rlwatch:acks:brake-lost", cmd_id, json.dumps(ack))
                assert await d.check_acks() == []
                # the late, signed acknowledgement resolves the escalation
                ack["signature"] = ack_signature(ack, CONTROL_SECRET)
                await d.outbox.redis.hset("rlwatch:acks:brake-lost", cmd_id, json.dumps(ack))
                late = await d.check_acks()
                return acked, lost, late
            finally:
                await d.close()

        acked, _lost, late = asyncio.run(go())
        held = trainer.step
        time.sleep(0.3)
        assert trainer.step == held, "the paused training loop kept stepping"
        ack = json.loads(r.hget("rlwatch:acks:brake-acked", acked.commands[0].id))
        assert ack["status"] == "applied" and ack["action"] == "pause"
        events = bodies(rec, "/pd/v2/enqueue")
        esc = [e for e in events if e.get("payload", {}).get("component") == "control_unacknowledged"]
        assert len(esc) == 1 and esc[0]["payload"]["severity"] == "critical"
        assert not [e for e in events if "control_acknowledged" in json.dumps(e)]
        hooked = [b for b in bodies(rec, "/hook") if b.get("rule") == "control_acknowledged"]
        assert len(hooked) == 1, hooked
        assert hooked[0]["run_id"] == "brake-acked" and hooked[0]["labels"]["ack_ranks"] == "0"
        assert hooked[0]["labels"]["command_id"] == acked.commands[0].id and "holds" in hooked[0]["summary"]
        assert "brake-lost" in esc[0]["payload"]["summary"] and "pause" in esc[0]["payload"]["summary"]
        assert [x.alert.state for x in late] == ["resolved"]
        assert events[-1]["event_action"] == "resolve" and events[-1]["dedup_key"] == esc[0]["dedup_key"]
        status = rlwatch("status", "brake-acked", redis_url=redis_url)
        assert "ack   pause" in status.stdout and "applied" in status.stdout
    finally:
        trainer.close()
        r.close()


# -- the whole loop on Kafka: routes file, incident snapshot, escalation from the worker's timer ------

def test_worker_routes_snapshots_and_escalates(services, redis_url, recorders, start_worker, tmp_path):
    rec = recorders()
    routes = tmp_path / "routes.yaml"
    routes.write_text("""
route:
  receiver: webhook
  routes:
    - match: {severity: black}
      receiver: pagerduty
    - match: {severity: red}
      receiver: [alertmanager, webhook]
""")
    sid = uuid.uuid4().hex[:8]
    env = worker_env(services, sid, None, RLWATCH_REDIS=redis_url, RLWATCH_ROUTES=str(routes),
                     RLWATCH_WEBHOOK_URL=f"{rec.url}/hook", RLWATCH_ALERTMANAGER_URL=f"{rec.url}/am",
                     RLWATCH_PAGERDUTY_ROUTING_KEY="pd-key", RLWATCH_PAGERDUTY_URL=f"{rec.url}/pd",
                     RLWATCH_ACK_TIMEOUT="2", RLWATCH_DELIVERY_TICK_SECONDS="0.5",
                     RLWATCH_CONTROL_SECRET=CONTROL_SECRET)
    start_worker(env)
    run_id = f"it-snap-{uuid.uuid4().hex[:6]}"
    mon = Monitor(run_id, kafka=services["kafka"], redis=False, topic=env["RLWATCH_EVENTS_TOPIC"],
                  heartbeat_seconds=0)   # no control listener: the pause is never acknowledged
    try:
        for step in range(40):
            kl = 0.02 if step < 20 else 0.15
            mon.log(step, {"kl/mean": kl, "reward/mean": 0.5, "entropy/mean": 2.0}, batch_ids=[f"batch-{step}"])
            if step % 5 == 0:
                mon.log_samples(step, [{"prompt_id": f"p{step}", "response": f"answer {step}",
                                        "reward": 0.5 if step < 20 else 3.0}])
        assert mon.flush(10)
        red = rec.wait_for("/am/api/v2/alerts", lambda r: run_id in r.body.decode(), timeout=40)
        am = red[0].json()[0]
        assert am["labels"]["alertname"] == "kl_above_target" and am["labels"]["severity"] == "red"
        assert am["annotations"]["actions_taken"] == "pause, snapshot" and am["annotations"]["incident"]
        # the worker's timer escalates the pause nobody acknowledged, to the black route
        esc = rec.wait_for("/pd/v2/enqueue", lambda r: run_id in r.body.decode(), timeout=20)[0].json()
        assert esc["payload"]["component"] == "control_unacknowledged" and esc["payload"]["severity"] == "critical"
        # the incident snapshot is in Redis and on the command line
        app = {"RLWATCH_APP_ID": env["RLWATCH_APP_ID"]}       # the worker's application's incidents
        listed = rlwatch("incidents", "list", "--json", redis_url=redis_url, env_extra=app)
        incs = [json.loads(line) for line in listed.stdout.splitlines()]
        [inc] = [i for i in incs if i["run_id"] == run_id and i["rule"] == "kl_above_target"]
        assert inc["id"] == am["annotations"]["incident"]
        full = json.loads(rlwatch("incidents", "show", inc["id"], "--json", redis_url=redis_url, env_extra=app).stdout)
        snap = full["snapshot"]
        steps = [w["step"] for w in snap["window"]["steps"]]
        assert min(steps) <= inc["onset_step"] - 5 and max(steps) >= inc["step"]
        # samples every 5 steps, rewards 0.5 before step 20 and 3.0 from there
        off, stable = snap["offending"], snap["last_stable"]
        assert stable["step"] < inc["onset_step"] <= off["step"] + 5 and off["step"] <= inc["step"]
        assert off["samples"][0]["reward"] == 3.0 and off["samples"][0]["response"] == f"answer {off['step']}"
        assert stable["samples"][0]["reward"] == (0.5 if stable["step"] < 20 else 3.0)
        assert stable["metrics"]["kl/mean"] == 0.02 and stable["step"] < 20   # before the first bad step
        assert snap["ranks"]["0"]["batch_ids"] == [f"batch-{inc['step']}"]
        shown = rlwatch("incidents", "show", inc["id"][:8], redis_url=redis_url, env_extra=app)
        assert shown.returncode == 0 and "kl_above_target" in shown.stdout and "offending step" in shown.stdout
        # the incident names the commands sent to the run, and says what the run answered to
        # each: nothing yet (this run has no control listener) ...
        assert set(full["commands"]) == {"pause", "snapshot"}
        assert full["answered"] == {"pause": "no answer from the run", "snapshot": "no answer from the run"}
        assert "run answered snapshot: no answer from the run" in shown.stdout
        # ... then a rank's signed answer (a script without on_snapshot), and a forged one
        ack = {"type": "ack", "command_id": full["commands"]["snapshot"], "run_id": run_id, "action": "snapshot",
               "status": "ignored", "detail": "no on_snapshot callback", "rank": 0, "ts": time.time()}
        forged = {**ack, "status": "applied", "rank": 1, "signature": "0" * 64}
        ack["signature"] = ack_signature(ack, CONTROL_SECRET)
        r = redis_sync.Redis.from_url(redis_url)
        for entry in (ack, forged):
            r.xadd(f"rlwatch:audit:{run_id}", {"entry": json.dumps(entry)})
        r.close()
        env_ctl = {**app, "RLWATCH_CONTROL_SECRET": CONTROL_SECRET}
        shown = rlwatch("incidents", "show", inc["id"], redis_url=redis_url, env_extra=env_ctl)
        assert "run answered snapshot: ignored (rank 0): no on_snapshot callback" in shown.stdout, shown.stdout
        assert "run answered pause: no answer from the run" in shown.stdout
        # the webhook got the red alert too, without the snapshot (it stays in Redis)
        hook = rec.wait_for("/hook", lambda r: r.json().get("run_id") == run_id and r.json().get("rule") == "kl_above_target"
                            and r.json().get("severity") == "red")[0].json()
        assert "snapshot" not in hook and hook["incident"] == inc["id"]
    finally:
        mon.close()
