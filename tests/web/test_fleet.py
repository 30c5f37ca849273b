"""The dashboard's pure model: ingestion, rows, alerts, commands, bounded history."""

from __future__ import annotations

import math

import pytest

from contract.alert import Alert
from contract.commands import Command
from contract.events import parse_event
from rules.loader import load_pack
from tests.web.conftest import sim_events
from web.fleet import Fleet, kl_lines_from_pack


def _feed(fleet: Fleet, clock, events):
    for ev in events:
        clock.t = ev.ts
        fleet.observe_event(ev)


def _alert(run="r", rule="kl_above_target", sev="red", state="firing", step=10, onset=8, summary="", **kw):
    return Alert(rule=rule, severity=sev, state=state, run_id=run, step=step, onset_step=onset,
                 summary=summary or f"{rule} {sev}", **kw)


def test_rows_of_simulated_runs(clock):
    f = Fleet(clock=clock)
    _feed(f, clock, sim_events("ppo-a", 60, seed=1))
    _feed(f, clock, sim_events("grpo-b", 30, algo="grpo", seed=2))
    rows = {r["run_id"]: r for r in f.rows()}
    a = rows["ppo-a"]
    assert a["last_step"] == 59 and a["state"] == "running" and a["worst"] is None
    assert a["tags"]["algo"] == "ppo"
    assert a["signals"]["kl/mean"] is not None and a["signals"]["reward/mean"] is not None
    assert a["steps_per_s"] == pytest.approx(1.0, rel=0.1)   # one simulated step per second
    assert a["checkpoint"]["step"] == 50
    assert rows["grpo-b"]["tags"]["algo"] == "grpo"
    # paused runs decay to 0 steps/s; silent runs age
    clock.t = a["last_seen"] + 60
    assert f.row("ppo-a")["steps_per_s"] == 0.0
    assert f.row("ppo-a")["age_s"] >= 60


def test_series_snapshot_and_groups(clock):
    f = Fleet(clock=clock, capacity=64)
    _feed(f, clock, sim_events("r", 200))
    snap = f.snapshot("r", points=400)
    s = snap["series"]
    assert s["step"][0] == 0 and s["step"][-1] == 199
    assert len(s["step"]) <= 128
    for m in ("reward/mean", "kl/mean", "entropy/mean", "loss/policy", "loss/value", "response/length_mean",
              "ppo/clip_frac", "response/eos_frac", "response/truncated_frac", "grad_norm/actor"):
        assert any(v is not None for v in s["raw"][m]), m
        assert any(v is not None for v in s["ema"][m]), m
    assert set(snap["groups"]["reward/mean"]) == {"safety", "knowledge", "creative"}
    assert "reward/mean@safety" in s["raw"]
    assert snap["versions"]["seq"] == 200
    d = f.dists("r")["dists"]
    assert {"reward", "response_length"} <= set(d)
    assert d["reward"]["latest_step"] == 199 and sum(d["reward"]["latest"]["counts"]) == 64
    assert d["reward"]["heatmap"]["density"]


def test_ema_skips_non_finite_values(clock):
    f = Fleet(clock=clock, ema_span=1)     # alpha = 1: the EMA is the last finite value
    for step, v in enumerate([1.0, 2.0, math.nan, math.inf, 3.0]):
        f.observe_event(parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": step,
                                     "metrics": {"loss/value": v}}, clock()))
        if step == 3:
            assert f.export()[0]["ema"]["loss/value"] == 2.0
    assert f.export()[0]["ema"]["loss/value"] == 3.0
    s = f.series("r")
    assert s["raw"]["loss/value"] == [1.0, 2.0, None, None, 3.0]
    assert s["bad"]["loss/value"] == [2, 3]


def test_duplicates_and_out_of_order_steps_are_counted_not_drawn(clock):
    f = Fleet(clock=clock)
    for s in [0, 1, 2, 2, 1, 3]:
        f.observe_event(parse_event({"schema": 1, "kind": "step", "run_id": "r", "step": s,
                                     "metrics": {"kl/mean": float(s)}}, clock()))
    assert f.series("r")["step"] == [0, 1, 2, 3]
    assert f.row("r")["out_of_order"] == 2


def test_rollback_rewinds_the_history(clock):
    f = Fleet(clock=clock)
    _feed(f, clock, sim_events("r", 100))
    f.observe_command(Command(run_id="r", action="rollback", params={"to_step": 50}, ts=clock()), "running")
    _feed(f, clock, sim_events("r", 10, start=51))
    s = f.series("r")
    assert s["step"][-1] == 60 and s["step"].count(55) == 1
    assert all(a < b for a, b in zip(s["step"], s["step"][1:]))


