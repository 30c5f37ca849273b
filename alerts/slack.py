"""Slack through the official ``slack_sdk``: incoming webhooks and bot tokens.

Each send is one attempt: ``slack_sdk``'s retry handlers are switched off, because retries are
the outbox's job (:mod:`alerts.retry`): a rate limit (HTTP 429) raises :class:`DeliveryError` with
Slack's Retry-After, which the outbox waits for. Point ``base_url`` / the webhook URL at a local
server to test without Slack.

With a bot token, everything about one alert (run, rule, rank) lands in one thread: the first
firing message starts it, an escalation to a higher tier is posted in the thread *and* to the
channel, the resolution is a reply. The thread's ``ts`` is kept in a :class:`ThreadStore`
(Redis for workers: ``rlwatch:slack:thread:<channel>:<run>/<rule>/<rank>``), so a restarted or
second worker continues the same thread.

``slack_sdk`` logs the webhook URL (a secret) when it retries; both clients get a logger of ours
that stays quiet below WARNING and redacts (:func:`alerts.redact.guarded_logger`).
"""

from __future__ import annotations

import json
from typing import Protocol

from alerts.notifiers import DeliveryError, PermanentDeliveryError, retry_after_of
from alerts.notices import ACKNOWLEDGED_RULE, OPERATOR_RULE
from alerts.redact import guarded_logger, redact
from alerts.render import slack_batch, slack_blocks
from contract.alert import SEVERITIES, Alert
from contract.commands import STATE_ACTIONS

__all__ = ["MemoryThreads", "RedisThreads", "SlackBotNotifier", "SlackWebhookNotifier", "ThreadStore"]

THREAD_TTL = 14 * 24 * 3600


class SlackWebhookNotifier:
    """An incoming webhook (``https://hooks.slack.com/services/...``). A group's alerts go in
    one message."""

    #: takes an operator's one-off notices (alerts.announce): it keeps no alert open
    takes_notices = True

    def __init__(self, url: str, timeout: float = 10.0, name: str = "slack-webhook"):
        from slack_sdk.webhook.async_client import AsyncWebhookClient

        self.name = name
        self.secrets = (url,)
        self.client = AsyncWebhookClient(url, timeout=int(timeout), retry_handlers=[],
                                         logger=guarded_logger(name, self.secrets))

    async def send(self, alert: Alert, done: list[str]) -> None:
        await self.send_batch([alert], [done])

    async def send_batch(self, alerts: list[Alert], dones: list[list[str]]) -> None:
        fallback, blocks, attachments = slack_batch(alerts, dones)
        try:
            resp = await self.client.send(text=fallback, blocks=blocks, attachments=attachments)
        except Exception as exc:  # noqa: BLE001 - network errors and timeouts
            raise DeliveryError(redact(f"Slack webhook unreachable: {type(exc).__name__}: {exc}",
                                       self.secrets)) from None
        if resp.status_code != 200:
            body = redact(str(resp.body)[:200], self.secrets)
            if resp.status_code in (400, 403, 404, 410):
                raise PermanentDeliveryError(f"Slack webhook answered {resp.status_code}: {body}")
            raise DeliveryError(f"Slack webhook answered {resp.status_code}: {body}",
                                retry_after=retry_after_of(resp.headers) if resp.status_code == 429 else None)

    async def close(self) -> None:
        return None


class ThreadStore(Protocol):
    async def get(self, key: str) -> dict | None: ...
    async def set(self, key: str, value: dict) -> None: ...


class MemoryThreads:
    def __init__(self):
        self.threads: dict[str, dict] = {}

    async def get(self, key: str) -> dict | None:
        return self.threads.get(key)

    async def set(self, key: str, value: dict) -> None:
        self.threads[key] = value


class RedisThreads:
    def __init__(self, redis):
        self.redis = redis

    async def get(self, key: str) -> dict | None:
        raw = await self.redis.get(f"rlwatch:slack:thread:{key}")
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: dict) -> None:
        await self.redis.set(f"rlwatch:slack:thread:{key}", json.dumps(value), ex=THREAD_TTL)


