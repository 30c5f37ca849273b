"""A batch lane through Faust's consumer: the events topic a fetched batch at a time.

Faust hands every message to an agent on its own: per message, the consumer's fetch loop
starts four tasks and waits on them (``Service.wait_first``), the conductor takes a lock,
decodes the message into an ``Event`` and puts it on the agent's queue, and the stream takes
it off, sets the current event, calls the sensors and acknowledges it. A trivial agent does
about 0.06-0.08 of the messages per second of a bare aiokafka loop over the same topic.

:class:`BatchApp` is a ``faust.App`` whose consumer (:class:`BatchConsumer`) gives the records
of the topics registered with :meth:`BatchApp.batch_lane` to their handler as a
:class:`LaneBatch`, one call per fetched batch, straight from the fetch loop. Everything else
about Faust stays: the topic is still subscribed through an agent (which receives nothing while
the lane runs) and co-partitioned with the tables, the group's rebalances, static membership,
tables and their changelogs, timers, the other agents (their messages take Faust's own path)
and Faust's offset commits.

A lane's records are aiokafka's ``ConsumerRecord`` (``key``, ``value``, ``partition``,
``offset``...), not Faust messages: per record, Faust's path builds a ``ConsumerMessage``
(about 1.2 µs here), resumes two round-robin generators and an async generator, reads the
partition's high-water mark and takes a lock to acknowledge it. In a py-spy profile of the
worker with its core a no-op, that fetch path, the acknowledgements and the rebalance check
were about 19 % of the samples after start-up; about 6 % with the lane as it is now. The lane
does the same bookkeeping once per partition (read offsets, gaps, high-water marks, the
livelock detector's times) or in one loop per acknowledgement (:meth:`LaneBatch.ack`), and
keeps Faust's order (round robin over the partitions). The next fetch is asked for before a
batch goes to its handler (:class:`Prefetch`): Faust's consumer thread fetches and unpacks it
while the handler works, instead of the handler's loop standing idle for it after each batch.

The handler acknowledges records once they are processed, and only then (``batch.ack(n)``:
the first ``n``); Faust commits acknowledged offsets (every ``broker_commit_interval``), so an
offset is never committed before its event was processed. Acknowledging before every ``await``
is enough: commits and rebalances happen only while the handler waits. A handler stops early
when a rebalance starts (:meth:`LaneBatch.active`): what it did not acknowledge is read again by
whoever owns the partition next. Callbacks in ``app.before_commit`` run right before each
commit, before the offsets to commit are chosen: a table written there reaches its changelog
(Faust flushes the producer before committing offsets) before the offsets of the events that
changed it are committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from itertools import chain, zip_longest
from time import monotonic
from typing import Any, Awaitable, Callable

import faust
from faust.tables.manager import TableManager
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as _driver
from mode import Service
from mode.utils.futures import StampedeWrapper, notify
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent

from streams.group_leave import leave_on_close
from streams.recovery import WatchedRecovery

try:   # the lock Faust's own acknowledgements take (newer Faust versions), else none
    from faust.types.tuples import ack_lock as _ack_lock
except ImportError:  # pragma: no cover - depends on the Faust version
    _ack_lock = contextlib.nullcontext()

__all__ = ["LANE_TURN_SECONDS", "BatchApp", "BatchConsumer", "LaneBatch", "Prefetch",
           "PromptTableManager", "SteadyFlowControl", "Turns", "commit_gap", "dropped_changelogs",
           "round_robin"]


class LaneBatch(list):
    """The records of one fetched batch of a lane topic (aiokafka ``ConsumerRecord``), in the
    order Faust would deliver them, with what the handler needs besides.

    ``generation_id``: the consumer group generation they were fetched in.
    :meth:`active`: False once a rebalance started since (stop there). :meth:`ack`: the first
    ``n`` records were processed."""

    __slots__ = ("_consumer", "_tps", "acked", "generation_id", "topic")

    def __init__(self, records: list, consumer: "BatchConsumer", topic: str, tps: dict,
                 generation_id: int):
        super().__init__(records)
        self._consumer, self.topic, self._tps = consumer, topic, tps
        self.generation_id = generation_id
        self.acked = 0      # records[:acked] acknowledged

    def active(self) -> bool:
        """False once a rebalance started after this batch was fetched."""
        app = self._consumer.app
        return app.flow_control.is_active() and app.consumer_generation_id == self.generation_id

    @property
    def partitions(self) -> int:
        """How many partitions the records are of."""
        return len(self._tps)

    def checker(self) -> Callable[[], bool]:
        """:meth:`active` as a function of nothing, cheaper to call per record."""
        app = self._consumer.app
        is_active = app.flow_control.is_active
        generation = self.generation_id
        return lambda: is_active() and app.consumer_generation_id == generation

    def by_key(self) -> list[int] | range:
        """The indices of the records, those of one key together: each key's in the batch's
        order, the keys in the order they first come. (A plain ``range`` when no key comes
        twice.) Taking a batch in this order keeps every key's records in order; for the
        events topic, keyed by run, a run's state, rules and statistics are then touched for
        several steps in a row while they are in the processor's caches, not once every few
        hundred events when the other runs have pushed them out."""
        groups: dict = {}
        get = groups.get
        for i, record in enumerate(self):
            g = get(record.key)
            if g is None:
                groups[record.key] = [i]
            else:
                g.append(i)
        if len(groups) == len(self):
            return range(len(self))
        return list(chain.from_iterable(groups.values()))

    def ack(self, n: int) -> None:
        """The first ``n`` records are processed: acknowledge those not acknowledged yet."""
        if n > self.acked:
            self._consumer.ack_lane(self, self.acked, n)
            self.acked = n

    def ack_at(self, i: int) -> None:
        """Record ``i`` alone is processed: acknowledge it (a lane whose records finish out of
        order, the alerts'; not to be mixed with :meth:`ack` on one batch)."""
        self._consumer.ack_lane(self, i, i + 1)


LaneHandler = Callable[[LaneBatch], Awaitable[None]]

#: seconds a lane handler works on a batch before the event loop's other tasks (timers, the
#: alerts lanes, a brake's completion) get a turn
LANE_TURN_SECONDS = 0.01


class Turns:
    """When a lane handler gives the event loop a turn: after ``seconds`` of work by ``clock``,
    however many records that took. A count of records (200) gave the other tasks a turn every
    8 ms on one host and every 20 ms or more on a slower one, or with costlier events: a timer,
    a brake's completion and each Redis round trip of a notification waited that long. 10 ms
    keeps the faster host's rhythm (more turns cost throughput: each runs every ready task).

    ``due()`` per record; after the turn (``await asyncio.sleep(0)``), ``taken()``."""

    __slots__ = ("_clock", "_next", "seconds")

    def __init__(self, seconds: float = LANE_TURN_SECONDS,
                 clock: Callable[[], float] | None = None):
        self.seconds = seconds
        self._clock = clock = clock or monotonic
        self._next = clock() + seconds

    def due(self) -> bool:
        return self._clock() >= self._next

    def taken(self) -> None:
        self._next = self._clock() + self.seconds


def round_robin(lists: list[list]) -> list:
    """The items of ``lists`` (a topic's records, one list per partition) in the order Faust's
    scheduler delivers them: the first of each list, then the second of each, and so on."""
    if len(lists) == 1:
        return lists[0]
    return [x for x in chain.from_iterable(zip_longest(*lists, fillvalue=_GAP)) if x is not _GAP]


_GAP = object()


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

    async def on_thread_stop(self) -> None:
        # a static member leaves its group too when it stops (see streams.group_leave)
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is not None:
            leave_on_close(coordinator)
        await super().on_thread_stop()


#: the ``before_commit`` hooks (the run states written to the table before each commit) take
#: at most about this share of the worker's time: hooks that took ``t`` seconds put the next
#: periodic commit at least ``t / HOOK_SHARE`` seconds later (see :func:`commit_gap`). The
#: producer then sends what they wrote, which costs about twice as much again (py-spy, a
#: thousand runs): the writes and their sending together stay near 5 %.
HOOK_SHARE = 0.02
#: the longest wait between two periodic commits, however long the hooks take
MAX_COMMIT_GAP = 30.0


def commit_gap(hook_seconds: float, interval: float, share: float = HOOK_SHARE,
               longest: float = MAX_COMMIT_GAP) -> float:
    """Seconds from one periodic commit to the next: Faust's ``interval``, or longer when the
    hooks before a commit took more than ``share`` of it, up to ``longest`` (never shorter than
    ``interval``).

    A worker of a few dozen runs writes their states in a few milliseconds and commits every
    ``interval`` (2.8 s). One of a thousand runs spends about 0.15 s on them and its producer
    twice that on sending 45 MB: every 2.8 s, that was about 15 % of its time; it now commits
    every 7 or 8 seconds. The price: a worker that crashes leaves that many more seconds of
    events to its successor, which reads them again (the run states recognise a step already
    counted), and a brake waits for no commit (an alert's run state is written at once).

    >>> commit_gap(0.01, 2.8), commit_gap(0.15, 2.8), commit_gap(9.0, 2.8)
    (2.8, 7.5, 30.0)
    """
    return max(interval, min(longest, hook_seconds / share))


def dropped_changelogs(records: Any, changelogs: Any, read: Any = None) -> dict:
    """The first offset of each changelog partition's records in ``records`` (tp -> records)
    not delivered yet, ``read`` giving the last offset delivered of a partition (or None)."""
    out = {}
    for tp, recs in records.items():
        if not recs or tp.topic not in changelogs:
            continue
        first = recs[0].offset
        done = read.get(tp) if read is not None else None
        if done is not None and done >= first:
            first = done + 1
            if first > recs[-1].offset:
                continue        # all delivered
        out[tp] = first
    return out


class BatchConsumer(_driver.Consumer):
    """Faust's aiokafka consumer whose fetch loop hands whole batches to the app's lanes."""

    _commit_after = 0.0     # monotonic time before which the periodic commit waits
    _count_after = 0.0      # the same for the commit every so many messages, when stretched
    _commit_asked = False   # the commit every so many messages is due: the commit task makes it
    #: for the drills of the tests only (``RLWATCH_FAULT=drop-recovery-fetch``): the records of
    #: the first fetch that brings a table recovery changelog records are lost
    _drop_recovery_fetch = os.environ.get("RLWATCH_FAULT") == "drop-recovery-fetch"

    def _new_consumer_thread(self) -> Any:
        return BatchConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        started = monotonic()
        for callback in getattr(self.app, "before_commit", ()):
            try:
                callback()
            except Exception:  # noqa: BLE001 - a failing hook must not stop the commits
                self.log.exception("before_commit hook %r failed", callback)
        spent = monotonic() - started
        gap = commit_gap(spent, self.commit_interval)
        self._commit_after = started + gap
        self._count_after = self._commit_after if gap > self.commit_interval else 0.0
        return await super().commit(topics, start_new_transaction=start_new_transaction)

    def count_commit_due(self, every: int) -> bool:
        """Whether the commit after every ``every`` acknowledged messages is due (it waits,
        as the periodic one does, while the last commit's hooks ask for a longer gap)."""
        return self._n_acked >= every and monotonic() >= self._count_after

    def commit_soon(self) -> None:
        """Have the commit task commit now (within a tenth of a second), while the fetch loop
        goes on. Faust's fetch loop made the commit every ``broker_commit_every`` messages
        itself and waited for it: for the whole of the producer's flush of the run states
        written before it (0.5-1.7 s with 1,250 runs, measured), no event was processed, and
        a brake waited that long."""
        self._commit_asked = True

    @Service.task
    async def _commit_handler(self) -> None:
        """Faust's periodic commit: every ``commit_interval`` from the start of the last commit,
        or longer when its hooks ask for it (:func:`commit_gap`). When they do, the commit after
        every ``broker_commit_every`` messages (10,000) waits as long too (at 5,000 events a
        second it came every two seconds). That one is made here too, when the fetch loop asks
        for it (:meth:`commit_soon`), not in the fetch loop; commits made for other reasons (a
        rebalance, the shutdown) happen as they did."""
        await self.sleep(self.commit_interval)
        while not self.should_stop:
            self._commit_asked = False
            await self.commit()
            while not self.should_stop and not self._commit_asked \
                    and monotonic() < self._commit_after:
                await self.sleep(min(0.1, self._commit_after - monotonic()))

    async def perform_seek(self) -> None:
        """Faust's seek back to the committed offsets, and for a stream partition on which
        nothing was committed yet, back to its beginning (``consumer_auto_offset_reset`` being
        "earliest", as the worker has it).

        Records fetched while the flow is stopped (a rebalance, the table's recovery) are
        dropped, and Faust relies on this seek to read them again. Without a committed offset
        Faust's seek leaves the position where the fetcher got to, past the dropped records: a
        worker starting on a new group, or taking over from one that died before its first
        commit, lost the events and alerts fetched during its recovery (seen as a brake drill
        that failed about one time in four on a freshly started broker)."""
        await super().perform_seek()
        if self.app.conf.consumer_auto_offset_reset != "earliest":
            return
        changelogs = set(self.app.tables.changelog_topics)
        fresh = [tp for tp in self.assignment()
                 if tp.topic not in changelogs and not self._read_offset.get(tp)]   # None, or 0
        if fresh:
            await self.seek_wait(await self.earliest_offsets(*fresh))

    async def _seek_back(self) -> None:
        """The flow is not active: the records fetched are dropped, and the consumer goes back
        to the committed offsets, as Faust's fetch loop does."""
        try:
            await self.perform_seek()
        except Exception as ex:  # noqa: BLE001 - as Faust's getmany
            self.log.warning(f"exception performing seek when flow not active {ex}")

    async def _read_changelogs_again(self, records: Any, read: Any = None) -> None:
        """The records of table changelogs in ``records`` that the fetch loop drops (the flow
        stopped, a new generation began) are fetched again: each such partition is sought back
        to its first record dropped (past ``read``, the offsets already delivered), unless it
        is already there or before.

        A fetch in flight when a rebalance starts completes under the new assignment with the
        changelog records of the table's recovery, or of its standby reading; the loop drops it
        (the flow is stopped), and the committed offsets it seeks back to are those of the
        stream partitions only. When the recovery had sought its partitions before that fetch
        completed, the dropped records were the ones it waited for. In a stress run of
        rebalances, a recovery got nothing from a partition twice in 71 cycles (the watched
        recovery, :mod:`streams.recovery`, reads it again 10 s later), and none in 65 cycles
        once these records were read again (too few to prove it the cause)."""
        if not records:
            return
        for tp, first in dropped_changelogs(records, self.app.tables.changelog_topics, read).items():
            try:
                at = await asyncio.wait_for(self.position(tp), 5.0)
                if at is None or first < at:
                    await self.seek(tp, first)
            except Exception as exc:  # noqa: BLE001 - no longer assigned: its next owner reads it
                self.log.dev("changelog %r not read again: %r", tp, exc)

    def ack_lane(self, batch: LaneBatch, start: int, stop: int) -> int:
        """Acknowledge ``batch[start:stop]``: for each record, what ``Consumer.ack`` does for a
        message (its offset joins the partition's acknowledged offsets, which the next commit
        reads), in one loop under Faust's ack lock. Lane records were never tracked as pending
        (Faust tracks a message when a stream takes it), so nothing is untracked. Returns how
        many were new."""
        if stop <= start or not self.app.topics.acks_enabled_for(batch.topic):
            return 0
        tps = batch._tps
        committed_of, index_of, acked_of = self._committed_offset, self._acked_index, self._acked
        n = 0
        with _ack_lock:
            for record in batch[start:stop]:
                tp = tps[record.partition]
                offset = record.offset
                committed = committed_of[tp]
                if committed is None or offset >= committed:
                    index = index_of[tp]
                    if offset not in index:
                        index.add(offset)
                        acked_of[tp].append(offset)
                        n += 1
            self._n_acked += n
        notify(self._waiting_for_ack)
        return n

    async def _lane_records(self, tp: Any, records: list, acks: bool) -> list:
        """The records of ``tp`` not read already, the partition's read offset moved past them
        and any gap before them noted (what Faust's fetch loop does per message)."""
        r_offset = self._read_offset[tp]
        first = records[0].offset
        contiguous = records[-1].offset - first == len(records) - 1
        if (r_offset is None or first >= r_offset) and contiguous:
            kept = records                      # the usual case: contiguous and new
            if r_offset and first - r_offset > 1 and acks:
                await self._add_gap(tp, r_offset + 1, first)
        else:
            kept = []
            for record in records:
                offset = record.offset
                if r_offset is not None and offset < r_offset:
                    continue                    # read already (Faust drops these too)
                if r_offset and offset - r_offset > 1 and acks:
                    await self._add_gap(tp, r_offset + 1, offset)
                kept.append(record)
                r_offset = offset
        if kept:
            self._read_offset[tp] = kept[-1].offset
        return kept

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - needs a broker
        # Faust's Consumer._drain_messages and Consumer.getmany in one, with the records of lane
        # topics given to their handler a fetched batch at a time (see the module doc); other
        # topics' messages take Faust's path, one ``wait_first`` and conductor callback each.
        lanes: dict[str, LaneHandler] = getattr(self.app, "batch_lanes", {})
        app = self.app
        callback = self.callback
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        set_flag = self.diag.set_flag
        unset_flag = self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = app.topics.acks_enabled_for
        to_message = self._to_message
        inbound = app.monitor.stream_inbound_time if app.monitor is not None else {}
        yield_every = 100
        num_since_yield = 0
        sleep = asyncio.sleep
        # the next fetch, asked for before a lane batch is handed over (see Prefetch)
        ahead: Prefetch | None = None
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                await self.sleep(0)
                if self.should_stop:
                    continue
                if ahead is None:
                    records, active_partitions = await self._wait_next_records(1.0)
                    generation_id = app.consumer_generation_id
                else:
                    fetched = await ahead.result()
                    ahead_records, ahead = ahead.records(), None
                    if fetched is None:     # completed while the flow was stopped: dropped
                        await self._read_changelogs_again(ahead_records)
                        if not self.flow_active:
                            await self._seek_back()
                        unset_flag(CONSUMER_FETCHING)
                        continue
                    (records, active_partitions), generation_id = fetched
                if records is None or self.should_stop:
                    unset_flag(CONSUMER_FETCHING)
                    continue
                if not self.flow_active:
                    self.log.dev("getmany called while flow not active. "
                                 "Seek back to committed offsets.")
                    await self._read_changelogs_again(records)
                    await self._seek_back()
                    unset_flag(CONSUMER_FETCHING)
                    continue
                buffered = self._buffered_partitions
                lane_tps: dict[str, list] = {}
                others = {}
                for tp, recs in records.items():
                    if recs and (active_partitions is None or tp in active_partitions
                                 or tp in buffered):
                        if tp.topic in lanes:
                            lane_tps.setdefault(tp.topic, []).append((tp, recs))
                        else:
                            others[tp] = recs
                if others and self._drop_recovery_fetch and app.in_recovery:
                    self._drop_recovery_fetch = False       # a drill: lose one recovery fetch
                    others = {tp: recs for tp, recs in others.items()
                              if tp.topic not in app.tables.changelog_topics}
                # other topics: Faust's path, message by message
                for tp, record in (self.scheduler.iterate(others) if others else ()):
                    if not self.flow_active or app.consumer_generation_id != generation_id:
                        await self._read_changelogs_again(others, self._read_offset)
                        break
                    app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                    message = to_message(tp, record)
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is not None and offset < r_offset:
                        continue            # read already (Faust drops these too)
                    if r_offset and offset - r_offset > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, r_offset + 1, offset)
                    if commit_every is not None and self.count_commit_due(commit_every):
                        self._n_acked = 0
                        self.commit_soon()
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await sleep(0)
                        num_since_yield = 0
                    await self.wait_first(callback(message), self.suspend_flow.wait())
                    set_read_offset(tp, offset)
                # lane topics: a batch per topic, its partitions in Faust's round robin
                for topic, parts in lane_tps.items():
                    acks = acks_enabled_for(topic)
                    kept, tps = [], {}
                    for tp, recs in parts:
                        if not self.flow_active or app.consumer_generation_id != generation_id:
                            break
                        app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                        recs = await self._lane_records(tp, recs, acks)
                        if recs:
                            kept.append(recs)
                            tps[tp.partition] = tp
                    if not kept:
                        continue
                    if commit_every is not None and self.count_commit_due(commit_every):
                        self._n_acked = 0
                        self.commit_soon()
                    ordered = round_robin(kept)
                    now = monotonic()
                    for tp in tps.values():     # the livelock detector's "stream is processing"
                        inbound[tp] = now
                    if ahead is None and self.flow_active and not self.should_stop:
                        ahead = Prefetch(self._wait_next_records(1.0), self)
                    await lanes[topic](LaneBatch(ordered, self, topic, tps, generation_id))
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
            if ahead is not None:
                ahead.cancel()