def test_only_the_lowest_rank_feeds_the_charts(clock):
    f = Fleet(clock=clock)
    _feed(f, clock, sim_events("r", 20, world_size=4))
    assert f.series("r")["step"] == list(range(20))
    assert f.row("r")["world_size"] == 4
    assert f.row("r")["out_of_order"] == 0


def test_alerts_worst_active_and_resolution(clock):
    f = Fleet(clock=clock, kl_lines={"target": 0.05})
    _feed(f, clock, sim_events("r", 5))
    f.observe_alert(_alert(sev="yellow", threshold=0.075, metric="kl/mean"))
    f.observe_alert(_alert(rule="kl_rising", sev="orange"))
    f.observe_alert(_alert(sev="red", threshold=0.125, metric="kl/mean", actions=["pause"]))
    row = f.row("r")
    assert row["worst"]["severity"] == "red" and row["worst"]["rule"] == "kl_above_target"
    assert row["active"] == 3 and row["fired"]["red"] == 1
    assert f.kl_lines_for("r") == {"target": 0.05, "yellow": 0.075, "red": 0.125}
    f.observe_alert(_alert(sev="red", state="resolved"))
    assert f.row("r")["worst"]["severity"] == "orange"
    markers = f.markers("r")
    assert [m["severity"] for m in markers] == ["yellow", "orange", "red", "red"]
    assert markers[0]["onset_step"] == 8
    assert f.markers("r", since=3)[0]["state"] == "resolved"
    # an escalated tier fires at the next severity and resolves at its own
    f.observe_alert(_alert(rule="stagnation", sev="orange", summary="x; escalated from yellow after 200 steps"))
    f.observe_alert(_alert(rule="stagnation", sev="yellow", state="resolved"))
    assert {a["rule"] for a in f.active_alerts("r")} == {"kl_above_target", "kl_rising"}
    # alerts for a run with no event yet (e.g. run_stalled) create it
    f.observe_alert(_alert(run="ghost", rule="run_stalled", sev="orange"))
    assert f.row("ghost")["worst"]["rule"] == "run_stalled"


def test_commands_set_the_state_once(clock):
    f = Fleet(clock=clock)
    _feed(f, clock, sim_events("r", 3))
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


def test_samples_filter_by_category_and_step(clock):
    f = Fleet(clock=clock)
    _feed(f, clock, sim_events("r", 31))
    all_ = f.samples("r")
    assert all_["steps"] == [30, 20, 10, 0] and all_["samples"][0]["step"] == 30
    assert set(all_["categories"]) == {"safety", "knowledge", "creative"}
    only = f.samples("r", category="safety", step=20)
    assert only["samples"] and all(s["category"] == "safety" and s["step"] == 20 for s in only["samples"])
    assert len(f.samples("r", limit=3)["samples"]) == 3
    assert f.samples("nope") is None


def test_tail_for_live_views(clock):
    f = Fleet(clock=clock, tail_rows=8)
    _feed(f, clock, sim_events("r", 5))
    rows, seq, ok = f.tail("r", 3)          # sequence numbers count rows from 1
    assert ok and seq == 5 and [r["step"] for r in rows] == [3, 4]
    assert "kl/mean" in rows[0]["v"] and "kl/mean" in rows[0]["e"]
    assert f.tail("r", 5) == ([], 5, True)
    _feed(f, clock, sim_events("r", 20, start=5))
    rows, seq, ok = f.tail("r", 2)       # evicted: the view must reload
    assert not ok and seq == 25


def test_rows_sort_filter_and_run_limit(clock):
    f = Fleet(clock=clock, max_runs=3)
    for i, run in enumerate(["a", "b", "c", "d"]):
        clock.t += 1
        f.observe_event(parse_event({"schema": 1, "kind": "step", "run_id": run, "step": i,
                                     "tags": {"algo": "grpo" if i % 2 else "ppo"}, "metrics": {}}, clock()))
    assert f.run_ids() == ["b", "c", "d"]       # the least recently seen run went
    f.observe_alert(_alert(run="c", sev="yellow"))
    assert [r["run_id"] for r in f.rows(sort="-last_step")] == ["d", "c", "b"]
    assert f.rows(sort="-severity")[0]["run_id"] == "c"
    assert [r["run_id"] for r in f.rows(q="algo=grpo")] == ["b", "d"]
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
