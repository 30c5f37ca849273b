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
from collections import OrderedDict
from typing import Callable

from contract.commands import (
    AUDIT_LENGTH,
    FRESH_SECONDS,
    SKEW_SECONDS,
    Command,
    RunControl,
    ack_signature,
    acks_key,
    audit_key,
    channel,
    implied_state,
    pending_key,
    refusal,
    state_key,
)

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

    Only commands that :func:`contract.commands.refusal` lets through are obeyed (signed when a
    secret is set, for this run, issued since this process started, fresh, not older than the
    last state change applied); the run's state is derived from them alone. Each command id is
    applied once; a brake that arrives again (the monitor re-sends until it hears back) is
    acknowledged again.
    """

    def __init__(self, run_id: str, rank: int = 0, *, secret: str | None = None,
                 clock: Callable[[], float] = time.time, started_at: float | None = None,
                 world_size: int | None = None):
        self.run_id, self.rank, self.secret, self.clock = run_id, rank, secret, clock
        #: the run's number of ranks, in each acknowledgement when known: the monitor then waits
        #: for every rank's answer before it tells that a brake holds, and names the silent ones
        self.world_size = world_size
        self.started_at = clock() if started_at is None else started_at
        self.state = "running"
        self.state_command: Command | None = None
        self.changed = False              # the training thread's fast-path flag
        self.closed = False
        self.connected = True
        self.rejected = 0
        self.refusals: dict[str, int] = {}
        self._one_shot: queue.Queue[Command] = queue.Queue()
        self._acks: queue.Queue[dict] = queue.Queue(maxsize=10_000)
        self._seen: OrderedDict[str, float] = OrderedDict()   # command id -> when it was seen
        self._last_ack: dict[str, dict] = {}                  # command id -> its latest ack
        self._lock = threading.Lock()
        # set when a paused training thread has something to do: a resume or a stop, a one-shot
        # command (adjust, rollback, snapshot: applied while paused, as an operator expects),
        # or the monitor closing
        self._news = threading.Event()
        self.on_ack: Callable[[dict], None] | None = None

    # -- delivering thread ----------------------------------------------------------------------
    def deliver_message(self, data: bytes | str) -> None:
        """A message from the run's channel. A ``state`` message is obeyed only for the signed
        command inside it (its ``state`` field is ignored); a bare state is refused."""
        try:
            payload = json.loads(data)
            if isinstance(payload, dict) and "state" in payload and "action" not in payload:
                ctl = RunControl.model_validate(payload)
                if ctl.command is None:
                    self._refuse(None, "a state message without a command")
                    return
                self.deliver_command(ctl.command)
            else:
                self.deliver_command(Command.model_validate(payload))
        except Exception as exc:  # noqa: BLE001 - a bad message must not kill the listener
            log.warning("rlwatch: ignored a malformed control message: %s", exc)

    def deliver_state(self, ctl: RunControl) -> None:
        """The stored state of the run (read when connecting): only its signed command counts,
        and only if it was issued since this process started."""
        if ctl.command is None:
            if ctl.state != "running":
                self._refuse(None, f"a stored {ctl.state!r} state without a command")
            return
        self.deliver_command(ctl.command, live=False)

    def deliver_command(self, cmd: Command, *, live: bool = True) -> None:
        with self._lock:
            self._deliver(cmd, live)

    def _deliver(self, cmd: Command, live: bool) -> None:
        now = self.clock()
        if cmd.id in self._seen:
            if cmd.verify(self.secret) and cmd.run_id == self.run_id:
                self._ack_again(cmd)
            return
        last = self.state_command.ts if self.state_command is not None else None
        why = refusal(cmd, run_id=self.run_id, secret=self.secret, now=now,
                      started_at=self.started_at, last_state_ts=last, live=live)
        if why is not None:
            self._refuse(cmd, why)
            return
        self._remember(cmd.id, now)
        state = implied_state(cmd.action)
        if state is None:
            self._one_shot.put(cmd)
            self.changed = True
            self._news.set()
        elif self.state == state:
            # nothing to change (a second pause of a paused run): say so, or the monitor
            # would take the silence for a worker that ignores its brake
            self.ack(cmd, "applied", f"already {state}")
        elif self.state == "stopped":
            # this process was told to stop; only a relaunch (a new process) trains again
            self.ack(cmd, "ignored", "this process was stopped")
        else:
            self.state, self.state_command = state, cmd
            self.changed = True
            if state != "paused":
                self._news.set()

    def _remember(self, command_id: str, now: float) -> None:
        self._seen[command_id] = now
        # ids need remembering only while the command could still be accepted (it is fresh)
        while self._seen and (len(self._seen) > 100_000 or
                              next(iter(self._seen.values())) < now - FRESH_SECONDS - SKEW_SECONDS):
            old, _ = self._seen.popitem(last=False)
            self._last_ack.pop(old, None)

    def _ack_again(self, cmd: Command) -> None:
        """A command applied before arrived again: repeat its acknowledgement (the first one may
        not have reached the monitor)."""
        last = self._last_ack.get(cmd.id)
        if last is not None:
            self._emit(dict(last, ts=self.clock(), repeat=True))

    def _refuse(self, cmd: Command | None, why: str) -> None:
        self.rejected += 1
        self.refusals[why] = self.refusals.get(why, 0) + 1
        what = f"{cmd.action} command {cmd.id[:12]}" if cmd is not None else "control message"
        if self.refusals[why] <= 3:   # a flood of forgeries must not flood the training log
            log.warning("rlwatch: refused a %s for run %s: %s", what, self.run_id, why)

    # -- training thread ------------------------------------------------------------------------
    def ack(self, cmd: Command | None, status: str, detail: str = "") -> None:
        if cmd is None:
            return
        ack = {"type": "ack", "command_id": cmd.id, "run_id": self.run_id, "action": cmd.action,
               "status": status, "detail": detail, "rank": self.rank, "ts": self.clock()}
        if self.world_size:
            ack["world_size"] = self.world_size
        self._last_ack[cmd.id] = ack
        self._emit(ack)

    def _emit(self, ack: dict) -> None:
        sig = ack_signature(ack, self.secret)
        if sig is not None:
            ack = {**ack, "signature": sig}
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

    def wait_news(self, timeout: float | None) -> bool:
        """Block a paused training thread until it has something to do (a resume or a stop, a
        one-shot command to apply, the monitor closing); False when ``timeout`` passed first.
        (It may also wake for nothing; the caller looks and waits again.)"""
        got = self._news.wait(timeout)
        self._news.clear()
        return got

    def close(self) -> None:
        """Release a training thread blocked in a pause (it returns from ``step_boundary``)."""
        self.closed = True
        self._news.set()


class ControlListener(CommandInbox):
    """A :class:`CommandInbox` fed from Redis by a daemon thread."""

    def __init__(self, redis_url: str, run_id: str, rank: int = 0, *, secret: str | None = None,
                 clock: Callable[[], float] = time.time, world_size: int | None = None):
        super().__init__(run_id, rank, secret=secret, clock=clock, world_size=world_size)
        self.redis_url = redis_url
        self.connected = False
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
                    self.deliver_state(RunControl.model_validate_json(raw))
                # one-shot commands sent while this worker was away (and since it started)
                for raw_cmd in reversed(client.lrange(pending_key(self.run_id), 0, 99)):
                    self.deliver_command(Command.model_validate_json(raw_cmd), live=False)
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
                client.xadd(audit_key(self.run_id), {"entry": json.dumps(ack)}, maxlen=AUDIT_LENGTH,
                            approximate=True)
                client.hset(acks_key(self.run_id), ack["command_id"], json.dumps(ack))
            except Exception:
                self._acks.put(ack)   # keep it for the next connection; an ack must not be lost
                raise

    def close(self) -> None:
        self._closing.set()
        super().close()
        self._thread.join(timeout=3)
