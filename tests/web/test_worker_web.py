"""`rlwatch worker --web` on the real Kafka and Redis: the agents feed the dashboard, and a
pause from the dashboard goes through Redis to the training process, and is told to the
worker's receivers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from producers.control import TrainingStopped
from producers.monitor import Monitor
from producers.sim import SimConfig, Simulator
from tests.integration.conftest import ROOT, recorder, services, worker_env  # noqa: F401 - the fixtures
from tests.support.ports import free_port

pytestmark = pytest.mark.integration
TOKEN = "worker-web-token"


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def _until(fn, timeout: float, what: str):
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = fn()
            if last:
                return last
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout}s (last: {last!r})")


def test_worker_feeds_the_dashboard_and_takes_its_commands(services, recorder):  # noqa: F811
    sid = uuid.uuid4().hex[:8]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = worker_env(services, sid, recorder, RLWATCH_OPERATOR_TOKEN=TOKEN)
    proc = subprocess.Popen([sys.executable, "-m", "rlwatch", "worker", "--web", f"127.0.0.1:{port}",
                             "--loglevel", "info"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []
    threading.Thread(target=lambda: [lines.append(ln) for ln in proc.stdout], daemon=True).start()
    faulty, healthy = f"web-kl-{sid}", f"web-ok-{sid}"
    mons = []
    try:
        _until(lambda: any("Ready" in ln for ln in lines) or proc.poll() is not None, 90, "worker ready")
        assert proc.poll() is None, "".join(lines[-40:])
        assert any("dashboard at http://127.0.0.1" in ln for ln in lines)
        for run_id, fault in ((faulty, "kl_above_target"), (healthy, "healthy")):
            mon = Monitor(run_id, kafka=services["kafka"], redis=services["redis"],
                          topic=env["RLWATCH_EVENTS_TOPIC"], heartbeat_seconds=0, tags={"algo": "ppo"})
            mons.append(mon)
            sim = Simulator(SimConfig(run_id=run_id, fault=fault, onset=20, seed=5, magnitude=1.0))
            for step in range(140):
                for ev in sim.step(step, time.time()):
                    if ev["kind"] == "step" and ev.get("rank", 0) == 0:
                        mon.log(step, ev["metrics"], dists=ev.get("dists"), groups=ev.get("groups"))
            mon.flush(10)

        def rows():
            got = {r["run_id"]: r for r in _get(base + "/api/fleet")["rows"]}
            return got if {faulty, healthy} <= set(got) and got[healthy]["last_step"] == 139 \
                and got[faulty]["worst"] else None
        got = _until(rows, 40, "both runs and the KL alert on the fleet page")
        assert got[faulty]["worst"]["rule"] == "kl_above_target"
        # the alert's own command (pause/stop) reached Redis; the dashboard mirrors that state
        _until(lambda: _get(base + "/api/fleet?state=stopped")["rows"]
               or _get(base + "/api/fleet?state=paused")["rows"], 20, "the faulty run's control state")

        metrics = _get(base + "/metrics")
        fams = {f.name: f for f in text_string_to_metric_families(metrics)}
        active = {(s.labels["run_id"], s.labels["rule"]) for s in fams["rlwatch_alert_active"].samples
                  if s.value == 1.0}
        assert (faulty, "kl_above_target") in active
        assert any(s.labels["run_id"] == healthy and s.labels["metric"] == "reward/mean"
                   for s in fams["rlwatch_metric_ema"].samples)

        # pause the healthy run from the dashboard: Redis state, then the training process sees it
        req = urllib.request.Request(f"{base}/api/run/command?run={healthy}", method="POST",
                                     data=json.dumps({"action": "pause", "reason": "from the web"}).encode(),
                                     headers={"Content-Type": "application/json", "X-RLWatch-Token": TOKEN})
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.load(r)
        assert answer["state"] == "paused"
        # the worker's receivers were told who paused it and why (the console left out)
        assert answer["announced"] == {"sent": ["slack-webhook", "slack-bot", "webhook"], "failed": {},
                                       "silenced": {}, "retrying": [], "unqueued": {}}
        told = [q.json() for q in recorder.on("/hook") if q.json().get("rule") == "operator_command"]
        assert [(t["run_id"], t["labels"]["issuer"], t["labels"]["run_state"]) for t in told] == \
            [(healthy, "web:operator", "paused")]
        assert told[0]["summary"].startswith(f"run {healthy}: pause sent by web:operator: from the web")
        mon = mons[1]
        _until(lambda: mon.state == "paused", 15, "the training process to see the pause")
        status = subprocess.run([sys.executable, "-m", "rlwatch", "status", healthy], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        assert f"{healthy}: paused by web:operator: from the web" in status.stdout, status.stdout
        def audit_of():
            return json.loads(urllib.request.urlopen(urllib.request.Request(
                f"{base}/api/run/audit?run={healthy}", headers={"X-RLWatch-Token": TOKEN}), timeout=5).read())
        # the training loop has not reached a step boundary: the pause is not applied yet
        assert audit_of()["answered"] is None
        def boundary(m):
            try:
                m.step_boundary()
            except TrainingStopped:      # the faulty run's rules went on to stop it (black)
                pass
        for m in mons:     # each reaches its next step boundary, applies its brake, and waits there
            threading.Thread(target=boundary, args=(m,), daemon=True).start()
        audit = _until(lambda: (lambda a: a if a["answered"] else None)(audit_of()), 15,
                       "the cockpit to show the run's answer to the pause")
        assert audit["state"] == "paused" and audit["answered"]["held"]
        assert audit["answered"]["said"].startswith("applied (rank 0)")
        assert [e["issuer"] for e in audit["history"] if e.get("type", "command") == "command"][-1] == "web:operator"
        # the rule's own pause of the faulty run: its training process acknowledged it, so the
        # worker's timer told the webhook that the brake holds, in the alert's words
        def told_held():
            told = [q.json() for q in recorder.on("/hook") if q.json().get("rule") == "control_acknowledged"]
            return told if any(t["labels"]["ack_status"] == "applied" for t in told) and \
                any(t["labels"]["command"] == "adjust" for t in told) else None
        told = _until(told_held, 20, "the webhook to hear that the rule's brake holds and its adjust was not applied")
        assert {(h["run_id"], h["labels"]["ack_ranks"]) for h in told} == {(faulty, "0")}
        # (a pause that reached the process after the rules' stop is answered "ignored": the
        # stop is the news, that answer is not told)
        held = [h for h in told if h["labels"]["command"] in ("pause", "stop")]
        assert held and {h["labels"]["ack_status"] for h in held} == {"applied"}
        for h in held:
            what, rule = h["labels"]["command"], h["labels"]["source_rule"]
            assert rule and h["summary"].startswith(f"run {faulty}: the {what} for {rule} (")
            assert " holds: rank 0 acknowledged it " in h["summary"], h
        # the rules' adjusts and rollbacks: this training script has no callbacks, and the
        # webhook hears that they were not applied
        for h in told:
            if h["labels"]["command"] in ("adjust", "rollback"):
                assert h["labels"]["ack_status"] == "ignored", h
                assert h["summary"].endswith(f"the run answered ignored (rank 0): no on_{h['labels']['command']} callback")
    finally:
        for m in mons:
            m.close(2)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
