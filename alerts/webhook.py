"""A generic JSON webhook: the alert as in contract section 3, signed, retried, idempotent.

Also the small HTTP helper the Alertmanager and PagerDuty sinks share (:class:`JsonPoster`):
one aiohttp session, a few quick retries for 429/5xx/network errors (the outbox retries for
longer), 4xx answers other than 408/429 raised as permanent, and error messages that name the
host only, never the URL's path or query (where tokens live).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json

from alerts.notifiers import DeliveryError, PermanentDeliveryError, retry_after_of
from alerts.redact import redact, safe_url
from contract.alert import Alert

__all__ = ["JsonPoster", "WebhookNotifier", "signature"]


def signature(secret: str, body: bytes) -> str:
    """Value of the ``X-Rlwatch-Signature`` header: ``sha256=<hex HMAC of the body>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class JsonPoster:
    def __init__(self, what: str, retries: int = 3, backoff: float = 0.5, timeout: float = 10.0,
                 secrets: tuple[str | None, ...] = ()):
        self.what, self.retries, self.backoff, self.timeout = what, retries, backoff, timeout
        self.secrets = tuple(s for s in secrets if s)
        self._session = None

    async def _client(self):
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        session = await self._client()
        last, wait = "", None
        for attempt in range(self.retries + 1):
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    if resp.status < 300:
                        return resp.status
                    last = f"HTTP {resp.status}"
                    wait = retry_after_of(resp.headers) if resp.status == 429 else None
                    if resp.status < 500 and resp.status not in (408, 429):
                        text = redact((await resp.text())[:200], self.secrets)
                        raise PermanentDeliveryError(
                            f"{self.what} at {safe_url(url)} refused the alert: HTTP {resp.status} {text}")
            except PermanentDeliveryError:
                raise
            except Exception as exc:  # noqa: BLE001 - network errors are retried
                last = redact(f"{type(exc).__name__}: {exc}".replace(url, safe_url(url)), self.secrets)
            if attempt < self.retries:
                await asyncio.sleep(min(wait, 30.0) if wait is not None else self.backoff * 2 ** attempt)
        raise DeliveryError(f"{self.what} at {safe_url(url)} failed: {last}", retry_after=wait)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class WebhookNotifier:
    """POSTs each alert as one JSON object, with ``actions_taken`` and ``actions_advisory``.

    Headers: ``X-Rlwatch-Signature`` (HMAC-SHA256 of the body with the shared secret) and
    ``Idempotency-Key`` (one per receiver and alert key: a receiver can drop a repeat that a
    crash between send and bookkeeping let through)."""

    def __init__(self, url: str, secret: str | None = None, retries: int = 3,
                 backoff: float = 0.5, timeout: float = 10.0, name: str = "webhook"):
        self.name, self.url, self.secret = name, url, secret
        self.http = JsonPoster(f"webhook {name}", retries, backoff, timeout, secrets=(url, secret))
        self.secrets = (url, secret)

    async def send(self, alert: Alert, done: list[str]) -> None:
        body = alert.model_copy(update={"actions_taken": done}).to_json().encode()
        headers = {"Content-Type": "application/json",
                   "Idempotency-Key": f"{self.name}:{alert.fingerprint}:{alert.state}:{alert.onset_step}"}
        if self.secret:
            headers["X-Rlwatch-Signature"] = signature(self.secret, body)
        await self.http.post(self.url, body, headers)

    async def close(self) -> None:
        await self.http.close()


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