class Prefetch:
    """The consumer's next fetch, started before a lane handler gets the batch at hand, so that
    Faust's consumer thread fetches and unpacks it while the handler works. When the fetch was
    asked for only once the handler was done, the handler's loop waited for that thread each
    time: in the worker's benchmark the events lane stood idle for 2.75 s of 22.6 s in 100
    fetches.

    The fetch loop takes its outcome as it took an awaited fetch's, as of when it completed:
    the consumer generation then (records of an older generation are dropped by the loop's
    checks before any bookkeeping), and nothing (:meth:`result` gives None) if the flow was
    stopped then; the loop seeks its changelog partitions back to the first records dropped
    (:meth:`BatchConsumer._read_changelogs_again`: the table's recovery may have sought there
    before this fetch completed), and the stream partitions to the committed offsets if the
    flow is still stopped (a rebalance that has ended meanwhile made its own seek of those).
    A fetch that completes under a new
    assignment is taken: a recovery's changelog records come that way, and dropping them
    left the recovery waiting for them for ever."""

    __slots__ = ("_consumer", "_task", "_then")

    def __init__(self, fetch: Awaitable, consumer: Any):
        self._consumer = consumer
        self._then: tuple[bool, int] | None = None
        self._task = asyncio.ensure_future(fetch)
        self._task.add_done_callback(self._completed)

    def _completed(self, task: asyncio.Future) -> None:
        c = self._consumer
        self._then = (c.flow_active, c.app.consumer_generation_id)

    async def result(self) -> tuple[Any, int] | None:
        """(the fetch's records and active partitions, the consumer generation when it
        completed), or None if the flow was stopped then."""
        got = await self._task
        if self._then is None:      # (its callback runs first; this only guards the order)
            self._completed(self._task)
        active, generation = self._then
        return (got, generation) if active else None

    def records(self) -> dict:
        """The records of the fetch, once it completed (none if it failed)."""
        task = self._task
        if not task.done() or task.cancelled() or task.exception() is not None:
            return {}
        return task.result()[0] or {}

    def cancel(self) -> None:
        """Drop the fetch (the loop stops); its outcome, an error included, is not wanted."""
        self._task.cancel()
        self._task.add_done_callback(_taken)


