"""Real Apache Kafka and real Redis, started by scripts/services.sh (never mocked)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.http_recorder import start_recorder
from tests.support.ports import port_open

ROOT = Path(__file__).resolve().parents[2]
KAFKA = os.environ.get("RLWATCH_TEST_KAFKA", "127.0.0.1:9092")
REDIS = os.environ.get("RLWATCH_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def services():
    """Start Kafka and Redis if they are not up (idempotent scripts); fail loudly otherwise."""
    if not (port_open(9092) and port_open(6379)):
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "start"], check=True, timeout=300)
    assert port_open(9092), "Kafka is not listening on 127.0.0.1:9092"
    assert port_open(6379), "Redis is not listening on 127.0.0.1:6379"
    return {"kafka": KAFKA, "redis": REDIS}


@pytest.fixture(scope="session")
def broker(services, tmp_path_factory):
    """A Kafka broker of the tests' own (tests stop and start it: never the shared one)."""
    from tests.support.kafka_broker import Broker

    b = Broker(tmp_path_factory.mktemp("kafka-private"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def recorder():
    rec, server = start_recorder()
    yield rec
    server.shutdown()


class WorkerProcess:
    """`rlwatch worker` as a user runs it, in a subprocess, with its output captured."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> "WorkerProcess":
        self.lines.clear()
        self.proc = subprocess.Popen([sys.executable, "-m", "rlwatch", "worker", "--loglevel", "info"],
                                     cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=self._pump, daemon=True).start()
        self.wait_for("Ready", timeout)
        return self

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.lines:
                if text in line:
                    return line
            if self.proc.poll() is not None:
                raise AssertionError("worker exited:\n" + "\n".join(self.lines[-40:]))
            time.sleep(0.1)
        raise AssertionError(f"worker never printed {text!r}:\n" + "\n".join(self.lines[-40:]))

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def session_id():
    return uuid.uuid4().hex[:8]


def worker_env(services, sid: str, recorder=None, **extra) -> dict[str, str]:
    data = os.path.join(tempfile.gettempdir(), "rlwatch-test-data")
    os.makedirs(data, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "RLWATCH_KAFKA": services["kafka"],
        "RLWATCH_REDIS": services["redis"],
        "RLWATCH_APP_ID": f"rlwatch-test-{sid}",
        "RLWATCH_EVENTS_TOPIC": f"rlwatch.events.{sid}",
        "RLWATCH_ALERTS_TOPIC": f"rlwatch.alerts.{sid}",
        "RLWATCH_DLQ_TOPIC": f"rlwatch.dlq.{sid}",
        "RLWATCH_TICK_SECONDS": "2",
        "PYTHONUNBUFFERED": "1",
        # Faust's data directory ("<app id>-data", in the working directory by default) out of
        # the checkout: each test's worker has its own application id
        "F_DATADIR": os.path.join(data, "{conf.name}-data"),
    })
    if recorder is not None:
        env.update({
            "RLWATCH_SLACK_WEBHOOK": f"{recorder.url}/slack/webhook",
            "RLWATCH_SLACK_TOKEN": "test-bot-token",
            "RLWATCH_SLACK_CHANNEL": "#rl-alerts",
            "RLWATCH_SLACK_API_URL": f"{recorder.url}/api/",
            "RLWATCH_WEBHOOK_URL": f"{recorder.url}/hook",
            "RLWATCH_WEBHOOK_SECRET": "hook-secret",
        })
    env.update(extra)
    return env


@pytest.fixture
def start_worker():
    started: list[WorkerProcess] = []

    def _start(env) -> WorkerProcess:
        w = WorkerProcess(env).start()
        started.append(w)
        return w

    yield _start
    for w in started:
        w.stop()
