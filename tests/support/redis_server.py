"""A private ``redis-server`` on a free port, for tests that kill or restart Redis without
disturbing the shared one on 6379 (or that need AUTH or TLS)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.support.ports import free_port, port_open


class RedisServer:
    """``redis-server`` without persistence on ``port``: ``start``, ``kill`` (SIGKILL, like a
    crash: its data is gone), ``start`` again on the same port."""

    def __init__(self, directory: Path, *args: str, port: int | None = None, password: str | None = None):
        self.dir, self.args = Path(directory), list(args)
        self.port = port or free_port()
        self.password = password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, tls: bool = False) -> RedisServer:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (scripts/services.sh install)"
        port_args = [] if tls else ["--port", str(self.port)]
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--dir", str(self.dir), *port_args, *auth, *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if port_open(self.port):
                return self
            assert self.proc.poll() is None, "redis-server exited"
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError("redis-server did not open its port")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        deadline = time.time() + 10
        while port_open(self.port) and time.time() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
