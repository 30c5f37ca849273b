"""The worker's liveness pass (streams.liveness) over its run states (streams.app.RunStates):
it gives the event loop turns while it restores runs, leaves the runs the events lane is
working on decoded, stops at a rebalance, and still finds stalled and expired runs."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("faust")

from streams.app import RunStates  # noqa: E402
from streams.liveness import liveness_pass  # noqa: E402
from streams.processor import Processor  # noqa: E402
from streams.state_codec import decode_state  # noqa: E402
from tests.unit._core import T0, rlhf_pack, step_event  # noqa: E402

STALLED_AT = T0 + 3 + 400     # more than run_stalled's 300 s after the runs' last step


def fleet(n: int, limit: int) -> tuple[Processor, RunStates, dict]:
    """``n`` runs with three steps each, all in the table, the last ``limit`` decoded."""
    processor = Processor(rlhf_pack())
    table: dict[bytes, bytes] = {}
    states = RunStates(table, processor, limit=limit)
    for i in range(n):
        run_id = f"run-{i:03d}"
        for step in range(3):
            processor.process(states.get(run_id), step_event(run_id, step, {"kl/mean": 0.02}), T0 + step)
        states.touch(run_id)
    states.flush()
    return processor, states, table


def run(coro):
    return asyncio.run(coro)


def test_a_pass_over_runs_not_decoded_gives_the_event_loop_turns():
    processor, states, table = fleet(12, limit=12)
    states.forget()                  # as after a restart: every run only in the table
    turns = []

    async def main():
        async def other_work():      # what the events lane would do meanwhile
            while True:
                turns.append(sum(1 for _ in states.cache))
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(other_work())
        await asyncio.sleep(0)
        turns.clear()
        published = []

        async def alerted(st, alerts):
            published.extend(alerts)

        done = await liveness_pass(states, processor, [k.decode() for k in table], T0 + 10,
                                   ttl_seconds=3600, active=lambda: True, alerted=alerted,
                                   expired=lambda run_id: None, slice_=4)
        task.cancel()
        return done, published

    done, published = run(main())
    assert (done.runs, done.restored, done.alerts, done.stopped) == (12, 12, 0, False)
    assert published == []
    assert len(turns) >= 2           # the loop ran other work during the pass (12 runs, 4 a slice)
    assert not states.cache          # the restored runs were not kept decoded


def test_the_runs_the_lane_works_on_stay_decoded_and_stalled_runs_still_alert():
    processor, states, table = fleet(8, limit=3)
    hot = list(states.cache)
    assert len(hot) == 3
    published = {}

    def firing_in_table(run_id: str) -> bool:
        stored = decode_state(table[run_id.encode()])
        return any(a.get("status") == "firing" for a in stored["alerts"].values())

    async def alerted(st, alerts):
        # the alerts go out before the state that raised them is written (a worker that dies
        # in between leaves its successor a state that raises them again)
        assert not firing_in_table(st.run_id)
        published[st.run_id] = alerts

    done = run(liveness_pass(states, processor, sorted(k.decode() for k in table), STALLED_AT,
                             ttl_seconds=3600 * 24, active=lambda: True, alerted=alerted,
                             expired=lambda run_id: None, slice_=2))
    assert (done.runs, done.restored) == (8, 5)
    assert list(states.cache) == hot              # the hot runs untouched, in the same order
    assert set(published) == {f"run-{i:03d}" for i in range(8)}
    assert all([(a.rule, a.state) for a in alerts] == [("run_stalled", "firing")]
               for alerts in published.values())
    assert all(firing_in_table(run_id) for run_id in published)     # written once they were out
    # every run's firing alert is kept (a second pass does not fire again)
    again = run(liveness_pass(states, processor, sorted(k.decode() for k in table), STALLED_AT + 10,
                              ttl_seconds=3600 * 24, active=lambda: True, alerted=alerted,
                              expired=lambda run_id: None))
    assert again.alerts == 0


def test_a_rebalance_stops_the_pass():
    processor, states, table = fleet(10, limit=10)
    states.forget()
    checks = []

    def active():
        checks.append(1)
        return len(checks) <= 4     # a rebalance starts while the fourth run is evaluated

    done = run(liveness_pass(states, processor, sorted(k.decode() for k in table), T0 + 10,
                             ttl_seconds=3600, active=active, alerted=None,
                             expired=lambda run_id: None, slice_=2))
    assert done.stopped and done.runs == 4


def test_runs_silent_past_the_ttl_expire_decoded_or_not():
    processor, states, table = fleet(4, limit=2)
    gone = []
    done = run(liveness_pass(states, processor, sorted(k.decode() for k in table), T0 + 7200,
                             ttl_seconds=3600, active=lambda: True, alerted=None,
                             expired=gone.append))
    assert done.expired == 4 and sorted(gone) == [f"run-{i:03d}" for i in range(4)]
    assert not table and not states.cache


def test_a_run_belongs_to_the_partition_the_producers_send_its_events_to():
    from aiokafka.partitioner import DefaultPartitioner as AioPartitioner
    from kafka.partitioner.default import DefaultPartitioner as SdkPartitioner

    from streams.app import partition_of

    parts = [0, 1, 2, 3]
    keys = ["run-a", "bench-x-fleet-01", "ü-run", "x" * 300] + [f"fleet-{i}" for i in range(40)]
    got = [partition_of(k, 4) for k in keys]

    class Cluster:         # what the SDK's partitioner asks of the cluster's metadata
        def topics(self):
            return {"events"}

        def partitions_for_topic(self, topic):
            return set(parts)

        available_partitions_for_topic = partitions_for_topic

    sdk = SdkPartitioner()
    assert got == [sdk.partition("events", k, k.encode(), None, None, Cluster()) for k in keys]
    assert got == [AioPartitioner.__call__(k.encode(), parts, parts) for k in keys]   # the table's
    assert set(got) == set(parts)


def test_an_unreadable_stored_state_is_logged_once_and_the_run_starts_afresh(caplog):
    processor, states, table = fleet(3, limit=3)
    states.forget()
    table[b"run-001"] = b"\xc1 not a state"
    for _ in range(3):
        done = run(liveness_pass(states, processor, sorted(k.decode() for k in table), T0 + 10,
                                 ttl_seconds=3600, active=lambda: True, alerted=None,
                                 expired=lambda run_id: None))
        assert done.runs == 3
    logged = [r.getMessage() for r in caplog.records if "run-001" in r.getMessage()]
    assert len(logged) == 1 and "is unreadable (13 bytes" in logged[0]
    assert list(states.cache) == ["run-001"] and states.cache["run-001"].events == 0


def test_runs_are_judged_as_of_how_far_their_partition_is_read():
    """A worker behind on a partition (after a rebalance, say) has the runs' later events still
    to read: their silence counts up to the last record read there, not the wall clock, and a
    run whose partition is not read at all yet is left for the next pass."""
    processor, states, table = fleet(3, limit=3)
    read_to = {"run-000": STALLED_AT, "run-001": T0 + 20, "run-002": None}
    published = {}

    async def alerted(st, alerts):
        published[st.run_id] = alerts

    done = run(liveness_pass(states, processor, sorted(k.decode() for k in table), STALLED_AT,
                             ttl_seconds=3600 * 24, active=lambda: True, alerted=alerted,
                             expired=lambda run_id: None, as_of=read_to.get))
    assert (done.runs, done.waiting) == (2, 1)
    assert list(published) == ["run-000"]
    assert published["run-000"][0].ts == STALLED_AT
    # once the backlog is read the run's silence is known: it fires then, as of that time
    read_to["run-001"] = STALLED_AT + 5
    run(liveness_pass(states, processor, sorted(k.decode() for k in table), STALLED_AT + 5,
                      ttl_seconds=3600 * 24, active=lambda: True, alerted=alerted,
                      expired=lambda run_id: None, as_of=read_to.get))
    assert sorted(published) == ["run-000", "run-001"]


def test_a_partition_behind_does_not_expire_its_runs():
    processor, states, table = fleet(2, limit=2)
    gone = []
    done = run(liveness_pass(states, processor, sorted(k.decode() for k in table), T0 + 7200,
                             ttl_seconds=3600, active=lambda: True, alerted=None,
                             expired=gone.append, as_of={"run-000": T0 + 10}.get))
    assert gone == [] and done.waiting == 1 and done.expired == 0


def test_a_run_that_speaks_while_its_stall_alert_goes_out_continues_from_the_state_that_raised_it():
    """The stall alert of a run that is not decoded goes to Kafka before its state is written.
    If the run's next event comes meanwhile, the events lane must take the copy that raised the
    alert (not the older one in the table, which does not know the alert fires: the alert
    would never resolve), and that copy, with the event, is what gets written."""
    processor, states, table = fleet(4, limit=1)
    quiet = "run-000"
    assert quiet not in states.cache
    seen = {}

    async def alerted(st, alerts):
        states.hold((st.run_id,))                # as the worker does while Kafka takes them
        if st.run_id == quiet:                   # the run speaks again, in the events lane
            lane = states.get(quiet)
            seen["same"] = lane is st
            processor.process(lane, step_event(quiet, 3, {"kl/mean": 0.02}, ts=STALLED_AT + 1), STALLED_AT + 1)
            states.touch(quiet)
        states.release((st.run_id,))

    run(liveness_pass(states, processor, [quiet], STALLED_AT, ttl_seconds=3600 * 24,
                      active=lambda: True, alerted=alerted, expired=lambda run_id: None))
    assert seen == {"same": True}
    stored = decode_state(table[quiet.encode()])
    assert stored["last_step"] == {"0": 3}                                          # the event
    assert any(a.get("status") == "firing" for a in stored["alerts"].values())       # the alert
    assert quiet in states.cache and not states.lent
    # the next tick knows the run spoke: the alert resolves
    resolved = processor.tick(states.get(quiet), STALLED_AT + 2)
    assert [(a.rule, a.state) for a in resolved] == [("run_stalled", "resolved")]


def test_a_stall_alert_kafka_refuses_is_logged_and_stops_the_worker_with_the_state_unwritten(
        monkeypatch, caplog):
    """If Kafka refuses a stall alert, the run's state (which says the alert fires) must not be
    written, and the worker stops, loudly: whoever owns the run next restores the state from
    before the alert and raises it again."""
    import faust.topics

    from contract.settings import Settings
    from streams.app import build_app

    async def refused(topic, *, key=None, value=None, **kw):
        raise RuntimeError("the broker refused the record")
    monkeypatch.setattr(faust.topics.Topic, "send", refused)
    app = build_app(Settings(redis="redis://127.0.0.1:1/0"))
    states = app.rlwatch_states
    processor = states.processor
    st = states.get("stalled")
    processor.process(st, step_event("stalled", 0, {"kl/mean": 0.02}), T0)
    states.touch("stalled")
    alerts = processor.tick(st, STALLED_AT)
    assert [a.rule for a in alerts] == ["run_stalled"]
    written: list = []
    monkeypatch.setattr(RunStates, "_write", lambda self, run_id, st: written.append(run_id) or True)
    with caplog.at_level("ERROR", logger="rlwatch"), pytest.raises(RuntimeError, match="refused"):
        run(app.rlwatch_liveness_alerts(st, alerts))
    assert "the firing alert run_stalled of run stalled could not be sent" in caplog.text
    assert "whoever owns the run next raises it again" in caplog.text
    states.flush()                          # a commit meanwhile
    assert written == [] and "stalled" in states.held
