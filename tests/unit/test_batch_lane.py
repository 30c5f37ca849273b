"""The worker's batch lane (streams.batch_lane) keeps Faust's bookkeeping: the offsets it
acknowledges are the ones Faust's own acknowledgements would record (so a commit covers the
processed events and nothing else), records read already are dropped and gaps noted, the order
is Faust's round robin over partitions; and the worker's events lane (streams.app) acknowledges
before each await exactly the events it processed whose alerts Kafka has taken."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("faust")

from aiokafka.structs import ConsumerRecord  # noqa: E402
from faust.transport.utils import DefaultSchedulingStrategy  # noqa: E402
from faust.types import TP  # noqa: E402
from faust.types.tuples import ConsumerMessage  # noqa: E402

from streams.batch_lane import BatchApp, LaneBatch, Turns, dropped_changelogs, round_robin  # noqa: E402
from tests.unit._core import needs_native  # noqa: E402

TOPIC = "lane.events"


def record(partition: int, offset: int, value: bytes = b"{}", topic: str = TOPIC, key: bytes = b"k"):
    return ConsumerRecord(topic=topic, partition=partition, offset=offset,
                          timestamp=1_700_000_000_000, timestamp_type=0, key=key, value=value,
                          checksum=None, serialized_key_size=1, serialized_value_size=len(value),
                          headers=[])


def message(rec: ConsumerRecord, tp: TP) -> ConsumerMessage:
    return ConsumerMessage(rec.topic, rec.partition, rec.offset, rec.timestamp / 1000.0,
                           rec.timestamp_type, rec.headers, rec.key, rec.value, rec.checksum,
                           rec.serialized_key_size, rec.serialized_value_size, tp, generation_id=1)


def consumer():
    """A lane app's consumer (never started), acknowledgements on for the lane topic."""
    app = BatchApp("lane-test", broker="kafka://127.0.0.1:1", store="memory://",
                   key_serializer="raw", value_serializer="raw")
    topic = app.topic(TOPIC, key_type=bytes, value_type=bytes)

    async def enable():
        app.topics.add(topic)
        await app.topics._update_indices()
    asyncio.run(enable())
    assert app.topics.acks_enabled_for(TOPIC)
    return app.consumer


def bookkeeping(c, tps):
    return ({tp: list(c._acked[tp]) for tp in tps}, {tp: set(c._acked_index[tp]) for tp in tps},
            c._n_acked)


def test_lane_acks_record_what_fausts_own_acks_record():
    tps = {0: TP(TOPIC, 0), 1: TP(TOPIC, 1)}
    recs = round_robin([[record(0, o) for o in range(10, 16)],
                        [record(1, o) for o in range(3, 6)]])
    mine, faust = consumer(), consumer()
    for c in (mine, faust):
        c._committed_offset[tps[0]] = 12           # offsets up to 11 were committed before
    batch = LaneBatch(recs, mine, TOPIC, tps, generation_id=1)
    batch.ack(4)
    batch.ack(4)                                     # nothing new
    batch.ack(7)
    assert batch.acked == 7
    for rec in recs[:7]:
        faust.ack(message(rec, tps[rec.partition]))
    assert bookkeeping(mine, tps.values()) == bookkeeping(faust, tps.values())
    # what the next commit takes (Faust's own reading): partition 0 after 13, partition 1 after 5
    assert [mine._new_offset(tp) for tp in tps.values()] \
        == [faust._new_offset(tp) for tp in tps.values()] == [14, 6]
    mine._committed_offset[tps[0]] = 14              # as the commit leaves it
    batch.ack(len(batch))
    assert mine._new_offset(tps[0]) == 16 and mine._new_offset(tps[1]) is None


def test_records_read_already_are_dropped_and_a_gap_is_noted():
    c = consumer()
    tp = TP(TOPIC, 0)
    c._read_offset[tp] = 4
    kept = asyncio.run(c._lane_records(tp, [record(0, o) for o in (2, 3, 4, 5, 6)], True))
    # as Faust: the records from the read offset on
    assert [r.offset for r in kept] == [4, 5, 6] and c._read_offset[tp] == 6
    kept = asyncio.run(c._lane_records(tp, [record(0, o) for o in (9, 10)], True))
    assert [r.offset for r in kept] == [9, 10] and c._read_offset[tp] == 10
    # 7 and 8 never came: noted as Faust's fetch loop notes it (_add_gap(tp, 7, 9))
    assert [(i.begin, i.end) for i in c._gap[tp]] == [(7, 10)]
    kept = asyncio.run(c._lane_records(tp, [record(0, o) for o in (11, 13)], True))
    assert [r.offset for r in kept] == [11, 13] and c._read_offset[tp] == 13
    assert sorted((i.begin, i.end) for i in c._gap[tp]) == [(7, 10), (12, 14)]


def test_a_batch_is_in_fausts_round_robin_order():
    lists = [[record(p, o) for o in range(n)] for p, n in enumerate((5, 2, 3))]
    faust = [rec for _tp, rec in DefaultSchedulingStrategy().iterate(
        {TP(TOPIC, i): recs for i, recs in enumerate(lists)})]
    assert round_robin(lists) == faust
    assert round_robin(lists[:1]) == lists[0]


# -- the worker's events lane ----------------------------------------------------------------------

class FakeConsumer:
    """What a LaneBatch needs of its consumer: acknowledgements, flow control, the generation."""

    def __init__(self, active_for: int = 10**9):
        self.acked = 0
        self.checks = 0
        self.active_for = active_for

        def is_active():
            self.checks += 1
            return self.checks <= self.active_for
        self.app = SimpleNamespace(flow_control=SimpleNamespace(is_active=is_active),
                                   consumer_generation_id=1)

    def ack_lane(self, batch, start, stop):
        assert start == self.acked, "acknowledged in order, each once"
        self.acked = stop
        self.stops = getattr(self, "stops", []) + [stop]


