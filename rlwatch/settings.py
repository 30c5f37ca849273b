"""Connection and delivery settings, from flags and the environment (contract section 5).

Secrets (tokens, webhook URLs, HMAC keys) may be given as ``NAME`` or as ``NAME_FILE`` (a path
to a file holding the value, e.g. a mounted secret). They are never printed: ``describe()``
masks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["Settings"]


def _env(name: str, default: str | None = None) -> str | None:
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"rlwatch: cannot read {name}_FILE={path}: {exc}") from None
    return os.environ.get(name, default)


SECRET_FIELDS = {"slack_webhook", "slack_token", "webhook_secret", "control_secret", "webhook_url"}


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
    kafka_security_protocol: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        s = cls()
        for f in fields(cls):
            value = _env(f"RLWATCH_{f.name.upper()}")
            if value is not None and value != "":
                setattr(s, f.name, float(value) if f.type in ("float", float) else value)
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        return s

    def describe(self) -> dict:
        return {f.name: ("***" if f.name in SECRET_FIELDS and getattr(self, f.name) else getattr(self, f.name))
                for f in fields(self)}
