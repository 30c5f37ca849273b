"""A generic JSON webhook: the alert as in contract section 3, signed, retried, idempotent."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

from alerts.notifiers import DeliveryError
from rlwatch.alert import Alert

__all__ = ["WebhookNotifier", "signature"]


def signature(secret: str, body: bytes) -> str:
    """Value of the ``X-Rlwatch-Signature`` header: ``sha256=<hex HMAC of the body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookNotifier:
    name = "webhook"

    def __init__(self, url: str, secret: str | None = None, retries: int = 3,
                 backoff: float = 0.5, timeout: float = 10.0):
        self.url, self.secret, self.retries, self.backoff, self.timeout = url, secret, retries, backoff, timeout
        self._session = None

    async def _client(self):
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def send(self, alert: Alert, done: list[str]) -> None:
        body = alert.model_copy(update={"actions_taken": done}).to_json().encode()
        headers = {"Content-Type": "application/json",
                   "Idempotency-Key": f"{alert.fingerprint}:{alert.state}:{alert.onset_step}"}
        if self.secret:
            headers["X-Rlwatch-Signature"] = signature(self.secret, body)
        session = await self._client()
        last = ""
        for attempt in range(self.retries + 1):
            try:
                async with session.post(self.url, data=body, headers=headers) as resp:
                    if resp.status < 300:
                        return
                    last = f"HTTP {resp.status}"
                    if resp.status < 500 and resp.status != 429:
                        break  # a client error will not get better by retrying
            except Exception as exc:  # noqa: BLE001 - network errors are retried
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2 ** attempt)
        raise DeliveryError(f"webhook {self.url} failed: {last}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
