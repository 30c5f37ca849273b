"""Connection and delivery settings, from flags and the environment (contract section 5).

Secrets (tokens, webhook URLs, HMAC keys) may be given as ``NAME`` or as ``NAME_FILE`` (a path
to a file holding the value, e.g. a mounted secret). They are never printed: ``describe()``
masks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["REDIS_SCHEMES", "Settings", "redis_url_problem"]

#: The schemes a Redis URL starts with.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _env(name: str, default: str | None = None) -> str | None:
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"rlwatch: cannot read {name}_FILE={path}: {exc}") from None
    return os.environ.get(name, default)


SECRET_FIELDS = {"slack_webhook", "slack_token", "webhook_secret", "control_secret", "webhook_url",
                 "pagerduty_routing_key", "kafka_sasl_password"}
#: URLs that may carry a password (``redis://:pw@host``): only the password is masked.
URL_FIELDS = {"redis", "kafka", "alertmanager_url", "pagerduty_url", "slack_api_url", "public_url"}


def redis_url_problem(url: str | None, source: str = "RLWATCH_REDIS") -> str | None:
    """What is wrong with a Redis URL (one line), or None. A bare ``host:port`` is the usual
    mistake: redis-py would reject it only when the first connection is tried."""
    if url and url.startswith(REDIS_SCHEMES):
        return None
    return (f"{source} must be a URL such as redis://{url or 'localhost:6379'}/0 (got {url!r}; "
            "rediss:// for TLS, redis://:PASSWORD@HOST:PORT/DB with a password)")


def mask_url(url: str) -> str:
    import re

    return re.sub(r"(?<=://)([^/@:\s]*)(:[^/@\s]*)?@", lambda m: (m.group(1) + ":***@") if m.group(2)
                  else "***@", url)


@dataclass
class Settings:
    kafka: str = "localhost:9092"
    redis: str = "redis://localhost:6379/0"
    rules: str = "rlhf"
    app_id: str = "rlwatch"
    events_topic: str = "rlwatch.events"
    alerts_topic: str = "rlwatch.alerts"
    dlq_topic: str = "rlwatch.dlq"
    slack_webhook: str | None = None
    slack_token: str | None = None
    slack_channel: str | None = None
    slack_api_url: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None
    control_secret: str | None = None
    advisory: str | None = None
    tick_seconds: float = 10.0
    run_ttl_hours: float = 72.0          # a run silent this long is forgotten (state and statistics)
    finished_after: float = 3600.0       # seconds: a run silent this long is shown as finished
    kafka_security_protocol: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_cafile: str | None = None
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    # delivery (alerts/): routing file, more receivers, the outbox timer, the brake's ack timeout
    routes: str | None = None
    alertmanager_url: str | None = None
    pagerduty_routing_key: str | None = None
    pagerduty_url: str | None = None
    public_url: str | None = None
    delivery_tick_seconds: float = 2.0
    ack_timeout: float = 60.0
    # the brake: a brake Redis has not taken for this long pages directly; an unacknowledged
    # one is published again this long after it was sent, then twice as long after each
    # re-send, at most brake_resend_max_seconds apart (never less than brake_resend_seconds)
    brake_alarm_seconds: float = 10.0
    brake_resend_seconds: float = 5.0
    brake_resend_max_seconds: float = 300.0
    # worker restarts: a stable id per worker process (Kafka static membership: a restarted
    # worker takes its partitions back at once); "" picks one per host and slot, "none" turns
    # it off. The session timeout bounds how long a dead worker's partitions wait.
    worker_id: str = ""
    session_timeout: float = 10.0
    # the most a worker's fetch takes of each partition, in MB: a worker that is behind takes
    # bigger batches, faster, for more memory (see streams.app.build_app; the worker takes 1 to 64)
    fetch_mb: float = 16.0

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        s = cls()
        for f in fields(cls):
            value = _env(f"RLWATCH_{f.name.upper()}")
            if value is not None and value != "":
                if f.type in ("float", float):
                    try:
                        value = float(value)
                    except ValueError:
                        raise SystemExit(f"rlwatch: RLWATCH_{f.name.upper()} must be a number, "
                                         f"got {value!r}") from None
                setattr(s, f.name, value)
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        return s

    def describe(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in SECRET_FIELDS and v:
                v = "***"
            elif f.name in URL_FIELDS and isinstance(v, str):
                v = mask_url(v)
            out[f.name] = v
        return out

    # -- Kafka security, for each client library --------------------------------------------------
    def kafka_python_kwargs(self) -> dict:
        """Security settings as kafka-python's clients (KafkaAdminClient, KafkaProducer) take them."""
        out: dict = {}
        if self.kafka_security_protocol:
            out["security_protocol"] = self.kafka_security_protocol.upper()
        elif self.kafka_sasl_mechanism:
            out["security_protocol"] = "SASL_PLAINTEXT"
        if self.kafka_sasl_mechanism:
            out["sasl_mechanism"] = self.kafka_sasl_mechanism.upper()
            out["sasl_plain_username"] = self.kafka_sasl_username
            out["sasl_plain_password"] = self.kafka_sasl_password
        for name in ("cafile", "certfile", "keyfile"):
            value = getattr(self, f"kafka_ssl_{name}")
            if value:
                out[f"ssl_{name}"] = value
        return out

    def kafka_ssl_context(self):
        """An ``ssl.SSLContext`` when the protocol uses TLS (SSL / SASL_SSL), else None."""
        proto = (self.kafka_security_protocol or "").upper()
        if proto not in ("SSL", "SASL_SSL"):
            return None
        import ssl

        ctx = ssl.create_default_context(cafile=self.kafka_ssl_cafile or None)
        if self.kafka_ssl_certfile:
            ctx.load_cert_chain(self.kafka_ssl_certfile, self.kafka_ssl_keyfile or None)
        return ctx
