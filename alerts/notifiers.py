"""The notifier seam: one small interface every sink implements."""

from __future__ import annotations

import sys
from typing import Protocol, TextIO

from alerts.render import paint, text
from contract.alert import Alert

__all__ = ["ConsoleNotifier", "DeliveryError", "Notifier", "PermanentDeliveryError", "retry_after_of"]


class DeliveryError(RuntimeError):
    """A sink refused or could not take an alert after its retries (the outbox retries later).
    ``retry_after``: seconds the receiver asked us to wait (HTTP 429 Retry-After), if it said."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def retry_after_of(headers) -> float | None:
    """Seconds from a Retry-After header (numeric form only), else None."""
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
        return None if value is None else max(0.0, float(value if isinstance(value, str) else value[0]))
    except (TypeError, ValueError, AttributeError, IndexError):
        return None


class PermanentDeliveryError(DeliveryError):
    """A sink refused an alert in a way retrying cannot fix (e.g. HTTP 400/404): dead-lettered."""


class Notifier(Protocol):
    name: str

    async def send(self, alert: Alert, done: list[str]) -> None:
        """Deliver one alert; ``done`` lists the commands the monitor sent for it.
        Raise :class:`DeliveryError` (or any error) when it could not be delivered. Error
        messages must not contain the sink's secrets (URLs with tokens, keys).

        A sink may also offer ``send_batch(alerts, dones)`` to take a group's alerts in one
        request; the dispatcher uses it when a group flushes several at once, and
        ``takes_notices = True`` when it takes one-off notices, which never resolve (an
        operator's command: :mod:`alerts.announce`)."""

    async def close(self) -> None: ...


class ConsoleNotifier:
    """Prints each alert: one line (coloured on a terminal, with the first lines of the
    diagnosis for red and black), or the alert's JSON with ``json_lines``. The worker's
    default sink and the embedded demo's."""

    name = "console"

    def __init__(self, stream: TextIO | None = None, *, json_lines: bool = False,
                 colour: bool = False, diagnosis_lines: int = 0):
        self.stream = stream or sys.stdout
        self.json_lines, self.colour, self.diagnosis_lines = json_lines, colour, diagnosis_lines

    async def send(self, alert: Alert, done: list[str]) -> None:
        if self.json_lines:
            print(alert.to_json(), file=self.stream, flush=True)
            return
        tone = "resolved" if alert.state == "resolved" else alert.severity
        lines = [paint(text(alert, done), tone, self.colour)]
        if alert.state == "firing" and alert.severity in ("red", "black") and alert.diagnosis:
            lines += [paint(f"      {line}", "dim", self.colour)
                      for line in alert.diagnosis.splitlines()[:self.diagnosis_lines]]
        print("\n".join(lines), file=self.stream, flush=True)

    async def close(self) -> None:
        return None