def worker_lane(monkeypatch, unanswered: list | None = None):
    """The worker's events lane, its sends recorded (topic, value, records acknowledged then)
    and taken by Kafka at once; or, with ``unanswered`` a list, the alerts' acknowledgements
    left to the test (their futures appended to it)."""
    import faust.topics

    from contract.settings import Settings
    from streams.app import build_app

    sent = []

    async def send(topic, *, key=None, value=None, **kw):
        sent.append((topic.get_topic_name(), value, current["batch"].acked))
        acked = asyncio.get_running_loop().create_future()      # Kafka took it
        if unanswered is not None and topic.get_topic_name() == settings.alerts_topic:
            unanswered.append(acked)
        else:
            acked.set_result(None)
        return acked
    monkeypatch.setattr(faust.topics.Topic, "send", send)
    settings = Settings(redis="redis://127.0.0.1:1/0")
    app = build_app(settings)
    current: dict = {}

    def run(values, consumer, during=None, keys=None):
        """The lane over ``values`` (keyed ``keys``, else all alike); with ``during``, that
        coroutine function (given the lane's task) runs beside it."""
        recs = [record(0, i, v, topic=settings.events_topic, key=keys[i] if keys else b"k")
                for i, v in enumerate(values)]
        tps = {0: TP(settings.events_topic, 0)}
        batch = current["batch"] = LaneBatch(recs, consumer, settings.events_topic, tps, 1)

        async def both() -> None:
            lane = asyncio.ensure_future(app.batch_lanes[settings.events_topic](batch))
            if during is not None:
                await during(lane)
            await lane
        asyncio.run(both())
        return batch
    return run, sent, app, settings


def step(run_id: str, s: int) -> bytes:
    return json.dumps({"schema": 1, "kind": "step", "run_id": run_id, "step": s, "ts": 1.7e9 + s,
                       "metrics": {"kl/mean": 0.01}}).encode()


def no_turns(monkeypatch) -> None:
    """The lane's clock stands still: one turn for the whole batch, whatever the host's speed
    (a slow first event, the rules compiled, would otherwise end a turn early)."""
    import streams.batch_lane as lane
    monkeypatch.setattr(lane, "monotonic", lambda: 1000.0)


def test_the_events_lane_acknowledges_the_processed_events_before_each_await(monkeypatch):
    no_turns(monkeypatch)
    run, sent, app, settings = worker_lane(monkeypatch)
    c = FakeConsumer()
    batch = run([step("a", 0), step("a", 1), b"not json", step("a", 2), b"{}", step("a", 3)], c)
    # the dead letters went out in order at the turn's end, with every event before the first
    # of them acknowledged and that one not yet
    assert [(t, acked) for t, _v, acked in sent] == [(settings.dlq_topic, 2),
                                                      (settings.dlq_topic, 2)]
    assert [json.loads(v)["raw"] for _t, v, _a in sent] == ["not json", "{}"]
    assert json.loads(sent[0][1])["reason"]
    assert c.acked == len(batch) == 6
    assert app.rlwatch_counters["events"] == 4 and app.rlwatch_counters["dlq"] == 2


def test_a_rebalance_stops_the_events_lane_with_the_processed_events_acknowledged(monkeypatch):
    run, sent, app, _settings = worker_lane(monkeypatch)
    c = FakeConsumer(active_for=3)
    run([step("b", s) for s in range(6)], c)
    assert c.acked == 3 and app.rlwatch_counters["events"] == 3 and not sent
    assert app.rlwatch_states.get("b").last_step == {0: 2}


def test_a_rebalance_stops_a_run_at_a_time_lane_acknowledging_only_the_first_records_all_taken(
        monkeypatch):
    """Two runs interleaved, a rebalance after four events: run a's three and run b's first
    were taken, the first three records of the batch (a0, b0, a1) are acknowledged, and the
    rest (b1, a2, b2) is read again by whoever owns the partition next (a2, which run a's state
    already holds, as a duplicate)."""
    run, sent, app, _settings = worker_lane(monkeypatch)
    c = FakeConsumer(active_for=4)
    keys = [b"a", b"b"] * 3
    run([step(k.decode(), s) for s in range(3) for k in (b"a", b"b")], c, keys=keys)
    assert c.acked == 3 and app.rlwatch_counters["events"] == 4 and not sent
    assert app.rlwatch_states.get("a").last_step == {0: 2}
    assert app.rlwatch_states.get("b").last_step == {0: 0}


def test_turns_come_after_so_many_seconds_of_work_however_many_records():
    now = [100.0]
    turns = Turns(0.005, clock=lambda: now[0])
    now[0] += 0.004
    assert not turns.due()
    now[0] += 0.001
    assert turns.due()
    now[0] += 0.003                   # the other tasks' turn took 3 ms: not counted as work
    turns.taken()
    now[0] += 0.004
    assert not turns.due()
    now[0] += 0.002
    assert turns.due()


