"""The dashboard's model: rows from the core's summaries and the fleet store's records, chart
history for the runs processed here, alerts, commands, finished runs, relaunches."""

from __future__ import annotations

import math

import pytest

from contract.alert import Alert
from contract.commands import Command
from contract.events import parse_event
from rules.loader import load_pack
from streams.fleet_store import make_record
from tests.web.conftest import Feed, sim_events
from web.fleet import Fleet, kl_lines_from_pack


def _step(run="r", step=0, metrics=None, ts=1_000_000.0, **kw):
    return parse_event({"schema": 1, "kind": "step", "run_id": run, "step": step, "ts": ts,
                        "metrics": metrics if metrics is not None else {"kl/mean": 0.01}, **kw}, ts)


def _summary(run="r", step=0, **kw):
    out = {"run_id": run, "incarnation": None, "generation": 0, "last_step": step,
           "last_event_ts": 1_000_000.0 + step, "events": step + 1, "world_size": 1, "tags": {},
           "targets": {"kl": 0.05}, "open_alerts": [], "worst": None, "latest": {}, "smoothed": {}}
    out.update(kw)
    return out


def test_rows_are_the_core_summary(clock):
    f = Fleet(clock=clock)
    feed = Feed(f)
    feed.events(sim_events("ppo-a", 55, seed=1))
    feed.events(sim_events("grpo-b", 30, algo="grpo", seed=2))
    rows = {r["run_id"]: r for r in f.rows()}
    a, core = rows["ppo-a"], feed.summary("ppo-a")
    assert a["last_step"] == core["last_step"] == 54 and a["state"] == "running" and a["worst"] is None
    assert a["tags"]["algo"] == "ppo" and rows["grpo-b"]["tags"]["algo"] == "grpo"
    # the number on the page is the EMA the rules read, not one the dashboard computed
    assert a["signals"]["reward/mean"] == core["smoothed"]["reward/mean"]
    assert a["steps_per_s"] == pytest.approx(1.0, rel=0.15)   # one simulated step per second
    assert a["checkpoint"]["step"] == 50 and a["status"] == "live" and a["local"]
    # runs that stop moving decay to 0 steps/s, go silent, then finished
    clock.t = a["last_seen"] + 60
    assert f.row("ppo-a")["steps_per_s"] == 0.0 and f.row("ppo-a")["age_s"] >= 60
    clock.t = a["last_seen"] + 400
    assert f.row("ppo-a")["status"] == "silent"
    clock.t = a["last_seen"] + 4000
    assert f.row("ppo-a")["status"] == "finished"
    assert [r["run_id"] for r in f.rows(state="finished")] == ["grpo-b", "ppo-a"]


def test_per_run_targets_give_the_kl_lines_the_engine_uses(clock):
    f = Fleet(clock=clock, kl_lines=kl_lines_from_pack(load_pack("rlhf")))
    feed = Feed(f)
    tagged = [ev for ev in sim_events("tight", 20)]
    for ev in tagged:
        ev.tags["target.kl"] = "0.03"       # what Monitor(targets={"kl": 0.03}) sends
    feed.events(tagged)
    feed.events(sim_events("default", 20))
    approx = pytest.approx
    assert f.kl_lines_for("tight") == approx({"target": 0.03, "yellow": 0.045, "red": 0.075, "black": 0.2})
    assert f.kl_lines_for("default") == approx({"target": 0.05, "yellow": 0.075, "red": 0.125, "black": 0.2})
    assert f.kl_lines_for("tight") == {**feed.summary("tight")["kl_lines"], "target": 0.03}
    assert f.snapshot("tight")["kl_lines"]["red"] == approx(0.075)


def test_series_draw_the_logged_values_and_the_rules_smoothing(clock):
    f = Fleet(clock=clock, capacity=16)
    feed = Feed(f)
    feed.events(sim_events("r", 80))
    snap = f.snapshot("r", points=400)
    s = snap["series"]
    assert s["step"][0] == 0 and s["step"][-1] == 79
    assert len(s["step"]) <= 32
    for m in ("reward/mean", "kl/mean", "entropy/mean", "loss/policy", "loss/value", "response/length_mean",
              "ppo/clip_frac", "response/eos_frac", "response/truncated_frac", "grad_norm/actor"):
        assert any(v is not None for v in s["raw"][m]), m
    smoothed = feed.summary("r")["smoothed"]
    assert "reward/mean" in smoothed and "kl/mean" not in smoothed    # KL is read as a median
    assert s["ema"]["reward/mean"][-1] == pytest.approx(smoothed["reward/mean"])
    for m in s["ema"]:            # no smoothed line where no rule smooths the metric
        if m not in smoothed and "@" not in m:
            assert all(v is None for v in s["ema"][m]), m
    assert set(snap["groups"]["reward/mean"]) == {"safety", "knowledge", "creative"}
    assert "reward/mean@safety" in s["raw"]
    assert snap["versions"]["seq"] > 80
    d = f.dists("r")["dists"]
    assert {"reward", "response_length"} <= set(d)
    assert d["reward"]["latest_step"] == 79 and sum(d["reward"]["latest"]["counts"]) == 64
    assert d["reward"]["heatmap"]["density"]


