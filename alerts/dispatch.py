"""Deliver an alert: pull the brake, keep the snapshot, route, notify.

Two lanes, each idempotent, so handling an alert again (after a crash, on a second worker) does
nothing twice, and each marked done only after it acted:

* **the brake** (:meth:`Dispatcher.brake`, :mod:`alerts.brake`): the rule's actions minus those
  that are advisory for this run (:class:`alerts.actions.EnforcementPolicy`) become commands,
  with ids derived from the alert, sent to the control channel and retried until it takes them;
  each pause or stop is remembered until a worker acknowledges it (:mod:`alerts.escalation`).
  No receiver is ever in its way.
* **notifications** (:meth:`Dispatcher.notify`): the **incident snapshot** of an alert with
  ``snapshot`` (:mod:`alerts.incidents`), then **routing**: the routing tree picks (route,
  receiver) pairs and each notification is written to the durable **outbox** (once per
  receiver and alert: the outbox's mark), due now or when its group's wait is over. Sending is
  :mod:`alerts.delivery`'s job, one lane per receiver. When the outbox (Redis) cannot be
  reached, the alert is sent straight to its receivers instead, loudly.

:meth:`Dispatcher.handle` does both and waits for the sends (the embedded demo, tests);
``rlwatch worker`` runs the lanes in separate agents and never waits for a receiver.
:meth:`Dispatcher.tick` (the worker's timer) sends the repeats that are due, escalates
unacknowledged brakes, re-sends them, and drains the outbox. Without stores the dispatcher keeps
everything in memory (the embedded demo), with the same semantics.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from alerts.actions import COMMAND_ACTIONS, Enforcement, command_id, commands_for
from alerts.brake import BRAKE_RETRY, BrakeLane
from alerts.control import ControlChannel
from alerts.delivery import STRAY_EVERY, Drainer, StoreHealth, delivery_key, notice_item
from alerts.escalation import RESEND_MOST, AckTracker, escalation_alert, unreachable_alert
from alerts.notices import acknowledged_notice, takes_notices
from alerts.grouping import GroupClock, due, group_key, repeat_due
from alerts.incidents import IncidentStore, make_incident
from alerts.notifiers import Notifier
from alerts.outbox import MemoryOutbox, Outbox, OutboxItem, item_id
from alerts.redact import redact
from alerts.retry import RetryPolicy
from alerts.routing import Routing
from alerts.silences import SilenceStore
from contract.alert import Alert, Raw
from contract.commands import Command

__all__ = ["Delivery", "Dispatcher", "delivery_key"]

log = logging.getLogger("rlwatch.alerts")

#: Sends straight to the receivers (outbox unreachable) running at once, at most.
DIRECT_MAX = 64


@dataclass
class Delivery:
    alert: Alert
    duplicate: bool = False                                    # handled before: nothing new done
    commands: list[Command] = field(default_factory=list)      # applied now (first time)
    advisory: list[str] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    queued: list[str] = field(default_factory=list)            # receivers it is waiting for
    suppressed: dict[str, str] = field(default_factory=dict)   # receiver -> silenced/inhibited/...
    incident: str | None = None


class Dispatcher:
    def __init__(self, notifiers: list[Notifier], control: ControlChannel | None, *,
                 clock: Callable[[], float], enforcement: Enforcement = Enforcement(),
                 secret: str | None = None, routing: Routing | None = None,
                 outbox: Outbox | None = None, silences: SilenceStore | None = None,
                 incidents: IncidentStore | None = None, acks: AckTracker | None = None,
                 retry: RetryPolicy | None = None, retry_base: float = 1.0, retry_cap: float = 300.0,
                 give_up_after: float = 86400.0, brake_retry: RetryPolicy = BRAKE_RETRY,
                 unreachable_after: float = 10.0, resend_every: float = 5.0,
                 resend_most: float = RESEND_MOST, step_hold: float = 600.0, lease: float = 30.0,
                 fleet_turn: float = 0.0):
        self.notifiers: dict[str, Notifier] = OrderedDict((n.name, n) for n in notifiers)
        if len(self.notifiers) != len(notifiers):
            raise ValueError("two notifiers share a name: " + ", ".join(n.name for n in notifiers))
        self.control, self.clock, self.secret = control, clock, secret
        self.routing = routing or Routing.default(self.notifiers, enforcement.advisory)
        missing = sorted({r for route in self.routing.root.walk() for r in route.receivers} - set(self.notifiers))
        if missing:
            raise ValueError(f"routes name receivers that are not configured: {', '.join(missing)}")
        self.outbox: Outbox = outbox or MemoryOutbox()
        self.silences, self.incidents, self.acks = silences, incidents, acks
        self.step_hold = step_hold
        #: seconds between two passes of the timer's fleet work (repeats, unacknowledged brakes)
        #: in the deployment: one worker's tick does it per turn (0: every tick)
        self.fleet_turn = fleet_turn
        self.secrets = [s for n in notifiers for s in getattr(n, "secrets", ()) if s]
        if secret:
            self.secrets.append(secret)
        self.retry = retry or RetryPolicy(retry_base, retry_cap, give_up_after)
        self.health = StoreHealth(self._safe)
        self.drainer = Drainer(self.notifiers, self.outbox, self.routing, clock=clock, retry=self.retry,
                               lease=lease, silences=silences, safe=self._safe, health=self.health)
        self.brakes = BrakeLane(control, acks, clock=clock, secret=secret, retry=brake_retry,
                                unreachable_after=unreachable_after, resend_every=resend_every,
                                resend_most=resend_most,
                                on_unreachable=self._unreachable, on_recovered=self._recovered,
                                safe=self._safe) if control is not None else None
        self._direct_tasks: set[asyncio.Task] = set()
        self.direct_failures = 0
        #: when this worker last asked for the turn of :meth:`Drainer.bury_strays` (its first
        #: tick only starts the count: the deployment's other workers say what they send to first)
        self._strays_at: float | None = None

    @property
    def failures(self) -> int:
        return self.drainer.failures + (self.brakes.failures if self.brakes else 0) + self.direct_failures

    # -- compatibility for the retry knobs (tests shrink them) ---------------------------------
    @property
    def retry_base(self) -> float:
        return self.retry.base

    @retry_base.setter
    def retry_base(self, value: float) -> None:
        self._set_retry(base=value)

    @property
    def retry_cap(self) -> float:
        return self.retry.cap

    @retry_cap.setter
    def retry_cap(self, value: float) -> None:
        self._set_retry(cap=value)

    def _set_retry(self, **kw) -> None:
        from dataclasses import replace

        self.retry = self.drainer.retry = replace(self.retry, **kw)

    # -- one alert ------------------------------------------------------------------------------
    async def handle(self, alert: Alert, wait: bool = True) -> Delivery:
        """The brake, then the notifications; with ``wait``, until the due sends are done."""
        alert, snapshot = self._split(alert)
        out = Delivery(alert)
        out.commands = await self.brake(alert)
        await self.notify(alert, out, snapshot=snapshot, wait=wait)
        return out

    async def brake(self, alert: Alert) -> list[Command]:
        """The brake lane: the commands of ``alert`` applied now (the first time), retried until
        the control channel takes them."""
        alert, _ = self._split(alert)
        planned = self._planned(alert, self.clock(), self.secret)
        if self.brakes is None or not planned:
            return []
        return await self.brakes.pull(planned)

    def plan(self, alert: Alert) -> list[Command]:
        """The commands of ``alert`` (signed; ids derived from the alert), none if not firing.
        (They read the alert's fields, never its snapshot: it is not stripped first.)"""
        return self._planned(alert, self.clock(), self.secret)

    async def alarm(self, cmd: Command, error: str, waited: float, resolved: bool = False) -> None:
        """Page that a brake could not be sent (or, ``resolved``, that it finally was)."""
        await (self._recovered if resolved else self._unreachable)(cmd, error, waited)

    def brake_later(self, alert: Alert, on_done: Callable[[], None]) -> None:
        """The brake lane of the worker: pull the brake in the background (after the run's
        earlier brakes, beside other runs'), then ``on_done``."""
        alert, _ = self._split(alert)
        planned = self._planned(alert, self.clock(), self.secret)
        if self.brakes is None or not planned:
            on_done()
            return
        self.brakes.submit(alert.run_id, planned, on_done)

    async def notify(self, alert: Alert, out: Delivery | None = None, *, snapshot: dict | Raw | None = None,
                     wait: bool = False) -> Delivery:
        """The notification lane of one alert: incident, outbox, then the sends (awaited with
        ``wait``, else started in the background)."""
        return (await self._notify_all([(alert, out, snapshot)], wait))[0]

    async def notify_all(self, alerts: list[Alert]) -> list[Delivery]:
        """:meth:`notify` each alert, in order, the sends in the background: the worker's
        notification lane, with the alerts waiting for it. The stores see them together:
        their incidents in one round trip to Redis, their admission in one, their items in
        one (each alert's took five, about 0.1 ms of CPU each)."""
        return await self._notify_all([(a, None, None) for a in alerts], False)

    async def _notify_all(self, entries: list[tuple[Alert, Delivery | None, dict | Raw | None]],
                          wait: bool) -> list[Delivery]:
        now = self.clock()
        todo: list[tuple[Alert, Delivery, dict | Raw | None, list[str]]] = []
        for alert, out, snapshot in entries:
            alert, snap = self._split(alert)
            out = out or Delivery(alert)
            advisory = self.routing.policy.advisory_for(alert.run_id, alert.rule)
            out.advisory = [a for a in alert.actions if a in COMMAND_ACTIONS and a in advisory]
            done = [c.action for c in self._planned(alert, now, None)] if self.control is not None else []
            todo.append((alert, out, snapshot if snapshot is not None else snap, done))
        outs = [out for _, out, _, _ in todo]
        try:
            notes = await self._incidents(todo, now)
            touched, new = await self._enqueue([(alert.model_copy(update=note) if note else alert, out, done)
                                                for (alert, out, _, done), note in zip(todo, notes)], now)
            self.health.ok(now)
        except Exception as exc:  # noqa: BLE001 - Redis is down: page anyway, straight to the receivers
            for alert, out, _, done in todo:
                await self._direct(alert, done, out, exc, wait)
            return outs
        for out, fresh in zip(outs, new):
            out.duplicate = not fresh and not out.commands
        await self._send_queued(now, touched, outs, wait)
        return outs

    async def _send_queued(self, now: float, receivers, outs: list[Delivery], wait: bool) -> None:
        """The sends of what was just queued for ``receivers``: awaited with ``wait`` (a lone
        alert's outcome noted in its delivery), else started in the background lanes; each
        delivery's ``queued`` then names the receivers it still waits for."""
        if wait:
            try:
                await self.drainer.drain(now, receivers, outs[0] if len(outs) == 1 else None)
            except Exception as exc:  # noqa: BLE001 - queued already: the timer's drain retries
                log.error("rlwatch: outbox drain failed (the timer retries): %s",
                          self._safe(f"{type(exc).__name__}: {exc}"))
        elif receivers:
            self.drainer.kick(receivers)
        for out in outs:
            out.queued = [r for r in out.queued if r not in out.delivered and r not in out.suppressed]

    async def notice(self, alert: Alert, wait: bool = False) -> Delivery:
        """A one-off notice (:mod:`alerts.notices`: a brake acknowledged) to its routed
        receivers that take notices: queued in the outbox due now, in a group of its own and
        never among the active alerts (it never resolves or repeats), so it is retried and
        silenced like any notification (as an operator's notice that failed is, which
        :class:`alerts.announce.Announcer` leaves there); sent (awaited with ``wait``, else in
        the background lanes). Straight to the receivers when the outbox is unreachable."""
        now = self.clock()
        out = Delivery(alert)
        targets = [name for _, name in self.routing.targets(alert) if takes_notices(self.notifiers[name])]
        if not targets:
            return out
        items = [notice_item(alert, name, now) for name in targets]
        try:
            new, _ = await self.outbox.enqueue_all(items, {}, {}, now)
        except Exception as exc:  # noqa: BLE001 - Redis is down: tell them anyway, straight
            await self._direct(alert, [], out, exc, wait, targets)
            return out
        out.queued = [it.receiver for it, fresh in zip(items, new) if fresh]
        out.duplicate = not out.queued
        if out.queued:
            await self._send_queued(now, list(out.queued), [out], wait)
        return out

    def _split(self, alert: Alert) -> tuple[Alert, dict | Raw | None]:
        """The alert without its snapshot, and the snapshot: a dict, or the JSON text it came
        in (``msgspec.Raw``: :meth:`contract.alert.Alert.from_json_keeping_snapshot`)."""
        extra = alert.model_extra or {}
        if "snapshot" not in extra:
            return alert, None
        # the snapshot (tens of kilobytes) is left out of the dump, not copied and dropped
        return Alert.model_validate(alert.model_dump(exclude={"snapshot"})), extra["snapshot"]

    def _planned(self, alert: Alert, now: float, secret: str | None) -> list[Command]:
        advisory = self.routing.policy.advisory_for(alert.run_id, alert.rule)
        return commands_for(alert, now, Enforcement(advisory), secret, key=delivery_key(alert))

    async def _incidents(self, todo: list[tuple[Alert, Delivery, dict | Raw | None, list[str]]],
                         now: float) -> list[dict]:
        """The incidents of the firing alerts with ``snapshot``, stored together; what each
        alert's notification says of them (and of its advisory actions)."""
        notes: list[dict] = []
        incidents = []
        for alert, out, snapshot, done in todo:
            note = {"actions_advisory": out.advisory} if out.advisory else {}
            if self.incidents is not None and alert.state == "firing" and "snapshot" in alert.actions:
                key = delivery_key(alert)
                inc = make_incident(alert, snapshot, now, done, {a: command_id(key, a) for a in done})
                incidents.append(inc)
                out.incident = inc["id"]
                note = {"incident": inc["id"], **note}
            notes.append(note)
        if incidents:
            await self.incidents.save_all(incidents)
        return notes

    async def _enqueue(self, todo: list[tuple[Alert, Delivery, list[str]]],
                       now: float) -> tuple[set[str], list[bool]]:
        """Queue one notification per routed receiver of each alert; (receivers to drain,
        whether each alert queued anything new). Two round trips to the outbox for all: the
        alerts tracked and their groups' clocks read, then the new clocks, the items and the
        release of the runs' held items written. A group's clock started by an alert holds for
        the alerts after it, as if each had been queued alone."""
        targets = [list(self.routing.targets(alert)) for alert, _, _ in todo]
        groups = [[group_key(route, alert) for route, _ in t] for (alert, _, _), t in zip(todo, targets)]
        clocks = await self.outbox.admit_all([(alert, g) for (alert, _, _), g in zip(todo, groups)], now)
        started: dict[str, GroupClock] = {}
        items: list[OutboxItem] = []
        owners: list[int] = []
        steps: dict[str, int] = {}
        for k, ((alert, _, done), tg, gs, cl) in enumerate(zip(todo, targets, groups, clocks)):
            key = delivery_key(alert)
            body = alert.to_json()
            for (route, receiver), group in zip(tg, gs):
                clock = cl.get(group)
                if clock is None:
                    clock = started.get(group)
                if clock is None:
                    clock = started[group] = GroupClock(route.id, alert.run_id, now, alert.step)
                due_ts, due_step = due(clock, route)
                if due_step is not None and alert.step >= due_step:
                    due_ts, due_step = now, None
                next_try = max(now, due_ts) if due_ts is not None else now + self.step_hold
                items.append(OutboxItem(item_id(receiver, key), receiver, group, key, alert.run_id, body,
                                        done, enqueued=now, next_try=next_try, due_step=due_step))
                owners.append(k)
            steps[alert.run_id] = max(alert.step, steps.get(alert.run_id, alert.step))
        new_items, released = await self.outbox.enqueue_all(items, started, steps, now)
        touched: set[str] = set()
        new = [False] * len(todo)
        for item, k, fresh in zip(items, owners, new_items):
            if fresh:
                todo[k][1].queued.append(item.receiver)
                touched.add(item.receiver)
                new[k] = True
        if released:
            touched.update(self.notifiers)
        return touched, new

    # -- straight to the receivers, when Redis is down ----------------------------------------
    async def _direct(self, alert: Alert, done: list[str], out: Delivery | None, exc: Exception | None,
                      wait: bool, targets: list[str] | None = None) -> None:
        """The degraded path when the store (Redis) fails: send straight to the routed receivers,
        without the outbox (no retries, no once-only guarantee). Loud, because a page may repeat
        or be lost; better than a silent monitor. Never blocks the caller unless ``wait``."""
        self.direct_failures += 1
        if exc is not None:
            self.health.failed(exc, f"queueing {alert.rule}/{alert.severity} for {alert.run_id}", self.clock())
            if out is not None:
                out.failed["store"] = self._safe(f"{type(exc).__name__}: {exc}")
        if targets is None:
            targets = [name for _, name in self.routing.targets(alert)]
        if wait:
            await self._send_direct(alert, done, targets, out)
            return
        if len(self._direct_tasks) >= DIRECT_MAX:
            log.error("rlwatch: %d direct sends pending already; %s/%s for %s not sent",
                      len(self._direct_tasks), alert.rule, alert.severity, alert.run_id)
            return
        task = asyncio.get_running_loop().create_task(self._send_direct(alert, done, targets, out))
        self._direct_tasks.add(task)
        task.add_done_callback(self._direct_tasks.discard)

    async def _send_direct(self, alert: Alert, done: list[str], targets: list[str], out: Delivery | None) -> None:
        results = await asyncio.gather(*(self.notifiers[n].send(alert, done) for n in targets),
                                       return_exceptions=True)
        for name, r in zip(targets, results):
            if isinstance(r, BaseException):
                if out is not None:
                    out.failed[name] = self._safe(f"{type(r).__name__}: {r}")
                log.error("rlwatch: %s: direct send of %s/%s for %s failed: %s", name, alert.rule,
                          alert.severity, alert.run_id, self._safe(f"{type(r).__name__}: {r}"))
            elif out is not None:
                out.delivered.append(name)

    async def _unreachable(self, cmd: Command, error: str, waited: float) -> None:
        log.error("rlwatch: run %s: %s not sent for %.0fs (control channel unreachable): paging directly",
                  cmd.run_id, cmd.action, waited)
        await self._direct(unreachable_alert(cmd, error, waited, self.clock()), [], None, None, wait=False)

    async def _recovered(self, cmd: Command, error: str, waited: float) -> None:
        await self._direct(unreachable_alert(cmd, error, waited, self.clock(), state="resolved"), [], None,
                           None, wait=False)

    # -- the timer ------------------------------------------------------------------------------
    async def tick(self, now: float | None = None, wait: bool = True) -> int:
        """Repeats, escalations and re-sends of unacknowledged brakes, then the due part of the
        outbox (awaited with ``wait``, else in the background lanes).

        The first part reads the whole fleet's state (its firing alerts and group clocks, its
        brakes not acknowledged) and acts on it once for all: one worker of the deployment does
        it per ``fleet_turn`` seconds (:meth:`Outbox.turn`), not every worker at every tick.

        The tick also says which receivers this worker sends to (:meth:`Drainer.note_receivers`)
        and, one worker per ``STRAY_EVERY`` seconds, settles the items of receivers no worker
        sends to (:meth:`Drainer.bury_strays`)."""
        now = self.clock() if now is None else now
        try:
            await self.drainer.note_receivers(now)
            if await self.outbox.turn("timer", now, self.fleet_turn):
                await self._repeats(now)
                await self.check_acks(now, wait=wait)
                if self.brakes is not None:
                    await self.brakes.resend(now)
            if self._strays_at is None:
                self._strays_at = now
            elif not self._strays_at <= now < self._strays_at + STRAY_EVERY:
                self._strays_at = now
                if await self.outbox.turn("strays", now, STRAY_EVERY):
                    await self.drainer.bury_strays(now)
        except Exception as exc:  # noqa: BLE001 - Redis down: the next tick tries again
            self.health.failed(exc, "checking repeats and acknowledgements", now)
            return 0
        if not wait:
            self.drainer.kick()
            return 0
        try:
            n = await self.drainer.drain(now)
        except Exception as exc:  # noqa: BLE001
            self.health.failed(exc, "draining the outbox", now)
            return 0
        self.health.ok(now)
        return n

    async def drain(self, now: float | None = None, receivers=None, out: Delivery | None = None) -> int:
        return await self.drainer.drain(now, receivers, out)

    async def _repeats(self, now: float) -> None:
        routes = self.routing.routes_by_id
        if not any(not r.repeat_interval.zero for r in routes.values()):
            return
        clocks = await self.outbox.clocks()
        active = await self.outbox.active(now)
        # the runs' newest steps, read at once (a repeat interval in steps counts on them)
        steps = await self.outbox.run_steps(sorted({a.run_id for a in active}))
        for alert in active:
            for route, receiver in self.routing.targets(alert):
                group = group_key(route, alert)
                clock = clocks.get(group)
                if clock is None or not repeat_due(clock, route, now, steps.get(alert.run_id)):
                    continue
                key = delivery_key(alert)
                if await self.outbox.outcome(receiver, key) != "sent":
                    continue  # never went out (muted, waiting or failing): nothing to repeat
                variant = f"repeat:{clock.last_flush_ts}"
                item = OutboxItem(item_id(receiver, key, variant), receiver, group, key, alert.run_id,
                                  alert.to_json(), [], enqueued=now, next_try=now, variant=variant)
                await self.outbox.enqueue(item)
        for group, clock in clocks.items():
            if now - (clock.last_flush_ts or clock.created_ts) > 7 * 86400:
                await self.outbox.drop_clock(group)

    async def check_acks(self, now: float | None = None, wait: bool = True) -> list[Delivery]:
        """Escalate brakes no worker acknowledged in time; resolve those acknowledged late."""
        if self.acks is None:
            return []
        now = self.clock() if now is None else now
        timeout = self.routing.ack_timeout
        got = await self.acks.check(now, timeout)
        out = []
        for s in got.overdue:
            log.error("rlwatch: run %s: %s command %s not acknowledged within %.0fs: escalating",
                      s.run_id, s.action, s.command_id, timeout)
            out.append(await self.handle(escalation_alert(s, timeout, now), wait=wait))
        for s in got.late:
            out.append(await self.handle(escalation_alert(s, timeout, now, state="resolved"), wait=wait))
        for s, answers in got.confirmed:
            note = acknowledged_notice(s, answers, now)
            log.info("rlwatch: %s", note.summary)
            out.append(await self.notice(note, wait=wait))
        return out

    # -- misc -----------------------------------------------------------------------------------
    def _safe(self, text) -> str:
        return redact(str(text), self.secrets)

    async def idle(self, timeout: float | None = None) -> None:
        """Wait for the background sends (tests, shutdown)."""
        await self.drainer.idle(timeout)
        if self._direct_tasks:
            await asyncio.wait(list(self._direct_tasks), timeout=timeout)

    async def close(self) -> None:
        if self.brakes is not None:
            await self.brakes.close()
        await self.drainer.close()
        for t in list(self._direct_tasks):
            t.cancel()
        for n in self.notifiers.values():
            await n.close()
        if self.control is not None:
            await self.control.close()
