"""Sending what the outbox holds: one lane per receiver, so a slow or hanging Slack holds back
nobody else (not the brake, not the webhook, not the next alert).

:meth:`Drainer.drain` takes the due items of some receivers (under a lease, so two workers never
send one item at once) and sends them, receivers in parallel. Silenced and inhibited alerts are
settled there (so a silence added while Slack is down still applies), a resolved notice goes
only where its firing one went, a failure goes back to the outbox after the delay of the retry
policy (:mod:`alerts.retry`, the one place retries are decided; the notifiers make one attempt
each) and the receiver is left alone until then. :meth:`Drainer.kick` starts the same drain in
the background for each receiver that is not draining already; the worker uses it, so that
handling an alert never waits on a receiver.

Each notification is sent at most once per (receiver, alert key): the outbox's mark, set when it
is queued and replaced by the outcome, is the one idempotency mechanism of delivery.

A worker says in the outbox which receivers it sends to (:meth:`Drainer.note_receivers`, from
the timer): an operator's notice that failed is kept there for a retry only for a receiver some
worker sends to (:mod:`alerts.announce`); the items of a receiver no worker sends to (kept by an
older version) are named in the log and dead-lettered once old (:meth:`Drainer.bury_strays`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable

from alerts.notifiers import Notifier, PermanentDeliveryError
from alerts.outbox import Outbox, OutboxItem, item_id
from alerts.retry import RetryPolicy
from alerts.routing import Routing
from alerts.inhibition import inhibited_by
from alerts.matchers import RUN_FIELDS
from alerts.notices import is_notice, notice_group
from alerts.silences import SilenceStore, silenced_by
from contract.alert import Alert

__all__ = ["Drainer", "StoreHealth", "delivery_key"]

log = logging.getLogger("rlwatch.alerts")

NOT_NOTIFIED = (None, "silenced", "inhibited", "skipped", "dead")
#: items a receiver's pass takes from the outbox, at most; a receiver's lane that took a full
#: pass goes on with another (the worker notifies many alerts at once, and only the timer's
#: next tick took the rest)
PASS_ITEMS = 100
#: seconds between a worker's notes of the receivers it sends to, at most one a timer tick
NOTE_EVERY = 30.0
#: a receiver noted by a worker within this many seconds is one a worker sends to
DRAINED_WITHIN = 300.0
#: seconds between a worker's checks for items of receivers no worker sends to (one worker of
#: the deployment per period does the check: :meth:`Outbox.turn`)
STRAY_EVERY = 600.0
#: items of a receiver no worker sends to are dead-lettered once queued this many seconds ago
STRAY_AGE = 3600.0
#: a receiver no worker has noted for this many seconds leaves the outbox's list of receivers
#: (a deployment that renames or drops receivers does not keep them for ever)
FORGET_AFTER = 86400.0


def delivery_key(alert: Alert) -> str:
    """The identity of one notification-worthy event: (fingerprint, state, onset step)."""
    return f"{alert.fingerprint}:{alert.state}:{alert.onset_step}"


def notice_item(alert: Alert, receiver: str, now: float, next_try: float | None = None, *,
                attempts: int = 0, error: str = "") -> OutboxItem:
    """The outbox item of a one-off notice (:mod:`alerts.notices`) for ``receiver``: in a group
    of its own, done nothing, due at ``next_try`` (now by default)."""
    key = delivery_key(alert)
    return OutboxItem(item_id(receiver, key), receiver, notice_group(alert), key, alert.run_id, alert.to_json(),
                      [], enqueued=now, next_try=now if next_try is None else next_try, attempts=attempts,
                      last_error=error)


_FIRING, _RESOLVED = ":firing:", ":resolved:"


def _firing_key(key: str) -> str:
    """The delivery key of the firing notice a resolved notice's ``key`` follows."""
    return key.replace(_RESOLVED, _FIRING, 1)


