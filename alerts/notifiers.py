"""The notifier seam: one small interface every sink implements."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from alerts.render import text
from rlwatch.alert import Alert

__all__ = ["ConsoleNotifier", "DeliveryError", "Notifier", "PermanentDeliveryError"]


class DeliveryError(RuntimeError):
    """A sink refused or could not take an alert after its retries (the outbox retries later)."""


class PermanentDeliveryError(DeliveryError):
    """A sink refused an alert in a way retrying cannot fix (e.g. HTTP 400/404): dead-lettered."""


class Notifier(Protocol):
    name: str

    async def send(self, alert: Alert, done: list[str]) -> None:
        """Deliver one alert; ``done`` lists the commands the monitor sent for it.
        Raise :class:`DeliveryError` (or any error) when it could not be delivered. Error
        messages must not contain the sink's secrets (URLs with tokens, keys).

        A sink may also offer ``send_batch(alerts, dones)`` to take a group's alerts in one
        request; the dispatcher uses it when a group flushes several at once."""

    async def close(self) -> None: ...


class ConsoleNotifier:
    """Prints one line per alert (the embedded demo, and a worker with no sinks configured)."""

    name = "console"

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    async def send(self, alert: Alert, done: list[str]) -> None:
        print(text(alert, done), file=self.stream, flush=True)

    async def close(self) -> None:
        return None
