"""``RunState.apply`` looks for a relaunch, a rollback and new tags (``_news``) only on the
events that may bring one; a run ends exactly as when it looks on every event
(``news_on_every_event``, the reference): the same alerts, the same state (everything
``to_state`` keeps, and the counters), the same errors, for streams that mix routine rank
steps with relaunches, rollbacks, changed tags and targets, timestamps from a broken clock,
steps too far ahead, duplicates, non-finite values and unmapped framework names."""

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
    cfg = SimConfig(run_id=f"news-{seed}", fault=rnd.choice(("rank_outlier", "nan_inf", "healthy")),
                    onset=30, seed=seed, world_size=4, samples_every=10, checkpoint_every=25)
    events = list(simulate(cfg, 90))
    base_ts = events[0]["ts"]
    out = []
    retarget: dict[str, str] = {}      # a changed target, sent by every event from then on
    for ev in events:
        ev["ts"] = NOW - 5000 + (ev["ts"] - base_ts)
        if retarget:
            ev["tags"] = {**(ev.get("tags") or {}), **retarget}
        if ev["kind"] == "step" and ev.get("rank"):
            roll = rnd.random()
            if roll < 0.03:
                ev["metrics"][next(iter(ev["metrics"]))] = rnd.choice((math.nan, math.inf))
            elif roll < 0.05:
                ev["ts"] = 12.0                                    # a clock far in the past
            elif roll < 0.06:
                retarget["target.kl"] = str(rnd.choice((0.02, 0.08, 0.3)))
                ev["tags"] = {**(ev.get("tags") or {}), **retarget}
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


def _run(events: list[dict], *, every_event: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(run_mod.RunState, "news_on_every_event", every_event)
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
def test_looking_for_news_only_when_it_may_come_leaves_the_run_as_looking_always(seed, monkeypatch):
    events = _stream(seed)
    always = _run(events, every_event=True, monkeypatch=monkeypatch)
    usual = _run(events, every_event=False, monkeypatch=monkeypatch)
    assert any(isinstance(x, tuple) for x in usual[0])   # the stream has rejected events too
    assert usual[0] == always[0]
    assert usual[1] == always[1]
    assert usual[2] == always[2]


def test_routine_steps_are_not_looked_into(monkeypatch):
    looked = []
    real = run_mod.RunState._news

    def spy(self, event, ts):
        looked.append((event.kind, event.rank, event.step))
        return real(self, event, ts)

    monkeypatch.setattr(run_mod.RunState, "_news", spy)
    proc = Processor(rlhf_pack())
    st = proc.new_state("news-spy")
    n = 0
    for e in simulate(SimConfig(run_id="news-spy", fault="healthy", world_size=4), 30):
        e["ts"] = NOW - 100 + e["step"]
        proc.process(st, parse_event(dump_event(e), NOW), NOW)
        n += 1
    assert len(looked) <= 2          # the first event's tags, nothing after
    st.incarnation = "before"
    e = {"schema": 1, "kind": "step", "run_id": "news-spy", "rank": 2, "world_size": 4,
         "step": 31, "ts": NOW, "metrics": {"loss/policy": 0.1}, "incarnation": "after"}
    proc.process(st, parse_event(dump_event(e), NOW), NOW)
    assert looked[-1] == ("step", 2, 31)      # a relaunch is looked into
    assert st.incarnation == "after"


def test_a_target_first_reported_by_another_rank_is_taken(monkeypatch):
    """New tags are news whichever rank brings them: the run's thresholds follow at once."""
    events = []
    for e in simulate(SimConfig(run_id="news-target", fault="healthy", world_size=2), 40):
        e["ts"] = NOW - 100 + e["step"]
        if e["step"] >= 20 or (e["step"] == 19 and e.get("rank")):
            e["tags"] = {**(e.get("tags") or {}), "target.kl": "0.3"}
        events.append(e)
    for every_event in (True, False):
        monkeypatch.setattr(run_mod.RunState, "news_on_every_event", every_event)
        proc = Processor(rlhf_pack())
        st = proc.new_state("news-target")
        for e in events:
            proc.process(st, parse_event(dump_event(e), NOW), NOW)
            if e["step"] == 19 and e.get("rank"):
                assert st.targets["kl"] == 0.3
        assert st.rules.targets["kl"] == 0.3
