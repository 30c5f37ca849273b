"""Telling a run's receivers that an operator sent it a command (``rlwatch pause`` ...,
the dashboard's buttons).

A rule's brake reaches Slack with its alert; a brake pulled by hand reached nobody but the
person who pulled it. :class:`Announcer` sends the notice (:func:`alerts.operator.operator_notice`,
:mod:`alerts.notices`) to the receivers the routing gives it (every configured receiver without a
routes file; with one, the routes that match ``rule: operator_command``, ``command: pause`` ...)
that take one-off notices (Slack, webhooks; not the console, where the command's own answer
goes, nor Alertmanager and PagerDuty, which keep an alert open until it resolves), straight from
the process that sent the command: the command is already applied, and the operator learns there
and then which receivers took it. A silence that matches the notice mutes it, as it mutes any
notification. A receiver that fails, or does not answer within ``timeout``, is reported to the
operator, and the notice is left in the worker's outbox (with a Redis) for the workers' timer to
retry, as any notification is: but only for a receiver some monitor worker sends to (each says
so in the outbox, :meth:`alerts.delivery.Drainer.note_receivers`). A receiver configured only
where the command was sent (``RLWATCH_SLACK_WEBHOOK`` in the operator's shell, not the
workers') would never be retried: its notice is not kept, and the operator is told so
(:attr:`Announced.unqueued`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from alerts.delivery import DRAINED_WITHIN, notice_item
from alerts.notices import takes_notices
from alerts.notifiers import Notifier, PermanentDeliveryError
from alerts.operator import operator_notice
from alerts.outbox import Outbox
from alerts.redact import redact
from alerts.retry import RetryPolicy
from alerts.routing import Routing
from alerts.silences import SilenceStore, silenced_by
from contract.commands import Command

__all__ = ["Announced", "Announcer"]

log = logging.getLogger("rlwatch.announce")


@dataclass
class Announced:
    """What became of a notice: the receivers that took it, those that failed (name -> why),
    those a silence muted (name -> the silence), those left to the workers to retry, and those
    that failed and are not left to them, no worker sending to them (name -> why)."""

    sent: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    silenced: dict[str, str] = field(default_factory=dict)
    retrying: list[str] = field(default_factory=list)
    unqueued: dict[str, str] = field(default_factory=dict)


class Announcer:
    """Sends operator notices to the receivers ``routing`` gives them, each within ``timeout``
    seconds (a slow receiver does not hold the operator's terminal); with ``outbox``, a failed
    send is queued there for a worker to retry; with ``silences``, a silenced notice is not sent."""

    def __init__(self, notifiers: list[Notifier], routing: Routing | None = None, *,
                 timeout: float = 10.0, secrets: list[str] | None = None, outbox: Outbox | None = None,
                 silences: SilenceStore | None = None, retry: RetryPolicy | None = None):
        self.notifiers = {n.name: n for n in notifiers if takes_notices(n)}
        self.routing = routing or Routing.default(list(self.notifiers))
        self.timeout = timeout
        self.outbox, self.silences = outbox, silences
        self.retry = retry or RetryPolicy()
        self.secrets = [s for s in (secrets or []) if s] + [
            s for n in notifiers for s in getattr(n, "secrets", ()) if s]

    @classmethod
    def from_settings(cls, settings, redis=None, timeout: float = 10.0) -> "Announcer":
        """The receivers of a worker of ``settings`` (environment and routes file), as the
        worker routes its alerts, and with ``redis`` its outbox and silences. A configuration
        error raises as it does for the worker."""
        from alerts.factory import build_notifiers, build_routing, namespace
        from alerts.outbox import RedisOutbox
        from alerts.silences import RedisSilences

        routing, notifiers = build_routing(settings, build_notifiers(settings, redis), redis)
        stores = {} if redis is None else {"outbox": RedisOutbox(redis, namespace(settings)),
                                           "silences": RedisSilences(redis)}
        return cls(notifiers, routing, timeout=timeout, secrets=[settings.control_secret], **stores)

    @property
    def receivers(self) -> list[str]:
        return list(self.notifiers)

    async def announce(self, cmd: Command, state: str, *, step: Any = None,
                       why: str | None = None, now: float | None = None) -> Announced:
        """Send the notice of ``cmd`` (the run now ``state``) to its routed receivers."""
        now = time.time() if now is None else now
        alert = operator_notice(cmd, state, now, step, why)
        targets = [name for _, name in self.routing.targets(alert) if name in self.notifiers]
        out = Announced()
        if targets and self.silences is not None:
            try:
                muted = silenced_by(alert, await self.silences.all(), now)
            except Exception as exc:  # noqa: BLE001 - the silences unread: tell rather than not
                log.warning("rlwatch: silences unreadable (%s): the notice goes out", self._safe(exc))
                muted = None
            if muted is not None:
                out.silenced = {name: f"silence {muted.id}" for name in targets}
                return out
        results = await asyncio.gather(*(self._send(name, alert) for name in targets),
                                       return_exceptions=True)
        keep: list[tuple[str, float | None]] = []
        for name, r in zip(targets, results):
            if isinstance(r, BaseException):
                why_not = "no answer within %gs" % self.timeout if isinstance(r, asyncio.TimeoutError) \
                    else f"{type(r).__name__}: {r}"
                out.failed[name] = self._safe(why_not)
                log.error("rlwatch: telling %s of the %s of run %s failed: %s", name, cmd.action,
                          cmd.run_id, out.failed[name])
                if not isinstance(r, PermanentDeliveryError):
                    keep.append((name, getattr(r, "retry_after", None)))
            else:
                out.sent.append(name)
        if keep and self.outbox is not None:
            drained = await self._drained(now)
            for name, retry_after in keep:
                await self._keep(name, alert, now, out, retry_after, drained)
        return out

    async def _send(self, name: str, alert) -> None:
        await asyncio.wait_for(self.notifiers[name].send(alert, []), self.timeout)

    async def _drained(self, now: float) -> set[str] | None:
        """The receivers some monitor worker said it sends to within ``DRAINED_WITHIN`` seconds
        of ``now`` (None: that could not be read)."""
        try:
            seen = await self.outbox.receivers_seen()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - unread: a failed notice is kept, as it always was
            log.error("rlwatch: could not read which receivers the monitor workers send to (%s): a "
                      "failed notice is kept for a retry whatever its receiver", self._safe(exc))
            return None
        return {name for name, at in seen.items() if now - at <= DRAINED_WITHIN}

    async def _keep(self, name: str, alert, now: float, out: Announced, retry_after: float | None,
                    drained: set[str] | None = None) -> None:
        """Queue a failed notice in the outbox, due after the retry policy's first wait, for
        the workers' timer to send (the failure is the operator's news already); not when no
        worker sends to ``name`` (``drained``, None: unknown), which ``out.unqueued`` says."""
        if self.outbox is None:
            return
        if drained is not None and name not in drained:
            out.unqueued[name] = (f"no monitor worker sends to {name} (it is configured only here)"
                                  if drained else
                                  f"no monitor worker is running to send to {name} (none seen in the last "
                                  f"{DRAINED_WITHIN / 60:.0f} minutes)") + ": not kept for a retry"
            log.error("rlwatch: the %s notice for %s: %s", name, alert.run_id, out.unqueued[name])
            return
        item = notice_item(alert, name, now, now + self.retry.delay(1, retry_after), attempts=1,
                           error=out.failed.get(name, ""))
        try:
            if await self.outbox.enqueue(item):
                out.retrying.append(name)
        except Exception as exc:  # noqa: BLE001 - told the operator already; nothing to keep it in
            log.error("rlwatch: the %s notice for %s could not be kept for a retry: %s", name, alert.run_id,
                      self._safe(exc))

    def _safe(self, text) -> str:
        return redact(str(text), self.secrets)

    async def close(self) -> None:
        for n in self.notifiers.values():
            try:
                await n.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.warning("rlwatch: closing %s: %s", n.name, exc)
