"""Telling a run's receivers that an operator sent it a command (``rlwatch pause`` ...,
the dashboard's buttons).

A rule's brake reaches Slack with its alert; a brake pulled by hand reached nobody but the
person who pulled it. :class:`Announcer` sends the notice (:func:`alerts.operator.operator_notice`)
to the receivers the routing gives it (every configured receiver without a routes file; with
one, the routes that match ``rule: operator_command``, ``command: pause`` ...), straight from
the process that sent the command, once, without the outbox: the command is already applied,
and a receiver that fails is reported to the operator there and then (one line each), never
retried behind their back. Only receivers that take such one-off notices are told (a notifier's
``takes_notices``: Slack, webhooks): not the console (the operator's terminal is where the
command's own answer goes), nor Alertmanager and PagerDuty, which keep an alert open until it
resolves, and a notice never does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from alerts.notifiers import Notifier
from alerts.operator import operator_notice
from alerts.redact import redact
from alerts.routing import Routing
from contract.commands import Command

__all__ = ["Announced", "Announcer"]

log = logging.getLogger("rlwatch.announce")


@dataclass
class Announced:
    """What became of a notice: the receivers that took it, and those that failed (name -> why)."""

    sent: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class Announcer:
    """Sends operator notices to the receivers ``routing`` gives them, each within ``timeout``
    seconds (a slow receiver does not hold the operator's terminal)."""

    def __init__(self, notifiers: list[Notifier], routing: Routing | None = None, *,
                 timeout: float = 10.0, secrets: list[str] | None = None):
        self.notifiers = {n.name: n for n in notifiers if getattr(n, "takes_notices", False)}
        self.routing = routing or Routing.default(list(self.notifiers))
        self.timeout = timeout
        self.secrets = [s for s in (secrets or []) if s] + [
            s for n in notifiers for s in getattr(n, "secrets", ()) if s]

    @classmethod
    def from_settings(cls, settings, redis=None, timeout: float = 10.0) -> "Announcer":
        """The receivers of a worker of ``settings`` (environment and routes file), as the
        worker routes its alerts. A configuration error raises as it does for the worker."""
        from alerts.factory import build_notifiers, build_routing

        routing, notifiers = build_routing(settings, build_notifiers(settings, redis), redis)
        return cls(notifiers, routing, timeout=timeout, secrets=[settings.control_secret])

    @property
    def receivers(self) -> list[str]:
        return list(self.notifiers)

    async def announce(self, cmd: Command, state: str, *, step: Any = None,
                       why: str | None = None, now: float | None = None) -> Announced:
        """Send the notice of ``cmd`` (the run now ``state``) to its routed receivers."""
        alert = operator_notice(cmd, state, time.time() if now is None else now, step, why)
        targets = [name for _, name in self.routing.targets(alert) if name in self.notifiers]
        out = Announced()
        results = await asyncio.gather(*(self._send(name, alert) for name in targets),
                                       return_exceptions=True)
        for name, r in zip(targets, results):
            if isinstance(r, BaseException):
                why_not = "no answer within %gs" % self.timeout if isinstance(r, asyncio.TimeoutError) \
                    else f"{type(r).__name__}: {r}"
                out.failed[name] = redact(why_not, self.secrets)
                log.error("rlwatch: telling %s of the %s of run %s failed: %s", name, cmd.action,
                          cmd.run_id, out.failed[name])
            else:
                out.sent.append(name)
        return out

    async def _send(self, name: str, alert) -> None:
        await asyncio.wait_for(self.notifiers[name].send(alert, []), self.timeout)

    async def close(self) -> None:
        for n in self.notifiers.values():
            try:
                await n.close()
            except Exception as exc:  # noqa: BLE001 - closing is best effort
                log.warning("rlwatch: closing %s: %s", n.name, exc)
