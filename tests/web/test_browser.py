"""The dashboard in a real headless Chromium (Debian's chromium, driven by playwright-core).

* ``rlwatch demo --web``: the fleet page lists both runs, the cockpit's charts draw with data,
  the KL alert's onset is marked after the injected fault, and the Pause button pauses the
  healthy run: the worker's training loop acknowledges it and stops advancing.
* a 50-run fleet stays responsive while live updates stream in.

Screenshots go to artifacts/screenshots/. These tests are never skipped: without Chromium, node
or web/frontend/node_modules they fail and say what to install (scripts/test.sh installs it).
"""

from __future__ import annotations

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
from contract.alert import Alert
from tests.web.conftest import free_port
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


def _drive(node: str, url: str, scenario: str, timeout: float = 90) -> dict:
    env = dict(os.environ, RLWATCH_URL=url, RLWATCH_SCENARIO=scenario, RLWATCH_TOKEN=TOKEN,
               RLWATCH_SHOTS=str(SHOTS), RLWATCH_CHROMIUM=CHROMIUM)
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


def _fleet_of_50(stop: threading.Event, fleet: Fleet) -> threading.Thread:
    """50 simulated runs: 60 steps each up front, then one step per run every 0.2 s."""
    from producers.simulator import SimConfig, Simulator
    from contract.events import parse_event

    faults = ["healthy"] * 6 + ["kl_above_target", "entropy_collapse", "length_hacking", "reward_spike"]
    sims = []
    for i in range(50):
        algo = "grpo" if i % 3 == 0 else "ppo"
        fault = faults[i % len(faults)]
        sims.append(Simulator(SimConfig(run_id=f"{algo}-run-{i:02d}", algo=algo, fault=fault, onset=120,
                                        seed=i, samples_every=10, checkpoint_every=100)))
    t0 = time.time() - 60

    def step(sim, s, ts):
        for raw in sim.step(s, ts):
            if raw.get("rank", 0) == 0:
                fleet.observe_event(parse_event(raw, ts))

    for s in range(60):
        for sim in sims:
            step(sim, s, t0 + s)
    for i, sim in enumerate(sims):
        if i % 10 in (6, 7):
            sev = "red" if i % 10 == 6 else "orange"
            fleet.observe_alert(Alert(rule="kl_above_target" if sev == "red" else "entropy_collapse",
                                      severity=sev, state="firing", run_id=sim.config.run_id, step=55,
                                      onset_step=50, summary=f"simulated {sev} alert"))

    def run():
        s = 60
        while not stop.is_set():
            for sim in sims:
                step(sim, s, time.time())
            s += 1
            stop.wait(0.2)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_fifty_runs_stay_responsive_in_chromium():
    node = _require_browser()
    fleet = Fleet()
    stop = threading.Event()
    feeder = _fleet_of_50(stop, fleet)
    server = WebServer(fleet, "127.0.0.1", 0, control=MemoryControl(), token=TOKEN).start()
    try:
        _drive(node, server.url.rstrip("/"), "fleet50")
    finally:
        stop.set()
        feeder.join(5)
        server.stop()
    assert (SHOTS / "fleet-50-runs.png").stat().st_size > 10_000
