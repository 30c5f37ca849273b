"""producers.sender.BackgroundSender: bounded buffer, exact drop accounting, drop report,
non-blocking put, flush on close. The transport is a fake (no Kafka)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from producers.sender import BackgroundSender, KafkaTransport

WAIT = 10.0  # generous upper bound for background progress; tests finish far sooner


class FakeTransport:
    """Raises while down, records while up; can also block inside send() on a gate."""

    def __init__(self, up: bool = True):
        self.up = up
        self.gate = threading.Event()
        self.gate.set()
        self.in_send = threading.Event()
        self.lock = threading.Lock()
        self.attempts = 0
        self.delivered: list[tuple[bytes, dict]] = []
        self.closed = False

    def send(self, items):
        with self.lock:
            self.attempts += 1
        self.in_send.set()
        self.gate.wait()
        if not self.up:
            raise ConnectionError("broker down")
        with self.lock:
            self.delivered.extend((k, json.loads(v)) for k, v in items)

    def close(self, timeout):
        self.closed = True

    # helpers for the tests
    def steps(self):
        return [e["step"] for _, e in self.delivered if e["kind"] == "step"]

    def reports(self):
        return [e for _, e in self.delivered if "dropped_events" in e]


def wait_until(cond, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return False


def ev(step, run_id="run-a"):
    return {"schema": 1, "kind": "step", "run_id": run_id, "rank": 0, "step": step,
            "ts": 1764500000.0 + step, "metrics": {"kl/mean": 0.02, "x": float("nan")}}


@pytest.fixture
def senders():
    made = []
    yield made
    for s, t in made:
        t.up = True
        t.gate.set()
        s.close(timeout=2.0)


def make(senders, transport, **kw):
    s = BackgroundSender(transport, **kw)
    senders.append((s, transport))
    return s


def test_events_are_delivered_as_strict_json_with_their_key(senders):
    t = FakeTransport(up=True)
    s = make(senders, t, capacity=100)
    for i in range(10):
        s.put(b"run-a", ev(i))
    assert s.flush(WAIT)
    assert t.steps() == list(range(10))
    assert {k for k, _ in t.delivered} == {b"run-a"}
    assert t.delivered[0][1]["metrics"]["x"] == "NaN"   # non-finite as the contract string
    assert s.dropped_total == 0 and s.sent == 10 and t.reports() == []


def test_exactly_put_minus_capacity_events_are_dropped_while_down_and_reported_after(senders):
    capacity, n = 50, 130
    t = FakeTransport(up=False)
    s = make(senders, t, capacity=capacity)
    for i in range(n):
        s.put(b"run-a", ev(i))
    # let the sender settle: two attempts after the last put means every event was taken
    # from the buffer after the puts ended, so all drops are accounted for
    a0 = t.attempts
    assert wait_until(lambda: t.attempts >= a0 + 2)
    assert s.dropped_total == n - capacity
    assert t.delivered == []
    assert s.failures >= 2 and "broker down" in s.last_error

    t.up = True
    assert s.flush(WAIT)
    # the newest `capacity` events got through, the oldest were dropped
    assert t.steps() == list(range(n - capacity, n))
    [report] = t.reports()
    assert report["dropped_events"] == n - capacity
    assert report["kind"] == "heartbeat" and report["run_id"] == "run-a"
    assert s.dropped_total == n - capacity and s.dropped == 0
    # the report is a valid contract event
    from contract.events import parse_event
    assert parse_event(json.dumps(report), 0.0).kind == "heartbeat"


def test_a_drop_report_is_sent_once(senders):
    t = FakeTransport(up=False)
    s = make(senders, t, capacity=5)
    for i in range(8):
        s.put(b"k", ev(i))
    a0 = t.attempts
    assert wait_until(lambda: t.attempts >= a0 + 2)
    t.up = True
    assert s.flush(WAIT)
    for i in range(8, 12):
        s.put(b"k", ev(i))
    assert s.flush(WAIT)
    assert [r["dropped_events"] for r in t.reports()] == [3]
    assert t.steps() == list(range(3, 12))


def test_put_never_blocks_while_the_transport_is_stuck(senders):
    t = FakeTransport(up=True)
    t.gate.clear()                 # send() will block until the gate opens
    s = make(senders, t, capacity=20)
    s.put(b"k", ev(0))
    assert t.in_send.wait(WAIT)    # the sender thread is now stuck inside send()

    done = threading.Event()

    def producer():
        for i in range(1, 101):
            s.put(b"k", ev(i))
        done.set()

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    assert done.wait(WAIT), "put() blocked while the transport was blocked"
    assert t.gate.is_set() is False   # still stuck: put() did not wait for it
    assert s.pending() == 20 and s.dropped_total == 80

    t.gate.set()
    assert s.flush(WAIT)
    assert t.steps() == [0] + list(range(81, 101))
    assert [r["dropped_events"] for r in t.reports()] == [80]


def test_close_flushes_what_is_buffered(senders):
    t = FakeTransport(up=True)
    s = BackgroundSender(t, capacity=1000, batch=7)
    for i in range(200):
        s.put(b"k", ev(i))
    assert s.close(timeout=WAIT) is True
    assert t.steps() == list(range(200))
    assert t.closed


def test_close_returns_false_when_the_transport_stays_down(senders):
    t = FakeTransport(up=False)
    s = BackgroundSender(t, capacity=10)
    s.put(b"k", ev(0))
    assert s.close(timeout=0.3) is False
    assert t.closed and t.delivered == []


def test_errors_are_reported_once_while_down(senders):
    messages = []
    t = FakeTransport(up=False)
    s = make(senders, t, capacity=10, on_error=messages.append)
    s.put(b"k", ev(0))
    assert wait_until(lambda: t.attempts >= 3)
    assert len(messages) == 1 and "training continues" in messages[0]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        BackgroundSender(FakeTransport(), capacity=0)


class HalfDelivered(FakeTransport):
    """Delivers only the items at even positions of the first ``partial`` batches (a partition
    whose batch expired while the others were written), then everything."""

    def __init__(self, partial: int = 1):
        super().__init__()
        self.partial = partial

    def send(self, items):
        from producers.sender import PartialDelivery

        with self.lock:
            self.attempts += 1
            if self.partial:
                self.partial -= 1
                self.delivered.extend((k, json.loads(v)) for i, (k, v) in enumerate(items) if i % 2 == 0)
                failed = [i for i in range(len(items)) if i % 2]
                if failed:
                    raise PartialDelivery(failed, TimeoutError("batch expired"))
                return
            self.delivered.extend((k, json.loads(v)) for k, v in items)


def test_a_partly_delivered_batch_sends_again_only_what_failed():
    t = HalfDelivered()
    s = BackgroundSender(t, capacity=100, batch=10)
    try:
        for i in range(10):
            s.put(b"run-a", ev(i))
        assert s.flush(WAIT)
    finally:
        s.close(timeout=2)
    # every event arrived once: the delivered half was not written a second time
    assert sorted(t.steps()) == list(range(10))
    assert t.attempts >= 2 and s.sent == 10 and s.failures == 1


@pytest.mark.parametrize("client", ["2.x", "3.x"])
def test_the_kafka_producer_gets_only_settings_its_client_version_knows(monkeypatch, client):
    """kafka-python 2.x refuses a setting it does not know (no bootstrap_timeout_ms, no
    enable_idempotence there): the SDK's sender connected to no broker at all with it. 3.x knows
    both: its idempotent producer is on, with the acks=all it needs (with acks=1 it turned
    itself off with a warning in every training log), unless the user asks for other acks."""
    import kafka

    made = {}

    class Producer:
        DEFAULT_CONFIG = {"bootstrap_servers": None, "client_id": None, "linger_ms": 0, "acks": 1,
                          "max_block_ms": 0, "request_timeout_ms": 0, "retries": 0,
                          "delivery_timeout_ms": 0, "compression_type": None,
                          **({"bootstrap_timeout_ms": 0, "enable_idempotence": True} if client == "3.x" else {})}

        def __init__(self, **configs):
            unknown = set(configs) - set(self.DEFAULT_CONFIG)
            assert not unknown, f"Unrecognized configs: {unknown}"      # as kafka-python does
            made.clear()
            made.update(configs)

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    KafkaTransport("127.0.0.1:9", "t", compression_type="gzip")._connect()
    assert made["compression_type"] == "gzip" and made["client_id"] == "rlwatch-sdk"
    if client == "3.x":
        assert made["enable_idempotence"] is True and made["acks"] == "all"
        assert made["bootstrap_timeout_ms"] == 2000
        KafkaTransport("127.0.0.1:9", "t", acks=1)._connect()
        assert made["acks"] == 1 and made["enable_idempotence"] is False
    else:
        assert made["acks"] == 1
        assert "enable_idempotence" not in made and "bootstrap_timeout_ms" not in made


class LateAnswer(FakeTransport):
    """A broker that comes back slowly: the first send after the outage is written, but its
    answer comes after the client gave up on it (a delivery timeout while on the wire)."""

    def __init__(self):
        super().__init__(up=False)
        self.late = True

    def send(self, items):
        with self.lock:
            self.attempts += 1
            if not self.up:
                raise ConnectionError("broker down")
            self.delivered.extend((k, json.loads(v)) for k, v in items)
            if self.late:
                self.late = False
                raise TimeoutError("Expiring 1 record(s): 8000 ms has passed since batch creation")


def test_a_late_answer_as_the_broker_returns_writes_no_event_twice(senders):
    t = LateAnswer()
    s = make(senders, t, capacity=100, batch=50)
    for i in range(30):
        s.put(b"run-a", ev(i))
    assert wait_until(lambda: s.failures >= 2)
    t.up = True
    assert s.flush(WAIT)
    # the first send after the outage was a lone heartbeat: it is the one written twice, if any
    assert t.steps() == list(range(30))
    kinds = [e["kind"] for _, e in t.delivered]
    assert kinds[0] == "heartbeat" and kinds.count("heartbeat") == 2 and s.sent == 30


class Record:
    """A kafka-python record future: done when the client answered (``error`` or not)."""

    def __init__(self, answer_after: float = 0.0, error: Exception | None = None):
        self.at, self.error = time.monotonic() + answer_after, error

    def get(self, timeout=None):
        wait = self.at - time.monotonic()
        if timeout is not None and wait > timeout:
            time.sleep(timeout)
            raise TimeoutError("Timeout after waiting for %s secs." % timeout)
        time.sleep(max(0.0, wait))
        if self.error:
            raise self.error


class Producer:
    """A kafka-python producer whose records answer as ``plan`` says, one entry per send():
    a Record, or an exception send() itself raises (no metadata within max_block_ms)."""

    def __init__(self, plan):
        self.plan, self.flushes = list(plan), []

    def send(self, topic, key=None, value=None):
        r = self.plan.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    def flush(self, timeout=None):
        self.flushes.append(timeout)
        raise TimeoutError("Timeout waiting for future")   # as kafka-python, before all answered


def transport_with(plan, settle=2.0):
    t = KafkaTransport("127.0.0.1:9", "t")
    t.SETTLE_SECONDS = settle
    t._producer = Producer(plan)
    return t


def test_records_the_client_still_holds_after_a_flush_timeout_are_not_handed_back():
    # the client answers after flush() gave up: the batch was delivered, nothing is sent again
    t = transport_with([Record(0.3), Record(0.4)])
    t.send([(b"k", b"1"), (b"k", b"2")])


def test_only_the_records_the_client_refused_or_failed_are_handed_back():
    from producers.sender import PartialDelivery

    t = transport_with([Record(0.1), TimeoutError("Failed to update metadata after 2.0 secs."),
                        Record(0.2, error=TimeoutError("Expiring 1 record(s)")), Record(0.1)])
    with pytest.raises(PartialDelivery) as got:
        t.send([(b"k", b"%d" % i) for i in range(4)])
    assert got.value.failed == [1, 2]


def test_a_record_the_client_never_answers_is_handed_back_after_the_wait():
    t = transport_with([Record(60.0)], settle=0.3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        t.send([(b"k", b"1")])
    assert time.monotonic() - t0 < 5


def test_a_topic_that_refuses_acks_all_is_published_to_with_acks_1_and_said_once(monkeypatch, caplog):
    """A topic of one replica on a cluster whose min.insync.replicas is 2 refuses every write with
    acks=all: the SDK goes on with acks=1 rather than dropping every event of the run."""
    import logging

    import kafka
    from kafka.errors import NotEnoughReplicasError

    made = []

    class Producer:
        DEFAULT_CONFIG = {"bootstrap_servers": None, "acks": 1, "enable_idempotence": True, "linger_ms": 0,
                          "max_block_ms": 0, "request_timeout_ms": 0, "retries": 0, "delivery_timeout_ms": 0,
                          "bootstrap_timeout_ms": 0, "client_id": None}

        def __init__(self, **configs):
            made.append(configs)

        def send(self, topic, key=None, value=None):
            if made[-1]["acks"] == "all":
                return Record(error=NotEnoughReplicasError("NOT_ENOUGH_REPLICAS"))
            return Record()

        def flush(self, timeout=None):
            pass

        def close(self, timeout=None):
            pass

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    t = KafkaTransport("127.0.0.1:9", "t")
    with caplog.at_level(logging.WARNING, "rlwatch"):
        with pytest.raises(NotEnoughReplicasError):
            t.send([(b"k", b"1")])
        t.send([(b"k", b"1")])          # the retry goes through, with acks=1
        t.send([(b"k", b"2")])
    assert [(m["acks"], m["enable_idempotence"]) for m in made] == [("all", True), (1, False)]
    assert caplog.text.count("publishing with acks=1") == 1
    # acks the user chose are the user's: no fallback
    made.clear()
    t = KafkaTransport("127.0.0.1:9", "t", acks="all")
    for _ in range(2):
        with pytest.raises(NotEnoughReplicasError):
            t.send([(b"k", b"1")])
    assert len(made) == 1 and not t.acks_one
