"""The Prometheus export: smoothed signals and alert states per run, valid exposition format."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from contract.alert import Alert
from contract.commands import Command
from contract.events import parse_event
from tests.web.conftest import Feed, sim_events
from web.fleet import Fleet
from web.metrics import registry_for, render

ROOT = Path(__file__).resolve().parents[2]


def _fleet(clock) -> Fleet:
    """Two runs through the core (one with its own KL target, as Monitor(targets=...) sends it),
    an alert fired and one resolved, a pause."""
    f = Fleet(clock=clock, kl_lines={"target": 0.05, "red": 0.125})
    feed = Feed(f)
    for run in ("ppo-8b-a", 'odd"run\\name'):
        evs = list(sim_events(run, 30))
        if run == "ppo-8b-a":
            for ev in evs:
                ev.tags["target.kl"] = "0.03"
        feed.events(evs)
    f.observe_alert(Alert(rule="kl_above_target", severity="red", state="firing", run_id="ppo-8b-a",
                          step=29, onset_step=27, threshold=0.075, value=0.2, metric="kl/mean"))
    f.observe_alert(Alert(rule="kl_rising", severity="orange", state="firing", run_id="ppo-8b-a", step=20))
    f.observe_alert(Alert(rule="kl_rising", severity="orange", state="resolved", run_id="ppo-8b-a", step=25))
    summary = feed.summary("ppo-8b-a")
    summary["open_alerts"] = [{"rule": "kl_above_target", "severity": "red", "onset_step": 27, "step": 29}]
    f.observe_event(parse_event({"schema": 1, "kind": "heartbeat", "run_id": "ppo-8b-a", "step": 29,
                                 "ts": clock.t}, clock.t), summary)
    f.observe_command(Command(run_id="ppo-8b-a", action="pause", ts=clock()), "paused")
    return f, feed


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_export_parses_and_carries_the_signals(clock):
    fleet, feed = _fleet(clock)
    text = render(registry_for(fleet)).decode()
    s = _samples(text)
    # the smoothed values are the core's own (the EMA the rules read), not recomputed here
    ema = {(lab["run_id"], lab["metric"]): v for lab, v in s["rlwatch_metric_ema"]}
    assert ema[("ppo-8b-a", "reward/mean")] == feed.summary("ppo-8b-a")["smoothed"]["reward/mean"]
    last = {(lab["run_id"], lab["metric"]): v for lab, v in s["rlwatch_metric"]}
    for m in ("kl/mean", "reward/mean", "entropy/mean", "loss/policy", "loss/value", "grad_norm/actor"):
        assert ("ppo-8b-a", m) in last, m
    groups = {(lab["metric"], lab["category"]) for lab, _ in s["rlwatch_group_metric"]}
    assert ("reward/mean", "safety") in groups
    active = {(lab["run_id"], lab["rule"], lab["severity"]): v for lab, v in s["rlwatch_alert_active"]}
    assert active[("ppo-8b-a", "kl_above_target", "red")] == 1.0
    assert active[("ppo-8b-a", "kl_rising", "orange")] == 0.0        # resolved, still exported
    fired = {(lab["run_id"], lab["severity"]): v for lab, v in s["rlwatch_alerts_fired_total"]}
    assert fired[("ppo-8b-a", "red")] == 1.0 and fired[("ppo-8b-a", "orange")] == 1.0
    state = {(lab["run_id"], lab["state"]): v for lab, v in s["rlwatch_run_state"]}
    assert state[("ppo-8b-a", "paused")] == 1.0 and state[("ppo-8b-a", "running")] == 0.0
    assert ({lab["run_id"]: v for lab, v in s["rlwatch_run_last_step"]}["ppo-8b-a"]) == 29.0
    # the run's own target (0.03) moves its lines, as it moves the engine's thresholds
    kl = {(lab["run_id"], lab["level"]): v for lab, v in s["rlwatch_kl_threshold"]}
    assert kl[("ppo-8b-a", "target")] == 0.03 and kl[("ppo-8b-a", "red")] == 0.075
    assert kl[('odd"run\\name', "target")] == 0.05 and kl[('odd"run\\name', "red")] == 0.125
    assert s["rlwatch_fleet_runs"][0][1] == 2.0
    q = {(lab["run_id"], lab["dist"], lab["q"]) for lab, _ in s["rlwatch_dist_quantile"]}
    assert ("ppo-8b-a", "reward", "0.5") in q and ("ppo-8b-a", "response_length", "0.95") in q
    assert 'odd"run\\name' in {lab["run_id"] for lab, _ in s["rlwatch_run_last_step"]}   # escaped right
    assert "# TYPE rlwatch_run_events_total counter" in text or "# TYPE rlwatch_run_events counter" in text


def test_empty_fleet_exports_valid_text():
    s = _samples(render(registry_for(Fleet())).decode())
    assert s["rlwatch_fleet_runs"][0][1] == 0.0


def test_promtool_check_metrics(clock, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, ("promtool is not installed: apt-get install prometheus "
                      "(scripts/test.sh does it)")
    text = render(registry_for(_fleet(clock)[0]))
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30, check=False)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_grafana_dashboard_mirrors_the_cockpit_rows():
    dash = json.loads((ROOT / "docs" / "grafana" / "rlwatch.json").read_text())
    panels = dash["panels"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert len(rows) == 3
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    for needle in ('metric="reward/mean"', 'metric="kl/mean"', 'metric="entropy/mean"', 'metric="loss/value"',
                   'metric="response/length_mean"', 'metric="ppo/clip_frac"', 'metric="response/eos_frac"',
                   'metric="grad_norm/actor"', "rlwatch_group_metric", "rlwatch_alert_active",
                   "rlwatch_kl_threshold"):
        assert needle in exprs, needle
    assert {v["name"] for v in dash["templating"]["list"]} >= {"datasource", "run"}
