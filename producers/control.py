"""The worker side of the control channel: listen for commands, apply them at step boundaries.

A daemon thread keeps a Redis subscription to the run's channel. On every (re)connect it first
reads the authoritative state, so a pause issued while the worker was cut off still applies.
The training thread pays one attribute read per step unless something changed.

If Redis cannot be reached the worker keeps training and says so loudly (a warning at once,
then every minute while it lasts).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Callable

from contract.commands import Command, RunControl, audit_key, channel, pending_key, state_key

__all__ = ["CommandInbox", "ControlListener", "TrainingStopped"]

log = logging.getLogger("rlwatch.producers")


class TrainingStopped(RuntimeError):
    """Raised at a step boundary when the run was told to stop. Catch it to save and exit."""

    def __init__(self, command: Command | None):
        reason = command.reason if command else ""
        super().__init__(f"rlwatch stopped this run: {reason}" if reason else "rlwatch stopped this run")
        self.command = command


def _mask(url: str) -> str:
    """A Redis URL without its password, for logs."""
    from contract.settings import mask_url

    return mask_url(url)


class CommandInbox:
    """The commands a worker has received, applied at its step boundaries.

    Transport-free: :class:`ControlListener` feeds it from Redis, the embedded demo feeds it in
    process. ``deliver_*`` run on the delivering thread; the rest on the training thread.
    """

    def __init__(self, run_id: str, rank: int = 0, *, secret: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.run_id, self.rank, self.secret, self.clock = run_id, rank, secret, clock
        self.state = "running"
        self.state_command: Command | None = None
        self.changed = False              # the training thread's fast-path flag
        self.connected = True
        self.rejected = 0
        self._one_shot: queue.Queue[Command] = queue.Queue()
        self._acks: queue.Queue[dict] = queue.Queue(maxsize=10_000)
        self._seen: set[str] = set()
        self._resumed = threading.Event()
        self._resumed.set()
        self.on_ack: Callable[[dict], None] | None = None

    def deliver_message(self, data: bytes | str) -> None:
        try:
            payload = json.loads(data)
            if "state" in payload:
                self.deliver_state(RunControl.model_validate(payload))
            else:
                self.deliver_command(Command.model_validate(payload))
        except Exception as exc:  # noqa: BLE001 - a bad message must not kill the listener
            log.warning("rlwatch: ignored a malformed control message: %s", exc)

    def deliver_state(self, ctl: RunControl) -> None:
        cmd = ctl.command
        if cmd is not None and not cmd.verify(self.secret):
            self.rejected += 1
            log.warning("rlwatch: rejected an unsigned or forged control state for %s", self.run_id)
            return
        if ctl.state != self.state:
            self.state, self.state_command = ctl.state, cmd
            if ctl.state == "paused":
                self._resumed.clear()
            else:
                self._resumed.set()
            self.changed = True
        if cmd is not None and cmd.action not in ("pause", "resume", "stop"):
            self.deliver_command(cmd)

    def deliver_command(self, cmd: Command) -> None:
        if not cmd.verify(self.secret):
            self.rejected += 1
            log.warning("rlwatch: rejected an unsigned or forged %s command for %s", cmd.action, self.run_id)
            return
        if cmd.id in self._seen:
            return
        if len(self._seen) > 10_000:
            self._seen.clear()
        self._seen.add(cmd.id)
        if cmd.action in ("pause", "resume", "stop"):
            state = {"pause": "paused", "resume": "running", "stop": "stopped"}[cmd.action]
            if self.state == state:
                # nothing to change (a second pause of a paused run): say so, or the monitor
                # would take the silence for a worker that ignores its brake
                self.ack(cmd, "applied", f"already {state}")
            elif self.state != "stopped":
                self.deliver_state(RunControl(run_id=self.run_id, state=state, command=cmd))
        else:
            self._one_shot.put(cmd)
            self.changed = True

    # -- training thread ------------------------------------------------------------------------
    def ack(self, cmd: Command | None, status: str, detail: str = "") -> None:
        if cmd is None:
            return
        ack = {"type": "ack", "command_id": cmd.id, "run_id": self.run_id, "action": cmd.action,
               "status": status, "detail": detail, "rank": self.rank, "ts": self.clock()}
        if self.on_ack is not None:
            self.on_ack(ack)
            return
        try:
            self._acks.put_nowait(ack)
        except queue.Full:
            pass

    def take_one_shots(self) -> list[Command]:
        out = []
        while True:
            try:
                out.append(self._one_shot.get_nowait())
            except queue.Empty:
                return out

    def wait_resumed(self, timeout: float | None) -> bool:
        return self._resumed.wait(timeout)

    def close(self) -> None:
        self._resumed.set()


class ControlListener(CommandInbox):
    """A :class:`CommandInbox` fed from Redis by a daemon thread."""

    def __init__(self, redis_url: str, run_id: str, rank: int = 0, *, secret: str | None = None,
                 clock: Callable[[], float] = time.time):
        super().__init__(run_id, rank, secret=secret, clock=clock)
        self.redis_url = redis_url
        self.connected = False
        self.started_at = clock()
        self._stale_noted = False
        self._closing = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlwatch-control", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the first connection attempt finished (for tests and the demo)."""
        return self._ready.wait(timeout)

    # -- listener thread ------------------------------------------------------------------------
    def _run(self) -> None:
        import redis

        warned_at = 0.0
        while not self._closing.is_set():
            client = pubsub = None
            try:
                client = redis.Redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=3)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(channel(self.run_id))
                raw = client.get(state_key(self.run_id))
                if raw:
                    ctl = RunControl.model_validate_json(raw)
                    if ctl.state == "stopped" and (ctl.updated or 0) < self.started_at:
                        if not self._stale_noted:
                            log.warning("rlwatch: run %s was stopped before this process started; "
                                        "ignoring that stop (a relaunch)", self.run_id)
                            self._stale_noted = True
                    else:
                        self.deliver_state(ctl)
                # one-shot commands sent while this worker was away (and since it started)
                for raw_cmd in reversed(client.lrange(pending_key(self.run_id), 0, 99)):
                    cmd = Command.model_validate_json(raw_cmd)
                    if cmd.ts >= self.started_at:
                        self.deliver_command(cmd)   # ids already seen are skipped
                if not self.connected and warned_at:
                    log.warning("rlwatch: control channel back (%s); authoritative state is %s",
                                _mask(self.redis_url), self.state)
                self.connected = True
                self._ready.set()
                while not self._closing.is_set():
                    self._send_acks(client)
                    msg = pubsub.get_message(timeout=0.2)
                    if msg and msg.get("type") == "message":
                        self.deliver_message(msg["data"])
                self._send_acks(client)
            except Exception as exc:  # noqa: BLE001 - any Redis failure: keep training, say so
                self.connected = False
                self._ready.set()
                now = time.monotonic()
                if now - warned_at > 60:
                    log.warning("rlwatch: control channel unreachable (%s: %s); training continues "
                                "without remote pause/stop until it returns",
                                type(exc).__name__, exc)
                    warned_at = now
                self._closing.wait(1.0)
            finally:
                for c in (pubsub, client):
                    try:
                        if c is not None:
                            c.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _send_acks(self, client) -> None:
        while True:
            try:
                ack = self._acks.get_nowait()
            except queue.Empty:
                return
            try:
                client.xadd(audit_key(self.run_id), {"entry": json.dumps(ack)}, maxlen=10_000,
                            approximate=True)
                client.hset(f"rlwatch:acks:{self.run_id}", ack["command_id"], json.dumps(ack))
            except Exception:
                self._acks.put(ack)   # keep it for the next connection; an ack must not be lost
                raise

    def close(self) -> None:
        self._closing.set()
        super().close()
        self._thread.join(timeout=3)
