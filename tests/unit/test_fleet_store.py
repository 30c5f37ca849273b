"""The fleet view's records (streams/fleet_store.py): sparkline, steps per second, finished,
relaunch, and the worker's writer (Redis down, a restart that continues a record). The Redis
store itself is tested on the real Redis in tests/integration/test_fleet_view.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from contract.events import parse_event
from streams.fleet_store import (
    SPARK_POINTS,
    FleetWriter,
    MemoryFleetStore,
    make_record,
    run_status,
    steps_per_second,
)

T0 = 1_700_000_000.0


def summary(step: int, ts: float | None = None, incarnation: str | None = "a", kl: float = 0.01, **kw) -> dict:
    out = {"run_id": "r", "incarnation": incarnation, "generation": 0, "last_step": step,
           "last_event_ts": T0 + step if ts is None else ts, "events": step + 1, "world_size": 1,
           "tags": {}, "targets": {"kl": 0.05}, "open_alerts": [], "worst": None,
           "latest": {"kl/mean": kl}, "smoothed": {"kl/mean": kl}}
    out.update(kw)
    return out


def test_the_sparkline_covers_the_whole_run_in_a_bounded_number_of_points():
    rec = None
    for step in range(10_000):
        rec = make_record(summary(step, kl=step / 10_000), rec, T0 + step)
    pts = rec["spark"]["points"]["kl/mean"]
    assert SPARK_POINTS // 2 <= len(pts) <= SPARK_POINTS
    assert pts[0][0] == 0 and pts[-1][0] >= 9_000          # from the start to (nearly) now
    assert all(a[0] < b[0] for a, b in zip(pts, pts[1:]))
    assert pts[-1][1] == pytest.approx(pts[-1][0] / 10_000, rel=1e-3)   # the smoothed value at that step


def test_steps_per_second_and_a_run_that_stopped_moving():
    rec = None
    for step in range(0, 100, 2):                    # 2 steps per second of event time
        rec = make_record(summary(step, ts=T0 + step / 2), rec, T0 + step / 2)
    now = T0 + 49
    assert steps_per_second(rec, now) == pytest.approx(2.0, rel=0.05)
    assert steps_per_second(rec, now + 60) == 0.0        # nothing for a minute


def test_status_live_silent_finished():
    rec = make_record(summary(10, ts=T0), None, T0)
    assert run_status(rec, T0 + 10) == "live"
    assert run_status(rec, T0 + 301) == "silent"
    assert run_status(rec, T0 + 3601) == "finished"
    assert run_status(rec, T0 + 100, finished_after=60) == "finished"


def test_a_run_that_closed_is_finished_until_a_newer_event():
    rec = make_record(summary(10, ts=T0), None, T0, closed={"ts": T0, "step": 10, "reason": "closed"})
    assert run_status(rec, T0 + 1) == "finished"
    rec = make_record(summary(10, ts=T0), rec, T0 + 5)             # nothing new: still closed
    assert rec["closed"] and run_status(rec, T0 + 6) == "finished"
    rec = make_record(summary(0, ts=T0 + 30, incarnation="b"), rec, T0 + 30)   # relaunched
    assert rec["closed"] is None and run_status(rec, T0 + 31) == "live"


def test_a_new_incarnation_starts_a_fresh_sparkline_and_rate():
    rec = None
    for step in range(200):
        rec = make_record(summary(step, incarnation="a"), rec, T0 + step)
    rec = make_record(summary(3, incarnation="b", ts=T0 + 300), rec, T0 + 300)
    assert rec["spark"]["points"]["kl/mean"] == [[3, 0.01]]
    assert rec["rate"] == [[T0 + 300, 3]]


class _State:
    """What the writer needs of a run state: an id (the summary comes from ``summarise``)."""

    def __init__(self, run_id: str, step: int = 0):
        self.run_id, self.step = run_id, step


def _writer(store, log=None, clock=lambda: T0):
    return FleetWriter(store, lambda st: {**summary(st.step), "run_id": st.run_id}, clock=clock,
                       writer="w1", log=log)


def test_the_writer_writes_changed_runs_and_marks_a_clean_close():
    store = MemoryFleetStore()
    w = _writer(store)
    w.note(_State("a", 5))
    w.note(_State("b", 7))
    assert asyncio.run(w.flush()) == 2
    assert asyncio.run(w.flush()) == 0                      # nothing changed since
    final = parse_event({"schema": 1, "kind": "heartbeat", "run_id": "a", "step": 5, "ts": T0 + 5,
                         "final": True}, T0 + 5)
    w.note(_State("a", 5), final)
    assert w.due()                                          # written at once, not in a second
    asyncio.run(w.flush())
    rec = asyncio.run(store.get("a"))
    assert rec["closed"]["step"] == 5 and run_status(rec, T0 + 6) == "finished"
    assert rec["writer"] == "w1" and not w.states          # states are held only until written


def test_a_burst_of_steps_written_at_once_draws_every_step_of_rank_0():
    """A short run, or a worker catching up, processes many steps between two writes: the
    sparkline still has a point per step (rank 0's logged values), not one per write."""
    store = MemoryFleetStore()
    w = _writer(store)
    for step in range(40):
        for rank in (0, 1):
            ev = parse_event({"schema": 1, "kind": "step", "run_id": "r", "rank": rank, "step": step,
                              "ts": T0 + step, "metrics": {"kl/mean": 0.01 * (1 + rank) + step / 1000,
                                                           "reward/mean": 0.5}}, T0 + step)
            w.note(_State("r", step), ev)
    asyncio.run(w.flush())
    pts = asyncio.run(store.get("r"))["spark"]["points"]
    assert [p[0] for p in pts["kl/mean"]] == list(range(40))
    assert pts["kl/mean"][-1][1] == pytest.approx(0.01 + 39 / 1000)        # rank 0's value
    assert len(pts["reward/mean"]) == 40


def test_a_restarted_writer_continues_the_record_another_one_wrote():
    store = MemoryFleetStore()
    first = _writer(store)
    for step in range(0, 60):
        first.note(_State("r", step))
        asyncio.run(first.flush())
    before = len(asyncio.run(store.get("r"))["spark"]["points"]["kl/mean"])
    second = _writer(store)                                 # a new process: empty memory
    second.note(_State("r", 60))
    asyncio.run(second.flush())
    after = asyncio.run(store.get("r"))["spark"]["points"]["kl/mean"]
    assert len(after) >= before and after[0][0] == 0       # the history went on, not restarted


class _Down:
    async def get_many(self, ids):
        raise ConnectionError("Redis is down")

    async def put(self, records):
        raise ConnectionError("Redis is down")


def test_redis_down_is_said_once_and_the_records_wait(caplog):
    log = logging.getLogger("test.fleet")
    down = _Down()
    w = _writer(down, log=log)
    with caplog.at_level(logging.INFO, logger="test.fleet"):
        for step in range(5):
            w.note(_State("r", step))
            assert asyncio.run(w.flush()) == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "cannot write the fleet view to Redis" in errors[0].getMessage()
    store = MemoryFleetStore()
    w.store = store                                          # Redis is back
    with caplog.at_level(logging.INFO, logger="test.fleet"):
        assert asyncio.run(w.flush()) == 1
    assert asyncio.run(store.get("r"))["summary"]["last_step"] == 4
    assert "writing the fleet view to Redis again" in caplog.text


def test_the_dashboard_gets_the_summary_with_rank_0_and_not_with_every_rank():
    """The local dashboard's summary is built per call: rank 0's steps bring it, the other
    ranks' steps of the same run do not (a run without a rank 0 still gets it)."""
    got = []

    class Local:
        def observe_event(self, event, summary):
            got.append((event.run_id, event.rank, summary is not None))

    calls = []
    w = FleetWriter(MemoryFleetStore(), lambda st: calls.append(st.run_id) or {"run_id": st.run_id},
                    local=Local(), clock=lambda: T0)
    for run_id, ranks in (("r", (0, 1, 2)), ("no-rank-0", (3, 4))):
        for rank in ranks:
            ev = parse_event({"schema": 1, "kind": "step", "run_id": run_id, "rank": rank, "step": 1,
                              "ts": T0, "metrics": {"kl/mean": 0.01}}, T0)
            w.note(_State(run_id, 1), ev)
    assert got == [("r", 0, True), ("r", 1, False), ("r", 2, False),
                   ("no-rank-0", 3, True), ("no-rank-0", 4, True)]
    assert calls == ["r", "no-rank-0", "no-rank-0"]


class _SlowStore(MemoryFleetStore):
    """A store whose writes take ``seconds`` per record on the writer's timer."""

    def __init__(self, clock: list[float], seconds: float):
        super().__init__()
        self.clock, self.seconds = clock, seconds

    async def put(self, records):
        self.clock[0] += self.seconds * len(records)
        await super().put(records)


def test_a_writer_of_many_runs_writes_less_often_and_an_urgent_note_still_goes_at_once():
    """Flushes that take long are spaced out (about a twentieth of the time goes to them), up
    to a limit; a few runs are written every time they changed."""
    now = [100.0]

    def writer(seconds_per_record: float) -> tuple[FleetWriter, list[float]]:
        w = FleetWriter(_SlowStore(now, seconds_per_record),
                        lambda st: {**summary(st.step), "run_id": st.run_id},
                        clock=lambda: T0, writer="w", timer=lambda: now[0])
        return w, []

    def seconds(w: FleetWriter, starts: list[float], runs: int, ticks: int) -> list[float]:
        """The worker's timer, once a second, with every run changed in between: the times
        between the flushes it made."""
        for _ in range(ticks):
            for r in range(runs):
                w.note(_State(f"r{r}", int(now[0])))
            if w.ready():
                starts.append(now[0])
                asyncio.run(w.flush())
            now[0] += 1.0
        return [round(b - a, 3) for a, b in zip(starts, starts[1:])]

    few = writer(0.0005)                                      # 4 runs: 2 ms per flush
    assert seconds(*few, runs=4, ticks=5) == [1.002] * 4      # every tick
    many = writer(0.0001)                                     # 1,000 runs: 0.1 s per flush
    assert seconds(*many, runs=1000, ticks=11) == [2.1] * 5   # 2 s after the start, next tick
    assert not many[0].ready()
    final = {"schema": 1, "kind": "heartbeat", "run_id": "r1", "step": 999, "ts": T0, "final": True}
    many[0].note(_State("r1", 999), parse_event(final, T0), urgent=True)
    assert many[0].ready()                                    # at once, all the same
    huge = writer(0.01)                                       # 10 s per flush
    assert seconds(*huge, runs=1000, ticks=16) == [15.0] * 3  # at most MAX_FLUSH_GAP apart


def test_a_flush_of_many_runs_gives_the_event_loop_turns_while_it_builds_the_records():
    """The worker's events lane shares the loop: a flush of 350 runs lets it in between slices
    of records instead of holding it until every record is built."""
    w = _writer(MemoryFleetStore())
    for r in range(350):
        w.note(_State(f"r{r}", 1))
    turns = []

    async def lane():
        while True:
            turns.append(len(w.states))      # runs not written yet when the lane got a turn
            await asyncio.sleep(0)

    async def both():
        other = asyncio.ensure_future(lane())
        await asyncio.sleep(0)
        written = await w.flush()
        other.cancel()
        return written

    assert asyncio.run(both()) == 350
    assert len(turns) >= 4 and all(n == 350 for n in turns[:4])   # turns while building