@pytest.mark.parametrize("ms_per_read, turns_at", [(0.0, []), (1000 / 256, [3, 6, 9, 12, 15, 18])])
def test_the_events_lane_gives_the_loop_a_turn_after_so_many_milliseconds(monkeypatch, ms_per_read,
                                                                         turns_at):
    """Events that take long (here: about 4 ms of the clock per read of it, exact in binary)
    get the loop's other tasks a turn after every 10 ms of work, acknowledging what was
    processed first; events that take no time get none within a batch."""
    import streams.batch_lane as lane

    now = [1000.0]

    def clock():
        now[0] += ms_per_read / 1000     # 1/256 s: no rounding near a turn
        return now[0]
    monkeypatch.setattr(lane, "monotonic", clock)
    run, _sent, _app, _settings = worker_lane(monkeypatch)
    c = FakeConsumer()
    run([step("t", s) for s in range(20)], c)
    assert c.stops[:-1] == turns_at and c.stops[-1] == 20


def seek_consumer(committed: dict, app_id: str = "lane-seek"):
    """A lane app's consumer (never started) whose table's changelog is "lane-seek-runs-changelog",
    assigned ``committed``'s partitions, the broker's committed offsets (None: nothing committed)
    served by ``seek_to_committed``; returns it and the partitions it sent to their beginning.
    (The app is this test's own: its attributes are set, not monkeypatched, as undoing a
    monkeypatch on a mode service upsets Python 3.11's AST checks later in the session.)"""
    app = BatchApp(app_id, broker="kafka://127.0.0.1:1", store="memory://",
                   key_serializer="raw", value_serializer="raw")
    app.tables = SimpleNamespace(changelog_topics={"lane-seek-runs-changelog"})
    c = app.consumer
    to_beginning: list = []

    async def seek_to_committed():
        return dict(committed)

    async def earliest_offsets(*tps):
        return {tp: 3 for tp in tps}      # the log's start (older records deleted)

    async def seek_wait(offsets):
        assert set(offsets.values()) == {3}
        to_beginning.extend(offsets)

    c.seek_to_committed, c.earliest_offsets, c.seek_wait = seek_to_committed, earliest_offsets, seek_wait
    c.assignment = lambda: set(committed)
    return c, to_beginning


def test_a_partition_with_nothing_committed_is_read_again_from_its_beginning():
    # records fetched while the flow stopped (recovery, a rebalance) are dropped; the seek back
    # must bring them again even where no offset was committed yet (a new group, or a worker
    # that died before its first commit), or those events and alerts are lost. Where every
    # partition has a committed offset, Faust's seek is left as it is.
    events0, events1, alerts0 = TP(TOPIC, 0), TP(TOPIC, 1), TP("lane.alerts", 0)
    changelog = TP("lane-seek-runs-changelog", 0)
    fresh = seek_consumer({events0: None, events1: 42, alerts0: None, changelog: None})
    committed = seek_consumer({events0: 7, alerts0: 1}, "lane-seek-2")

    async def seek_both():
        for c, _ in (fresh, committed):
            await c.perform_seek()
    asyncio.run(seek_both())
    (c, to_beginning), (c2, to_beginning2) = fresh, committed
    assert sorted(to_beginning) == sorted([events0, alerts0])   # not the table's changelog
    assert c._read_offset[events1] == 42 and c._committed_offset[events1] == 42
    assert to_beginning2 == [] and c2._read_offset[events0] == 7


def test_resuming_a_flow_that_was_not_suspended_keeps_the_agents_queues():
    # a worker's recovery resumes the flow to read the changelogs, resumes the stream partitions,
    # seeks them, then resumes the flow again: Faust's second resume emptied the agents' queues,
    # and a message fetched in between (counted as read already) was never processed. A worker
    # that took over from one killed right after it published an alert lost that alert's brake.
    def final_resume_keeps(app) -> bool:
        fc = app.flow_control
        q = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
        fc.resume()                   # the changelogs are read
        q.put_nowait("alert @0")      # fetched once the stream partitions were resumed
        fc.resume()                   # the recovery's last step
        kept = q.qsize() == 1
        q.put_nowait("stale")
        fc.suspend()                  # a rebalance: what was queued belongs to the old assignment
        fc.resume()
        assert q.empty(), "a resume that ends a suspension must still empty the queues"
        return kept

    assert final_resume_keeps(BatchApp("lane-flow", broker="kafka://127.0.0.1:1"))
    import faust
    assert not final_resume_keeps(faust.App("lane-flow-faust", broker="kafka://127.0.0.1:1"))  # the bug


def test_commits_are_spaced_out_while_the_writes_before_them_take_long(monkeypatch):
    """The periodic commit comes every ``commit_interval`` while the hooks before it (the run
    states written to the table) are quick, and later when they take more than a fiftieth of
    that: a worker of a thousand runs spent about 15 % of its time on them and their sending."""
    import streams.batch_lane as lane
    from faust.transport.drivers import aiokafka as driver

    assert [lane.commit_gap(s, 2.8) for s in (0.0, 0.01, 0.15, 9.0)] == [2.8, 2.8, 7.5, 30.0]
    c = consumer()
    clock, hook, waits, commits, starts = [1000.0], [0.001], [], [], []

    async def committed(self, topics=None, start_new_transaction=True):
        commits.append(round(clock[0], 3))
        return True

    def write_states():
        starts.append(clock[0])
        clock[0] += hook[0]

    async def sleep(seconds):
        waits.append(round(seconds, 3))
        clock[0] += seconds
        if len(commits) == 3:
            hook[0] = 0.2                   # the fleet grew: its writes take 0.2 s
        if len(commits) >= 6:
            c._stopped.set()

    monkeypatch.setattr(driver.Consumer, "commit", committed)
    monkeypatch.setattr(lane, "monotonic", lambda: clock[0])
    c.app.before_commit.append(write_states)
    c.sleep = sleep
    asyncio.run(type(c)._commit_handler(c))
    assert len(commits) == len(starts) == 6          # every commit after its hooks
    gaps = [round(b - a, 3) for a, b in zip(starts, starts[1:])]
    assert gaps == [2.8, 2.8, 2.8, 10.0, 10.0]     # 0.2 s of writes: 10 s apart
    # the commit every 10,000 messages waits as long, and only then
    c._n_acked = 10_000
    clock[0] = starts[-1] + 9.9
    assert not c.count_commit_due(10_000)
    clock[0] = starts[-1] + 10.01
    assert c.count_commit_due(10_000) and not c.count_commit_due(10_001)
    hook[0] = 0.001                                   # quick again: as many messages, at once
    asyncio.run(c.commit())
    assert c.count_commit_due(10_000)


