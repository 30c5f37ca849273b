"""Incident snapshots (streams.snapshot) built from what the recorder kept of each event: the
recorder keeps the events' own data and serialises samples only when a snapshot is built, and
the snapshot shows what was logged, as it did when every event was copied on arrival."""

from __future__ import annotations

from contract.events import parse_event
from streams.processor import Processor
from streams.snapshot import MAX_SAMPLES, MAX_TEXT, SnapshotRecorder, build_snapshot
from tests.unit._core import T0, rlhf_pack, step_event
from tests.unit.alerts._helpers import alert


def test_the_window_shows_the_metrics_as_logged_after_the_core_renamed_them():
    """A run logging a framework's names (here TRL's) is mapped onto the canonical names by the
    core, which replaces the event's metrics; the snapshot keeps the names the run logged."""
    processor = Processor(rlhf_pack())
    state = processor.new_state("trl")
    rec = SnapshotRecorder()
    for s in range(30):
        ev = step_event("trl", s, {"objective/kl": 0.01 * s, "objective/scores": 1.0},
                        batch_ids=[f"b{s}"])
        rec.observe(ev)
        processor.process(state, ev, T0 + s)
    assert state.preset == "trl-ppo" and "kl/mean" in ev.metrics   # the core did rename them
    snap = build_snapshot(alert(run_id="trl", step=20, onset_step=18, metric="objective/kl",
                                value=0.2, threshold=0.15), rec, state, before=3, after=2)
    assert [(w["step"], w["metrics"]) for w in snap["window"]["steps"]] == [
        (s, {"objective/kl": 0.01 * s, "objective/scores": 1.0}) for s in range(15, 21)]
    assert snap["ranks"] == {"0": {"value": 0.2, "batch_ids": ["b20"]}}
    assert snap["last_stable"]["metrics"] == {"objective/kl": 0.01 * 15, "objective/scores": 1.0}


def test_samples_are_serialised_when_the_snapshot_is_built_as_they_were_on_arrival():
    rec = SnapshotRecorder()
    long_text = "y" * (MAX_TEXT + 10)
    samples = [{"prompt_id": f"p{i}", "response": long_text if i == 0 else "ok", "reward": float(i),
                "truncated": None, "note": "an extra field"} for i in range(MAX_SAMPLES + 3)]
    rec.observe(parse_event({"schema": 1, "kind": "samples", "run_id": "r", "step": 5, "ts": T0,
                             "samples": samples}, T0))
    for s in range(8):
        rec.observe(step_event("r", s, {"kl/mean": 0.01}))
    snap = build_snapshot(alert(run_id="r", step=7, onset_step=6), rec)
    got = snap["offending"]
    assert got["step"] == 5 and got["samples_total"] == MAX_SAMPLES + 3
    assert got["samples"][0] == {   # unset fields left out, long texts clipped
        "prompt_id": "p0", "response": "y" * MAX_TEXT + "... [10 more chars]", "reward": 0.0,
        "note": "an extra field"}
    assert got["samples"][1:] == [{"prompt_id": f"p{i}", "response": "ok", "reward": float(i),
                                   "note": "an extra field"} for i in range(1, MAX_SAMPLES)]


def test_a_rank_reports_at_most_64_batch_ids():
    rec = SnapshotRecorder()
    ids = [f"b{i}" for i in range(100)]
    rec.observe(step_event("r", 3, {"kl/mean": 0.5}, rank=2, batch_ids=ids))
    snap = build_snapshot(alert(run_id="r", step=3, onset_step=3, metric="kl/mean"), rec)
    assert snap["ranks"] == {"2": {"value": 0.5, "batch_ids": ids[:64]}}


def test_steps_kept_as_their_raw_events_give_the_same_snapshots():
    """The worker hands the recorder each event's bytes: steps are kept as those and read
    again when a snapshot is built. Every snapshot is the one the decoded steps give, renamed
    metrics, non-finite spellings, batch ids and other ranks included."""
    import json

    processor = Processor(rlhf_pack())
    state = processor.new_state("trl")
    decoded, raw_kept = SnapshotRecorder(), SnapshotRecorder()
    # steps read once while among the last 50 read (a burst of alerts shows the same steps),
    # and read again for every snapshot
    small, uncached = SnapshotRecorder(read_rows=50), SnapshotRecorder(read_rows=0)
    for s in range(60):
        for rank in range(3):
            raw = json.dumps({"schema": 1, "kind": "step", "run_id": "trl", "step": s, "rank": rank,
                              "ts": T0 + s, "world_size": 3,
                              "metrics": {"objective/kl": 0.01 * s + rank, "objective/scores": 1.0,
                                          "loss/value": "NaN" if s == 40 else 0.5},
                              "batch_ids": [f"b{s}-{rank}-{i}" for i in range(70)]}).encode()
            ev = parse_event(raw, T0 + s)
            decoded.observe(ev)
            for rec in (raw_kept, small, uncached):
                rec.observe(ev, raw)
            processor.process(state, ev, T0 + s)
    assert type(raw_kept.tape("trl").steps[0][2]) is bytes     # kept as the event's bytes
    for a in (alert(run_id="trl", step=45, onset_step=40, metric="objective/kl", value=0.45,
                    threshold=0.35),
              alert(run_id="trl", step=50, onset_step=48, metric="loss/value", rank=2),
              alert(run_id="trl", step=59, onset_step=10, metric="objective/kl", value=1.5,
                    threshold=1.2, rank=1)):
        want = json.dumps(build_snapshot(a, decoded, state), sort_keys=True)
        for rec in (raw_kept, raw_kept, small, small, uncached):     # twice: read, then kept
            got = build_snapshot(a, rec, state)
            assert json.dumps(got, sort_keys=True) == want
            assert got["window"]["steps"] and got["ranks"]
    assert 50 < len(raw_kept._read) <= 4096 and len(small._read) == 50 and not uncached._read


def test_an_alert_of_a_rank_shows_that_ranks_steps_and_every_rank_at_its_step():
    """The window of an alert about rank 2 holds rank 2's steps only (the other ranks' steps
    are kept apart from rank 0's), and ``ranks`` every rank that reported the alert's step, in
    rank order as they came."""
    rec = SnapshotRecorder()
    for s in range(30):
        for rank in (0, 1, 2):
            rec.observe(step_event("r", s, {"kl/mean": rank + 0.01 * s}, rank=rank,
                                   batch_ids=[f"b{s}-{rank}"]))
    snap = build_snapshot(alert(run_id="r", step=20, onset_step=18, metric="kl/mean", rank=2,
                                value=2.2, threshold=2.15), rec)
    window = snap["window"]["steps"]
    assert [w["step"] for w in window] == list(range(30))
    assert all(w["metrics"]["kl/mean"] == 2 + 0.01 * w["step"] for w in window)
    assert snap["ranks"] == {str(r): {"value": r + 0.2, "batch_ids": [f"b20-{r}"]} for r in (0, 1, 2)}
    assert list(snap["ranks"]) == ["0", "1", "2"]
    # rank 0's alert: rank 0's steps
    snap0 = build_snapshot(alert(run_id="r", step=20, onset_step=18, metric="kl/mean"), rec)
    assert all(w["metrics"]["kl/mean"] == 0.01 * w["step"] for w in snap0["window"]["steps"])
