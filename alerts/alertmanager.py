"""Alertmanager as a receiver: ``POST /api/v2/alerts`` (a group's alerts in one request).

Labels carry the alert's identity (``alertname`` = rule, ``severity``, ``run_id``, ``rank``
and the rule's labels), so Alertmanager's own grouping, inhibition and silences work on them;
annotations carry what changes (summary, diagnosis, value vs threshold, step, what the monitor
did). rlwatch sends a firing alert once, not every evaluation as Prometheus does, so its
``endsAt`` lies ``hold`` seconds ahead (a day by default) and the resolved notice ends it.
"""

from __future__ import annotations

from datetime import datetime, timezone

from alerts.render import num
from alerts.webhook import JsonPoster, dumps
from contract.alert import Alert

__all__ = ["AlertmanagerNotifier", "am_alert"]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def am_alert(alert: Alert, done: list[str], *, now: float, hold: float = 86400.0,
             generator_url: str | None = None) -> dict:
    """One element of the ``/api/v2/alerts`` body (postableAlert). Pure."""
    ts = alert.ts or now
    labels = {"alertname": alert.rule, "severity": alert.severity, "run_id": alert.run_id,
              "source": "rlwatch"}
    if alert.rank is not None:
        labels["rank"] = str(alert.rank)
    for k, v in alert.labels.items():
        labels.setdefault(str(k), str(v))
    annotations = {
        "summary": alert.summary or alert.rule,
        "step": str(alert.step),
        "onset_step": "" if alert.onset_step is None else str(alert.onset_step),
        "value": num(alert.value), "threshold": num(alert.threshold),
        "actions_taken": ", ".join(done), "fingerprint": alert.fingerprint,
    }
    if alert.diagnosis:
        annotations["description"] = alert.diagnosis
    if alert.metric:
        annotations["metric"] = alert.metric
    for extra in ("actions_advisory", "incident"):
        v = getattr(alert, extra, None)
        if v:
            annotations[extra] = ", ".join(v) if isinstance(v, list) else str(v)
    out = {"labels": labels, "annotations": {k: v for k, v in annotations.items() if v != ""},
           "startsAt": _iso(ts)}
    out["endsAt"] = _iso(ts) if alert.state == "resolved" else _iso(ts + hold)
    if generator_url:
        out["generatorURL"] = generator_url.replace("{run_id}", alert.run_id)
    return out


class AlertmanagerNotifier:
    def __init__(self, base_url: str, *, name: str = "alertmanager", generator_url: str | None = None,
                 hold: float = 86400.0, timeout: float = 10.0, clock=None):
        import time

        self.name, self.base_url = name, base_url.rstrip("/")
        self.generator_url, self.hold, self.clock = generator_url, hold, clock or time.time
        self.http = JsonPoster(f"alertmanager {name}", timeout, secrets=(base_url,))
        self.secrets = (base_url,)

    async def send(self, alert: Alert, done: list[str]) -> None:
        await self.send_batch([alert], [done])

    async def send_batch(self, alerts: list[Alert], dones: list[list[str]]) -> None:
        now = self.clock()
        body = [am_alert(a, d, now=now, hold=self.hold, generator_url=self.generator_url)
                for a, d in zip(alerts, dones)]
        await self.http.post(f"{self.base_url}/api/v2/alerts", dumps(body),
                             {"Content-Type": "application/json"})

    async def close(self) -> None:
        await self.http.close()
