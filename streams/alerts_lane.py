"""What the worker does with each alert it reads back from the alerts topic: pull its brake
(a firing alert's commands to the control channel) and notify it (incident, outbox), and
acknowledge it to Kafka only once both are done.

The alerts topic is what makes a brake and a notice durable: a worker killed before both were
done leaves the alert unacknowledged, so whoever owns the partition next reads it again (both
are idempotent: by command id and by delivery key). The brake runs on its own thread; the
notifications run in the topic's order, in :meth:`AlertsLane.notifications`, a task of their
own, so neither holds up the consumer that hands the alerts over (and, in the worker, the events
fetched with them). The alerts waiting for their notification when it gets to them are notified
together (up to ``NOTIFY_BATCH``): the dispatcher then makes one round trip to Redis for all of
them where each alert made five.

The worker took the topic through two Faust agents before, each message on Faust's own path
(``wait_first``, the conductor, two agents' streams): about 1.1 ms per alert in which the
consumer handed no event to the events lane (measured: 1.08 s for 957 alerts of a 96-run fleet).
The batch lane (:mod:`streams.batch_lane`) now gives them here a fetched batch at a time.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from contract.alert import Alert

__all__ = ["NOTICES_QUEUED", "NOTIFY_BATCH", "AlertsLane"]

log = logging.getLogger("rlwatch.worker")

#: alerts waiting for their notification; with more, the consumer waits (as it waited for a
#: full agent queue before): nothing read is dropped
NOTICES_QUEUED = 1024
#: alerts notified together, at most
NOTIFY_BATCH = 64


class AlertsLane:
    """Takes the alerts topic's messages (:meth:`take`) and acknowledges each once its brake
    and its notification are done.

    ``read(raw)``: the message's alert, or None (a foreign message: acknowledged at once).
    ``brake(alert, done)``: pull a firing alert's brake; ``done()`` is called on the event loop
    once the control channel took its commands. ``notify(alerts)``: the notifications of
    ``alerts``, in their order (awaited; raising fails them all).
    ``generation()``: the consumer group's generation now; a notification whose alert was read
    in an older one is left undone and unacknowledged (a rebalance came between: the alert is
    read again, here or by the partition's new owner, as Faust dropped what its agents' queues
    held then).
    """

    def __init__(self, read: Callable[[Any], Alert | None],
                 brake: Callable[[Alert, Callable[[], None]], None],
                 notify: Callable[[list[Alert]], Awaitable[Any]],
                 generation: Callable[[], int], *, queued: int = NOTICES_QUEUED,
                 batch: int = NOTIFY_BATCH):
        self._read, self._brake, self._notify = read, brake, notify
        self._generation, self._batch = generation, batch
        self._queue: asyncio.Queue = asyncio.Queue(queued)
        self._busy = False      # a notification under way
        self._progress = asyncio.Event()     # set when one is done (catch_up)
        self.stale = 0          # notifications left to a later reading after a rebalance

    async def take(self, raw: Any, ack: Callable[[], Any], generation: int) -> None:
        """One message of the alerts topic, read in consumer ``generation``: ``ack()`` once
        what it asks is done. Waits only while the notifications' queue is full."""
        alert = self._read(raw)
        if alert is None:
            ack()
            return
        left = 2 if alert.state == "firing" else 1

        def one_done() -> None:
            nonlocal left
            left -= 1
            if not left:
                ack()

        if left == 2:
            self._brake(alert, one_done)
        await self._queue.put((alert, one_done, generation))

    async def notifications(self) -> None:
        """Notify the alerts taken, in the order taken, those waiting together (runs for
        ever)."""
        queue = self._queue
        while True:
            taken = [await queue.get()]
            while len(taken) < self._batch and not queue.empty():
                taken.append(queue.get_nowait())
            now = self._generation()
            fresh = [t for t in taken if t[2] == now]
            self.stale += len(taken) - len(fresh)
            if not fresh:
                continue
            self._busy = True
            try:
                await self._notify([alert for alert, _, _ in fresh])
            except Exception:  # noqa: BLE001 - the next alerts are notified all the same
                if len(fresh) == 1:
                    self._failed(fresh[0][0])
                else:       # each again alone: one bad alert holds back only itself
                    for alert, done, _ in fresh:
                        try:
                            await self._notify([alert])
                        except Exception:  # noqa: BLE001
                            self._failed(alert)
                        else:
                            done()
            else:
                for _, done, _ in fresh:
                    done()
            finally:
                self._busy = False
                self._progress.set()

    @staticmethod
    def _failed(alert: Alert) -> None:
        log.exception("rlwatch: notifying the %s alert %s of run %s failed; it stays "
                      "unacknowledged, so the worker that reads it again notifies it",
                      alert.state, alert.rule, alert.run_id)

    @property
    def behind(self) -> bool:
        """Whether notifications are waiting or under way."""
        return self._busy or not self._queue.empty()

    async def catch_up(self, seconds: float, clock: Callable[[], float]) -> None:
        """Let the notifications run for up to ``seconds`` (by ``clock``), or until none is
        left. A busy events lane calls this at each of its turns: a notification takes a few
        round trips to Redis, each a turn of the event loop, and with one turn per 10 ms of
        events the alerts of a busy fleet waited seconds to be notified."""
        end = clock() + seconds
        progress = self._progress
        while self.behind:
            left = end - clock()
            if left <= 0:
                return
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), left)
            except asyncio.TimeoutError:
                return

    @property
    def waiting(self) -> int:
        """Alerts waiting for their notification."""
        return self._queue.qsize()
