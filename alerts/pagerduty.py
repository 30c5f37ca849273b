"""PagerDuty as a receiver: the Events API v2 (``POST /v2/enqueue``).

``dedup_key`` is the alert's fingerprint, so a repeat updates the open incident and the
resolved notice resolves it. ``routing_key`` is a secret: it never appears in errors or logs.
"""

from __future__ import annotations

from datetime import datetime, timezone

from alerts.render import num
from alerts.webhook import JsonPoster, dumps
from contract.alert import Alert

__all__ = ["PD_SEVERITY", "PagerDutyNotifier", "pd_event"]

#: rlwatch tier -> PagerDuty severity (critical, error, warning, info)
PD_SEVERITY = {"black": "critical", "red": "error", "orange": "warning", "yellow": "warning", "info": "info"}
DEFAULT_URL = "https://events.pagerduty.com"


def pd_event(alert: Alert, done: list[str], routing_key: str, *, now: float,
             client_url: str | None = None) -> dict:
    """The Events v2 body for one alert. Pure."""
    event = {"routing_key": routing_key, "dedup_key": alert.fingerprint,
             "event_action": "resolve" if alert.state == "resolved" else "trigger"}
    if alert.state == "resolved":
        return event
    details = {"rule": alert.rule, "run_id": alert.run_id, "rank": alert.rank, "step": alert.step,
               "onset_step": alert.onset_step, "metric": alert.metric, "value": num(alert.value),
               "threshold": num(alert.threshold), "actions_taken": done,
               "actions_advisory": getattr(alert, "actions_advisory", None) or [],
               "diagnosis": alert.diagnosis, "labels": alert.labels}
    incident = getattr(alert, "incident", None)
    if incident:
        details["incident"] = incident
    ts = alert.ts or now
    event["payload"] = {
        "summary": f"[{alert.severity.upper()}] {alert.run_id}: {alert.summary or alert.rule}"[:1024],
        "severity": PD_SEVERITY.get(alert.severity, "error"),
        "source": alert.run_id, "component": alert.rule, "group": alert.run_id,
        "class": alert.rule,
        "timestamp": datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds"),
        "custom_details": details,
    }
    event["client"] = "rlwatch"
    if client_url:
        event["client_url"] = client_url.replace("{run_id}", alert.run_id)
    return event


class PagerDutyNotifier:
    def __init__(self, routing_key: str, base_url: str | None = None, *, name: str = "pagerduty",
                 client_url: str | None = None, timeout: float = 10.0, clock=None):
        import time

        self.name, self.routing_key = name, routing_key
        self.url = (base_url or DEFAULT_URL).rstrip("/") + "/v2/enqueue"
        self.client_url, self.clock = client_url, clock or time.time
        self.http = JsonPoster(f"pagerduty {name}", timeout, secrets=(routing_key,))
        self.secrets = (routing_key,)

    async def send(self, alert: Alert, done: list[str]) -> None:
        body = pd_event(alert, done, self.routing_key, now=self.clock(), client_url=self.client_url)
        await self.http.post(self.url, dumps(body), {"Content-Type": "application/json"})

    async def close(self) -> None:
        await self.http.close()
