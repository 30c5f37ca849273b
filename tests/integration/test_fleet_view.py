"""One fleet view on the real Redis and a real worker: records namespaced by application,
`rlwatch status` lists every run (its step, live or finished, the KL lines of its own targets)
and keeps listing them after the worker stopped."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import redis.asyncio as aioredis

from producers.monitor import Monitor
from streams.fleet_store import FleetStore, make_record
from tests.integration.conftest import ROOT, worker_env

pytestmark = pytest.mark.integration


def _summary(run_id: str, step: int, ts: float) -> dict:
    return {"run_id": run_id, "incarnation": None, "generation": 0, "last_step": step, "last_event_ts": ts,
            "events": step, "world_size": 1, "tags": {}, "targets": {}, "open_alerts": [], "worst": None,
            "latest": {}, "smoothed": {"kl/mean": 0.01}}


def test_the_store_on_redis_is_namespaced_and_expires(services):
    async def go():
        r = aioredis.Redis.from_url(services["redis"])
        app_a, app_b = f"fleet-a-{uuid.uuid4().hex[:6]}", f"fleet-b-{uuid.uuid4().hex[:6]}"
        a, b = FleetStore(r, app_a), FleetStore(r, app_b, ttl_seconds=1)
        try:
            now = time.time()
            await a.put([make_record(_summary("run-1", 5, now), None, now)])
            await b.put([make_record(_summary("run-2", 7, now), None, now)])
            assert [x["run_id"] for x in await a.all()] == ["run-1"]       # each app its own runs
            assert [x["run_id"] for x in await b.all()] == ["run-2"]
            assert await a.changed_since(now) == []
            await a.put([make_record(_summary("run-1", 6, now + 1), None, now + 1)])
            assert [x["summary"]["last_step"] for x in await a.changed_since(now)] == [6]
            await asyncio.sleep(1.5)                                         # b's TTL passes
            assert await b.all() == [] and await b.run_ids() == []           # gone, index too
            assert (await a.get("run-1"))["summary"]["last_step"] == 6
        finally:
            await a.delete("run-1")
            await r.aclose()

    asyncio.run(go())


def rlwatch(*args, env, timeout=60):
    return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _status(env) -> dict:
    r = rlwatch("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {x["run_id"]: x for x in json.loads(r.stdout)}


def test_status_shows_every_run_finished_or_live_and_after_the_worker_stopped(services, start_worker):
    sid = uuid.uuid4().hex[:8]
    env = worker_env(services, sid)
    worker = start_worker(env)
    done, live = f"done-{sid}", f"live-{sid}"
    a = Monitor(done, kafka=services["kafka"], redis=False, topic=env["RLWATCH_EVENTS_TOPIC"],
                heartbeat_seconds=0)
    b = Monitor(live, kafka=services["kafka"], redis=False, topic=env["RLWATCH_EVENTS_TOPIC"],
                heartbeat_seconds=0, targets={"kl": 0.03}, tags={"team": "rl"})
    try:
        for step in range(30):
            a.log(step, {"kl/mean": 0.01, "reward/mean": 1.0})
            b.log(step, {"kl/mean": 0.01, "reward/mean": 1.0})
        a.close(10)                      # the script ended: its last event says so
        b.flush(10)
        deadline = time.time() + 40
        runs = {}
        while time.time() < deadline:
            runs = _status(env)
            if runs.get(done, {}).get("status") == "finished" and \
                    (runs.get(live, {}).get("summary") or {}).get("last_step") == 29:
                break
            time.sleep(0.5)
        assert runs[done]["status"] == "finished" and runs[done]["closed"]["step"] == 29
        assert runs[live]["status"] == "live"
        s = runs[live]["summary"]
        assert s["targets"]["kl"] == 0.03 and s["kl_lines"]["red"] == pytest.approx(0.075)
        assert s["tags"]["team"] == "rl"
        text = rlwatch("status", env=env).stdout
        assert f"{done}: finished  [step 29, finished (closed its monitor)" in text   # not "running"
        assert f"{live}: running  [step 29, live" in text
        # relaunched under the same id (a new Monitor: a new incarnation): live again, afresh
        first = runs[done]["summary"]["incarnation"]
        a = Monitor(done, kafka=services["kafka"], redis=False, topic=env["RLWATCH_EVENTS_TOPIC"],
                    heartbeat_seconds=0)
        for step in range(3):
            a.log(step, {"kl/mean": 0.01, "reward/mean": 1.0})
        a.flush(10)
        deadline = time.time() + 30
        while time.time() < deadline:
            runs = _status(env)
            if runs[done]["summary"]["incarnation"] != first and runs[done]["summary"]["last_step"] == 2:
                break
            time.sleep(0.5)
        assert runs[done]["status"] == "live" and runs[done]["closed"] is None
        assert runs[done]["summary"]["incarnation"] not in (None, first)
        assert runs[done]["summary"]["last_step"] == 2
        a.close(10)
        deadline = time.time() + 30
        while _status(env)[done]["status"] != "finished" and time.time() < deadline:
            time.sleep(0.5)
        # another application sees none of them
        other = _status({**env, "RLWATCH_APP_ID": f"other-{sid}"})
        assert done not in other and live not in other
        # the worker stops: the fleet view stays (it is in Redis, not in the worker)
        worker.stop()
        runs = _status(env)
        assert runs[live]["summary"]["last_step"] == 29 and runs[done]["status"] == "finished"
        # commands reach known runs; resume says who owns the run now
        assert rlwatch("pause", live, "--reason", "look", env=env).returncode == 0
        out = rlwatch("resume", live, env=env)
        assert out.returncode == 0 and "the brake does not re-arm by itself" in out.stdout
    finally:
        a.close(2)
        b.close(2)


def test_pause_of_an_unknown_run_is_refused_and_leaves_no_ghost(services):
    env = {**os.environ, "RLWATCH_REDIS": services["redis"], "RLWATCH_APP_ID": f"ghost-{uuid.uuid4().hex[:6]}"}
    run = f"no-such-run-{uuid.uuid4().hex[:6]}"
    r = rlwatch("pause", run, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"no run {run!r} is known" in r.stderr and "--force" in r.stderr
    assert run not in rlwatch("status", env=env).stdout          # no ghost run
    st = rlwatch("status", run, "--json", env=env)
    assert st.returncode == 1 and json.loads(st.stdout)["error"].startswith("no run")
    forced = rlwatch("pause", run, "--force", "--reason", "before it starts", env=env)
    assert forced.returncode == 0 and f"{run}: paused" in forced.stdout


def test_status_json_is_json_when_there_are_no_runs(services):
    async def empty_db() -> str:
        url = services["redis"].rsplit("/", 1)[0] + "/11"      # a database only this test uses
        r = aioredis.Redis.from_url(url)
        await r.flushdb()
        await r.aclose()
        return url

    url = asyncio.run(empty_db())
    r = rlwatch("status", "--json", env={**os.environ, "RLWATCH_REDIS": url})
    assert r.returncode == 0 and json.loads(r.stdout) == []
    text = rlwatch("status", env={**os.environ, "RLWATCH_REDIS": url})
    assert text.returncode == 0 and text.stdout.startswith("no runs known to app")


def test_a_wrong_kafka_address_is_one_line_not_client_logging(services):
    env = {**os.environ, "RLWATCH_REDIS": services["redis"], "RLWATCH_APP_ID": f"nokafka-{uuid.uuid4().hex[:6]}"}
    r = rlwatch("worker", "--kafka", "127.0.0.1:1", env=env, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    out = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(out) == 1, out                           # no client logging, no traceback
    assert out[0].startswith("rlwatch worker: cannot reach Kafka at 127.0.0.1:1")


def test_the_cockpit_lists_the_runs_incidents_from_redis(services):
    """`GET /api/run/incidents` of a dashboard on Redis: what `rlwatch incidents list --run` shows."""
    import aiohttp
    from aiohttp.test_utils import TestServer

    from alerts.control import RedisControl
    from alerts.incidents import RedisIncidents, make_incident
    from contract.alert import Alert
    from web.fleet import Fleet
    from web.server import build_web_app

    run = f"inc-{uuid.uuid4().hex[:6]}"

    async def go():
        app_id = f"inc-app-{uuid.uuid4().hex[:6]}"
        store = FleetStore.from_url(services["redis"], app_id)
        now = time.time()
        await store.put([make_record(_summary(run, 40, now), None, now)])
        alert = Alert(rule="kl_above_target", severity="red", state="firing", run_id=run, step=40,
                      onset_step=38, summary="KL high")
        await RedisIncidents(store.redis, f"rlwatch:{app_id}").save(make_incident(alert, None, now, ["pause"]))
        # another application's incident of the same run id is not this dashboard's
        other = Alert(rule="nan_inf", severity="black", state="firing", run_id=run, step=41, onset_step=41)
        await RedisIncidents(store.redis, "rlwatch:another-app").save(make_incident(other, None, now, ["stop"]))
        app = build_web_app(Fleet(), RedisControl(services["redis"]), store=store, store_poll=0.05)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(str(server.make_url(f"/api/run/incidents?run={run}"))) as r:
                    data = await r.json()
        finally:
            await server.close()
            await store.delete(run)
            await store.close()
        return data

    data = asyncio.run(go())
    [inc] = data["incidents"]
    assert inc["rule"] == "kl_above_target" and inc["severity"] == "red" and inc["step"] == 40
    assert inc["id"].startswith("inc-")