def test_an_alert_in_a_fleet_of_more_than_a_thousand_runs_has_its_runs_history(monkeypatch):
    """The snapshot recorder keeps as many runs as the worker keeps decoded: with its old limit
    of 1,000 runs, a run's history was gone by its next step in a fleet of 1,100 runs, and its
    alert's snapshot showed nothing of the steps before it."""
    import streams.app as app_module

    class Brakes:       # no Redis here: the brakes are only counted
        pulled: list = []

        def submit(self, alert, done):
            self.pulled.append(alert.run_id)

    monkeypatch.setattr(app_module.RunStates, "flush_run", lambda self, run_id: None)  # no broker
    monkeypatch.setattr(app_module, "build_brake_thread", lambda *a: Brakes())
    run, sent, app, settings = worker_lane(monkeypatch)

    def kl(run_id: str, s: int, value: float) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": run_id, "step": s,
                           "ts": 1.7e9 + s, "metrics": {"kl/mean": value}}).encode()

    events = [kl("hot", s, 0.02) for s in range(6)]
    events += [kl(f"other-{i}", 0, 0.02) for i in range(1100)]
    events += [kl("hot", s, 0.3) for s in range(6, 14)]
    run(events, FakeConsumer())
    fired = [json.loads(v) for t, v, _ in sent if t == settings.alerts_topic]
    red = [a for a in fired
           if a["run_id"] == "hot" and a["severity"] == "red" and a.get("snapshot")]
    assert red, [(a["rule"], a["severity"]) for a in fired]
    window = [row["step"] for row in red[0]["snapshot"]["window"]["steps"]]
    assert window[:6] == [0, 1, 2, 3, 4, 5]          # the healthy steps before the burst
    assert "hot" in Brakes.pulled


def test_a_stray_programs_events_go_into_no_snapshot_and_are_told_once(monkeypatch):
    """Two programs under one run id: the worker follows the one that took the run over. The
    other's steps (a KL of 5) are dropped: the red alert of the followed program's blow-up
    shows only its own steps, and one run_id_shared notice is published."""
    import time

    import streams.app as app_module

    class Brakes:
        def submit(self, alert, done):
            pass

    monkeypatch.setattr(app_module.RunStates, "flush_run", lambda self, run_id: None)
    monkeypatch.setattr(app_module, "build_brake_thread", lambda *a: Brakes())
    run, sent, app, settings = worker_lane(monkeypatch)
    t0 = time.time() - 3000

    def kl(s: int, value: float, inc: str, t: float) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": "twice", "step": s, "ts": t,
                           "incarnation": inc, "metrics": {"kl/mean": value}}).encode()
    events = [kl(s, 0.02, "a", t0 + s) for s in range(40)]
    events += [kl(s, 0.02, "b", t0 + 100 + s) for s in range(6)]
    events += [kl(40 + s, 5.0, "a", t0 + 200 + s) for s in range(3)]
    events += [kl(s, 0.3, "b", t0 + 300 + s) for s in range(6, 14)]
    run(events, FakeConsumer())
    fired = [json.loads(v) for t, v, _ in sent if t == settings.alerts_topic]
    assert [a["rule"] for a in fired if a["rule"] == "run_id_shared"] == ["run_id_shared"]
    red = [a for a in fired if a["rule"] == "kl_above_target" and a["severity"] == "red"
           and a.get("snapshot")]
    assert red, [(a["rule"], a["severity"]) for a in fired]
    rows = red[0]["snapshot"]["window"]["steps"]
    assert max(row["metrics"]["kl/mean"] for row in rows) < 1, rows
    assert not [row for row in rows if row["step"] >= 40]


def test_the_commit_every_so_many_messages_is_made_by_the_commit_task_within_a_tenth(monkeypatch):
    """The fetch loop only asks for it (``commit_soon``) and goes on processing: it used to make
    the commit itself and wait for the producer's flush of the states, up to 1.7 s with 1,250
    runs, and no event (and no brake) was processed meanwhile."""
    import streams.batch_lane as lane
    from faust.transport.drivers import aiokafka as driver

    c = consumer()
    clock, starts = [1000.0], []

    async def committed(self, topics=None, start_new_transaction=True):
        return True

    async def sleep(seconds):
        clock[0] += seconds
        if len(starts) == 2 and abs(clock[0] - (starts[-1] + 1.0)) < 1e-6:
            c._n_acked = 10_000                    # 10,000 messages a second after a commit
            assert c.count_commit_due(10_000)
            c.commit_soon()
        if len(starts) >= 3:
            c._stopped.set()

    monkeypatch.setattr(driver.Consumer, "commit", committed)
    monkeypatch.setattr(lane, "monotonic", lambda: clock[0])
    c.app.before_commit.append(lambda: starts.append(clock[0]))
    c.sleep = sleep
    asyncio.run(type(c)._commit_handler(c))
    assert [round(b - a, 3) for a, b in zip(starts, starts[1:])] == [2.8, 1.0]


