"""The alerts topic's lane (streams.alerts_lane, and the worker's use of it in streams.app): an
alert is acknowledged to Kafka only once its brake (firing alerts) and its notification are
done, notifications go in the order read, and nothing is acknowledged that was not done: a
foreign message only, at once; a notification that failed, or whose alert was read before a
rebalance, never (the alert is read again)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from contract.alert import Alert
from streams.alerts_lane import AlertsLane


def alert(state: str = "firing", rule: str = "kl_above_target", step: int = 10) -> Alert:
    return Alert(rule=rule, severity="red", state=state, run_id="lane-run", step=step,
                 onset_step=step, value=0.2, threshold=0.1, actions=["pause"] if state == "firing" else [],
                 summary="KL high", diagnosis="", ts=1.7e9 + step)


class Lane:
    """An AlertsLane whose brakes wait for the test (``land(i)``) and whose notifications are
    recorded, optionally failing or waiting for the test too."""

    def __init__(self, *, queued: int = 16, fail: set | None = None, hold: bool = False,
                 batch: int = 64):
        self.brakes: list = []          # (alert, done) in the order pulled
        self.notified: list[int] = []   # steps notified, in order
        self.calls: list[list[int]] = []  # the steps of each call of notify
        self.acked: list[int] = []      # message numbers acknowledged, in order
        self.generation = 1
        self.fail = fail or set()
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()
        self.lane = AlertsLane(lambda raw: raw if isinstance(raw, Alert) else None,
                               lambda a, done: self.brakes.append((a, done)), self.notify,
                               lambda: self.generation, queued=queued, batch=batch)

    async def notify(self, alerts: list[Alert]) -> None:
        await self.gate.wait()
        self.calls.append([a.step for a in alerts])
        if any(a.step in self.fail for a in alerts):
            raise RuntimeError("receiver exploded")
        self.notified += [a.step for a in alerts]

    async def take(self, n: int, raw, generation: int = 1) -> None:
        await self.lane.take(raw, lambda: self.acked.append(n), generation)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def run(test, **options) -> None:
    """``test(lane)`` on a Lane made with ``options``, its notifications running."""
    async def main() -> None:
        lane = Lane(**options)
        task = asyncio.ensure_future(lane.lane.notifications())
        try:
            await test(lane)
        finally:
            task.cancel()
    asyncio.run(main())


def test_a_firing_alert_is_acknowledged_only_once_its_brake_and_its_notification_are_done():
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("firing", step=1))
        await settle()
        assert lane.notified == [1] and len(lane.brakes) == 1
        assert lane.acked == [], "acknowledged before the control channel took the brake"
        lane.brakes[0][1]()           # the brake landed
        assert lane.acked == [0]
    run(test)


def test_a_brake_that_lands_before_the_notification_still_waits_for_it():
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("firing", step=1))
        lane.brakes[0][1]()
        await settle()
        assert lane.acked == [] and lane.notified == []
        lane.gate.set()
        await settle()
        assert lane.notified == [1] and lane.acked == [0]
    run(test, hold=True)


def test_a_resolved_alert_pulls_no_brake_and_is_acknowledged_once_notified():
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("resolved", step=2))
        await settle()
        assert lane.brakes == [] and lane.notified == [2] and lane.acked == [0]
    run(test)


def test_notifications_go_in_the_order_read_and_a_foreign_message_is_acknowledged_at_once():
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("resolved", step=5))
        await lane.take(1, b"not an alert")
        await lane.take(2, alert("resolved", step=3))
        await lane.take(3, alert("firing", step=4))
        assert lane.acked == [1]        # the foreign one, before any notification ran
        await settle()
        assert lane.notified == [5, 3, 4]
        assert lane.acked == [1, 0, 2]  # the firing one waits for its brake
    run(test)


def test_a_notification_that_fails_is_logged_left_unacknowledged_and_the_next_go_on(caplog):
    async def test(lane: Lane) -> None:
        with caplog.at_level(logging.ERROR, logger="rlwatch.worker"):
            await lane.take(0, alert("resolved", step=7))
            await settle()
            await lane.take(1, alert("resolved", step=8))
            await settle()
        assert lane.notified == [8] and lane.acked == [1]
        assert "stays unacknowledged" in caplog.text and "lane-run" in caplog.text
    run(test, fail={7})


def test_the_alerts_waiting_are_notified_together_in_order_and_a_bad_one_holds_back_only_itself(caplog):
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("resolved", step=0))
        await settle()                  # the notifier took it alone and waits
        for n in range(1, 6):
            await lane.take(n, alert("resolved", step=n))
        with caplog.at_level(logging.ERROR, logger="rlwatch.worker"):
            lane.gate.set()
            await settle()
        # those waiting went together, at most three at a time, in the order read; the call
        # with 2 failed, and its alerts went again each alone: 2 alone stays unacknowledged
        assert lane.calls == [[0], [1, 2, 3], [1], [2], [3], [4, 5]]
        assert lane.notified == [0, 1, 3, 4, 5] and lane.acked == [0, 1, 3, 4, 5]
        assert caplog.text.count("stays unacknowledged") == 1 and "alert kl_above_target" in caplog.text
    run(test, hold=True, batch=3, fail={2})


def test_an_alert_read_before_a_rebalance_is_not_notified_nor_acknowledged():
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("resolved", step=1), generation=1)
        await settle()                  # being notified when the rebalance comes: goes on
        await lane.take(1, alert("resolved", step=2), generation=1)
        lane.generation = 2             # a rebalance: the waiting alert is read again after it
        lane.gate.set()
        await lane.take(2, alert("resolved", step=2), generation=2)
        await settle()
        assert lane.notified == [1, 2] and lane.acked == [0, 2] and lane.lane.stale == 1
    run(test, hold=True)


def test_a_full_queue_holds_the_reader_back_and_loses_nothing():
    async def test(lane: Lane) -> None:
        await lane.take(0, alert("resolved", step=0))
        await settle()                  # the notifier took it and waits
        await lane.take(1, alert("resolved", step=1))
        await lane.take(2, alert("resolved", step=2))
        third = asyncio.ensure_future(lane.take(3, alert("resolved", step=3)))
        await settle()
        assert not third.done() and lane.lane.waiting == 2
        lane.gate.set()
        await third
        await settle()
        assert lane.notified == [0, 1, 2, 3] and lane.acked == [0, 1, 2, 3]
    run(test, queued=2, hold=True)


# -- the worker's alerts lane (streams.app) -------------------------------------------------------

pytest.importorskip("faust")


def test_the_workers_alerts_lane_acknowledges_each_alert_once_braked_and_notified(monkeypatch):
    """The alerts of a fetched batch go to the brake thread (firing ones) and the dispatcher;
    each record is acknowledged on its own once both are done, whatever the order they finish
    in; a foreign message at once."""
    from faust.types import TP

    import streams.app as app_module
    from contract.settings import Settings
    from streams.batch_lane import LaneBatch
    from tests.unit.test_batch_lane import FakeConsumer, record

    class Brakes:
        def __init__(self):
            self.pulled: list = []

        def submit(self, a, done):
            self.pulled.append((a.step, done))

    class Dispatcher:
        def __init__(self):
            self.notified: list = []
            self.gate = asyncio.Event()

        async def notify_all(self, alerts):
            await self.gate.wait()
            self.notified += [(a.step, a.state) for a in alerts]

    brakes, dispatcher = Brakes(), Dispatcher()
    monkeypatch.setattr(app_module, "build_brake_thread", lambda *a: brakes)
    monkeypatch.setattr(app_module, "build_dispatcher", lambda *a: dispatcher)
    settings = Settings(redis="redis://127.0.0.1:1/0")
    app = app_module.build_app(settings)

    class Acks(FakeConsumer):
        def ack_lane(self, batch, start, stop):
            assert stop == start + 1
            self.stops = getattr(self, "stops", []) + [start]

    values = [alert("firing", step=1).to_json().encode(), b"{not json",
              alert("resolved", step=2).to_json().encode()]
    recs = [record(0, i, v, topic=settings.alerts_topic) for i, v in enumerate(values)]
    consumer = Acks()
    batch = LaneBatch(recs, consumer, settings.alerts_topic, {0: TP(settings.alerts_topic, 0)}, 1)

    async def main() -> None:
        app.consumer_generation_id = 1
        notifier = asyncio.ensure_future(app.rlwatch_alerts_lane.notifications())
        await app.batch_lanes[settings.alerts_topic](batch)     # returns without waiting
        assert getattr(consumer, "stops", []) == [1]             # the foreign message only
        assert [s for s, _ in brakes.pulled] == [1]
        dispatcher.gate.set()
        await settle()
        assert dispatcher.notified == [(1, "firing"), (2, "resolved")]
        assert consumer.stops == [1, 2]                          # the firing one: brake pending
        brakes.pulled[0][1]()       # the brake thread: its commands landed
        await settle()
        assert consumer.stops == [1, 2, 0]
        notifier.cancel()
    asyncio.run(main())


def test_catch_up_waits_until_the_notifications_behind_are_done_or_its_time_is_up():
    from time import monotonic

    async def test(lane: Lane) -> None:
        assert not lane.lane.behind
        for n in range(3):
            await lane.take(n, alert("resolved", step=n))
        assert lane.lane.behind
        await lane.lane.catch_up(0.02, monotonic)      # the receiver hangs: back after its time
        assert lane.lane.behind and lane.notified == []
        lane.gate.set()
        # (a catch_up that waited out its whole minute would be cut here by wait_for, failing)
        await asyncio.wait_for(lane.lane.catch_up(60.0, monotonic), 10.0)
        assert not lane.lane.behind and lane.notified == [0, 1, 2] and lane.acked == [0, 1, 2]
    run(test, hold=True)


def test_a_busy_events_lane_lets_the_notifications_behind_it_catch_up_at_each_turn(monkeypatch):
    """With notifications waiting, each of the events lane's turns gives them up to
    NOTIFY_TURN_SECONDS; with none waiting, it gives nothing more than its turn."""
    import streams.app as app_module
    import streams.batch_lane as lane_module
    from tests.unit.test_batch_lane import FakeConsumer, step, worker_lane

    now = [1000.0]

    def clock():
        now[0] += 4 / 1000      # 4 ms of work per event: a turn every third event
        return now[0]
    monkeypatch.setattr(lane_module, "monotonic", clock)
    run, _sent, app, _settings = worker_lane(monkeypatch)
    caught: list = []

    async def catch_up(seconds, _clock):
        caught.append(seconds)
    behind = [True]
    monkeypatch.setattr(type(app.rlwatch_alerts_lane), "behind", property(lambda self: behind[0]))
    monkeypatch.setattr(app.rlwatch_alerts_lane, "catch_up", catch_up)
    run([step("c", s) for s in range(9)], FakeConsumer())
    assert caught and set(caught) == {app_module.NOTIFY_TURN_SECONDS}
    turns = len(caught)
    behind[0] = False
    run([step("d", s) for s in range(9)], FakeConsumer())
    assert len(caught) == turns
