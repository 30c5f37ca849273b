"""Prometheus export of the fleet (``GET /metrics``).

Families (all per ``run_id``):

* ``rlwatch_metric_ema{run_id, metric}``: the smoothed value the rules read (the core's own
  EMA, from the run's summary), for each metric a rule smooths (canonical names as labels,
  e.g. ``metric="kl/mean"``);
* ``rlwatch_metric{run_id, metric}``: the last value of each metric the run logs (for runs
  processed elsewhere: the key metrics of the run's summary);
* ``rlwatch_group_metric{run_id, metric, category}``: per-prompt-category metrics, last value;
* ``rlwatch_dist_quantile{run_id, dist, q}``: quantiles (0.05 .. 0.95) of the latest
  step's per-sample distributions (``reward``, ``response_length``);
* ``rlwatch_alert_active{run_id, rule, severity}``: 1 while an alert of that rule and tier is
  firing, 0 once it resolved (every pair seen so far is exported, so ``== 0`` is meaningful);
* ``rlwatch_alerts_fired_total{run_id, severity}``;
* ``rlwatch_run_state{run_id, state}``: 1 for the run's control state (running, paused,
  stopped), 0 for the other two;
* ``rlwatch_run_last_step``, ``rlwatch_run_steps_per_second``,
  ``rlwatch_run_last_seen_timestamp_seconds``, ``rlwatch_run_events_total``;
* ``rlwatch_kl_threshold{run_id, level}``: the KL target and the tier thresholds the engine
  uses for this run (its own targets included; ``level`` = target, yellow, red, black);
* ``rlwatch_run_finished{run_id}``: 1 when the run finished (closed its monitor, or silent
  past the finished timeout);
* ``rlwatch_fleet_runs``.

``rlwatch worker --web`` exports the runs that worker processes (scrape every worker, each run
is counted once); ``rlwatch web`` and ``rlwatch demo --web`` export the whole fleet.
Served from a private registry, so nothing else in the process leaks into the output.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from web.fleet import SEVERITIES, Fleet

__all__ = ["CONTENT_TYPE", "FleetCollector", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("running", "paused", "stopped")


def _ok(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


class FleetCollector:
    def __init__(self, fleet: Fleet, scope: str = "all"):
        self.fleet = fleet
        self.scope = scope

    def describe(self):
        return []

    def collect(self):
        runs = self.fleet.export(scope=self.scope)
        ema = GaugeMetricFamily("rlwatch_metric_ema",
                                "Smoothed value of a step metric, as the rules read it",
                                labels=["run_id", "metric"])
        last = GaugeMetricFamily("rlwatch_metric", "Last value of a step metric of the run",
                                 labels=["run_id", "metric"])
        grp = GaugeMetricFamily("rlwatch_group_metric",
                                "Last value of a per-prompt-category metric of the run",
                                labels=["run_id", "metric", "category"])
        active = GaugeMetricFamily("rlwatch_alert_active",
                                   "1 while the alert (rule, tier) is firing for the run, else 0",
                                   labels=["run_id", "rule", "severity"])
        fired = CounterMetricFamily("rlwatch_alerts_fired", "Alerts fired for the run, by severity",
                                    labels=["run_id", "severity"])
        state = GaugeMetricFamily("rlwatch_run_state", "Control state of the run (1 = current)",
                                  labels=["run_id", "state"])
        step = GaugeMetricFamily("rlwatch_run_last_step", "Last step the run reported",
                                 labels=["run_id"])
        rate = GaugeMetricFamily("rlwatch_run_steps_per_second", "Training steps per second",
                                 labels=["run_id"])
        seen = GaugeMetricFamily("rlwatch_run_last_seen_timestamp_seconds",
                                 "When the dashboard last received an event of the run",
                                 labels=["run_id"])
        events = CounterMetricFamily("rlwatch_run_events", "Events received for the run",
                                     labels=["run_id"])
        kl = GaugeMetricFamily("rlwatch_kl_threshold",
                               "KL target and tier thresholds the engine uses for the run",
                               labels=["run_id", "level"])
        finished = GaugeMetricFamily("rlwatch_run_finished", "1 when the run finished",
                                     labels=["run_id"])
        dist = GaugeMetricFamily("rlwatch_dist_quantile",
                                 "Quantile of a per-sample distribution (reward, response_length) "
                                 "at the run's latest step", labels=["run_id", "dist", "q"])
        for r in runs:
            rid = r["run_id"]
            for name, qs in sorted(r["quantiles"].items()):
                for q, v in qs.items():
                    if _ok(v):
                        dist.add_metric([rid, name, f"{q:g}"], v)
            for name, v in sorted(r["smoothed"].items()):
                if _ok(v):
                    ema.add_metric([rid, name], v)
            for name, v in sorted(r["latest"].items()):
                if not _ok(v):
                    continue
                if "@" in name:
                    metric, cat = name.split("@", 1)
                    grp.add_metric([rid, metric, cat], v)
                else:
                    last.add_metric([rid, name], v)
            for rule, sev in sorted(r["alert_keys"]):
                active.add_metric([rid, rule, sev], 1.0 if (rule, sev) in r["active"] else 0.0)
            for sev in SEVERITIES:
                fired.add_metric([rid, sev], float(r["fired"].get(sev, 0)))
            for s in STATES:
                state.add_metric([rid, s], 1.0 if r["state"] == s else 0.0)
            if r["last_step"] is not None:
                step.add_metric([rid], float(r["last_step"]))
            rate.add_metric([rid], float(r["steps_per_s"]))
            if _ok(r["last_seen"]):
                seen.add_metric([rid], float(r["last_seen"]))
            events.add_metric([rid], float(r["events"]))
            finished.add_metric([rid], 1.0 if r["status"] == "finished" else 0.0)
            for level, v in sorted(r["kl_lines"].items()):
                if _ok(v):
                    kl.add_metric([rid, level], v)
        runs_g = GaugeMetricFamily("rlwatch_fleet_runs", "Runs this export covers")
        runs_g.add_metric([], float(len(runs)))
        errors = CounterMetricFamily("rlwatch_web_observer_errors",
                                     "Events or alerts the dashboard could not ingest")
        errors.add_metric([], float(self.fleet.errors))
        yield from (ema, last, grp, dist, active, fired, state, step, rate, seen, events, kl, finished,
                    runs_g, errors)


def registry_for(fleet: Fleet, scope: str = "all") -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FleetCollector(fleet, scope))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