def test_the_table_manager_starts_recovery_without_waiting_a_second(monkeypatch):
    """Faust's table manager waits a second at start before it looks at the tables; the
    worker's declares them first, so its manager goes straight to the recovery."""
    app = BatchApp("lane-tables", broker="kafka://127.0.0.1:1", store="memory://",
                   key_serializer="raw", value_serializer="raw")
    app.Table("runs", default=None, partitions=4, key_type=bytes, value_type=bytes)
    manager = app.tables
    steps: list[str] = []

    async def no_sleep(seconds):
        raise AssertionError(f"the table manager waited {seconds} s at start")

    async def channels():
        steps.append("channels")

    async def recovery_start():
        steps.append("recovery")

    monkeypatch.setattr(manager, "sleep", no_sleep)
    monkeypatch.setattr(manager, "_update_channels", channels)
    monkeypatch.setattr(type(manager.recovery), "start", lambda self: recovery_start())
    asyncio.run(manager.on_start())
    assert steps == ["channels", "recovery"]


def test_a_run_whose_ranks_all_alert_in_a_turn_has_its_state_written_once_after_they_are_in_kafka(
        monkeypatch):
    """A NaN on every rank raises one alert per rank, each from its own event: the run's state
    is written to the table once for them all, not once per rank, and only once Kafka holds
    them all (a worker that dies before leaves a successor the state from before them, and it
    raises them again: none is lost)."""
    import streams.app as app_module

    class Brakes:       # no Redis here: the brakes are only counted
        pulled: list = []

        def submit(self, alert, done):
            self.pulled.append(alert.rank)

    writes: list = []

    def flush_run(self, run_id):
        writes.append((run_id, len(sent)))          # what had gone out when it was written
    monkeypatch.setattr(app_module.RunStates, "flush_run", flush_run)
    monkeypatch.setattr(app_module, "build_brake_thread", lambda *a: Brakes())
    no_turns(monkeypatch)
    run, sent, app, settings = worker_lane(monkeypatch)

    def ranked(s: int, rank: int, loss: float) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": "nan", "step": s, "rank": rank,
                           "world_size": 4, "ts": 1.7e9 + s,
                           "metrics": {"loss/policy": loss, "kl/mean": 0.01}}).encode()

    events = [ranked(s, r, 0.5) for s in range(3) for r in range(4)]
    events += [ranked(3, r, float("nan")) for r in range(4)]
    c = FakeConsumer()
    run(events, c)
    fired = [json.loads(v) for t, v, _ in sent if t == settings.alerts_topic]
    nan = [a for a in fired if a["rule"] == "nan_inf" and a["state"] == "firing"]
    assert sorted({a["rank"] or 0 for a in nan}) == [0, 1, 2, 3]
    assert writes == [("nan", len(sent))]            # once, after the last alert went out
    assert {acked for t, _v, acked in sent} == {12}  # the events before the NaNs acknowledged
    assert c.acked == len(events)


def test_the_events_lane_reads_on_while_kafka_has_yet_to_take_an_alert(monkeypatch):
    """Waiting for Kafka's acknowledgement of a turn's alerts, the lane stood idle for a round
    trip to the broker per alerting turn. It reads on now, but acknowledges no event from the
    first alerting one on, and writes no state of a run whose alerts are on their way, until
    Kafka took them: a crash meanwhile still loses no alert."""
    import itertools

    import streams.app as app_module
    import streams.batch_lane as lane

    class Brakes:       # no Redis here
        def submit(self, alert, done):
            pass

    writes: list = []
    monkeypatch.setattr(app_module.RunStates, "_write",
                        lambda self, run_id, st: writes.append(run_id) or True)
    monkeypatch.setattr(app_module, "build_brake_thread", lambda *a: Brakes())
    ticks = itertools.count()
    monkeypatch.setattr(lane, "monotonic", lambda: float(next(ticks)))    # a turn per event
    unanswered: list = []
    run, sent, app, settings = worker_lane(monkeypatch, unanswered)

    def loss(run_id: str, s: int, value: float) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": run_id, "step": s, "ts": 1.7e9 + s,
                           "metrics": {"loss/policy": value, "kl/mean": 0.01}}).encode()

    events = [loss("nan", s, 0.5) for s in range(3)] + [loss("nan", 3, float("nan"))]
    events += [loss("other", s, 0.5) for s in range(8)] + [loss("nan", s, 0.5) for s in range(4, 8)]
    c = FakeConsumer()
    seen = {}

    async def during(task) -> None:
        for _ in range(1000):           # far more turns than the lane needs for every event
            await asyncio.sleep(0)
        seen.update(events=app.rlwatch_counters["events"], acked=c.acked, writes=list(writes),
                    waiting=len(unanswered), done=task.done())
        while not task.done():          # Kafka takes them now, and any sent later at once
            for f in unanswered:
                if not f.done():
                    f.set_result(None)
            await asyncio.sleep(0)

    run(events, c, during)
    assert seen["waiting"] >= 1 and not seen["done"]
    assert seen["events"] == len(events)     # every event read while the alert waited
    assert seen["acked"] == 3                # ... but none acknowledged from the NaN on
    assert "nan" not in seen["writes"]       # nor the state that raised it written
    fired = [json.loads(v) for t, v, _ in sent if t == settings.alerts_topic]
    assert any(a["rule"] == "nan_inf" and a["state"] == "firing" for a in fired)
    assert c.acked == len(events)            # once Kafka took them: everything
    assert writes.count("nan") == 1          # written once, after the last of its sends landed


