"""Shared pieces of the alert-delivery unit tests: a clock, recording notifiers, alerts."""

from __future__ import annotations

import asyncio

from alerts.notifiers import DeliveryError
from contract.alert import Alert

T0 = 1_764_500_000.0


def run(coro):
    return asyncio.run(coro)


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t


class Recording:
    """A notifier that records what it got and can be told to fail."""

    takes_notices = True       # (as Slack and webhooks: alerts.announce tells it)

    def __init__(self, name: str, batch: bool = False):
        self.name = name
        self.sent: list[tuple[Alert, list[str]]] = []
        self.batches: list[list[Alert]] = []
        self.fail: Exception | None = None
        self.attempts = 0
        if batch:
            self.send_batch = self._send_batch

    async def send(self, alert: Alert, done: list[str]) -> None:
        self.attempts += 1
        if self.fail is not None:
            raise self.fail
        self.sent.append((alert, list(done)))
        self.batches.append([alert])

    async def _send_batch(self, alerts: list[Alert], dones: list[list[str]]) -> None:
        self.attempts += 1
        if self.fail is not None:
            raise self.fail
        self.batches.append(list(alerts))
        self.sent.extend(zip(alerts, dones))

    def keys(self) -> list[tuple[str, str, str, int]]:
        return [(a.rule, a.severity, a.state, a.step) for a, _ in self.sent]

    async def close(self) -> None:
        return None


def down(message: str = "HTTP 500") -> DeliveryError:
    return DeliveryError(message)


def alert(**kw) -> Alert:
    base = dict(rule="kl_above_target", severity="red", state="firing", run_id="ppo-8b-a",
                step=1204, onset_step=1200, value=0.131, threshold=0.125,
                actions=["pause", "snapshot"], summary="Mean KL 0.131 above 0.125",
                diagnosis="Probably: beta too small.", ts=T0)
    base.update(kw)
    return Alert(**base)