class StoreHealth:
    """One log line when the delivery store (Redis) starts failing, one when it works again,
    however many operations fail in between."""

    def __init__(self, safe: Callable[[object], str] = str):
        self.safe = safe
        self.down_since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException, doing: str, now: float) -> None:
        self.failures += 1
        if self.down_since is None:
            self.down_since = now
            log.error("rlwatch: delivery store unreachable while %s (%s); notifications go straight to "
                      "their receivers and the outbox waits until it is back (said once)", doing,
                      self.safe(f"{type(exc).__name__}: {exc}"))

    def ok(self, now: float) -> None:
        if self.down_since is not None:
            log.warning("rlwatch: delivery store reachable again after %.0fs (%d failed operations)",
                        now - self.down_since, self.failures)
            self.down_since, self.failures = None, 0

    @property
    def down(self) -> bool:
        return self.down_since is not None


class Drainer:
    def __init__(self, notifiers: dict[str, Notifier], outbox: Outbox, routing: Routing, *,
                 clock: Callable[[], float], retry: RetryPolicy, lease: float = 30.0,
                 silences: SilenceStore | None = None, safe: Callable[[object], str] = str,
                 health: StoreHealth | None = None):
        self.notifiers, self.outbox, self.routing = notifiers, outbox, routing
        self.clock, self.retry, self.lease, self.silences, self.safe = clock, retry, lease, silences, safe
        self.health = health or StoreHealth(safe)
        self.down_until: dict[str, float] = {}
        self.failures = 0
        self._lanes: dict[str, asyncio.Task] = {}
        self._again: set[str] = set()
        self._noted: float | None = None       # when this worker last noted its receivers
        self._strays_told: set[str] = set()    # receivers no worker sends to, logged once each

    @property
    def _run_scoped(self) -> bool:
        """Whether every inhibition rule compares alerts of one run only."""
        return all(RUN_FIELDS.intersection(r.equal) for r in self.routing.inhibit_rules)

    # -- in the background ----------------------------------------------------------------------
    def kick(self, receivers: Iterable[str] | None = None) -> None:
        """Drain ``receivers`` (default all) in background lanes, one per receiver."""
        for name in (self.notifiers if receivers is None else receivers):
            if name not in self.notifiers:
                continue
            lane = self._lanes.get(name)
            if lane is not None and not lane.done():
                self._again.add(name)     # it looks again when the current pass ends
                continue
            self._lanes[name] = asyncio.get_running_loop().create_task(self._lane(name))

    async def _lane(self, name: str) -> None:
        while True:
            self._again.discard(name)
            try:
                await self.drain(receivers=[name])
            except Exception as exc:  # noqa: BLE001 - the store failed: the timer kicks again
                self.health.failed(exc, f"draining the outbox of {name}", self.clock())
                return
            self.health.ok(self.clock())
            if name not in self._again:
                return

    async def idle(self, timeout: float | None = None) -> None:
        """Wait for the background lanes (tests, shutdown)."""
        lanes = [t for t in self._lanes.values() if not t.done()]
        if lanes:
            await asyncio.wait(lanes, timeout=timeout)

    async def close(self) -> None:
        for t in self._lanes.values():
            t.cancel()
        await asyncio.gather(*self._lanes.values(), return_exceptions=True)

    # -- which receivers the workers send to ----------------------------------------------------
    async def note_receivers(self, now: float) -> None:
        """Say in the outbox that this worker sends to its receivers, once per ``NOTE_EVERY``
        seconds at most (an operator's notice that failed is kept for a retry only for a
        receiver some worker noted within ``DRAINED_WITHIN``)."""
        if self._noted is not None and self._noted <= now < self._noted + NOTE_EVERY:
            return
        await self.outbox.note_receivers(list(self.notifiers), now)
        self._noted = now

    async def bury_strays(self, now: float) -> int:
        """The items waiting for a receiver that neither this worker nor any other (lately)
        sends to: each such receiver named in the log (once), its items dead-lettered once
        queued ``STRAY_AGE`` ago. The number dead-lettered. Receivers no worker has noted for
        ``FORGET_AFTER`` seconds are forgotten."""
        seen = await self.outbox.receivers_seen()
        drained = {name for name, at in seen.items() if now - at <= DRAINED_WITHIN}
        gone = [name for name, at in seen.items() if now - at > FORGET_AFTER]
        if gone:
            await self.outbox.forget_receivers(gone)
        buried = 0
        for name in await self.outbox.queued_receivers():
            if name in self.notifiers or name in drained:
                continue
            if name not in self._strays_told:
                self._strays_told.add(name)
                log.error("rlwatch: %d notification(s) wait in the outbox for %s, which no monitor worker "
                          "sends to (it is configured only where they were queued, or no longer): dead-lettered "
                          "once %.0f min old (said once)", await self.outbox.pending(name), name, STRAY_AGE / 60)
            # an item is due at or after it was queued: those due STRAY_AGE ago are that old at least
            n = 0
            while True:
                old = await self.outbox.take_due(name, now - STRAY_AGE, limit=PASS_ITEMS, lease=0.0)
                for it in old:
                    await self.outbox.bury(it, f"no monitor worker sends to {name}")
                n += len(old)
                if len(old) < PASS_ITEMS:
                    break
            if n:
                buried += n
                log.error("rlwatch: dead-lettered %d notification(s) for %s, which no monitor worker "
                          "sends to", n, name)
        return buried

    # -- one pass -------------------------------------------------------------------------------
    async def drain(self, now: float | None = None, receivers: Iterable[str] | None = None,
                    out=None) -> int:
        """Send what is due (for ``receivers``, default all); the number of items settled."""
        now = self.clock() if now is None else now
        names = [n for n in (receivers if receivers is not None else self.notifiers)
                 if n in self.notifiers and self.down_until.get(n, 0.0) <= now]
        taken = [(n, await self.outbox.take_due(n, now, limit=PASS_ITEMS, lease=self.lease)) for n in names]
        for n, items in taken:      # a full pass: more may be due (the lane takes them next)
            if len(items) >= PASS_ITEMS:
                self._again.add(n)
        taken = [(n, items) for n, items in taken if items]
        if not taken:
            return 0
        silences = await self.silences.all() if self.silences is not None else []
        # inhibition compares alerts of one run (the default rules, and any whose `equal` names
        # the run): only those runs' firing alerts are read, however large the fleet
        runs = {it.run_id for _, items in taken for it in items} if self._run_scoped else None
        context = (await self.outbox.active(now, runs), silences)
        done = await asyncio.gather(*(self._receiver(n, items, now, context, out) for n, items in taken))
        return sum(done)

    async def _receiver(self, name: str, items: list[OutboxItem], now: float, context, out) -> int:
        active, silences = context
        notifier = self.notifiers[name]
        mine_key = delivery_key(out.alert) if out is not None else None
        groups: OrderedDict[str, list[OutboxItem]] = OrderedDict()
        # (a firing notice before the resolved one of the same step: it may go first)
        for it in sorted(items, key=lambda i: (i.enqueued, i.step, _RESOLVED in i.key, i.id)):
            groups.setdefault(it.group, []).append(it)
        settled = 0
        units: list[list[OutboxItem]] = []
        going: set[str] = set()      # the firing notices this pass sends (delivery keys)
        # what became of the firing notices the pass's resolved ones follow, read at once
        marks = await self.outbox.outcomes(
            name, sorted({_firing_key(it.key) for it in items if _RESOLVED in it.key}))
        for batch in groups.values():
            ready = []
            for it in batch:
                why = await self._suppressed(name, it, it.alert_obj(), active, silences, now, going,
                                             marks)
                if why == "wait":
                    await self.outbox.retry(it, now + 1.0, "waiting for its firing notice to go first", count=False)
                elif why:
                    await self.outbox.finish(it, why)
                    settled += 1
                    if _FIRING in it.key:
                        marks[it.key] = why     # (as a resolved notice after it would read it)
                    if it.key == mine_key:
                        out.suppressed[name] = why
                else:
                    ready.append(it)
                    if _FIRING in it.key:
                        going.add(it.key)
            if ready:
                units.extend([ready] if hasattr(notifier, "send_batch") else [[it] for it in ready])
        refused: set[str] = set()    # firing notices refused for good in this pass
        for n, unit in enumerate(units):
            if refused:    # a resolved notice goes only where its firing one went
                for it in [it for it in unit if _firing_key(it.key) in refused]:
                    await self.outbox.finish(it, "skipped")
                    settled += 1
                    unit.remove(it)
                if not unit:
                    continue
            mine = any(it.key == mine_key for it in unit)
            try:
                alerts = [it.alert_obj() for it in unit]
                if len(unit) > 1:
                    await notifier.send_batch(alerts, [it.done for it in unit])  # type: ignore[attr-defined]
                else:
                    await notifier.send(alerts[0], unit[0].done)
            except PermanentDeliveryError as exc:
                self.failures += 1
                msg = self.safe(exc)
                for it in unit:
                    await self.outbox.bury(it, msg)
                refused.update(it.key for it in unit)
                log.error("rlwatch: %s refused %d notification(s) for good (dead-lettered): %s",
                          name, len(unit), msg)
                if mine:
                    out.failed[name] = msg
                continue
            except Exception as exc:  # noqa: BLE001 - any other failure: back to the outbox
                self.failures += 1
                msg = self.safe(f"{type(exc).__name__}: {exc}")
                rest = [it for u in units[n:] for it in u]
                await self._failed(name, rest, msg, now, getattr(exc, "retry_after", None))
                if any(it.key == mine_key for it in rest):
                    out.failed[name] = msg
                break
            await self._settle(unit, now)
            if mine and name not in out.delivered:
                out.delivered.append(name)
            settled += len(unit)
            self.down_until.pop(name, None)
        return settled

    async def _settle(self, unit: list[OutboxItem], now: float) -> None:
        """Mark sent items done and their groups flushed. The send happened: if the store fails
        now, try once more before giving up (an item left under its lease would be sent again
        when it expires)."""
        try:
            await self.outbox.sent(unit, now)
        except Exception:  # noqa: BLE001
            await asyncio.sleep(0.2)
            await self.outbox.sent(unit, now)

    async def _suppressed(self, receiver: str, it: OutboxItem, alert: Alert, active: list[Alert],
                          silences: list, now: float, going: set[str],
                          marks: dict[str, str | None]) -> str | None:
        """Why ``it`` is not sent now (None: it is). A resolved notice waits for its firing
        one: it goes when that was sent, or goes first in this pass (``going``), and not
        at all where that was not notified (``marks``: the outcomes of firing notices, read
        for the pass)."""
        if alert.state == "firing":
            if silenced_by(alert, silences, now) is not None:
                return "silenced"
            # a notice is news about the brake: the alert that pulled it must not mute it
            if not is_notice(alert) and inhibited_by(alert, active, self.routing.inhibit_rules) is not None:
                return "inhibited"
            return None
        firing = f"{alert.fingerprint}:firing:{alert.onset_step}"
        if firing in going:
            return None
        was = marks[firing] if firing in marks else await self.outbox.outcome(receiver, firing)
        if was == "queued":
            return "wait" if not self.retry.exhausted(it.enqueued, now) else None
        return "skipped" if was in NOT_NOTIFIED else None

    async def _failed(self, name: str, items: list[OutboxItem], msg: str, now: float,
                      retry_after: float | None = None) -> None:
        """Back to the outbox after the policy's delay (at least what a 429 asked for)."""
        for it in items:
            if self.retry.exhausted(it.enqueued, now):
                await self.outbox.bury(it, msg)
                log.error("rlwatch: %s: gave up on %s after %d attempts (dead-lettered): %s",
                          name, it.key, it.attempts + 1, msg)
            else:
                await self.outbox.retry(it, now + self.retry.delay(it.attempts + 1, retry_after), msg)
        wait = self.retry.delay(min((it.attempts for it in items), default=1), retry_after)
        self.down_until[name] = now + wait
        log.error("rlwatch: %s could not deliver %d notification(s); kept in the outbox, next try in "
                  "%.0fs: %s", name, len(items), wait, msg)