def test_a_batch_is_taken_a_key_at_a_time_each_keys_records_in_order():
    c = FakeConsumer()
    keys = [b"a", b"b", b"a", b"c", b"b", b"a"]
    batch = LaneBatch([record(0, i, key=k) for i, k in enumerate(keys)], c, TOPIC,
                      {0: TP(TOPIC, 0)}, 1)
    assert list(batch.by_key()) == [0, 2, 5, 1, 4, 3]
    alone = LaneBatch([record(0, i, key=k) for i, k in enumerate([b"a", b"b", None])], c, TOPIC,
                      {0: TP(TOPIC, 0)}, 1)
    assert list(alone.by_key()) == [0, 1, 2]


def test_the_events_lane_takes_a_runs_events_together_and_acknowledges_only_what_it_took(monkeypatch):
    """The events of two runs, interleaved in the batch, are taken a run at a time (each run's
    in order), so that a run's state stays in the processor's caches. What is acknowledged is
    always a run of the batch's first records that were all taken; while the alert of one
    run's NaN waits for Kafka, that event is not acknowledged."""
    import itertools

    import streams.app as app_module
    import streams.batch_lane as lane

    class Brakes:       # no Redis here
        def submit(self, alert, done):
            pass

    monkeypatch.setattr(app_module.RunStates, "_write", lambda self, run_id, st: True)
    monkeypatch.setattr(app_module, "build_brake_thread", lambda *a: Brakes())
    ticks = itertools.count()
    monkeypatch.setattr(lane, "monotonic", lambda: float(next(ticks)))    # a turn per event
    seen_order: list = []
    read = app_module.read_routine
    monkeypatch.setattr(app_module, "read_routine", lambda raw: seen_order.append(raw) or read(raw))
    unanswered: list = []
    run, sent, app, settings = worker_lane(monkeypatch, unanswered)

    def loss(run_id: str, s: int, value: float) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": run_id, "step": s, "ts": 1.7e9 + s,
                           "metrics": {"loss/policy": value, "kl/mean": 0.01}}).encode()

    events, keys = [], []
    for s in range(5):
        for run_id in ("a", "b"):
            events.append(loss(run_id, s, float("nan") if (run_id, s) == ("a", 3) else 0.5))
            keys.append(run_id.encode())
    nan_at = events.index(loss("a", 3, float("nan")))
    c = FakeConsumer()
    seen = {}

    async def during(task) -> None:
        for _ in range(1000):
            await asyncio.sleep(0)
        seen.update(events=app.rlwatch_counters["events"], acked=c.acked, done=task.done())
        while not task.done():
            for f in unanswered:
                if not f.done():
                    f.set_result(None)
            await asyncio.sleep(0)

    run(events, c, during, keys)
    assert seen_order == events[0::2] + events[1::2]       # run a's steps, then run b's
    assert seen["events"] == len(events) and not seen["done"]
    assert seen["acked"] <= nan_at                          # the NaN not acknowledged yet
    assert c.stops == sorted(c.stops) and c.acked == len(events)
    for run_id in ("a", "b"):                               # each run's steps taken in order
        st = app.rlwatch_states.get(run_id)
        assert st.last_step == {0: 4} and st.duplicates == 0
    fired = [json.loads(v) for t, v, _ in sent if t == settings.alerts_topic]
    assert [(a["run_id"], a["rule"]) for a in fired if a["state"] == "firing"] == [("a", "nan_inf")]


def test_an_alert_kafka_refuses_at_once_is_logged_and_stops_the_lane_with_the_state_unwritten(
        monkeypatch, caplog):
    """A send the producer refuses outright (stopped, a record over the broker's limit) used to
    stop the worker with Faust's crash line alone. The lane's log now names the alert and its
    run, acknowledges nothing from the alerting event on, and leaves the run's state unwritten:
    whoever owns the run next reads the event again and raises the alert."""
    import faust.topics

    import streams.app as app_module

    writes: list = []
    monkeypatch.setattr(app_module.RunStates, "_write",
                        lambda self, run_id, st: writes.append(run_id) or True)
    no_turns(monkeypatch)
    run, sent, app, settings = worker_lane(monkeypatch)
    accepting = faust.topics.Topic.send

    async def send(topic, *, key=None, value=None, **kw):
        if topic.get_topic_name() == settings.alerts_topic:
            raise RuntimeError("the record is larger than the broker accepts")
        return await accepting(topic, key=key, value=value, **kw)
    monkeypatch.setattr(faust.topics.Topic, "send", send)

    def loss(s: int, value: float) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": "big", "step": s, "ts": 1.7e9 + s,
                           "metrics": {"loss/policy": value, "kl/mean": 0.01}}).encode()

    c = FakeConsumer()
    with caplog.at_level("ERROR", logger="rlwatch"), pytest.raises(RuntimeError, match="larger"):
        run([loss(0, 0.5), loss(1, 0.5), loss(2, float("nan")), loss(3, 0.5)], c)
    assert "the firing alert nan_inf of run big could not be sent" in caplog.text
    assert "whoever owns the run next raises it again" in caplog.text
    assert c.acked == 2                 # nothing from the NaN on
    assert writes == [] and "big" in app.rlwatch_states.held


# -- the fetch loop's next fetch, asked for while the lane works ------------------------------------

