"""Build the delivery edges a worker uses from its settings (one place, for CLI and worker)."""

from __future__ import annotations

import time

from alerts.actions import Enforcement
from alerts.control import RedisControl
from alerts.dedup import RedisDedup
from alerts.dispatch import Dispatcher
from alerts.notifiers import ConsoleNotifier, Notifier
from alerts.slack import SlackBotNotifier, SlackWebhookNotifier
from alerts.webhook import WebhookNotifier
from rlwatch.settings import Settings

__all__ = ["build_dispatcher", "build_notifiers"]


def build_notifiers(s: Settings) -> list[Notifier]:
    out: list[Notifier] = [ConsoleNotifier()]
    if s.slack_webhook:
        out.append(SlackWebhookNotifier(s.slack_webhook))
    if s.slack_token:
        if not s.slack_channel:
            raise SystemExit("rlwatch: RLWATCH_SLACK_TOKEN needs RLWATCH_SLACK_CHANNEL")
        out.append(SlackBotNotifier(s.slack_token, s.slack_channel, base_url=s.slack_api_url))
    if s.webhook_url:
        out.append(WebhookNotifier(s.webhook_url, secret=s.webhook_secret))
    return out


def build_dispatcher(s: Settings) -> Dispatcher:
    control = RedisControl(s.redis)
    return Dispatcher(build_notifiers(s), control, RedisDedup(control.redis), clock=time.time,
                      enforcement=Enforcement.parse(s.advisory), secret=s.control_secret)
