"""Deliver an alert: claim it once, send the commands its actions call for, notify every sink.

Commands go first (a pause should not wait on Slack); a failing sink is logged loudly and
counted, never allowed to block the others or the brake.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

from alerts.actions import Enforcement, commands_for
from alerts.control import ControlChannel
from alerts.dedup import Dedup, delivery_key
from alerts.notifiers import Notifier
from rlwatch.alert import Alert
from rlwatch.commands import Command

__all__ = ["Delivery", "Dispatcher"]

log = logging.getLogger("rlwatch.alerts")


@dataclass
class Delivery:
    alert: Alert
    duplicate: bool = False
    commands: list[Command] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class Dispatcher:
    def __init__(self, notifiers: list[Notifier], control: ControlChannel | None, dedup: Dedup,
                 *, clock: Callable[[], float], enforcement: Enforcement = Enforcement(),
                 secret: str | None = None):
        self.notifiers, self.control, self.dedup = notifiers, control, dedup
        self.clock, self.enforcement, self.secret = clock, enforcement, secret
        self.failures = 0

    async def handle(self, alert: Alert) -> Delivery:
        out = Delivery(alert)
        key = delivery_key(alert)
        if not await self.dedup.claim(key):
            out.duplicate = True
            return out
        if self.control is not None:
            for cmd in commands_for(alert, self.clock(), self.enforcement, self.secret):
                try:
                    await self.control.apply(cmd)
                    out.commands.append(cmd)
                except Exception as exc:  # noqa: BLE001
                    self.failures += 1
                    log.error("rlwatch: could not send %s to run %s: %s", cmd.action, alert.run_id, exc)
                    out.failed[f"control:{cmd.action}"] = str(exc)
        done = [c.action for c in out.commands]
        results = await asyncio.gather(*(n.send(alert, done) for n in self.notifiers),
                                       return_exceptions=True)
        for n, r in zip(self.notifiers, results):
            if isinstance(r, BaseException):
                self.failures += 1
                out.failed[n.name] = f"{type(r).__name__}: {r}"
                log.error("rlwatch: %s could not deliver %s/%s for %s: %s", n.name, alert.rule,
                          alert.severity, alert.run_id, r)
            else:
                out.delivered.append(n.name)
        if self.notifiers and not out.delivered:
            await self.dedup.release(key)  # nothing got through: let a retry deliver it
        return out

    async def close(self) -> None:
        for n in self.notifiers:
            await n.close()
        if self.control is not None:
            await self.control.close()
