"""Build the delivery edges a worker uses from its settings (one place, for CLI and worker).

Receivers configured by the environment get fixed names: ``console``, ``slack-webhook``,
``slack-bot``, ``webhook``, ``alertmanager``, ``pagerduty``. A routes file (``RLWATCH_ROUTES``)
may define more under ``receivers:`` and route between them; without one, every alert goes to
every receiver.
"""

from __future__ import annotations

import asyncio
import time

from alerts.actions import Enforcement
from alerts.brake import BrakeLane, BrakeThread
from alerts.alertmanager import AlertmanagerNotifier
from alerts.control import RedisControl
from alerts.dispatch import Dispatcher
from alerts.escalation import RedisAcks
from alerts.incidents import RedisIncidents
from alerts.notifiers import ConsoleNotifier, Notifier
from alerts.outbox import RedisOutbox
from alerts.pagerduty import PagerDutyNotifier
from alerts.routes_file import ReceiverSpec, RoutesFileError, load_routes
from alerts.routing import Routing
from alerts.silences import RedisSilences
from alerts.slack import RedisThreads, SlackBotNotifier, SlackWebhookNotifier
from alerts.webhook import WebhookNotifier
from contract.settings import Settings

__all__ = ["build_brake_thread", "build_dispatcher", "build_notifiers", "build_routing", "namespace",
           "receiver_notifier"]


def namespace(s: Settings) -> str:
    """The Redis key prefix of this application's delivery state (outbox, pending brakes)."""
    return f"rlwatch:{s.app_id}"


def build_notifiers(s: Settings, redis=None) -> list[Notifier]:
    threads = RedisThreads(redis) if redis is not None else None
    out: list[Notifier] = [ConsoleNotifier()]
    if s.slack_webhook:
        out.append(SlackWebhookNotifier(s.slack_webhook))
    if s.slack_token:
        if not s.slack_channel:
            raise SystemExit("rlwatch: RLWATCH_SLACK_TOKEN needs RLWATCH_SLACK_CHANNEL")
        out.append(SlackBotNotifier(s.slack_token, s.slack_channel, base_url=s.slack_api_url,
                                    threads=threads))
    if s.webhook_url:
        out.append(WebhookNotifier(s.webhook_url, secret=s.webhook_secret))
    if s.alertmanager_url:
        out.append(AlertmanagerNotifier(s.alertmanager_url, generator_url=_run_url(s)))
    if s.pagerduty_routing_key:
        out.append(PagerDutyNotifier(s.pagerduty_routing_key, s.pagerduty_url, client_url=_run_url(s)))
    return out


def _run_url(s: Settings) -> str | None:
    return f"{s.public_url.rstrip('/')}/run?run={{run_id}}" if s.public_url else None


def receiver_notifier(spec: ReceiverSpec, s: Settings, redis=None) -> Notifier:
    """A receiver defined in the routes file."""
    def need(*names: str) -> None:
        missing = [n for n in names if not getattr(spec, n)]
        if missing:
            raise RoutesFileError(f"receiver {spec.name!r} ({spec.type}) needs {', '.join(missing)}")

    if spec.type == "console":
        n: Notifier = ConsoleNotifier()
        n.name = spec.name  # type: ignore[misc]
        return n
    if spec.type == "slack_webhook":
        need("url")
        return SlackWebhookNotifier(spec.url, name=spec.name)  # type: ignore[arg-type]
    if spec.type == "slack_bot":
        need("token", "channel")
        return SlackBotNotifier(spec.token, spec.channel, base_url=spec.api_url or s.slack_api_url,  # type: ignore[arg-type]
                                threads=RedisThreads(redis) if redis is not None else None, name=spec.name)
    if spec.type == "webhook":
        need("url")
        return WebhookNotifier(spec.url, secret=spec.secret, name=spec.name)  # type: ignore[arg-type]
    if spec.type == "alertmanager":
        need("url")
        return AlertmanagerNotifier(spec.url, name=spec.name, generator_url=_run_url(s))  # type: ignore[arg-type]
    need("routing_key")
    return PagerDutyNotifier(spec.routing_key, spec.url or spec.api_url, name=spec.name,  # type: ignore[arg-type]
                             client_url=_run_url(s))


def build_routing(s: Settings, notifiers: list[Notifier], redis=None) -> tuple[Routing, list[Notifier]]:
    """The routing configuration and the full list of notifiers (environment + file)."""
    advisory = Enforcement.parse(s.advisory).advisory
    names = [n.name for n in notifiers]
    if not s.routes:
        return Routing.default(names, advisory, s.ack_timeout), notifiers
    routing = load_routes(s.routes, names, advisory, s.ack_timeout)
    extra = [receiver_notifier(spec, s, redis) for spec in routing.receivers if spec.name not in names]
    return routing, [*notifiers, *extra]


def build_dispatcher(s: Settings, **kw) -> Dispatcher:
    """The dispatcher of a worker: every store in the one Redis, delivery state per application."""
    control = RedisControl(s.redis, secret=s.control_secret)
    redis = control.redis
    routing, notifiers = build_routing(s, build_notifiers(s, redis), redis)
    ns = namespace(s)
    # the timer's fleet work, one worker's tick per turn: a turn a little shorter than the tick,
    # so that a worker alone still does it at every tick
    kw.setdefault("fleet_turn", 0.9 * s.delivery_tick_seconds)
    return Dispatcher(notifiers, control, clock=time.time,
                      enforcement=Enforcement(routing.policy.default), secret=s.control_secret,
                      routing=routing, outbox=RedisOutbox(redis, ns), silences=RedisSilences(redis),
                      incidents=RedisIncidents(redis, ns), acks=RedisAcks(redis, ns, s.control_secret),
                      unreachable_after=s.brake_alarm_seconds, resend_every=s.brake_resend_seconds,
                      resend_most=s.brake_resend_max_seconds, **kw)


def build_brake_thread(s: Settings, dispatcher: Dispatcher, loop: asyncio.AbstractEventLoop) -> BrakeThread:
    """The brake's own thread for a worker: its own Redis client, the dispatcher's plan of
    commands, and its alarms paged by the dispatcher on ``loop`` (the worker's)."""
    def alarm(resolved: bool):
        async def page(cmd, error: str, waited: float) -> None:
            asyncio.run_coroutine_threadsafe(dispatcher.alarm(cmd, error, waited, resolved), loop)
        return page

    def make_lane() -> BrakeLane:
        control = RedisControl(s.redis, secret=s.control_secret)
        return BrakeLane(control, RedisAcks(control.redis, namespace(s), s.control_secret), clock=time.time,
                         secret=s.control_secret, unreachable_after=s.brake_alarm_seconds,
                         resend_every=s.brake_resend_seconds, resend_most=s.brake_resend_max_seconds,
                         on_unreachable=alarm(False),
                         on_recovered=alarm(True), safe=dispatcher._safe)

    return BrakeThread(make_lane, dispatcher.plan).start()
