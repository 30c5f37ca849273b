"""An Apache Kafka broker (KRaft) of a test's own, driven by scripts/kafka.sh on its own ports
and data directory, so that stopping it does not pull the shared broker on 9092 from under
anything else running on this machine."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.ports import free_port, port_open

KAFKA_SH = str(ROOT / "scripts" / "kafka.sh")


class Broker:
    """``start`` / ``stop`` (``kafka.sh``); ``bootstrap`` is its address."""

    def __init__(self, home: Path):
        # reuse the jars that services.sh resolved for the shared broker (no second Maven run)
        libs = Path(os.environ.get("RLWATCH_KAFKA_HOME", ROOT / ".local" / "kafka")) / "libs"
        if (libs / ".complete").exists() and not (home / "libs").exists():
            (home / "libs").symlink_to(libs)
        self.port = free_port()
        self.env = dict(os.environ, RLWATCH_KAFKA_HOME=str(home), RLWATCH_KAFKA_PORT=str(self.port),
                        RLWATCH_KAFKA_CONTROLLER_PORT=str(free_port()))
        self.bootstrap = f"127.0.0.1:{self.port}"

    def _sh(self, cmd: str) -> None:
        proc = subprocess.run([KAFKA_SH, cmd], check=False, env=self.env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, f"kafka.sh {cmd} failed:\n{proc.stdout}\n{proc.stderr}"

    def start(self) -> None:
        self._sh("start")
        assert port_open(self.port), "the broker did not come back"

    def stop(self) -> None:
        self._sh("stop")
        deadline = time.time() + 30
        while port_open(self.port) and time.time() < deadline:
            time.sleep(0.1)
        assert not port_open(self.port), "the broker is still listening after kafka.sh stop"
