"""The dashboard in a real headless Chromium (Debian's chromium, driven by playwright-core).

* ``rlwatch demo --web``: the fleet page lists both runs, the cockpit's charts draw with data,
  the KL alert's onset is marked after the injected fault, and the Pause button pauses the
  healthy run: the worker's training loop acknowledges it and stops advancing.
* a fleet of 200 runs stays responsive while live updates stream in: sort, filter, group by tag,
  a sparkline per run, counts by tier;
* one fleet view: the page of either of two workers lists the runs of both, and after both stop,
  `rlwatch web` still lists every run (from Redis).

Screenshots go to artifacts/screenshots/. These tests are never skipped: without Chromium, node
or web/frontend/node_modules they fail and say what to install (scripts/test.sh installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from alerts.control import MemoryControl
from tests.support.ports import free_port
from web.fleet import Fleet
from web.server import WebServer

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
SCRIPT = Path(__file__).with_name("browser_check.mjs")
CHROMIUM = os.environ.get("RLWATCH_CHROMIUM", "/usr/bin/chromium")
TOKEN = "browser-test-token"


def _require_browser() -> str:
    problems = []
    node = shutil.which("node")
    if node is None:
        problems.append("node is not installed (apt-get install -y nodejs npm)")
    if not Path(CHROMIUM).exists():
        problems.append(f"Chromium is not at {CHROMIUM} (apt-get install -y chromium)")
    if not (ROOT / "web" / "frontend" / "node_modules" / "playwright-core").is_dir():
        problems.append("playwright-core is missing: run `npm ci` in web/frontend")
    if problems:
        pytest.fail("browser test cannot run: " + "; ".join(problems) + ". scripts/test.sh installs these.",
                    pytrace=False)
    return node


def _drive(node: str, url: str, scenario: str, timeout: float = 90, **extra) -> dict:
    env = dict(os.environ, RLWATCH_URL=url, RLWATCH_SCENARIO=scenario, RLWATCH_TOKEN=TOKEN,
               RLWATCH_SHOTS=str(SHOTS), RLWATCH_CHROMIUM=CHROMIUM, **extra)
    r = subprocess.run([node, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=timeout,
                       check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"browser driver printed no result (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    result = json.loads(lines[-1])
    failed = [c for c in result["checks"] if not c["ok"]]
    assert result["ok"], (f"{scenario}: {result['error']}\nfailed checks: {failed}\n"
                          f"passed: {[c['name'] for c in result['checks'] if c['ok']]}\n"
                          f"page errors: {result.get('pageErrors')}\nstderr: {r.stderr[-2000:]}")
    return result


def _wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer in {timeout}s")


def test_demo_dashboard_in_chromium(tmp_path):
    node = _require_browser()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    env = dict(os.environ, RLWATCH_OPERATOR_TOKEN=TOKEN, PYTHONUNBUFFERED="1")
    env.pop("RLWATCH_CONTROL_SECRET", None)
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, "-m", "rlwatch", "demo", "--web", f"127.0.0.1:{port}",
                                 "--steps", "6000", "--onset", "30"], cwd=ROOT, env=env, stdout=fo, stderr=fe)
        try:
            _wait_http(url + "/healthz", proc)
            result = _drive(node, url, "demo")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    stdout, stderr = out.read_text(), err.read_text()
    # the worker itself saw the pause: the demo reports its training loop blocked
    assert "worker ppo-healthy is PAUSED" in stdout, stdout[-3000:]
    assert "worker ppo-kl-blowup is PAUSED" in stdout
    assert "operator pause ppo-healthy" in stderr, stderr[-3000:]
    assert "dashboard at http://127.0.0.1" in stderr
    assert len(result["checks"]) > 20
    for name in ("fleet.png", "cockpit-kl-blowup.png", "cockpit-healthy-paused.png"):
        assert (SHOTS / name).stat().st_size > 10_000, name


FLEET_RUNS = 200


def _fleet_records(stop: threading.Event, store) -> threading.Thread:
    """Records of FLEET_RUNS runs, as the workers write them into the fleet store: 20 steps each
    up front, then one step per run every 0.2 s. (The page reads records; which worker wrote them
    does not matter to it.)"""
    import math as _m

    from streams.fleet_store import make_record

    runs = []
    for i in range(FLEET_RUNS):
        algo = "grpo" if i % 3 == 0 else "ppo"
        sev = {6: "red", 7: "orange", 8: "yellow"}.get(i % 10)
        runs.append({"run_id": f"{algo}-run-{i:03d}", "algo": algo, "team": f"team-{i % 4}", "sev": sev,
                     "kl": 0.02 + 0.01 * (i % 5), "rec": None})
    t0 = time.time() - 20

    def write(step: int, ts: float) -> None:
        recs = []
        for r in runs:
            kl = r["kl"] * (1 + 0.3 * _m.sin(step / 7 + len(r["run_id"])))
            alerts = [] if r["sev"] is None else [{"rule": "kl_above_target" if r["sev"] == "red" else "kl_rising",
                                                   "severity": r["sev"], "onset_step": 20, "step": 25,
                                                   "summary": f"simulated {r['sev']} alert"}]
            summary = {"run_id": r["run_id"], "incarnation": "i", "generation": 0, "last_step": step,
                       "last_event_ts": ts, "events": step + 1, "world_size": 8,
                       "tags": {"algo": r["algo"], "team": r["team"]}, "targets": {"kl": 0.05},
                       "kl_lines": {"yellow": 0.075, "red": 0.125, "black": 0.2}, "open_alerts": alerts,
                       "worst": r["sev"], "latest": {"kl/mean": kl, "reward/mean": 0.5},
                       "smoothed": {"kl/mean": kl}}
            r["rec"] = make_record(summary, r["rec"], ts, writer="browser-test")
            recs.append(r["rec"])
        asyncio.run(store.put(recs))

    for s_ in range(20):
        write(s_, t0 + s_)

    def run():
        s_ = 20
        try:
            while not stop.is_set():
                write(s_, time.time())
                s_ += 1
                stop.wait(0.2)
        except BaseException as exc:  # noqa: BLE001 - the test reports it (a dead feeder, not the page)
            failures.append(exc)

    failures: list[BaseException] = []
    t = threading.Thread(target=run, daemon=True)
    t.failures = failures
    t.start()
    return t


def test_hundreds_of_runs_stay_responsive_in_chromium():
    from streams.fleet_store import MemoryFleetStore

    node = _require_browser()
    store = MemoryFleetStore()
    stop = threading.Event()
    feeder = _fleet_records(stop, store)
    server = WebServer(Fleet(), "127.0.0.1", 0, control=MemoryControl(), store=store, token=TOKEN).start()
    try:
        try:
            result = _drive(node, server.url.rstrip("/"), "fleet", RLWATCH_RUNS=str(FLEET_RUNS))
        finally:
            assert not feeder.failures, f"the test's record feeder failed: {feeder.failures!r}"
        print(f"fleet page, {FLEET_RUNS} runs: {result['figures']}")   # figures, not assertions
    finally:
        stop.set()
        feeder.join(5)
        server.stop()
    assert (SHOTS / f"fleet-{FLEET_RUNS}-runs.png").stat().st_size > 10_000


# -- one fleet view: two workers, then a restart ------------------------------------------------------
def _run_ids_on_every_partition(prefix: str, n: int, partitions: int = 4) -> list[str]:
    """``n`` run ids whose keys cover every partition of the events topic (so that both workers
    get some, whatever the assignment)."""
    from kafka.partitioner.default import murmur2

    ids, seen, i = [], set(), 0
    while len(ids) < n:
        rid = f"{prefix}-{i}"
        part = (murmur2(rid.encode()) & 0x7FFFFFFF) % partitions
        if part not in seen or len(seen) == partitions:
            seen.add(part)
            ids.append(rid)
        i += 1
    return ids


def test_one_fleet_view_from_two_workers_and_after_their_restart_in_chromium():
    """Two workers of one application, each with --web: the page of either lists the runs of both
    (sort, filter, group by tag, sparklines, counts by tier, the run that closed its monitor
    finished); after both workers stop, `rlwatch web` still shows every run, from Redis."""
    import uuid

    from producers.monitor import Monitor
    from producers.sim import SimConfig, Simulator
    from tests.integration.conftest import WorkerProcess, worker_env

    node = _require_browser()
    svc = {"kafka": os.environ.get("RLWATCH_TEST_KAFKA", "127.0.0.1:9092"),
           "redis": os.environ.get("RLWATCH_TEST_REDIS", "redis://127.0.0.1:6379/0")}
    subprocess.run([str(ROOT / "scripts" / "services.sh"), "start"], check=True, timeout=300,
                   capture_output=True)
    sid = uuid.uuid4().hex[:8]
    env = worker_env(svc, sid, RLWATCH_OPERATOR_TOKEN=TOKEN)
    ports = [free_port(), free_port()]
    workers = [WorkerProcess({**env}) for _ in ports]
    for w, port in zip(workers, ports):
        w.proc = subprocess.Popen([sys.executable, "-m", "rlwatch", "worker", "--web", f"127.0.0.1:{port}",
                                   "--loglevel", "info"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=w._pump, daemon=True).start()
    runs = _run_ids_on_every_partition(f"fleet-{sid}", 6)
    plan = {rid: ("kl_above_target" if i == 0 else "healthy", f"team-{'ab'[i % 2]}") for i, rid in enumerate(runs)}
    done = f"done-{sid}"              # a run that finishes: its script closes the monitor
    plan[done] = ("healthy", "team-a")
    stop = threading.Event()
    mons: dict[str, Monitor] = {}

    def train(rid: str, fault: str, team: str) -> None:
        mon = mons[rid] = Monitor(rid, kafka=svc["kafka"], redis=False, topic=env["RLWATCH_EVENTS_TOPIC"],
                                  heartbeat_seconds=0, tags={"algo": "ppo", "team": team})
        sim = Simulator(SimConfig(run_id=rid, fault=fault, onset=15, seed=len(rid)))
        step = 0
        while not stop.is_set() and not (rid == done and step >= 40):
            for ev in sim.step(step, time.time()):
                if ev["kind"] == "step" and ev.get("rank", 0) == 0:
                    mon.log(step, ev["metrics"])
            step += 1
            stop.wait(0.05)
        mon.close(10)

    trainers = []
    web = None
    try:
        for w in workers:
            w.wait_for("Ready", 90)
        trainers = [threading.Thread(target=train, args=(rid, *plan[rid]), daemon=True) for rid in plan]
        for t in trainers:
            t.start()
        base = f"http://127.0.0.1:{ports[0]}"

        def writers() -> set:
            with urllib.request.urlopen(base + "/api/fleet", timeout=5) as r:
                rows = json.load(r)["rows"]
            return {r["writer"] for r in rows} if len(rows) == len(plan) else set()

        deadline = time.time() + 60
        while len(writers()) < 2 and time.time() < deadline:   # the two workers share the partitions
            time.sleep(0.5)
        _drive(node, base, "workers", timeout=180, RLWATCH_RUNS=str(len(plan)))
        stop.set()
        for t in trainers:
            t.join(15)
        for w in workers:
            w.stop()
        # both workers gone: a separate dashboard still has the whole fleet, from Redis
        port = free_port()
        web = subprocess.Popen([sys.executable, "-m", "rlwatch", "web", f"127.0.0.1:{port}"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _wait_http(f"http://127.0.0.1:{port}/healthz", web)
        _drive(node, f"http://127.0.0.1:{port}", "restarted", RLWATCH_RUNS=str(len(plan)))
    finally:
        stop.set()
        for t in trainers:
            t.join(15)
        for w in workers:
            w.stop()
        if web is not None:
            web.terminate()
            web.wait(10)
