"""A local HTTP server that records what it receives: stands in for Slack, webhook receivers,
Alertmanager and PagerDuty in tests. It can be told to answer errors (429/500) for a while, or
to hang (read the request, answer nothing) on some paths until released."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)

    def form_or_json(self) -> dict:
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            return self.json()
        from urllib.parse import parse_qs

        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}


@dataclass
class Recorder:
    requests: list[Request] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)   # status codes to answer, in order
    port: int = 0
    hang: tuple[str, ...] = ()                            # path prefixes that hang until released
    hung: list[Request] = field(default_factory=list)     # requests held by a hang
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """End the hang: held requests get their answer, new ones go through."""
        self.hang = ()
        self.released.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def on(self, path_prefix: str) -> list[Request]:
        return [r for r in self.requests if r.path.startswith(path_prefix)]

    def wait_for(self, path_prefix: str, predicate=lambda r: True, timeout: float = 30.0) -> list[Request]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            hits = [r for r in self.on(path_prefix) if predicate(r)]
            if hits:
                return hits
            time.sleep(0.05)
        raise AssertionError(f"nothing matching arrived at {path_prefix} within {timeout}s; "
                             f"got {[r.path for r in self.requests]}")


def start_recorder() -> tuple[Recorder, ThreadingHTTPServer]:
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n)
            if any(self.path.startswith(p) for p in rec.hang):
                rec.hung.append(Request("POST", self.path, dict(self.headers), body))
                rec.released.wait(300)
                self.send_response(503)
                self.end_headers()
                return
            if rec.fail_next:
                code = rec.fail_next.pop(0)
                self.send_response(code)
                if code == 429:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(b"error")
                return
            rec.requests.append(Request("POST", self.path, dict(self.headers), body))
            if self.path.startswith("/api/"):
                payload = {"ok": True, "ts": f"{time.time():.6f}", "channel": "C1"}
                out = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            else:
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return rec, server