def _taken(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class BatchTransport(_driver.Transport):
    Consumer = BatchConsumer


class SteadyFlowControl(FlowControlEvent):
    """Faust's flow control, except that resuming a flow that is not suspended leaves the
    agents' queues alone.

    ``FlowControlEvent.resume`` empties every agent's queue, meant for the messages of an
    assignment that a rebalance took away (the flow was suspended then). But a worker's
    recovery resumes the flow twice: to read the changelogs, then again once it has resumed the
    stream partitions and sought them back to their committed offsets. Messages fetched in
    between sit in the agents' queues, already counted as read, and the second resume dropped
    them unprocessed: a worker taking over from one killed right after publishing an alert lost
    that alert, its brake and its notice, about one start in twenty. Only a resume that ends a
    suspension empties the queues now."""

    def resume(self) -> None:
        if self.is_active():
            return        # not suspended: the queues hold this assignment's messages
        super().resume()


class PromptTableManager(TableManager):
    """Faust's table manager without the second it waits at start before it looks at the
    tables (for tables an app declares late). The worker declares its table before it starts,
    so that second was only a second more of restart, with the brake off. Its recovery is
    watched (:class:`streams.recovery.WatchedRecovery`)."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    @property
    def recovery(self) -> WatchedRecovery:
        """The recovery, one whose changelog partitions that went quiet are read again."""
        if self._recovery is None:
            self._recovery = WatchedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


#: the function of Faust's own ``App.maybe_start_producer`` (a mode ``stampede`` descriptor,
#: whose ``__wrapped__`` it is)
_FAUST_START_PRODUCER = faust.App.__dict__["maybe_start_producer"].__wrapped__


class BatchApp(faust.App):
    """A ``faust.App`` with batch lanes (:meth:`batch_lane`) and ``before_commit`` hooks, whose
    flow control keeps the agents' queues when nothing was suspended (:class:`SteadyFlowControl`)
    and whose started producer is given to each send without turns of the event loop
    (:meth:`maybe_start_producer`)."""

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        return SteadyFlowControl(loop=self.loop)

    def __init__(self, *args: Any, batch_lanes: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("TableManager", PromptTableManager)
        super().__init__(*args, **kwargs)
        self.batch_lanes_enabled = batch_lanes
        self.batch_lanes: dict[str, LaneHandler] = {}
        self.before_commit: list[Callable[[], None]] = []
        # Faust's maybe_start_producer, kept under another name (see maybe_start_producer)
        self._start_producer = StampedeWrapper(_FAUST_START_PRODUCER, self)
        self._running_producer: Any = None

    async def maybe_start_producer(self) -> Any:
        """The producer, started: Faust's, once it has started it, straight away.

        Faust calls this before every message it sends (a topic's ``send``, the table's
        changelog writes), and its own version (a mode ``stampede``, which makes concurrent
        callers wait for one start) takes three turns of the event loop on every call, started
        or not. In the events lane each alert's send waited that long, 2 ms at the median on a
        busy worker, while the consumer thread and every other task took those turns: 1.5 s of
        a 14 s pass over 480 alerts, measured. Through Kafka against the worker before this
        (bench_worker_kafka, 48 runs x 800 steps, two runs of 5 rounds): 1.01 and 1.11 times the
        throughput at the median, faster in 7 rounds of 10 (the threads' other work filled most
        of those turns). Until the producer has started, Faust's version starts it (one start
        however many callers)."""
        producer = self._running_producer
        if producer is not None and producer is self.producer and not producer.should_stop:
            return producer
        producer = await self._start_producer()
        if not self.in_transaction:     # (a transaction's producer is Faust's to choose)
            self._running_producer = producer
        return producer

    def _new_transport(self) -> Any:
        # lanes off (``batch_lanes=False``): the same consumer, every message through Faust's
        # own path, and the before_commit hooks still run
        return BatchTransport(self.conf.broker_consumer, self)

    def batch_lane(self, topic: Any) -> Callable[[LaneHandler], LaneHandler]:
        """Give the records of ``topic`` (subscribed by an agent) to the decorated coroutine
        function, a fetched batch (a :class:`LaneBatch`) at a time."""
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
