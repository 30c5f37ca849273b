"""``RunState.apply`` takes a rank's routine steps (a rank other than 0, a sane clock, nothing
new in them, nothing the rank's own rules could change) through ``_routine_rank_step``; a run
ends exactly as when every event takes the general path (``rank_fast_path = False``, the
reference): the same alerts, the same state, the same counters and errors, for streams that
mix routine steps with non-finite values on ranks (alerts of a rank's own, open then closed),
an outlier rank (the cross-rank rules), relaunches, rollbacks, changed targets, broken clocks,
steps too far ahead, duplicates, out-of-order steps and unmapped framework names."""

from __future__ import annotations

import math
import random

import pytest

import streams.run as run_mod
from contract.events import EventError, dump_event, parse_event
from producers.sim import SimConfig, simulate
from streams.processor import Processor
from tests.unit._core import rlhf_pack
from tests.unit.test_event_news import NOW, _stream


def _run(events: list[dict], *, fast: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(run_mod.RunState, "rank_fast_path", fast)
    proc = Processor(rlhf_pack())
    st = proc.new_state(events[0]["run_id"])
    trace = []
    for raw in (dump_event(e) for e in events):
        ev = parse_event(raw, NOW)
        try:
            alerts = proc.process(st, ev, NOW)
        except EventError as exc:
            trace.append(("error", str(exc)))
            continue
        trace.append(([a.to_json() for a in alerts], st.closed))
    counters = (st.events, st.duplicates, st.ts_replaced, st.newest, st.closed, st.now,
                st.last_event_ts, dict(st.last_seen), dict(st.last_step), st.world_size,
                dict(st.targets), st.generation, sorted(st._ranks_open), sorted(st.pending))
    return trace, st.to_state(), counters


def _rank_faults(seed: int) -> list[dict]:
    """An 8-rank run whose ranks now and then log a non-finite value for a few steps (the
    rank's own alert opens, then resolves) and whose rank 3 drifts away from the others."""
    rnd = random.Random(seed)
    cfg = SimConfig(run_id=f"fast-{seed}", fault="rank_outlier", onset=40, seed=seed,
                    world_size=8, samples_every=10, checkpoint_every=25)
    events = list(simulate(cfg, 120))
    base_ts = events[0]["ts"]
    sick: dict[int, int] = {}       # rank -> steps left with a non-finite value
    for ev in events:
        ev["ts"] = NOW - 5000 + (ev["ts"] - base_ts)
        rank = ev.get("rank") or 0
        if ev["kind"] != "step" or not rank:
            continue
        if rank not in sick and rnd.random() < 0.01:
            sick[rank] = rnd.randint(1, 6)
        if sick.get(rank):
            ev["metrics"][rnd.choice(sorted(ev["metrics"]))] = rnd.choice((math.nan, -math.inf))
            sick[rank] -= 1
            if not sick[rank]:
                del sick[rank]
    # rank 0 closes its monitor mid-run and the run goes on: the next rank step reopens it
    mid = next(i for i, e in enumerate(events) if e["kind"] == "step" and e["step"] == 60
               and not e.get("rank"))
    events.insert(mid + 1, {"schema": 1, "kind": "heartbeat", "run_id": events[mid]["run_id"],
                            "rank": 0, "step": 60, "ts": events[mid]["ts"], "final": True})
    return events


@pytest.mark.parametrize("seed", range(6))
def test_routine_rank_steps_taken_straight_leave_the_run_as_the_general_path(seed, monkeypatch):
    events = _stream(seed)
    reference = _run(events, fast=False, monkeypatch=monkeypatch)
    fast = _run(events, fast=True, monkeypatch=monkeypatch)
    assert any(x[0] == "error" for x in fast[0])     # the stream has rejected events too
    assert fast == reference


@pytest.mark.parametrize("seed", range(4))
def test_alerts_of_a_rank_of_its_own_and_across_ranks_are_the_same_on_the_fast_path(seed, monkeypatch):
    events = _rank_faults(seed)
    reference = _run(events, fast=False, monkeypatch=monkeypatch)
    fast = _run(events, fast=True, monkeypatch=monkeypatch)
    raised = [a for alerts, _closed in reference[0] if isinstance(alerts, list) for a in alerts]
    assert any('"rank_outlier"' in a for a in raised)       # the cross-rank rule fired
    assert any('"nan_inf"' in a and '"rank":0' not in a for a in raised)   # a rank's own alert
    assert fast == reference
    assert any(closed is True for _, closed in fast[0])   # closed by the final heartbeat...
    assert fast[2][4] is False                               # ... and reopened


def test_most_rank_steps_take_the_fast_path(monkeypatch):
    general = []
    real = run_mod.RunState._rank_step

    def spy(self, event, ts):
        general.append((event.rank, event.step))
        return real(self, event, ts)

    monkeypatch.setattr(run_mod.RunState, "_rank_step", spy)
    events = list(simulate(SimConfig(run_id="fast-healthy", fault="healthy", world_size=8,
                                     samples_every=10, checkpoint_every=25), 60))
    for e in events:
        e["ts"] = NOW - 100 + e["step"]
    proc = Processor(rlhf_pack())
    st = proc.new_state("fast-healthy")
    for e in events:
        proc.process(st, parse_event(dump_event(e), NOW), NOW)
    rank_steps = sum(1 for e in events if e["kind"] == "step" and e.get("rank"))
    assert rank_steps == 7 * 60
    # only the first step of each rank (its rules compiled then) takes the general path
    assert sorted(general) == [(r, 0) for r in range(1, 8)]


def test_a_cross_rank_rule_that_also_reads_the_step_sees_the_same_metrics(monkeypatch):
    """A user's cross-rank rule may also read the step at hand (here: a non-finite value among
    the metrics of the event that completed the step); it sees the same on both paths."""
    from rules.loader import load_pack_text

    pack = load_pack_text("""
rules:
  - id: outlier_while_broken
    tiers:
      - severity: orange
        when:
          all:
            - {ranks: grad_norm/actor, stat: max_over_median, above: 0.5}
            - {nonfinite: any}
        actions: [notify]
""")
    events = []
    for e in simulate(SimConfig(run_id="fast-user", fault="healthy", world_size=4), 40):
        e["ts"] = NOW - 100 + e["step"]
        if e["kind"] == "step" and e.get("rank") == 3 and e["step"] in (12, 13, 14):
            e["metrics"]["loss/policy"] = math.nan       # rank 3 completes these steps
        events.append(e)
    order = {0: 0, 1: 1, 2: 2, 3: 3}
    events.sort(key=lambda e: (e["step"], order.get(e.get("rank") or 0, 0)))
    results = []
    for fast in (False, True):
        monkeypatch.setattr(run_mod.RunState, "rank_fast_path", fast)
        proc = Processor(pack)
        st = proc.new_state("fast-user")
        fired = []
        for e in events:
            fired += [(a.step, a.state) for a in proc.process(st, parse_event(dump_event(e), NOW), NOW)]
        results.append(fired)
    assert results[0] and (12, "firing") in results[0]
    assert results[1] == results[0]
