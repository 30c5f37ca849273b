"""The brake's own lane: a firing alert's commands reach the control channel first, whatever
the receivers are doing, and are retried until the channel takes them.

:meth:`BrakeLane.pull` sends each command (:meth:`alerts.control.ControlChannel.send`:
idempotent per command id, so a crash anywhere before the caller marks the alert done only means
it is sent again) and registers each pause or stop with the acknowledgement tracker
(:mod:`alerts.escalation`). While the control channel (Redis) is unreachable it keeps trying,
after the delays of the retry policy (:mod:`alerts.retry`): it never drops a brake. It says so
once in the log, and when a pause or stop has waited ``unreachable_after`` seconds it raises the alarm
through ``on_unreachable`` (the dispatcher pages the receivers directly, without Redis); when the
brake finally lands, ``on_recovered`` is called.

:meth:`BrakeLane.resend` (on the worker's timer) publishes again, with a new signed ``sent``
time, the brakes no worker has acknowledged yet: a worker that missed it gets it, one that
applied it acknowledges it again. It re-sends each one ``resend_every`` seconds after it was
sent, then twice as long after each re-send, at most ``resend_most`` apart, and each re-send
is taken by one worker of the deployment (:meth:`alerts.escalation.AckTracker.due_again`).

:meth:`BrakeLane.submit` runs a pull in the background: brakes of different runs proceed side by
side (one run waiting for Redis holds back no other run's alarm), those of one run in order. The
worker acknowledges the alert to Kafka only from ``on_done``, so a worker that dies first leaves
it to its successor.

:class:`BrakeThread` gives the lane a thread and an event loop of its own in the worker: a pause
then waits for no turn behind the processing of events or the sending of notifications on the
worker's loop (a pause's trip through Redis takes a few milliseconds there, and its turn on a
busy shared loop could take hundreds).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from alerts.actions import may_command
from alerts.control import ControlChannel
from alerts.escalation import BRAKES, RESEND_MOST, AckTracker
from alerts.retry import RetryPolicy
from contract.commands import Command

__all__ = ["BRAKE_RETRY", "BrakeLane", "BrakeThread"]

log = logging.getLogger("rlwatch.alerts")

#: Brakes are retried quickly and never given up: a pause lands seconds after Redis returns.
BRAKE_RETRY = RetryPolicy(base=0.2, cap=2.0, give_up_after=float("inf"))

Alarm = Callable[[Command, str, float], Awaitable[None]]

#: command ids a lane remembers having got taken (the worker pulls each brake twice: at once,
#: and again from the alerts topic, which is what survives a crash)
TAKEN_MEMORY = 4096


class BrakeLane:
    def __init__(self, control: ControlChannel, acks: AckTracker | None = None, *,
                 clock: Callable[[], float], secret: str | None = None,
                 retry: RetryPolicy = BRAKE_RETRY, unreachable_after: float = 10.0,
                 resend_every: float = 5.0, resend_most: float = RESEND_MOST,
                 on_unreachable: Alarm | None = None, on_recovered: Alarm | None = None,
                 safe: Callable[[object], str] = str,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        if not resend_every > 0:
            raise ValueError(f"the wait before a brake's first re-send must be positive, not {resend_every}")
        self.control, self.acks, self.clock, self.secret = control, acks, clock, secret
        self.retry, self.unreachable_after = retry, unreachable_after
        self.resend_every, self.resend_most = resend_every, resend_most
        self.on_unreachable, self.on_recovered, self.safe, self.sleep = on_unreachable, on_recovered, safe, sleep
        self.failures = 0
        self._tails: dict[str, asyncio.Task] = {}      # run id -> its latest brake in progress
        self._taken: OrderedDict[str, None] = OrderedDict()   # ids the channel took from this lane
        self._one_by_one = False     # said that sending commands together failed

    def submit(self, run_id: str, commands: list[Command], on_done: Callable[[], None] | None = None) -> None:
        """Pull these brakes in the background, after any earlier ones of the same run; call
        ``on_done`` once the control channel took every command."""
        before = self._tails.get(run_id)

        async def go() -> None:
            if before is not None:
                await asyncio.wait([before])
            await self.pull(commands)
            if on_done is not None:
                on_done()

        task = asyncio.get_running_loop().create_task(go())
        self._tails[run_id] = task

        def forget(t: asyncio.Task) -> None:
            if self._tails.get(run_id) is t:
                del self._tails[run_id]
            if not t.cancelled() and t.exception() is not None:
                log.error("rlwatch: the brake of run %s failed: %s", run_id, self.safe(t.exception()))

        task.add_done_callback(forget)

    @property
    def in_progress(self) -> int:
        return len(self._tails)

    async def close(self) -> None:
        """Stop the brakes still waiting for Redis (their alerts were not acknowledged: the
        next worker pulls them)."""
        for t in list(self._tails.values()):
            t.cancel()
        await asyncio.gather(*self._tails.values(), return_exceptions=True)

    async def pull(self, commands: list[Command]) -> list[Command]:
        """Send ``commands`` in order; returns those applied for the first time (the others had
        been applied before and were only published again). A command this lane got taken
        already (among its last ``TAKEN_MEMORY``) is not sent again: the worker pulls each brake
        twice, at once and from the alerts topic, and the second pull by the same process
        would only repeat Redis's answer (a successor after a crash has no such memory, and
        sends it)."""
        fresh = []
        taken = self._taken
        todo = [cmd for cmd in commands if cmd.id not in taken]
        for cmd, first in zip(todo, await self._at_once(todo)):
            if first is None:
                first = await self._until_taken(cmd)
            if first:
                fresh.append(cmd)
            taken[cmd.id] = None
            if len(taken) > TAKEN_MEMORY:
                taken.popitem(last=False)
        return fresh

    async def _at_once(self, cmds: list[Command], track: bool = True) -> list[bool | None]:
        """``cmds`` sent in one round trip with their acknowledgement tracking, where the
        control channel and the tracker share a Redis client (``RedisControl.send_all``): a
        pause and its snapshot took four round trips one by one. For each command whether it
        was applied now, or None where it must go the one-by-one way (:meth:`_until_taken`):
        the run's state had changed under it, or the round trip failed (that way retries it,
        says so and raises the alarm). ``track``: the pauses and stops among them wait for
        an acknowledgement (a re-send does not track them again)."""
        send_all = getattr(self.control, "send_all", None)
        acks = self.acks if track else None
        if send_all is None or not cmds or (acks is not None and (
                getattr(acks, "redis", None) is not getattr(self.control, "redis", None)
                or not hasattr(acks, "expect_on"))):
            return [None] * len(cmds)

        def expect(pipe) -> None:
            for cmd in cmds:
                acks.expect_on(pipe, cmd)
        try:
            if acks is None:
                return await send_all(cmds)
            return await send_all(cmds, then=expect, scripts=acks.scripts)
        except Exception as exc:  # noqa: BLE001 - the one-by-one way retries, logs and alarms
            if not self._one_by_one:      # (said once: Redis away is said by that way too)
                self._one_by_one = True
                log.warning("rlwatch: sending the commands of a brake together failed (%s); "
                            "they go one by one", self.safe(f"{type(exc).__name__}: {exc}"))
            return [None] * len(cmds)

    async def _until_taken(self, cmd: Command) -> bool:
        attempts, since, alarmed, err = 0, None, False, ""
        while True:
            try:
                first = await self.control.send(cmd)
                if self.acks is not None:
                    await self.acks.expect(cmd)
                break
            except Exception as exc:  # noqa: BLE001 - Redis down or flaky: try again, never drop
                attempts += 1
                self.failures += 1
                now = self.clock()
                since = now if since is None else since
                err = self.safe(f"{type(exc).__name__}: {exc}")
                if attempts == 1:
                    log.error("rlwatch: cannot send %s to run %s (%s); retrying until the control "
                              "channel takes it", cmd.action, cmd.run_id, err)
                if not alarmed and now - since >= self.unreachable_after and self.on_unreachable \
                        and cmd.action in BRAKES:      # an adjust or a snapshot waits quietly
                    alarmed = True
                    await self.on_unreachable(cmd, err, now - since)
                await self.sleep(self.retry.delay(attempts))
        if attempts:
            waited = self.clock() - since
            log.warning("rlwatch: %s reached run %s after %d failed attempt(s) in %.1fs",
                        cmd.action, cmd.run_id, attempts, waited)
            if alarmed and self.on_recovered:
                await self.on_recovered(cmd, err, waited)
        return first

    async def resend(self, now: float) -> int:
        """Publish again the brakes still unacknowledged whose re-send is due (the first
        ``resend_every`` after the brake, then twice as long after each, at most
        ``resend_most`` apart; due once per deployment); how many."""
        if self.acks is None:
            return 0
        due = [cmd.signed(self.secret, sent=now)
               for cmd in await self.acks.due_again(now, self.resend_every, self.resend_most)]
        # all in one round trip where the channel can (a fleet's brakes no worker acknowledges,
        # of runs without a listener or gone, took one each), not tracked again (an escalated
        # brake must not wait for its acknowledgement anew); one by one those whose run's
        # state changed under them, and all of them if that trip fails
        for cmd, sent in zip(due, await self._at_once(due, track=False)):
            if sent is None:
                await self.control.send(cmd)
        return len(due)


class BrakeThread:
    """A :class:`BrakeLane` on a thread and event loop of its own.

    ``make_lane`` builds the lane inside the thread (its Redis client belongs to that loop);
    ``plan`` turns an alert into its commands. :meth:`submit` may be called from any thread;
    ``on_done`` runs on the brake thread (hand it to your own loop with ``call_soon_threadsafe``),
    or at once on the caller's for an alert that cannot command anything (the thread is not
    woken for it: a woken thread takes the GIL from the caller's work).
    """

    def __init__(self, make_lane: Callable[[], BrakeLane], plan: Callable[[object], list[Command]],
                 name: str = "rlwatch-brake"):
        self.make_lane, self.plan = make_lane, plan
        self.lane: BrakeLane | None = None
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self, timeout: float = 10.0) -> BrakeThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the brake thread did not start")
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def build() -> None:
            self.lane = self.make_lane()

        self.loop.run_until_complete(build())
        self._ready.set()
        self.loop.run_forever()

    def submit(self, alert, on_done: Callable[[], None] | None = None) -> None:
        """Pull the brake of ``alert`` (a firing alert) on the brake thread."""
        if not may_command(alert):
            if on_done is not None:
                on_done()
            return

        def go() -> None:
            commands = self.plan(alert)
            if not commands:
                if on_done is not None:
                    on_done()
                return
            self.lane.submit(alert.run_id, commands, on_done)

        self.loop.call_soon_threadsafe(go)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still waits for Redis (its alerts stay unacknowledged) and end the thread."""
        if not self._thread.is_alive():
            return

        async def close() -> None:
            if self.lane is not None:
                await self.lane.close()
                await self.lane.control.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout)
        except Exception:  # noqa: BLE001 - closing: nothing more to do
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
