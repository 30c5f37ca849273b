"""The short way through ``RunState.apply`` for a plain step of a rank other than 0
(``_plain_rank_step``) leaves a run exactly as the long way does: the same alerts, the same
state (everything ``to_state`` keeps, and the counters), the same errors, for streams that
mix plain rank steps with everything that must take the long way: relaunches, rollbacks,
changed tags and targets, timestamps from a broken clock, steps too far ahead, duplicates,
non-finite values, unmapped framework names."""

from __future__ import annotations

import math
import random

import pytest

import streams.run as run_mod
from contract.events import EventError, dump_event, parse_event
from producers.sim import SimConfig, simulate
from streams.processor import Processor
from tests.unit._core import rlhf_pack

NOW = 1_800_000_000.0


def _stream(seed: int) -> list[dict]:
    """A 4-rank run's events, shuffled a little and salted with the unusual."""
    rnd = random.Random(seed)
    cfg = SimConfig(run_id=f"plain-{seed}", fault=rnd.choice(("rank_outlier", "nan_inf", "healthy")),
                    onset=30, seed=seed, world_size=4, samples_every=10, checkpoint_every=25)
    events = list(simulate(cfg, 90))
    base_ts = events[0]["ts"]
    out = []
    for ev in events:
        ev["ts"] = NOW - 5000 + (ev["ts"] - base_ts)
        if ev["kind"] == "step" and ev.get("rank"):
            roll = rnd.random()
            if roll < 0.03:
                ev["metrics"][next(iter(ev["metrics"]))] = rnd.choice((math.nan, math.inf))
            elif roll < 0.05:
                ev["ts"] = 12.0                                    # a clock far in the past
            elif roll < 0.06:
                ev.setdefault("tags", {})["target.kl"] = str(rnd.choice((0.02, 0.08)))
            elif roll < 0.07:
                ev.setdefault("tags", {})["generation"] = str(rnd.randint(0, 3))
            elif roll < 0.08:
                ev["incarnation"] = rnd.choice(("inc-a", "inc-b"))
            elif roll < 0.09:
                ev["step"] += 2_000_000                            # too far ahead: rejected
            elif roll < 0.11:
                out.append(dict(ev))                               # a duplicate
            elif roll < 0.12:
                ev["metrics"] = {"train/grad_norm": 1.0, "train/loss": 0.5}   # framework names
        out.append(ev)
    # a little out of order
    for i in range(0, len(out) - 1, 17):
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def _run(events: list[dict], *, plain: bool, monkeypatch) -> tuple:
    if not plain:
        monkeypatch.setattr(run_mod.RunState, "_plain_rank_step", lambda self, event, now: None)
    else:
        monkeypatch.undo()
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
        trace.append([a.to_json() for a in alerts])
    counters = (st.events, st.duplicates, st.ts_replaced, st.newest, st.closed, st.now,
                st.last_event_ts, dict(st.last_seen), st.world_size, dict(st.targets), st.generation)
    return trace, st.to_state(), counters


@pytest.mark.parametrize("seed", range(6))
def test_plain_rank_steps_leave_the_run_as_the_long_way_does(seed, monkeypatch):
    events = _stream(seed)
    long_way = _run(events, plain=False, monkeypatch=monkeypatch)
    short_way = _run(events, plain=True, monkeypatch=monkeypatch)
    assert short_way[0] == long_way[0]
    assert short_way[1] == long_way[1]
    assert short_way[2] == long_way[2]


def test_the_short_way_is_taken_for_plain_rank_steps_and_only_for_them(monkeypatch):
    taken = []
    real = run_mod.RunState._plain_rank_step

    def spy(self, event, now):
        out = real(self, event, now)
        taken.append((event.rank, out is not None))
        return out

    monkeypatch.setattr(run_mod.RunState, "_plain_rank_step", spy)
    proc = Processor(rlhf_pack())
    st = proc.new_state("plain-spy")
    for e in simulate(SimConfig(run_id="plain-spy", fault="healthy", world_size=4), 30):
        e["ts"] = NOW - 100 + e["step"]
        proc.process(st, parse_event(dump_event(e), NOW), NOW)
    assert taken and all(rank != 0 for rank, _ in taken)
    assert sum(ok for _, ok in taken) > 0.8 * len(taken)   # most rank steps: the short way
    st.incarnation = "before"
    e = {"schema": 1, "kind": "step", "run_id": "plain-spy", "rank": 2, "world_size": 4,
         "step": 31, "ts": NOW, "metrics": {"loss/policy": 0.1}, "incarnation": "after"}
    proc.process(st, parse_event(dump_event(e), NOW), NOW)
    assert taken[-1] == (2, False)      # a relaunch goes the long way

