"""A generic JSON webhook: the alert as in contract section 3, signed, retried, idempotent.

Also the small HTTP helper the Alertmanager and PagerDuty sinks share (:class:`JsonPoster`):
one aiohttp session, one attempt per call (retries are the outbox's job, :mod:`alerts.retry`:
429/5xx/network errors raise :class:`DeliveryError`, with the receiver's Retry-After), 4xx
answers other than 408/429 raised as permanent, and error messages that name the host only,
never the URL's path or query (where tokens live).
"""

from __future__ import annotations

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
    def __init__(self, what: str, timeout: float = 10.0, secrets: tuple[str | None, ...] = ()):
        self.what, self.timeout = what, timeout
        self.secrets = tuple(s for s in secrets if s)
        self._session = None

    async def _client(self):
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        """One attempt. Raises :class:`PermanentDeliveryError` for a refusal retrying cannot fix,
        :class:`DeliveryError` (with ``retry_after`` when a 429 said) for the rest."""
        session = await self._client()
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                if resp.status < 300:
                    return resp.status
                if resp.status < 500 and resp.status not in (408, 429):
                    text = redact((await resp.text())[:200], self.secrets)
                    raise PermanentDeliveryError(
                        f"{self.what} at {safe_url(url)} refused the alert: HTTP {resp.status} {text}")
                wait = retry_after_of(resp.headers) if resp.status == 429 else None
                raise DeliveryError(f"{self.what} at {safe_url(url)} failed: HTTP {resp.status}", retry_after=wait)
        except DeliveryError:
            raise
        except Exception as exc:  # noqa: BLE001 - network errors and timeouts: the outbox retries
            last = redact(f"{type(exc).__name__}: {exc}".replace(url, safe_url(url)), self.secrets)
            raise DeliveryError(f"{self.what} at {safe_url(url)} failed: {last}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class WebhookNotifier:
    """POSTs each alert as one JSON object, with ``actions_taken`` and ``actions_advisory``.

    Headers: ``X-Rlwatch-Signature`` (HMAC-SHA256 of the body with the shared secret) and
    ``Idempotency-Key`` (one per receiver and alert key: a receiver can drop a repeat that a
    crash between send and bookkeeping let through)."""

    #: takes an operator's one-off notices (alerts.announce): it keeps no alert open
    takes_notices = True

    def __init__(self, url: str, secret: str | None = None, timeout: float = 10.0, name: str = "webhook"):
        self.name, self.url, self.secret = name, url, secret
        self.http = JsonPoster(f"webhook {name}", timeout, secrets=(url, secret))
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
