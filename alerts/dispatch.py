"""Deliver an alert: claim it once, pull the brake, keep the snapshot, route, notify.

:meth:`Dispatcher.handle` does, in this order:

1. **claim** the alert's delivery key (``fingerprint:state:onset``) so a restarted or second
   worker never handles it twice;
2. **commands** first, so a pause never waits on Slack: the rule's actions minus those that are
   advisory for this run (:class:`alerts.routing.EnforcementPolicy`); each pause or stop is
   remembered until a worker acknowledges it (:mod:`alerts.escalation`);
3. the **incident snapshot** of an alert with ``snapshot`` (:mod:`alerts.incidents`);
4. **routing**: the routing tree picks (route, receiver) pairs; each notification is written to
   the durable **outbox**, due now or when its group's wait is over;
5. a **drain** of what is due: silenced and inhibited alerts are dropped there (so a silence
   added while Slack is down still applies), a resolved notice goes only where its firing one
   went, a failed send goes back to the outbox with backoff and the receiver is left alone
   until then.

:meth:`Dispatcher.tick` (the worker's timer) drains the outbox, sends the repeats that are due
and escalates unacknowledged brakes. Without stores the dispatcher keeps everything in memory
(the embedded demo), with the same semantics.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from alerts.actions import COMMAND_ACTIONS, Enforcement, commands_for
from alerts.control import ControlChannel
from alerts.dedup import Dedup, delivery_key
from alerts.escalation import AckTracker, escalation_alert
from alerts.incidents import IncidentStore, make_incident
from alerts.notifiers import Notifier, PermanentDeliveryError
from alerts.outbox import MemoryOutbox, Outbox, OutboxItem, backoff, item_id
from alerts.redact import redact
from alerts.routing import GroupClock, Routing, due, group_key, inhibited_by, repeat_due
from alerts.silences import SilenceStore, silenced_by
from contract.alert import Alert
from contract.commands import Command

__all__ = ["Delivery", "Dispatcher"]

log = logging.getLogger("rlwatch.alerts")

NOT_NOTIFIED = (None, "silenced", "inhibited", "skipped", "dead")


@dataclass
class Delivery:
    alert: Alert
    duplicate: bool = False
    commands: list[Command] = field(default_factory=list)
    advisory: list[str] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    queued: list[str] = field(default_factory=list)          # receivers it is waiting for
    suppressed: dict[str, str] = field(default_factory=dict)  # receiver -> silenced/inhibited/...
    incident: str | None = None


class Dispatcher:
    def __init__(self, notifiers: list[Notifier], control: ControlChannel | None, dedup: Dedup,
                 *, clock: Callable[[], float], enforcement: Enforcement = Enforcement(),
                 secret: str | None = None, routing: Routing | None = None,
                 outbox: Outbox | None = None, silences: SilenceStore | None = None,
                 incidents: IncidentStore | None = None, acks: AckTracker | None = None,
                 retry_base: float = 1.0, retry_cap: float = 300.0, give_up_after: float = 86400.0,
                 step_hold: float = 600.0, lease: float = 30.0):
        self.notifiers: dict[str, Notifier] = OrderedDict((n.name, n) for n in notifiers)
        if len(self.notifiers) != len(notifiers):
            raise ValueError("two notifiers share a name: " + ", ".join(n.name for n in notifiers))
        self.control, self.dedup, self.clock, self.secret = control, dedup, clock, secret
        self.routing = routing or Routing.default(self.notifiers, enforcement.advisory)
        missing = sorted({r for route in self.routing.root.walk() for r in route.receivers} - set(self.notifiers))
        if missing:
            raise ValueError(f"routes name receivers that are not configured: {', '.join(missing)}")
        self.outbox: Outbox = outbox or MemoryOutbox()
        self.silences, self.incidents, self.acks = silences, incidents, acks
        self.retry_base, self.retry_cap, self.give_up_after = retry_base, retry_cap, give_up_after
        self.step_hold, self.lease = step_hold, lease
        self.down_until: dict[str, float] = {}
        self.failures = 0
        self.secrets = [s for n in notifiers for s in getattr(n, "secrets", ()) if s]
        if secret:
            self.secrets.append(secret)

    # -- one alert ------------------------------------------------------------------------------
    async def handle(self, alert: Alert) -> Delivery:
        extra = alert.model_extra or {}
        snapshot = extra.get("snapshot")
        if snapshot is not None:
            alert = Alert.model_validate({k: v for k, v in alert.model_dump().items() if k != "snapshot"})
        out = Delivery(alert)
        key = delivery_key(alert)
        try:
            claimed = await self.dedup.claim(key)
        except Exception as exc:  # noqa: BLE001 - Redis is down: page anyway, without dedup
            return await self._direct(alert, key, out, exc)
        if not claimed:
            out.duplicate = True
            return out
        now = self.clock()
        await self._brake(alert, key, now, out)
        try:
            note = await self._incident(alert, snapshot, now, out)
            touched = await self._enqueue(alert.model_copy(update=note), key, now, out)
        except Exception as exc:  # noqa: BLE001 - the store failed mid-way
            try:
                await self.dedup.release(key)
            except Exception:  # noqa: BLE001
                pass
            return await self._direct(alert, key, out, exc, brake=False)
        try:
            await self.drain(now, touched, out)
        except Exception as exc:  # noqa: BLE001 - queued already: the timer's drain retries
            log.error("rlwatch: outbox drain failed (the timer retries): %s", self._safe(f"{type(exc).__name__}: {exc}"))
        out.queued = [r for r in out.queued if r not in out.delivered and r not in out.suppressed]
        return out

    async def _direct(self, alert: Alert, key: str, out: Delivery, exc: Exception, brake: bool = True) -> Delivery:
        """The degraded path when the store (Redis) fails: try the brake, send straight to the
        routed receivers, no dedup, no outbox, no retries. Loud, because a page may repeat or be
        lost; better than a silent monitor."""
        self.failures += 1
        msg = self._safe(f"{type(exc).__name__}: {exc}")
        log.error("rlwatch: delivery store unreachable (%s); sending %s/%s for %s directly, without "
                  "dedup or retries", msg, alert.rule, alert.severity, alert.run_id)
        out.failed["store"] = msg
        if brake:
            await self._brake(alert, key, self.clock(), out)
        done = [c.action for c in out.commands]
        targets = [name for _, name in self.routing.targets(alert)]
        results = await asyncio.gather(*(self.notifiers[n].send(alert, done) for n in targets),
                                       return_exceptions=True)
        for name, r in zip(targets, results):
            if isinstance(r, BaseException):
                out.failed[name] = self._safe(f"{type(r).__name__}: {r}")
            else:
                out.delivered.append(name)
        return out

    async def _brake(self, alert: Alert, key: str, now: float, out: Delivery) -> None:
        advisory = self.routing.policy.advisory_for(alert.run_id, alert.rule)
        out.advisory = [a for a in alert.actions if a in COMMAND_ACTIONS and a in advisory]
        if self.control is None:
            return
        for cmd in commands_for(alert, now, Enforcement(advisory), self.secret, key=key):
            try:
                await self.control.apply(cmd)
                out.commands.append(cmd)
            except Exception as exc:  # noqa: BLE001
                self.failures += 1
                log.error("rlwatch: could not send %s to run %s: %s", cmd.action, alert.run_id, self._safe(exc))
                out.failed[f"control:{cmd.action}"] = self._safe(exc)
                continue
            if self.acks is not None:
                try:
                    await self.acks.expect(cmd)
                except Exception as exc:  # noqa: BLE001
                    log.error("rlwatch: cannot track the ack of %s for %s: %s", cmd.action, alert.run_id,
                              self._safe(exc))

    async def _incident(self, alert: Alert, snapshot: dict | None, now: float, out: Delivery) -> dict:
        if self.incidents is None or alert.state != "firing" or "snapshot" not in alert.actions:
            return {"actions_advisory": out.advisory} if out.advisory else {}
        inc = make_incident(alert, snapshot, now, [c.action for c in out.commands])
        await self.incidents.save(inc)
        out.incident = inc["id"]
        return {"incident": inc["id"], **({"actions_advisory": out.advisory} if out.advisory else {})}

    async def _enqueue(self, alert: Alert, key: str, now: float, out: Delivery) -> set[str]:
        if alert.state == "firing":
            await self.outbox.activate(alert, now)
        else:
            await self.outbox.deactivate(alert)
        await self.outbox.note_step(alert.run_id, alert.step)
        done = [c.action for c in out.commands]
        touched: set[str] = set()
        for route, receiver in self.routing.targets(alert):
            group = group_key(route, alert)
            clock = await self.outbox.clock(group)
            if clock is None:
                clock = GroupClock(route.id, alert.run_id, now, alert.step)
                await self.outbox.set_clock(group, clock)
            due_ts, due_step = due(clock, route)
            if due_step is not None and alert.step >= due_step:
                due_ts, due_step = now, None
            next_try = max(now, due_ts) if due_ts is not None else now + self.step_hold
            item = OutboxItem(item_id(receiver, key), receiver, group, key, alert.run_id, alert.to_json(),
                              done, enqueued=now, next_try=next_try, due_step=due_step)
            if await self.outbox.enqueue(item):
                out.queued.append(receiver)
                touched.add(receiver)
        if await self.outbox.release_steps(alert.run_id, alert.step, now):
            touched.update(self.notifiers)
        return touched

    # -- the outbox -----------------------------------------------------------------------------
    async def drain(self, now: float | None = None, receivers: Iterable[str] | None = None,
                    out: Delivery | None = None) -> int:
        """Send what is due (for ``receivers``, default all); the number of items settled."""
        now = self.clock() if now is None else now
        names = [n for n in (receivers if receivers is not None else self.notifiers)
                 if n in self.notifiers and self.down_until.get(n, 0.0) <= now]
        taken = [(n, await self.outbox.take_due(n, now, limit=100, lease=self.lease)) for n in names]
        taken = [(n, items) for n, items in taken if items]
        if not taken:
            return 0
        silences = await self.silences.all() if self.silences is not None else []
        context = (await self.outbox.active(now), silences)
        # receivers in parallel: a slow or failing Slack does not hold PagerDuty back
        done = await asyncio.gather(*(self._drain_receiver(n, items, now, context, out) for n, items in taken))
        return sum(done)

    async def _drain_receiver(self, name: str, items: list[OutboxItem], now: float, context, out) -> int:
        active, silences = context
        notifier = self.notifiers[name]
        groups: OrderedDict[str, list[OutboxItem]] = OrderedDict()
        for it in sorted(items, key=lambda i: (i.enqueued, i.step, i.id)):
            groups.setdefault(it.group, []).append(it)
        settled = 0
        units: list[list[OutboxItem]] = []
        for batch in groups.values():
            ready = []
            for it in batch:
                a = it.alert_obj()
                why = await self._suppressed(name, it, a, active, silences, now)
                if why == "wait":
                    await self.outbox.retry(it, now + 1.0, "waiting for its firing notice to go first", count=False)
                elif why:
                    await self.outbox.finish(it, why)
                    settled += 1
                    if out is not None and it.key == delivery_key(out.alert):
                        out.suppressed[name] = why
                else:
                    ready.append(it)
            if ready:
                units.extend([ready] if hasattr(notifier, "send_batch") else [[it] for it in ready])
        for n, unit in enumerate(units):
            mine = out is not None and any(it.key == delivery_key(out.alert) for it in unit)
            try:
                alerts = [it.alert_obj() for it in unit]
                if len(unit) > 1:
                    await notifier.send_batch(alerts, [it.done for it in unit])  # type: ignore[attr-defined]
                else:
                    await notifier.send(alerts[0], unit[0].done)
            except PermanentDeliveryError as exc:
                self.failures += 1
                msg = self._safe(exc)
                for it in unit:
                    await self.outbox.bury(it, msg)
                log.error("rlwatch: %s refused %d notification(s) for good (dead-lettered): %s",
                          name, len(unit), msg)
                if mine:
                    out.failed[name] = msg
                continue
            except Exception as exc:  # noqa: BLE001 - any other failure: back to the outbox
                self.failures += 1
                msg = self._safe(f"{type(exc).__name__}: {exc}")
                rest = [it for u in units[n:] for it in u]
                await self._failed(name, rest, msg, now, getattr(exc, "retry_after", None))
                if out is not None and any(it.key == delivery_key(out.alert) for it in rest):
                    out.failed[name] = msg
                break
            for it in unit:
                await self.outbox.finish(it, "sent")
            if mine and name not in out.delivered:
                out.delivered.append(name)
            settled += len(unit)
            self.down_until.pop(name, None)
            await self._flushed(unit, now)
        return settled

    async def _suppressed(self, receiver: str, it: OutboxItem, alert: Alert, active: list[Alert],
                          silences: list, now: float) -> str | None:
        if alert.state == "firing":
            if silenced_by(alert, silences, now) is not None:
                return "silenced"
            if inhibited_by(alert, active, self.routing.inhibit_rules) is not None:
                return "inhibited"
            return None
        firing = f"{alert.fingerprint}:firing:{alert.onset_step}"
        was = await self.outbox.outcome(receiver, firing)
        if was == "queued":
            return "wait" if now - it.enqueued < self.give_up_after else None
        return "skipped" if was in NOT_NOTIFIED else None

    async def _failed(self, name: str, items: list[OutboxItem], msg: str, now: float,
                      retry_after: float | None = None) -> None:
        """Back to the outbox with backoff (at least what the receiver asked for with 429)."""
        floor = retry_after or 0.0
        for it in items:
            if now - it.enqueued >= self.give_up_after:
                await self.outbox.bury(it, msg)
                log.error("rlwatch: %s: gave up on %s after %d attempts (dead-lettered): %s",
                          name, it.key, it.attempts + 1, msg)
            else:
                await self.outbox.retry(
                    it, now + max(floor, backoff(it.attempts + 1, self.retry_base, self.retry_cap)), msg)
        wait = max(floor, backoff(min((it.attempts for it in items), default=1), self.retry_base, self.retry_cap))
        self.down_until[name] = now + wait
        log.error("rlwatch: %s could not deliver %d notification(s); kept in the outbox, next try in "
                  "%.0fs: %s", name, len(items), wait, msg)

    async def _flushed(self, unit: list[OutboxItem], now: float) -> None:
        for group in {it.group for it in unit}:
            clock = await self.outbox.clock(group)
            if clock is not None:
                clock.last_flush_ts = now
                clock.last_flush_step = max(it.step for it in unit if it.group == group)
                await self.outbox.set_clock(group, clock)

    # -- the timer ------------------------------------------------------------------------------
    async def tick(self, now: float | None = None) -> int:
        """Repeats, escalations of unacknowledged brakes, then the due part of the outbox."""
        now = self.clock() if now is None else now
        try:
            await self._repeats(now)
            await self.check_acks(now)
        except Exception as exc:  # noqa: BLE001 - Redis down: the next tick tries again
            log.error("rlwatch: delivery timer: %s", self._safe(f"{type(exc).__name__}: {exc}"))
        try:
            return await self.drain(now)
        except Exception as exc:  # noqa: BLE001
            log.error("rlwatch: outbox drain: %s", self._safe(f"{type(exc).__name__}: {exc}"))
            return 0

    async def _repeats(self, now: float) -> None:
        routes = self.routing.routes_by_id
        if not any(not r.repeat_interval.zero for r in routes.values()):
            return
        clocks = await self.outbox.clocks()
        for alert in await self.outbox.active(now):
            for route, receiver in self.routing.targets(alert):
                group = group_key(route, alert)
                clock = clocks.get(group)
                if clock is None or not repeat_due(clock, route, now, await self.outbox.run_step(alert.run_id)):
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

    async def check_acks(self, now: float | None = None) -> list[Delivery]:
        """Escalate brakes no worker acknowledged in time; resolve those acknowledged late."""
        if self.acks is None:
            return []
        now = self.clock() if now is None else now
        timeout = self.routing.ack_timeout
        overdue, late = await self.acks.check(now, timeout)
        out = []
        for s in overdue:
            log.error("rlwatch: run %s: %s command %s not acknowledged within %.0fs: escalating",
                      s.run_id, s.action, s.command_id, timeout)
            out.append(await self.handle(escalation_alert(s, timeout, now)))
        for s in late:
            out.append(await self.handle(escalation_alert(s, timeout, now, state="resolved")))
        return out

    # -- misc -----------------------------------------------------------------------------------
    def _safe(self, text) -> str:
        return redact(str(text), self.secrets)

    async def close(self) -> None:
        for n in self.notifiers.values():
            await n.close()
        if self.control is not None:
            await self.control.close()