def _by_hand_brake(alert: Alert) -> bool:
    """An operator's notice of a command that changes the run's state (pause, resume, stop)."""
    return alert.rule == OPERATOR_RULE and alert.labels.get("command") in STATE_ACTIONS


class SlackBotNotifier:
    """``chat.postMessage`` with a bot token; follow-ups of an alert go in its thread."""

    #: takes an operator's one-off notices (alerts.announce): it keeps no alert open
    takes_notices = True

    def __init__(self, token: str, channel: str, base_url: str | None = None, timeout: float = 10.0,
                 threads: ThreadStore | None = None, name: str = "slack-bot"):
        from slack_sdk.web.async_client import AsyncWebClient

        self.name = name
        self.secrets = (token,)
        kwargs = {"base_url": base_url} if base_url else {}
        self.client = AsyncWebClient(token=token, timeout=int(timeout), logger=guarded_logger(name, self.secrets),
                                     **kwargs)
        self.client.retry_handlers.clear()   # one attempt: the outbox retries
        self.channel = channel
        self.threads: ThreadStore = threads or MemoryThreads()

    def thread_key(self, alert: Alert) -> str:
        """The thread of an alert (run, rule, rank); a brake's acknowledgement goes in the
        thread of the alert that pulled it (a run-wide one: a command names no rank)."""
        rule = alert.labels.get("source_rule") or alert.rule if alert.rule == ACKNOWLEDGED_RULE else alert.rule
        return f"{self.channel}:{alert.run_id}/{rule}/{'' if alert.rank is None else alert.rank}"

    async def send(self, alert: Alert, done: list[str]) -> None:
        from slack_sdk.errors import SlackApiError

        fallback, blocks, attachments = slack_blocks(alert, done)
        key = self.thread_key(alert)
        thread = await self._thread(key)
        kwargs: dict = {}
        escalation = False
        if thread:
            kwargs["thread_ts"] = thread["ts"]
            was = thread.get("severity", "info")
            escalation = alert.state == "firing" and SEVERITIES.index(alert.severity) > SEVERITIES.index(was)
            if escalation or _by_hand_brake(alert):
                # an escalation is news for the channel too, and so is a run paused, resumed
                # or stopped by hand (an operator's later commands go in its first one's thread)
                kwargs["reply_broadcast"] = True
        try:
            resp = await self.client.chat_postMessage(channel=self.channel, text=fallback, blocks=blocks,
                                                      attachments=attachments, **kwargs)
        except SlackApiError as exc:
            error = exc.response.get("error") if exc.response is not None else "unknown"
            if exc.response is not None and exc.response.status_code == 429:
                raise DeliveryError("Slack chat.postMessage: rate limited",
                                    retry_after=retry_after_of(exc.response.headers)) from None
            err = PermanentDeliveryError if error in (
                "channel_not_found", "not_in_channel", "invalid_auth", "account_inactive",
                "token_revoked", "is_archived", "invalid_blocks") else DeliveryError
            raise err(f"Slack chat.postMessage failed: {error}") from None
        except Exception as exc:  # noqa: BLE001 - network errors and timeouts
            raise DeliveryError(redact(f"Slack API unreachable: {type(exc).__name__}: {exc}",
                                       self.secrets)) from None
        try:
            # (an acknowledgement whose alert has no thread here starts none in its alert's name)
            if thread is None and resp.get("ts") and alert.rule != ACKNOWLEDGED_RULE:
                await self.threads.set(key, {"ts": resp["ts"], "severity": alert.severity})
            elif thread is not None and escalation:
                await self.threads.set(key, {**thread, "severity": alert.severity})
        except Exception:  # noqa: BLE001 - posted: a thread not remembered must not make it fail
            pass

    async def _thread(self, key: str) -> dict | None:
        """The alert's thread, or None; with the thread store (Redis) down the message still
        goes out, outside its thread."""
        try:
            return await self.threads.get(key)
        except Exception:  # noqa: BLE001
            return None

    async def close(self) -> None:
        return None