def drain(batches: list[list[int]], during=None):
    """Faust's fetch loop (``BatchConsumer._drain_messages``) over ``batches`` (the offsets of
    each fetch, one partition), with a lane handler that records what it is given and calls
    ``during(consumer, n, phase)`` as it works on its n-th batch: as it starts ("first",
    before the fetch ahead completes) and later, after it ("later"). Returns (the offsets handed to the
    lane, per batch; how many fetches had been asked for while the lane worked on each; the
    number of batches handed over at each seek back)."""
    c = consumer()
    app = c.app
    tp = TP(TOPIC, 0)
    left = iter(batches)
    asked: list[int] = []
    handed: list[list[int]] = []
    asked_then: list[int] = []
    seeks: list[int] = []
    stopped = asyncio.Event()

    async def wait_next_records(timeout):
        asked.append(len(handed))
        await asyncio.sleep(0)          # the consumer thread's round trip
        offsets = next(left, None)
        if offsets is None:
            stopped.set()
            return None, None
        return {tp: [record(0, o) for o in offsets]}, {tp}

    async def perform_seek():
        seeks.append(len(handed))
        c._read_offset[tp] = None       # as a seek to the committed offsets leaves it

    async def lane(batch):
        handed.append([r.offset for r in batch])
        if during is not None:
            during(c, len(handed), "first")
        for _ in range(5):              # the lane's turns: the loop's other tasks run
            await asyncio.sleep(0)
        asked_then.append(len(asked))
        if during is not None:
            during(c, len(handed), "later")
        for _ in range(5):
            await asyncio.sleep(0)

    # (the app is this test's own: attributes set, not monkeypatched; see seek_consumer)
    c._wait_next_records, c.perform_seek, c.highwater = wait_next_records, perform_seek, lambda tp: 0
    app.batch_lanes = {TOPIC: lane}
    app.consumer_generation_id = 1
    asyncio.run(c._drain_messages(SimpleNamespace(_stopped=stopped)))
    return handed, asked_then, seeks


def test_the_next_fetch_is_asked_for_before_the_lane_works_on_the_batch_at_hand():
    """The lane waited for Faust's consumer thread at the end of every batch (2.75 s of a
    22.6 s benchmark run, the events lane idle); the next fetch is under way meanwhile now."""
    handed, asked_then, seeks = drain([[0, 1, 2], [3, 4], [5, 6, 7]])
    assert handed == [[0, 1, 2], [3, 4], [5, 6, 7]]          # every record, in order, once
    assert asked_then == [2, 3, 4]                            # one fetch ahead of the lane
    assert seeks == []


def test_a_fetch_that_completed_before_a_rebalance_is_not_taken_by_the_new_assignment():
    """Records fetched while the lane worked on a batch of the old assignment, taken after a
    rebalance: given to the lane, their read offset would skip the events the new
    assignment's seek brings back. They are dropped before any bookkeeping."""
    def rebalanced(c, n, phase):
        if n == 1 and phase == "later":       # after the fetch ahead completed
            c.app.consumer_generation_id = 2
    handed, _asked, seeks = drain([[0, 1, 2], [3, 4], [3, 4], [5]], rebalanced)
    assert handed == [[0, 1, 2], [3, 4], [5]]     # the second [3, 4] read after the drop
    assert seeks == []                             # (the rebalance made its own seek)


def test_a_fetch_that_completed_under_the_new_assignment_is_taken():
    """A fetch asked for before a rebalance that completes after it, with the flow running,
    holds the new assignment's records (a recovery's changelog records come that way):
    dropping them left a worker's recovery waiting for them for ever."""
    def rebalanced(c, n, phase):
        if n == 1 and phase == "first":       # before the fetch ahead completes
            c.app.consumer_generation_id = 2
    handed, _asked, seeks = drain([[0, 1, 2], [3, 4], [5]], rebalanced)
    assert handed == [[0, 1, 2], [3, 4], [5]]
    assert seeks == []


def test_a_fetch_that_completed_while_the_flow_was_stopped_is_dropped_though_it_runs_again():
    """A fetch that completes while the flow is stopped (a rebalance under way) is not taken,
    even if the flow runs again by the time the lane is done with the batch at hand; if it
    is still stopped, the consumer seeks back to the committed offsets."""
    def pause_then_resume(c, n, phase):
        if n == 1:
            c.flow_active = phase == "later"    # stopped before the fetch ahead completes
    handed, _asked, seeks = drain([[0, 1], [2, 3], [2, 3], [4]], pause_then_resume)
    assert handed == [[0, 1], [2, 3], [4]]
    assert seeks == []

    def paused(c, n, phase):
        if n == 1:
            c.flow_active = False
    handed, _asked, seeks = drain([[0, 1], [2, 3]], paused)
    assert handed == [[0, 1]] and seeks == [1]


def test_the_started_producer_is_given_without_a_turn_of_the_event_loop():
    """Faust asks for the producer before every message it sends (an alert, a state write to
    the table's changelog); its own answer took three turns of the event loop each time, during
    which the events lane waited. Concurrent first callers still share one start."""
    from mode import Service

    class Producer(Service):
        starts = 0

        async def on_start(self) -> None:
            type(self).starts += 1
            await asyncio.sleep(0.01)

    app = BatchApp("lane-producer", broker="kafka://127.0.0.1:1", store="memory://")
    producer = app.producer = Producer()

    async def go():
        got = await asyncio.gather(*(app.maybe_start_producer() for _ in range(3)))
        assert got == [producer] * 3 and Producer.starts == 1
        turns: list = []
        loop = asyncio.get_running_loop()
        for _ in range(5):
            loop.call_soon(turns.append, 1)     # runs only if the loop takes a turn
            assert await app.maybe_start_producer() is producer
        assert turns == []
        await asyncio.sleep(0)
        assert turns == [1] * 5
        # a producer put in its place is the one given (and started) from then on
        other = app.producer = Producer()
        assert await app.maybe_start_producer() is other and Producer.starts == 2
        await producer.stop()
        await other.stop()
    asyncio.run(go())


