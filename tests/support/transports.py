"""An SDK transport for tests that records what the Monitor's sender hands it."""

from __future__ import annotations

import json
import threading


class RecordingTransport:
    def __init__(self):
        self.items: list[tuple[bytes, bytes]] = []
        self.lock = threading.Lock()

    def send(self, items):
        with self.lock:
            self.items.extend(items)

    def close(self, timeout):
        pass

    def events(self, kind=None):
        with self.lock:
            evs = [json.loads(v) for _, v in self.items]
        return evs if kind is None else [e for e in evs if e.get("kind") == kind]
