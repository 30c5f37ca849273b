"""A batch lane through Faust's consumer: the events topic a fetched batch at a time.

Faust hands every message to an agent on its own: per message, the consumer's fetch loop
starts four tasks and waits on them (``Service.wait_first``), the conductor takes a lock,
decodes the message into an ``Event`` and puts it on the agent's queue, and the stream takes
it off, sets the current event, calls the sensors and acknowledges it. A trivial agent does
about 0.06-0.08 of the messages per second of a bare aiokafka loop over the same topic.

:class:`BatchApp` is a ``faust.App`` whose consumer (:class:`BatchConsumer`) gives the
messages of the topics registered with :meth:`BatchApp.batch_lane` to their handler as a list,
one call per fetched batch, straight from the fetch loop. Everything else about Faust stays:
the topic is still subscribed through an agent (which receives nothing while the lane runs)
and co-partitioned with the tables, the group's rebalances, static membership, tables and
their changelogs, timers, the other agents and Faust's offset commits.

The handler acknowledges (``app.consumer.ack(message)``) each message once it is processed,
and only then; Faust commits acknowledged offsets (every ``broker_commit_interval``), so an
offset is never committed before its event was processed. A handler stops early when a
rebalance starts (:meth:`BatchApp.lane_active`): what it did not acknowledge is read again by
whoever owns the partition next. Callbacks in ``app.before_commit`` run right before each
commit, before the offsets to commit are chosen: a table written there reaches its changelog
(Faust flushes the producer before committing offsets) before the offsets of the events that
changed it are committed.
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import Any, Awaitable, Callable

import faust
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as _driver

__all__ = ["BatchApp", "BatchConsumer"]

LaneHandler = Callable[[list], Awaitable[None]]


FETCH_MAX_WAIT_MS = 100


class BatchConsumerThread(_driver.AIOKafkaConsumerThread):
    """Faust's consumer thread, with the broker's wait for an empty fetch cut from Faust's fixed
    1,500 ms to ``FETCH_MAX_WAIT_MS``.

    aiokafka keeps one fetch in flight per broker, over the partitions that have nothing
    buffered. When the events partitions are all buffered, that fetch asks only for the quiet
    partitions (Faust's leader topic, the alerts topic) and the broker holds it for the whole
    wait: everything fetched meanwhile is processed and the consumer then stalls until it
    returns. Measured on the trivial batch lane over 39,000 events: 7 s of stalls with 1,500 ms,
    none (but the last) with 100 ms. The cost is a fetch every 100 ms on an idle worker.
    """

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS     # read when the consumer starts
        return consumer


class BatchConsumer(_driver.Consumer):
    """Faust's aiokafka consumer whose fetch loop hands whole batches to the app's lanes."""

    def _new_consumer_thread(self) -> Any:
        return BatchConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        for callback in getattr(self.app, "before_commit", ()):
            try:
                callback()
            except Exception:  # noqa: BLE001 - a failing hook must not stop the commits
                self.log.exception("before_commit hook %r failed", callback)
        return await super().commit(topics, start_new_transaction=start_new_transaction)

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - needs a broker
        # Faust's Consumer._drain_messages, with the messages of lane topics collected per
        # fetched batch and given to their handler, instead of one ``wait_first`` (four tasks)
        # and one conductor callback per message.
        lanes: dict[str, LaneHandler] = getattr(self.app, "batch_lanes", {})
        callback = self.callback
        getmany = self.getmany
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        set_flag = self.diag.set_flag
        unset_flag = self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        inbound = self.app.monitor.stream_inbound_time if self.app.monitor is not None else {}
        yield_every = 100
        num_since_yield = 0
        sleep = asyncio.sleep
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                ait = getmany(timeout=1.0)
                await self.sleep(0)
                if self.should_stop:
                    continue
                batches: dict[str, list] = {}
                async for tp, message in ait:
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is not None and offset < r_offset:
                        continue            # read already (Faust drops these too)
                    gap = offset - (r_offset or 0)
                    if gap > 1 and r_offset and acks_enabled_for(message.topic):
                        await self._add_gap(tp, r_offset + 1, offset)
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    lane = batches.get(tp.topic)
                    if lane is not None:
                        lane.append(message)
                    elif tp.topic in lanes:
                        batches[tp.topic] = [message]
                    else:
                        num_since_yield += 1
                        if num_since_yield > yield_every:
                            await sleep(0)
                            num_since_yield = 0
                        await self.wait_first(callback(message), self.suspend_flow.wait())
                    set_read_offset(tp, offset)
                for topic, messages in batches.items():
                    now = monotonic()
                    for m in messages:      # the livelock detector's "stream is processing"
                        inbound[m.tp] = now
                    await lanes[topic](messages)
                unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)


class BatchTransport(_driver.Transport):
    Consumer = BatchConsumer


class BatchApp(faust.App):
    """A ``faust.App`` with batch lanes (:meth:`batch_lane`) and ``before_commit`` hooks."""

    def __init__(self, *args: Any, batch_lanes: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_lanes_enabled = batch_lanes
        self.batch_lanes: dict[str, LaneHandler] = {}
        self.before_commit: list[Callable[[], None]] = []

    def _new_transport(self) -> Any:
        # lanes off (``batch_lanes=False``): the same consumer, every message through Faust's
        # own path, and the before_commit hooks still run
        return BatchTransport(self.conf.broker_consumer, self)

    def batch_lane(self, topic: Any) -> Callable[[LaneHandler], LaneHandler]:
        """Give the messages of ``topic`` (subscribed by an agent) to the decorated coroutine
        function, a fetched batch (a list of Faust messages) at a time."""
        def register(handler: LaneHandler) -> LaneHandler:
            if self.batch_lanes_enabled:
                for name in topic.topics:
                    self.batch_lanes[name] = handler
            return handler
        return register

    def lane_active(self, generation_id: int) -> bool:
        """False once a rebalance started after a batch of ``generation_id`` was fetched: the
        handler stops there and leaves the rest unacknowledged."""
        return self.flow_control.is_active() and self.consumer_generation_id == generation_id
