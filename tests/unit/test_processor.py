"""streams.processor: NaN/Inf on any rank, duplicates and late steps, cross-rank rules, samples
and checkpoints, and the run state surviving a restart (to_state -> JSON -> load_state)."""

from __future__ import annotations

import json
import random

import pytest

from producers.sim import SimConfig, simulate
from contract.events import parse_event
from streams.processor import Pipeline, Processor
from tests.unit._core import (
    T0,
    checkpoint_event,
    feed_series,
    firing,
    only_rules,
    resolved,
    rlhf_pack,
    step_event,
)


def feed(pipeline, events):
    out = []
    for e in events:
        out += pipeline.feed(e, e.ts)
    return out


# -- nan_inf -----------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
def test_nan_inf_fires_black_on_rank_zero_without_rank(bad):
    p = Pipeline(rlhf_pack())
    alerts = feed_series(p, "r", "kl/mean", [0.02] * 5)
    alerts += feed(p, [step_event("r", 5, {"kl/mean": 0.02, "loss/value": bad})])
    nan = firing(alerts, "nan_inf")
    assert len(nan) == 1
    a = nan[0]
    assert a.severity == "black" and a.step == 5 and a.rank is None
    assert a.metric == "loss/value" and "loss/value" in a.summary
    assert "stop" in a.actions and "snapshot" in a.actions
    # the alert line stays strict JSON although its value is NaN
    json.loads(a.to_json(), parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_nan_on_another_rank_fires_with_that_rank():
    p = Pipeline(rlhf_pack())
    alerts = []
    for s in range(8):
        for r in range(4):
            m = {"kl/mean": 0.02, "grad_norm/actor": 1.0}
            if s == 6 and r == 2:
                m["grad_norm/actor"] = "NaN"
            alerts += feed(p, [step_event("multi", s, m, rank=r, world_size=4)])
    nan = firing(alerts, "nan_inf")
    # a non-finite gradient norm with a finite loss: a skipped mixed-precision step, a notice
    assert [(a.step, a.rank, a.severity) for a in nan] == [(6, 2, "yellow")]
    assert nan[0].metric == "grad_norm/actor" and nan[0].actions == ["notify"]
    # a per-rank identity: the same rule on rank 3 would be another alert
    assert nan[0].fingerprint != firing(
        feed(Pipeline(rlhf_pack()), [step_event("multi", 0, {"x": "NaN"})]), "nan_inf")[0].fingerprint


def test_nan_resolves_when_metrics_are_finite_again():
    p = Pipeline(only_rules("nan_inf"))
    alerts = feed_series(p, "r", "reward/mean", [1.0, "NaN", "NaN", 1.0])
    assert [(a.state, a.step) for a in alerts] == [("firing", 1), ("resolved", 3)]


def test_resolved_nan_alert_still_names_the_metric():
    p = Pipeline(only_rules("nan_inf"))
    alerts = feed_series(p, "r", "loss/value", [0.5, "NaN", 0.5])
    fired, done = alerts
    assert fired.metric == "loss/value" and "loss/value" in fired.summary
    assert done.state == "resolved"
    # the resolution message must say what recovered, not "n/a became nan"
    assert done.metric == "loss/value", done.summary
    assert "n/a" not in done.summary, done.summary


def test_nan_metric_does_not_poison_the_kl_signals():
    p = Pipeline(rlhf_pack())
    values = [0.02] * 10 + ["NaN"] + [0.02] * 10
    alerts = feed_series(p, "r", "kl/mean", values)
    assert [a.rule for a in firing(alerts)] == ["nan_inf"]


# -- duplicates and out-of-order steps ---------------------------------------------------------

def test_duplicate_steps_are_not_reevaluated_and_do_not_count_for_for():
    p = Pipeline(rlhf_pack())
    alerts = feed_series(p, "r", "kl/mean", [0.02] * 10 + [0.08] * 4)   # 4 steps above yellow
    for _ in range(5):   # the same step 13 redelivered: must not be a 5th, 6th ... step
        alerts += feed(p, [step_event("r", 13, {"kl/mean": 0.08})])
    assert not firing(alerts)
    alerts += feed_series(p, "r", "kl/mean", [0.08], start=14)
    y = firing(alerts, "kl_above_target", "yellow")
    assert [(a.step, a.onset_step) for a in y] == [(14, 10)]


def test_duplicate_and_late_steps_with_bad_values_never_alert_or_crash():
    p = Pipeline(rlhf_pack())
    alerts = feed_series(p, "r", "kl/mean", [0.02] * 20)
    late = [step_event("r", s, {"kl/mean": v, "loss/value": "NaN"})
            for s, v in ((19, 9.0), (3, 9.0), (0, "Infinity"), (19, "NaN"), (10, -1.0))]
    alerts += feed(p, late)
    assert alerts == []
    st = p.runs["r"]
    assert st.duplicates == 5
    # the run goes on normally afterwards
    after = feed_series(p, "r", "kl/mean", [0.5] * 4, start=20)
    assert {a.severity for a in firing(after, "kl_above_target")} == {"info", "red", "black"}


def test_out_of_order_ranks_are_tracked_separately():
    p = Pipeline(only_rules("nan_inf"))
    events = [step_event("r", 5, {"x": 1.0}, rank=0, world_size=2),
              step_event("r", 3, {"x": 1.0}, rank=1, world_size=2),   # rank 1 is behind: fine
              step_event("r", 4, {"x": "NaN"}, rank=1, world_size=2)]
    alerts = feed(p, events)
    assert [(a.rule, a.rank, a.step) for a in firing(alerts)] == [("nan_inf", 1, 4)]


# -- samples and checkpoints at the same step as the step event ---------------------------------

def samples_event(run_id, step, token="Certainly"):
    samples = [{"prompt_id": f"p{i}", "response": f"answer {i} about topic {i * 7}",
                "reward": 1.0 + 0.1 * i, "token_kl_argmax": token if i < 6 else f"tok{i}"}
               for i in range(8)]
    return parse_event({"schema": 1, "kind": "samples", "run_id": run_id, "step": step,
                        "ts": T0 + step, "samples": samples}, T0)


def test_tool_words_fire_from_a_samples_event_alone():
    alerts = feed(Pipeline(rlhf_pack()), [samples_event("r", 0)])
    tw = firing(alerts, "tool_words")
    assert len(tw) == 1 and tw[0].severity == "yellow" and "Certainly" in tw[0].summary


def test_samples_of_a_step_are_evaluated_after_that_steps_metrics():
    # The SDK and the simulator log a step's metrics, then that step's samples (same step number).
    p = Pipeline(rlhf_pack())
    alerts = feed(p, [step_event("r", 0, {"kl/mean": 0.02}), samples_event("r", 0)])
    assert firing(alerts, "tool_words"), "the samples of step 0 were dropped as a duplicate step"


def test_a_checkpoint_reported_before_the_step_event_does_not_hide_that_step():
    p = Pipeline(rlhf_pack())
    alerts = feed(p, [step_event("r", s, {"kl/mean": 0.02}) for s in range(5)])
    alerts += feed(p, [checkpoint_event("r", 5, "/c/5"),
                       step_event("r", 5, {"kl/mean": 0.02, "loss/value": "NaN"})])
    assert firing(alerts, "nan_inf"), "the step-5 metrics were dropped after the step-5 checkpoint"


# -- cross-rank rules ----------------------------------------------------------------------------

def rank_events(steps, world_size=4, grad=None, hashes=None):
    """Step events of every rank; grad(step, rank) and hashes(step, rank) give the values."""
    out = []
    for s in range(steps):
        for r in range(world_size):
            kw = {"rank": r, "world_size": world_size}
            if hashes is not None:
                kw["hashes"] = {"actor": hashes(s, r)}
            out.append(step_event("dist", s, {"grad_norm/actor": grad(s, r) if grad else 1.0,
                                              "kl/mean": 0.02}, **kw))
    return out


def test_rank_outlier_fires_when_one_rank_has_five_times_the_others_grad_norm():
    """One step over the line is an info notice; the same rank over it at two of its last three
    steps (from step 7) for 10 steps is the orange alarm with the snapshot of the rank's
    batch."""
    grad = lambda s, r: 5.0 if (s >= 6 and r == 2) else 1.0 + 0.01 * r  # noqa: E731
    alerts = feed(Pipeline(rlhf_pack()), rank_events(20, grad=grad))
    ro = firing(alerts, "rank_outlier")
    assert [(a.severity, a.step) for a in ro] == [("info", 6), ("orange", 16)]
    a = ro[1]
    assert a.value == pytest.approx(5.0 / 1.015, rel=0.02)  # max over median of all ranks
    assert a.threshold == 3.5                          # the held line (the notice: 3)
    assert "snapshot" in a.actions
    assert "rank 2" in a.summary.lower()


def test_a_rank_over_the_line_at_single_steps_is_no_alarm():
    """Per-rank gradient norms scatter: a different rank over 3 x the median now and then
    (never 10 steps in a row) is an info notice each time, never the alarm."""
    grad = lambda s, r: 4.0 if (s % 4 == 0 and r == s // 4 % 4) else 1.0  # noqa: E731
    ro = firing(feed(Pipeline(rlhf_pack()), rank_events(60, grad=grad)), "rank_outlier")
    assert ro and {a.severity for a in ro} == {"info"}


def test_ranks_taking_turns_over_the_line_at_every_step_are_no_alarm():
    """Four ranks whose norms scatter put one over 3 x the median at many steps, a different
    one each time: the largest rank's ratio is over the line at every step, but no rank holds
    it (a bad shard or GPU stays bad), so no alarm; a rank that holds it is one."""
    grad = lambda s, r: 4.0 if r == s % 4 else 1.0  # noqa: E731
    ro = firing(feed(Pipeline(rlhf_pack()), rank_events(60, grad=grad)), "rank_outlier")
    assert ro and {a.severity for a in ro} == {"info"}
    # rank 1 over the line at two steps in three, the others taking turns at the third
    held = lambda s, r: 4.0 if (r == 1 and s % 3) or (s % 3 == 0 and r == s % 4) else 1.0  # noqa: E731
    ro = firing(feed(Pipeline(rlhf_pack()), rank_events(60, grad=held)), "rank_outlier")
    orange = [a for a in ro if a.severity == "orange"]
    assert orange and "rank 1" in orange[0].summary.lower()


def test_rank_outlier_summary_names_the_rank_instead_of_n_a():
    grad = lambda s, r: 5.0 if (s >= 6 and r == 2) else 1.0  # noqa: E731
    a = firing(feed(Pipeline(rlhf_pack()), rank_events(8, grad=grad)), "rank_outlier")[0]
    # the template reads "Rank {rank} gradient norm ..."; the outlier rank is 2
    assert "n/a" not in a.summary, a.summary
    assert a.summary.startswith("Rank 2 "), a.summary


def test_equal_ranks_raise_no_rank_outlier():
    grad = lambda s, r: 1.0 + 0.3 * r  # noqa: E731 - max/median = 1.9/1.3 < 3
    assert not firing(feed(Pipeline(rlhf_pack()), rank_events(10, grad=grad)), "rank_outlier")


def test_rank_outlier_waits_for_every_rank_of_the_step():
    grad = lambda s, r: 5.0 if r == 2 else 1.0  # noqa: E731
    events = rank_events(1, grad=grad)
    p = Pipeline(rlhf_pack())
    first = feed(p, events[:3])            # ranks 0..2 only: the step is not complete
    assert not firing(first, "rank_outlier")
    assert firing(feed(p, events[3:]), "rank_outlier")


def test_param_hash_mismatch_fires_black_stop():
    hashes = lambda s, r: "sha256:bad" if (s >= 4 and r == 3) else f"sha256:good{s}"  # noqa: E731
    alerts = feed(Pipeline(rlhf_pack()), rank_events(6, hashes=hashes))
    hm = firing(alerts, "param_hash_mismatch")
    assert len(hm) == 1
    a = hm[0]
    assert a.severity == "black" and a.step == 4
    assert "stop" in a.actions
    assert "3" in a.summary


def test_matching_hashes_raise_nothing_and_mismatch_resolves():
    hashes = lambda s, r: "sha256:bad" if (s == 2 and r == 1) else f"sha256:{s}"  # noqa: E731
    alerts = feed(Pipeline(rlhf_pack()), rank_events(5, hashes=hashes))
    assert [(a.state, a.step) for a in alerts if a.rule == "param_hash_mismatch"] == [
        ("firing", 2), ("resolved", 3)]
    same = lambda s, r: f"sha256:{s}"  # noqa: E731
    assert not [a for a in feed(Pipeline(rlhf_pack()), rank_events(5, hashes=same))
                if a.rule == "param_hash_mismatch"]


# -- state survives a restart --------------------------------------------------------------------

def kl_run_events(n=100, seed=3):
    rng = random.Random(seed)
    out = []
    for s in range(n):
        kl = 0.02 + (0.006 * (s - 35) if s > 35 else 0.0) + rng.gauss(0, 0.002)
        metrics = {"kl/mean": kl, "reward/mean": 1 + 0.01 * s + rng.gauss(0, 0.05),
                   "entropy/mean": 2.5 - (0.03 * (s - 45) if s > 45 else 0.0),
                   "response/length_mean": 300 + 2 * s, "grad_norm/actor": 1 + rng.random(),
                   "ppo/clip_frac": 0.2, "loss/value": 0.5}
        if s == 70:
            metrics["loss/value"] = "NaN"
        out.append(step_event("sr", s, metrics))
        if s in (20, 40):
            out.append(checkpoint_event("sr", s, f"/c/{s}"))
    return out


def replay_with_restart(pack, events, cut_step):
    proc = Processor(pack)
    st = proc.new_state(events[0].run_id)
    alerts = []
    i = 0
    while i < len(events) and events[i].step < cut_step:
        alerts += proc.process(st, events[i], events[i].ts)
        i += 1
    blob = json.dumps(st.to_state())
    proc2 = Processor(pack)                    # a new worker process
    st2 = proc2.load_state(json.loads(blob))
    for e in events[i:]:
        alerts += proc2.process(st2, e, e.ts)
    return alerts


def uninterrupted(pack, events):
    proc = Processor(pack)
    st = proc.new_state(events[0].run_id)
    out = []
    for e in events:
        out += proc.process(st, e, e.ts)
    return out


def test_state_round_trip_gives_the_same_alerts_as_an_uninterrupted_run():
    pack = rlhf_pack()
    events = kl_run_events(100)
    full = uninterrupted(pack, events)
    # the incident must straddle the snapshot for this to mean anything
    assert [a for a in full if a.step < 50] and [a for a in full if a.step >= 50]
    assert firing(full, "kl_above_target", "black")[0].rollback_to == {"step": 40,
                                                                        "checkpoint": "/c/40"}
    restarted = replay_with_restart(pack, events, 50)
    assert [a.model_dump_json() for a in restarted] == [a.model_dump_json() for a in full]


def test_state_round_trip_with_alert_pending_at_the_snapshot():
    pack = rlhf_pack()
    events = [step_event("p", s, {"kl/mean": 0.08 if s >= 47 else 0.02}) for s in range(60)]
    full = uninterrupted(pack, events)
    assert [(a.severity, a.step) for a in firing(full, "kl_above_target")] == [("yellow", 51)]
    restarted = replay_with_restart(pack, events, 50)    # yellow is pending (3 of 5) at 50
    assert [a.model_dump_json() for a in restarted] == [a.model_dump_json() for a in full]


@pytest.mark.parametrize("fault, world_size, onset, cut", [("rank_outlier", 4, 40, 45),
                                                           ("degenerate_text", 1, 30, 50)])
def test_state_round_trip_on_simulated_runs(fault, world_size, onset, cut):
    raw = list(simulate(SimConfig(run_id="sim", fault=fault, onset=onset, seed=5, samples_every=5,
                                  checkpoint_every=20, world_size=world_size), 70))
    events = [parse_event(r, r["ts"]) for r in raw]
    pack = rlhf_pack()
    full = uninterrupted(pack, events)
    # samples, dists and checkpoints flow through the state; alerts after the cut to compare
    assert [a for a in full if a.step >= cut], f"no alert after the restart in {fault}: vacuous"
    restarted = replay_with_restart(pack, events, cut)
    assert [a.model_dump_json() for a in restarted] == [a.model_dump_json() for a in full]


def test_state_is_plain_json_and_remembers_checkpoints_and_steps():
    p = Pipeline(rlhf_pack())
    feed(p, kl_run_events(30))
    data = json.loads(json.dumps(p.runs["sr"].to_state()))
    assert data["run_id"] == "sr"
    assert [list(c) for c in data["checkpoints"]] == [[20, "/c/20"]]
    st = Processor(rlhf_pack()).load_state(data)
    assert st.checkpoint_before(25) == {"step": 20, "checkpoint": "/c/20"}
    assert st.last_step == {0: 29}


# -- the processor stays per run -----------------------------------------------------------------

def test_runs_do_not_share_state():
    p = Pipeline(rlhf_pack())
    alerts = []
    for s in range(15):
        alerts += feed(p, [step_event("hot", s, {"kl/mean": 0.02 if s < 5 else 0.5}),
                           step_event("cold", s, {"kl/mean": 0.02})])
    assert {a.run_id for a in alerts} == {"hot"}
    assert set(p.runs) == {"hot", "cold"}


def test_heartbeats_do_not_alert_and_tick_detects_a_stalled_run():
    p = Pipeline(rlhf_pack())
    alerts = feed(p, [step_event("r", s, {"kl/mean": 0.02}) for s in range(3)])
    hb = parse_event({"schema": 1, "kind": "heartbeat", "run_id": "r", "step": 2,
                      "ts": T0 + 10}, T0 + 10)
    alerts += p.feed(hb, hb.ts)
    assert alerts == []
    assert p.tick(T0 + 100) == []
    stalled = p.tick(T0 + 10 + 301)
    assert [(a.rule, a.severity, a.state) for a in stalled] == [("run_stalled", "orange", "firing")]
    # the run speaks again: the silence is over
    after = feed(p, [step_event("r", 3, {"kl/mean": 0.02}, ts=T0 + 400)])
    after += p.tick(T0 + 401)
    assert [(a.rule, a.state) for a in after] == [("run_stalled", "resolved")]


# -- memory ------------------------------------------------------------------------------------

def test_a_dropped_run_state_is_freed_with_its_compiled_rules():
    """A worker drops the decoded states of runs that ended or were evicted. A run's compiled
    rules read its state, so state and rules form a cycle: the collector must be able to free
    it, native tests (which hold Python readers) included. Before the native classes let the
    collector see their references, every dropped run stayed in memory for good."""
    import gc
    import weakref

    raw = list(simulate(SimConfig(run_id="gone", fault="rank_outlier", onset=20, seed=3,
                                  samples_every=5, world_size=4), 40))
    proc = Processor(rlhf_pack())
    st = proc.new_state("gone")
    alerts = []
    for r in raw:
        alerts += proc.process(st, parse_event(r, r["ts"]), r["ts"])
    assert firing(alerts, "rank_outlier"), "the cross-rank rules never ran: vacuous"
    assert len(st.programs) == 4
    gone = weakref.ref(st)
    del st
    gc.collect()
    assert gone() is None, [type(x).__name__ for x in gc.get_referrers(gone())][:10]


def _rank_outlier_run(run_id: str = "gone"):
    raw = list(simulate(SimConfig(run_id=run_id, fault="rank_outlier", onset=20, seed=3,
                                  samples_every=5, world_size=4), 60))
    return [parse_event(r, r["ts"]) for r in raw]


def test_a_released_run_state_is_freed_by_reference_counting_alone():
    """A worker freezes its heap (streams.heap), so the collector no longer frees a dropped
    run: RunState.release breaks the cycle of the run and its compiled rules."""
    import gc
    import weakref

    proc = Processor(rlhf_pack())
    st = proc.new_state("gone")
    for e in _rank_outlier_run()[:200]:
        proc.process(st, e, e.ts)
    gone = weakref.ref(st)
    gc.collect()
    gc.disable()
    try:
        st.release()
        del st
        assert gone() is None
    finally:
        gc.enable()


def test_a_released_run_state_used_again_gives_the_same_alerts():
    events = _rank_outlier_run()
    pack = rlhf_pack()
    whole = Processor(pack)
    st = whole.new_state("gone")
    full = [a for e in events for a in whole.process(st, e, e.ts)]
    assert firing(full, "rank_outlier"), "no cross-rank alert: vacuous"
    again = Processor(pack)
    st = again.new_state("gone")
    out = []
    for i, e in enumerate(events):
        if i % 37 == 36:
            st.release()          # as a worker that dropped the state and then used it after all
        out += again.process(st, e, e.ts)
    assert [a.model_dump_json() for a in out] == [a.model_dump_json() for a in full]
