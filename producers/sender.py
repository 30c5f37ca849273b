"""Background sending of events: a bounded buffer in front of a transport.

The training thread only appends to the buffer (microseconds, never the network). A daemon
thread serialises and hands batches to the :class:`Transport`. When the buffer is full the
oldest event is dropped and counted; the count is reported in the next event that gets
through (``dropped_events`` on a heartbeat) once the broker is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Protocol

from contract.events import dump_event

__all__ = ["BackgroundSender", "KafkaTransport", "PartialDelivery", "Transport"]

log = logging.getLogger("rlwatch.producers")


class PartialDelivery(Exception):
    """Some of a batch was delivered: ``failed`` holds the positions (in the batch handed to
    ``send``) of the items that were not, the only ones sent again (a retry of the whole batch
    would write a second copy of the others)."""

    def __init__(self, failed: list[int], cause: BaseException):
        super().__init__(f"{len(failed)} event(s) not delivered: {type(cause).__name__}: {cause}")
        self.failed = failed


class Transport(Protocol):
    """Where serialised events go. ``send`` may block; it runs on the sender thread."""

    def send(self, items: list[tuple[bytes, bytes]]) -> None:
        """Deliver (key, value) pairs; raise on failure: :class:`PartialDelivery` when only
        some items failed (those are retried), anything else to retry the whole batch."""

    def close(self, timeout: float) -> None: ...


def _as_float(x) -> float:
    item = getattr(x, "item", None)   # numpy and torch scalars
    return float(item() if callable(item) else x)


class KafkaTransport:
    """kafka-python producer to the events topic. Connects lazily, reconnects on failure."""

    SETTLE_SECONDS = 15.0   # how long send() waits for the client's answer on each record

    #: what a broker answers a write with acks=all when the topic has fewer in-sync replicas than
    #: its min.insync.replicas (a topic of one replica on a cluster that asks for two)
    UNDER_REPLICATED = ("NotEnoughReplicasError", "NotEnoughReplicasAfterAppendError")

    def __init__(self, bootstrap: str, topic: str = "rlwatch.events", **config):
        self.bootstrap, self.topic, self.config = bootstrap, topic, config
        self._producer = None
        self.acks_one = False     # acks=all was refused: publishing with acks=1 (said once)

    def _connect(self):
        from kafka import KafkaProducer

        # delivery_timeout_ms < SETTLE_SECONDS: records the client could not deliver expire
        # inside send()'s wait, before the batch is handed back for a retry. bootstrap_timeout_ms
        # keeps a first connection to a broker that is down from holding the sender thread for
        # long. Where the client has an idempotent producer (kafka-python 3), it is on, with the
        # acks=all it needs: the client's own retry of a request whose answer was lost is then
        # not written twice. kafka-python 2.x refuses settings it does not know, so only those
        # the client knows are passed.
        known = KafkaProducer.DEFAULT_CONFIG
        ours = dict(linger_ms=5, acks=1, max_block_ms=2000, request_timeout_ms=5000, retries=2,
                    delivery_timeout_ms=8000, bootstrap_timeout_ms=2000, client_id="rlwatch-sdk")
        if "enable_idempotence" in known:
            wants_all = self.config.get("acks", "all") in ("all", -1) and not self.acks_one
            ours.update(acks="all" if wants_all else 1, enable_idempotence=wants_all)
        return KafkaProducer(bootstrap_servers=self.bootstrap,
                             **{**{k: v for k, v in ours.items() if k in known}, **self.config})

    def send(self, items):
        if self._producer is None:
            self._producer = self._connect()
        held, failed, first = [], [], None
        for i, (k, v) in enumerate(items):
            try:
                held.append((i, self._producer.send(self.topic, key=k, value=v)))
            except Exception as exc:  # noqa: BLE001 - not handed to the client (no metadata in
                failed.append(i)      # max_block_ms, its buffer full): safe to send again
                first = first or exc
        # A record the client holds may still be written, so it is only handed back for a retry
        # once the client has given up on it: the wait covers the client's own delivery timeout
        # (a flush() that timed out used to hand the whole batch back while the client still held
        # it, and both copies reached the topic).
        deadline = time.monotonic() + self.SETTLE_SECONDS
        try:
            self._producer.flush(timeout=self.SETTLE_SECONDS)
        except Exception:  # noqa: BLE001 - a timeout: each record's own future says what happened
            pass
        for i, f in held:
            try:
                f.get(timeout=max(0.0, deadline - time.monotonic()))  # raises its delivery error
            except Exception as exc:  # noqa: BLE001 - any delivery error: this item is retried
                failed.append(i)
                first = first or exc
        if failed:
            if type(first).__name__ in self.UNDER_REPLICATED and "acks" not in self.config and not self.acks_one:
                self._acks_one(first)
            if len(failed) == len(items):
                raise first
            raise PartialDelivery(sorted(failed), first)

    def _acks_one(self, refusal: BaseException) -> None:
        """The broker refuses acks=all for the events topic: go on with acks=1 (the idempotent
        producer needs all, so it goes too), and say so once: events keep flowing, and a
        retry the client makes after a lost answer may then write a record twice."""
        log.warning("rlwatch: the broker refused to write events with acks=all (%s: the topic %s has fewer "
                    "in-sync replicas than its min.insync.replicas); publishing with acks=1 from now on",
                    type(refusal).__name__, self.topic)
        self.acks_one = True
        self.close(1.0)       # the next send connects again, with acks=1

    def close(self, timeout):
        if self._producer is not None:
            try:
                self._producer.close(timeout=timeout)
            except Exception:  # noqa: BLE001 - closing must never raise into training
                pass
            self._producer = None


class BackgroundSender:
    """A bounded queue of events drained by one daemon thread."""

    def __init__(self, transport: Transport, *, capacity: int = 10_000, batch: int = 500,
                 clock: Callable[[], float] = time.time, on_error: Callable[[str], None] | None = None):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.transport, self.capacity, self.batch, self.clock = transport, capacity, batch, clock
        self._q: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._in_flight = 0       # events taken from the buffer and not yet delivered or requeued
        self.dropped = 0          # dropped since the last report
        self.dropped_total = 0    # dropped over the sender's life
        self.sent = 0
        self.failures = 0
        self.invalid = 0          # events that could not be serialised (counted, reported once)
        self.last_error: str | None = None
        self._reported_down = False
        self._probe = False       # the last send failed: probe the broker before the next batch
        self._on_error = on_error or (lambda msg: log.warning(msg))
        self._thread = threading.Thread(target=self._run, name="rlwatch-sender", daemon=True)
        self._thread.start()

    def put(self, key: bytes, event: dict) -> None:
        """Queue one event (a contract-shaped dict). Never blocks on the network."""
        with self._lock:
            if len(self._q) >= self.capacity:
                self._q.popleft()
                self.dropped += 1
                self.dropped_total += 1
            self._q.append((key, event))
        if not self._wake.is_set():
            self._wake.set()

    def pending(self) -> int:
        return len(self._q)

    def _take(self) -> list:
        with self._lock:
            n = min(self.batch, len(self._q))
            self._in_flight = n
            return [self._q.popleft() for _ in range(n)]

    def _requeue(self, items: list) -> None:
        with self._lock:
            self._in_flight = 0
            room = self.capacity - len(self._q)
            keep = items[-room:] if room > 0 else []
            lost = len(items) - len(keep)
            self.dropped += lost
            self.dropped_total += lost
            self._q.extendleft(reversed(keep))

    def _run(self) -> None:
        backoff = 0.05
        while True:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            while True:
                items = self._take()
                if not items:
                    break
                if not self._deliver(items):
                    if self._stop:
                        return
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                backoff = 0.05
            if self._stop:
                return

    def _deliver(self, items: list) -> bool:
        """Send one batch taken from the buffer; False (the batch requeued) if it failed.

        After a failure the broker is probed first with a lone heartbeat, and the batch goes
        only once it is answered. A record the client gave up on while its request was on the
        wire may have been written anyway (a broker that came back and answered late); the
        batch handed over as the broker returns would then be written twice. A heartbeat
        written twice is harmless: the monitor reads it as a sign of life."""
        key, like = items[0]
        try:
            if self._probe:
                self.transport.send([(key, dump_event(self._heartbeat(like)))])
                self._probe = False
        except Exception as exc:  # noqa: BLE001 - the broker is still away: nothing else was sent
            self._failed(exc, items)
            return False
        report = None
        if self.dropped:
            report = self._heartbeat(like, dropped_events=self.dropped)
        sendable = [(k, e, v) for k, e, v in ((k, e, self._serialise(e)) for k, e in items) if v]
        payload = [(k, v) for k, _, v in sendable]
        if report is not None:
            payload.append((key, dump_event(report)))
        try:
            self.transport.send(payload)
        except Exception as exc:  # noqa: BLE001 - any transport failure is survivable
            if isinstance(exc, PartialDelivery):
                # the others are in the topic: only the failed ones go again
                items = [(sendable[i][0], sendable[i][1]) for i in exc.failed if i < len(sendable)]
                self.sent += len(sendable) - len(items)
                if report is not None and len(payload) - 1 not in exc.failed:
                    with self._lock:
                        self.dropped -= report["dropped_events"]
            self._failed(exc, items)
            return False
        self.sent += len(sendable)
        self._in_flight = 0
        if report is not None:
            with self._lock:
                self.dropped -= report["dropped_events"]
        if self._reported_down:
            log.warning("rlwatch: event publishing recovered")
            self._reported_down = False
        return True

    def _failed(self, exc: BaseException, items: list) -> None:
        """A send failed: say so once per outage, probe before the next batch, requeue ``items``."""
        self.failures += 1
        self._probe = True
        self.last_error = f"{type(exc).__name__}: {exc}"
        if not self._reported_down:
            self._on_error(f"rlwatch: cannot publish events ({self.last_error}); "
                           "training continues, events are buffered "
                           f"(capacity {self.capacity}, oldest dropped when full)")
            self._reported_down = True
        self._requeue(items)

    def _serialise(self, event: dict) -> bytes | None:
        """Strict JSON of an event; numpy/torch scalars become floats; None if impossible."""
        try:
            return dump_event(event)
        except (TypeError, ValueError):
            pass
        try:
            fixed = dict(event)
            for field in ("metrics", "groups"):
                if field in fixed:
                    fixed[field] = {k: (_as_float(v) if field == "metrics" else
                                        {c: _as_float(x) for c, x in v.items()})
                                    for k, v in fixed[field].items()}
            if "dists" in fixed:
                fixed["dists"] = {k: [_as_float(x) for x in v] for k, v in fixed["dists"].items()}
            return dump_event(fixed)
        except Exception as exc:  # noqa: BLE001 - a bad event is counted, never fatal
            self.invalid += 1
            if self.invalid == 1:
                self._on_error(f"rlwatch: dropped an event that cannot be written as JSON: {exc}")
            return None

    def _heartbeat(self, like: dict, **extra) -> dict:
        """A heartbeat of the run and rank of the queued event ``like``, at its step."""
        return {"schema": 1, "kind": "heartbeat", "run_id": like["run_id"], "step": like["step"],
                "rank": like.get("rank", 0), "ts": self.clock(), **extra}

    def flush(self, timeout: float) -> bool:
        """Wait until the buffer is empty (or ``timeout``); True if everything went out."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while time.monotonic() < deadline:
            with self._lock:
                if not self._q and not self._in_flight:
                    return True
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        with self._lock:
            return not self._q and not self._in_flight

    def close(self, timeout: float = 5.0) -> bool:
        ok = self.flush(timeout)
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=max(0.1, timeout))
        self.transport.close(timeout=1.0)
        return ok