def test_non_finite_values_are_gaps(clock):
    f = Fleet(clock=clock)
    for step, v in enumerate([1.0, 2.0, math.nan, math.inf, 3.0]):
        f.observe_event(_step(step=step, metrics={"loss/value": v}), _summary(step=step))
    s = f.series("r")
    assert s["raw"]["loss/value"] == [1.0, 2.0, None, None, 3.0]
    assert s["bad"]["loss/value"] == [2, 3]


def test_out_of_order_steps_are_not_drawn(clock):
    f = Fleet(clock=clock)
    for s in [0, 1, 2, 2, 1, 3]:
        f.observe_event(_step(step=s, metrics={"kl/mean": float(s)}), _summary(step=max(s, 0)))
    assert f.series("r")["step"] == [0, 1, 2, 3]


def test_a_rollback_generation_rewinds_the_charts(clock):
    f = Fleet(clock=clock)
    feed = Feed(f)
    feed.events(sim_events("r", 60))
    again = list(sim_events("r", 10, start=51))
    for ev in again:
        ev.tags["generation"] = "1"          # what the SDK sends after a rollback
    feed.events(again)
    s = f.series("r")
    assert s["step"][-1] == 60 and s["step"].count(55) == 1
    assert all(a < b for a, b in zip(s["step"], s["step"][1:]))
    assert f.row("r")["generation"] == 1


def test_a_new_incarnation_starts_the_charts_afresh(clock):
    f = Fleet(clock=clock)
    for s in range(50):
        f.observe_event(_step(step=s), _summary(step=s, incarnation="first"))
    seq = f.versions("r")["seq"]
    for s in range(5):       # relaunched under the same run id: steps start over
        f.observe_event(_step(step=s), _summary(step=s, incarnation="second"))
    assert f.series("r")["step"] == [0, 1, 2, 3, 4]
    assert f.row("r")["incarnation"] == "second"
    rows, _, complete = f.tail("r", seq)
    assert not complete                     # open cockpits reload


def test_only_the_lowest_rank_feeds_the_charts(clock):
    f = Fleet(clock=clock)
    feed = Feed(f)
    feed.events(sim_events("r", 20, world_size=4))
    assert f.series("r")["step"] == list(range(20))
    assert f.row("r")["world_size"] == 4


def test_open_alerts_come_from_the_core_and_markers_from_the_alerts(clock):
    f = Fleet(clock=clock)
    feed = Feed(f)
    fired = feed.events(sim_events("r", 100, fault="kl_above_target", onset=20))
    assert any(a.rule == "kl_above_target" and a.state == "firing" for a in fired)
    row = f.row("r")
    core = feed.summary("r")
    assert row["active"] == len(core["open_alerts"]) > 0
    assert row["worst"]["severity"] == core["worst"]
    assert row["worst"]["summary"]                # the text of the alert as it fired here
    assert {m["rule"] for m in f.markers("r")} >= {"kl_above_target"}
    kl = [m for m in f.markers("r") if m["rule"] == "kl_above_target"]
    assert kl and kl[0]["onset_step"] >= 20
    assert {a["rule"] for a in f.active_alerts("r")} == {a["rule"] for a in core["open_alerts"]}
    # an alert alone (e.g. run_stalled of a run never seen here) is a marker, not a row's state
    f.observe_alert(Alert(rule="run_stalled", severity="orange", state="firing", run_id="ghost", step=1,
                          summary="x"))
    assert f.row("ghost")["worst"] is None and f.markers("ghost")[0]["rule"] == "run_stalled"


def test_commands_set_the_state_once(clock):
    f = Fleet(clock=clock)
    Feed(f).events(sim_events("r", 3))
    cmd = Command(run_id="r", action="pause", ts=clock(), reason="look", issuer="web:operator")
    f.observe_command(cmd, "paused")
    f.observe_command(cmd, "paused")        # reported twice (channel and web server)
    row = f.row("r")
    assert row["state"] == "paused" and row["state_reason"] == "look" and row["state_issuer"] == "web:operator"
    assert len(f.commands("r")) == 1
    assert f.set_control_state("r", "running", "resume", "cli:me") is True
    assert f.set_control_state("r", "running", "resume", "cli:me") is False
    assert f.set_control_state("unknown", "paused") is False
    assert f.row("r")["state"] == "running"
    # a command that sets no state (an operator's adjust of a paused run) is listed, and the run
    # still shows the reason of the pause
    f.observe_command(Command(run_id="r", action="pause", ts=clock(), reason="spikes", issuer="cli:me"), "paused")
    f.observe_command(Command(run_id="r", action="adjust", params={"beta": 1.5}, ts=clock(), reason="beta up",
                              issuer="web:operator"), "paused")
    row = f.row("r")
    assert (row["state"], row["state_reason"], row["state_issuer"]) == ("paused", "spikes", "cli:me")
    assert [c["action"] for c in f.commands("r")] == ["pause", "pause", "adjust"]


