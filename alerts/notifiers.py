"""The notifier seam: one small interface every sink implements."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from alerts.render import text
from rlwatch.alert import Alert

__all__ = ["ConsoleNotifier", "DeliveryError", "Notifier"]


class DeliveryError(RuntimeError):
    """A sink refused or could not take an alert after its retries."""


class Notifier(Protocol):
    name: str

    async def send(self, alert: Alert, done: list[str]) -> None:
        """Deliver one alert; ``done`` lists the commands the monitor sent for it.
        Raise :class:`DeliveryError` (or any error) when it could not be delivered."""

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
