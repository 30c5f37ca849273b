"""Keep tokens and secrets out of logs, errors and alerts.

Slack webhook URLs, bot tokens, PagerDuty routing keys, HMAC keys and passwords in URLs are
secrets. Notifiers never put them in their error messages (:func:`safe_url`); every message the
dispatcher logs or stores passes :func:`redact`; and third-party clients that log URLs
(``slack_sdk`` logs the webhook URL when it retries) get a logger of ours that redacts
(:func:`guarded_logger`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["guarded_logger", "redact", "safe_url"]

MASK = "***"
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SLACK_HOOK = re.compile(r"(/services/)[A-Za-z0-9/_\-]+")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]+")
_SLACK_TOKEN = re.compile(r"xox[abposr]-[A-Za-z0-9\-]+")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret, URL password, Slack hook path and token masked.

    >>> redact("POST https://u:pw@hooks.example/services/T0/B0/abc failed", ["abc"])
    'POST https://***@hooks.example/services/*** failed'
    """
    out = str(text)
    for s in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        out = out.replace(s, MASK)
    out = _USERINFO.sub(MASK + "@", out)
    out = _SLACK_HOOK.sub(r"\1" + MASK, out)
    out = _BEARER.sub(r"\1" + MASK, out)
    return _SLACK_TOKEN.sub(MASK, out)


def safe_url(url: str) -> str:
    """Scheme, host and port only: what an error may say about where it tried to deliver."""
    try:
        p = urlsplit(url)
        host = p.hostname or "?"
        return f"{p.scheme}://{host}{f':{p.port}' if p.port else ''}"
    except ValueError:
        return "<url>"


class _Redacting(logging.Filter):
    def __init__(self, secrets: Iterable[str | None]):
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format string: keep the raw template
            msg = str(record.msg)
        record.msg, record.args = redact(msg, self.secrets), None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
            record.exc_info = None
        return True


def guarded_logger(name: str, secrets: Iterable[str | None], level: int = logging.WARNING) -> logging.Logger:
    """A logger for a third-party client: quiet below ``level`` and redacting what it says."""
    logger = logging.getLogger(f"rlwatch.alerts.sdk.{name}")
    logger.setLevel(level)
    mine = next((f for f in logger.filters if isinstance(f, _Redacting)), None)
    if mine is None:
        logger.addFilter(_Redacting(secrets))
    else:
        mine.secrets.extend(s for s in secrets if s and s not in mine.secrets)
    return logger