def test_samples_filter_by_category_and_step(clock):
    f = Fleet(clock=clock)
    Feed(f).events(sim_events("r", 31))
    all_ = f.samples("r")
    assert all_["steps"] == [30, 20, 10, 0] and all_["samples"][0]["step"] == 30
    assert set(all_["categories"]) == {"safety", "knowledge", "creative"}
    only = f.samples("r", category="safety", step=20)
    assert only["samples"] and all(s["category"] == "safety" and s["step"] == 20 for s in only["samples"])
    assert len(f.samples("r", limit=3)["samples"]) == 3
    assert f.samples("nope") is None


def test_tail_for_live_views(clock):
    f = Fleet(clock=clock, tail_rows=8)
    for s in range(5):
        f.observe_event(_step(step=s, metrics={"kl/mean": 0.01}), _summary(step=s, smoothed={"kl/mean": 0.02}))
    seq = f.versions("r")["seq"]
    rows, seq2, ok = f.tail("r", seq - 2)
    assert ok and seq2 == seq and [r["step"] for r in rows] == [3, 4]
    assert rows[0]["v"]["kl/mean"] == 0.01 and rows[0]["e"]["kl/mean"] == 0.02
    assert f.tail("r", seq) == ([], seq, True)
    for s in range(5, 25):
        f.observe_event(_step(step=s), _summary(step=s))
    rows, _, ok = f.tail("r", seq - 2)       # evicted: the view must reload
    assert not ok


def test_records_of_runs_processed_elsewhere_are_rows(clock):
    """Another worker's runs reach this dashboard through the fleet store."""
    f = Fleet(clock=clock)
    Feed(f).events(sim_events("here", 10))
    rec = None
    for s in range(0, 300, 5):
        rec = make_record(_summary("there", step=s, last_event_ts=clock.t, tags={"team": "b"},
                                   smoothed={"kl/mean": 0.01 + s / 1e4},
                                   open_alerts=[{"rule": "kl_rising", "severity": "orange", "onset_step": 200,
                                                 "step": 210, "summary": "KL rising"}], worst="orange"),
                          rec, clock.t, writer="other-host:42")
    f.set_records([rec])
    row = f.row("there")
    assert row and not row["local"] and row["writer"] == "other-host:42"
    assert row["worst"]["rule"] == "kl_rising" and row["worst"]["summary"] == "KL rising"
    assert 10 < len(row["spark"]["kl/mean"]) <= 48
    snap = f.snapshot("there")
    assert snap["local"] is False and snap["series"]["step"][-1] == 295
    assert snap["series"]["ema"]["kl/mean"][-1] == pytest.approx(0.01 + 295 / 1e4, rel=1e-3)
    assert [r["run_id"] for r in f.rows(q="team=b")] == ["there"]
    assert {r["run_id"] for r in f.export(scope="local")} == {"here"}
    assert {r["run_id"] for r in f.export()} == {"here", "there"}


def test_a_run_that_closed_its_monitor_is_finished_until_it_speaks_again(clock):
    f = Fleet(clock=clock)
    feed = Feed(f)
    feed.events(sim_events("r", 20))
    final = parse_event({"schema": 1, "kind": "heartbeat", "run_id": "r", "step": 19, "ts": clock.t + 1,
                         "final": True}, clock.t + 1)
    feed.events([final])
    row = f.row("r")
    assert row["status"] == "finished" and row["closed"]["step"] == 19
    feed.events(sim_events("r", 3, start=20, t0=clock.t + 5 - 20))   # relaunched
    assert f.row("r")["status"] == "live" and f.row("r")["closed"] is None


def test_rows_sort_and_filter(clock):
    f = Fleet(clock=clock)
    for i, run in enumerate(["a", "b", "c", "d"]):
        clock.t += 1
        f.observe_event(_step(run=run, step=i, ts=clock.t, tags={"algo": "grpo" if i % 2 else "ppo"}),
                        _summary(run, step=i, last_event_ts=clock.t,
                                 tags={"algo": "grpo" if i % 2 else "ppo"},
                                 open_alerts=[{"rule": "kl_rising", "severity": "yellow", "onset_step": 1,
                                               "step": 2}] if run == "c" else []))
    assert [r["run_id"] for r in f.rows(sort="-last_step")] == ["d", "c", "b", "a"]
    assert f.rows(sort="-severity")[0]["run_id"] == "c"
    assert [r["run_id"] for r in f.rows(q="algo=grpo")] == ["b", "d"]
    assert [r["run_id"] for r in f.rows(q="algo=ppo kl_rising")] == ["c"]
    f.observe_command(Command(run_id="b", action="stop", ts=1.0), "stopped")
    assert [r["run_id"] for r in f.rows(state="stopped")] == ["b"]


def test_bad_input_never_raises():
    f = Fleet()
    f.observe_event(object())
    f.observe_alert(object())
    f.observe_command(object())
    assert f.errors == 3 and f.rows() == []


def test_kl_lines_of_the_builtin_pack():
    assert kl_lines_from_pack(load_pack("rlhf")) == {"target": 0.05, "yellow": 0.075, "red": 0.125,
                                                    "black": 0.2}
