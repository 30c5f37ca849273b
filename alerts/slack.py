"""Slack through the official ``slack_sdk``: incoming webhooks and bot tokens.

Rate limits (HTTP 429) and passing server errors are retried by ``slack_sdk``'s own retry
handlers. Point ``base_url`` / the webhook URL at a local server to test without Slack.
"""

from __future__ import annotations

from alerts.notifiers import DeliveryError
from alerts.render import slack_blocks
from rlwatch.alert import Alert

__all__ = ["SlackBotNotifier", "SlackWebhookNotifier"]


def _retry_handlers(max_retries: int = 3):
    from slack_sdk.http_retry.builtin_async_handlers import (
        AsyncConnectionErrorRetryHandler,
        AsyncRateLimitErrorRetryHandler,
        AsyncServerErrorRetryHandler,
    )

    return [AsyncRateLimitErrorRetryHandler(max_retry_count=max_retries),
            AsyncServerErrorRetryHandler(max_retry_count=max_retries),
            AsyncConnectionErrorRetryHandler(max_retry_count=max_retries)]


class SlackWebhookNotifier:
    """An incoming webhook (``https://hooks.slack.com/services/...``)."""

    name = "slack-webhook"

    def __init__(self, url: str, timeout: float = 10.0):
        from slack_sdk.webhook.async_client import AsyncWebhookClient

        self.client = AsyncWebhookClient(url, timeout=int(timeout), retry_handlers=_retry_handlers())

    async def send(self, alert: Alert, done: list[str]) -> None:
        fallback, blocks, attachments = slack_blocks(alert, done)
        resp = await self.client.send(text=fallback, blocks=blocks, attachments=attachments)
        if resp.status_code != 200:
            raise DeliveryError(f"Slack webhook answered {resp.status_code}: {resp.body[:200]}")

    async def close(self) -> None:
        return None


class SlackBotNotifier:
    """``chat.postMessage`` with a bot token; follow-ups of an alert go in its thread."""

    name = "slack-bot"

    def __init__(self, token: str, channel: str, base_url: str | None = None, timeout: float = 10.0):
        from slack_sdk.web.async_client import AsyncWebClient

        kwargs = {"base_url": base_url} if base_url else {}
        self.client = AsyncWebClient(token=token, timeout=int(timeout), **kwargs)
        self.client.retry_handlers.extend(_retry_handlers())
        self.channel = channel
        self.threads: dict[str, str] = {}   # (run, rule) -> thread ts of the first message

    async def send(self, alert: Alert, done: list[str]) -> None:
        from slack_sdk.errors import SlackApiError

        fallback, blocks, attachments = slack_blocks(alert, done)
        thread_key = f"{alert.run_id}/{alert.rule}/{alert.rank}"
        try:
            resp = await self.client.chat_postMessage(
                channel=self.channel, text=fallback, blocks=blocks, attachments=attachments,
                thread_ts=self.threads.get(thread_key))
        except SlackApiError as exc:
            raise DeliveryError(f"Slack chat.postMessage failed: {exc.response.get('error')}") from None
        if thread_key not in self.threads and resp.get("ts"):
            self.threads[thread_key] = resp["ts"]

    async def close(self) -> None:
        return None