@needs_native
def test_a_runs_rank_steps_taken_in_a_row_are_all_recorded_and_a_commit_between_them_misses_none(
        monkeypatch):
    """The events lane takes a run's routine rank steps in a row without looking the run up
    again (a streak: after a step of rank 0, its other ranks' steps at once). Each is still
    kept for the run's snapshots, and a commit during a turn of the lane (here: the run states
    written at every turn) ends the streak: a step taken after it marks the state changed
    again, so the next commit writes it."""
    import streams.batch_lane as lane_module

    writes: list = []
    # the lane's turns: step 0's four steps one by one (each rank's first compiles its rules);
    # step 1's rank 0, then its rank 1 (which starts the streak) with ranks 2-3 at once; the
    # commit, which ends the streak; step 2 as step 1; step 3's rank 0 with ranks 1-3 at once
    turns_after = {5}
    taken = [0]

    def due(self):
        taken[0] += 1
        return taken[0] - 1 in turns_after

    def commit(self):        # what a commit during the turn does first
        writes.append(app.rlwatch_states.flush())
    import streams.app as app_module
    table: dict = {}
    monkeypatch.setattr(app_module.RunStates, "_write",         # (no producer here)
                        lambda self, run_id, st: table.setdefault(run_id, []).append(st.events) or True)
    monkeypatch.setattr(lane_module.Turns, "due", due)
    monkeypatch.setattr(lane_module.Turns, "taken", commit)
    run, _sent, app, _settings = worker_lane(monkeypatch)

    import time
    t0 = time.time() - 60       # (a step from too long ago is not a routine one)

    def ranked(s: int, rank: int) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": "streak", "step": s, "rank": rank,
                           "world_size": 4, "ts": t0 + s,
                           "metrics": {"loss/policy": 0.5, "kl/mean": 0.01}}).encode()

    run([ranked(s, r) for s in range(4) for r in range(4)], FakeConsumer())
    assert taken[0] == 9, "a step's rank steps were not taken at once"
    assert writes == [1] and table == {"streak": [8]}
    assert app.rlwatch_states.flush() == 1, "a step taken after the commit was not marked changed"
    assert table == {"streak": [8, 16]}
    tape = app.rlwatch_recorder.runs["streak"]
    assert [row[:2] for row in tape.others] == [(s, r) for s in range(4) for r in (1, 2, 3)]
    assert [row[:2] for row in tape.steps] == [(s, 0) for s in range(4)]
    assert app.rlwatch_states.get("streak").last_step == {0: 3, 1: 3, 2: 3, 3: 3}


def test_the_changelog_records_a_fetch_loop_drops_are_read_again_from_the_first_not_delivered():
    """A fetch dropped at a rebalance carries the table recovery's changelog records: each
    changelog partition is read again from its first record not delivered; stream partitions
    are left to the committed offsets."""
    log, events = "app-runs-changelog", TOPIC
    tp = {(t, p): TP(t, p) for t in (log, events) for p in (0, 1, 2)}
    records = {tp[log, 0]: [record(0, o, topic=log) for o in range(5, 9)],
               tp[log, 1]: [record(1, o, topic=log) for o in range(0, 3)],
               tp[log, 2]: [record(2, o, topic=log) for o in range(10, 12)],
               tp[events, 0]: [record(0, 40)]}
    changelogs = {log}
    assert dropped_changelogs(records, changelogs) == {tp[log, 0]: 5, tp[log, 1]: 0, tp[log, 2]: 10}
    # part of the fetch was delivered (partition 0 up to 6, partition 2 all of it)
    read = {tp[log, 0]: 6, tp[log, 2]: 11, tp[events, 0]: 40}
    assert dropped_changelogs(records, changelogs, read) == {tp[log, 0]: 7, tp[log, 1]: 0}
    assert dropped_changelogs({}, changelogs) == {}


@needs_native
def test_a_fault_in_taking_rank_steps_at_once_loses_and_repeats_no_event(monkeypatch, caplog):
    """When RunState.rank_steps fails partway (a fault of the native core), the lane logs it
    and takes the records it had not taken one by one: every event is taken once, none is
    dead-lettered or counted twice, and the batch is acknowledged whole."""
    import time

    import streams.run as run_module

    real = run_module.RunState.rank_steps
    faults = [0]

    def failing(self, records, order, pos, now, keep, taken):
        # the first call takes one record and then fails
        if faults[0] == 0:
            faults[0] += 1
            got = real(self, records, order, pos, now, keep, taken)
            if got[1]:
                taken[order[pos]] = 1
                raise RuntimeError("native fault")
        return real(self, records, order, pos, now, keep, taken)
    monkeypatch.setattr(run_module.RunState, "rank_steps", failing)
    run, _sent, app, _settings = worker_lane(monkeypatch)
    t0 = time.time() - 60

    def ranked(s: int, rank: int) -> bytes:
        return json.dumps({"schema": 1, "kind": "step", "run_id": "faulty", "step": s, "rank": rank,
                           "world_size": 4, "ts": t0 + s, "metrics": {"loss/policy": 0.5}}).encode()
    values = [ranked(s, r) for s in range(12) for r in range(4)]
    batch = run(values, FakeConsumer())
    assert faults[0] == 1 and "taking the routine steps of run faulty at once failed" in caplog.text
    assert app.rlwatch_counters["events"] == len(values) and app.rlwatch_counters["dlq"] == 0
    assert batch.acked == len(values)
    st = app.rlwatch_states.get("faulty")
    assert st.last_step == {0: 11, 1: 11, 2: 11, 3: 11} and st.duplicates == 0
