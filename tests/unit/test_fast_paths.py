"""The core's fast paths change nothing a user sees: a fixed simulated fleet gives the same
alerts (rule, severity, state, step, rank) through them as through the straightforward path
(every rule of every rank evaluated on every step)."""

from __future__ import annotations

import json
import math

import pytest

import streams.run as run_mod
from contract.events import dump_event, parse_event, read_event
from producers.sim import SimConfig, simulate
from streams.processor import Pipeline
from streams.snapshot import SnapshotRecorder, build_snapshot
from tests.unit._core import rlhf_pack

FAULTS = ("nan_inf", "rank_outlier", "param_hash_mismatch", "grad_norm_anomaly", "healthy",
          "gpu_memory_spike")     # (a spike that resolves)


def _fleet() -> list[bytes]:
    events = []
    for i, fault in enumerate(FAULTS):
        cfg = SimConfig(run_id=f"fast-{i}", fault=fault, onset=60, seed=7 + i, world_size=4,
                        samples_every=10, checkpoint_every=40)
        for ev in simulate(cfg, 140):
            if ev["kind"] == "step" and ev.get("rank") and ev["step"] in (70, 71, 72, 95):
                # non-finite values on ranks other than 0, which then recover
                name = next(iter(ev["metrics"]))
                ev["metrics"][name] = math.nan if ev["step"] < 90 else math.inf
            ev["ts"] += 0.01 * i
            events.append(ev)
    events.sort(key=lambda e: e["ts"])
    return [dump_event(e) for e in events]


def _replay(lines: list[bytes], read=parse_event, snapshots: bool = False) -> list[tuple]:
    pipe = Pipeline(rlhf_pack())
    recorder = SnapshotRecorder()
    out = []
    for raw in lines:
        ev = read(raw, 0.0)
        recorder.observe(ev, raw if snapshots == "raw" else None)
        for a in pipe.feed(ev, ev.ts):
            out.append((a.run_id, a.rule, a.severity, a.state, a.step, a.rank))
            if snapshots:
                out.append(json.dumps(build_snapshot(a, recorder, pipe.runs[a.run_id]),
                                      sort_keys=True, default=repr))
    return out


@pytest.mark.parametrize("raw", [False, True])
def test_events_read_as_the_worker_reads_them_give_the_same_alerts_and_snapshots(raw):
    """The worker takes a plain step as read_event gives it (a WireStep, no pydantic model):
    the core and the snapshot recorder must see it as they see parse_event's StepEvent."""
    lines = _fleet()
    mode = "raw" if raw else True
    models = _replay(lines, parse_event, mode)
    assert sum(isinstance(x, str) for x in models) >= 10
    assert any('"ranks"' in x and '"window"' in x for x in models if isinstance(x, str))
    assert _replay(lines, read_event, mode) == models


def test_the_fast_paths_fire_the_same_alerts_as_evaluating_everything(monkeypatch):
    lines = _fleet()
    fast = _replay(lines)

    program = run_mod.RunState.program

    def every_rule_every_step(self, rank):
        p = program(self, rank)
        p.finite_gate = False        # no step is skipped
        p.routine = p.routine and not p.every_step     # (what RunState.program works out from it)
        return p

    monkeypatch.setattr(run_mod, "quiet_when_finite", lambda p: False)
    monkeypatch.setattr(run_mod.RunState, "program", every_rule_every_step)
    slow = _replay(lines)
    assert any(a[5] not in (None, 0) for a in slow), "the fleet must raise alerts on other ranks"
    assert any(a[3] == "resolved" for a in slow)
    assert fast == slow


@pytest.mark.parametrize("tiers, expected", [
    ([{"nonfinite": "any"}], True),
    ([{"all": [{"nonfinite": "any"}, {"not": {"nonfinite": ["a"]}}]}], True),
    ([{"not": {"nonfinite": ["a"]}}], False),           # holds when everything is finite
    ([{"any": [{"nonfinite": "any"}, {"metric": "a", "above": 1}]}], False),
])
def test_a_rank_step_is_skipped_only_when_no_rule_can_hold_on_finite_values(tiers, expected):
    from rules.compile import compile_rules
    from rules.schema import Condition, Rule

    rule = Rule.model_validate({"id": "r", "scope": "each_rank", "summary": "s",
                                "tiers": [{"severity": "yellow", "when": t} for t in tiers]})
    assert isinstance(rule.tiers[0].when, Condition)
    state = Pipeline(rlhf_pack()).state("q")
    state.program(0)     # a run's rules are compiled on first use: its bank is made then
    program = compile_rules([rule], {}, {}, run_mod._Source(state, 0))
    assert run_mod.quiet_when_finite(program) is expected


def test_what_a_rule_reads_is_worked_out_once_per_rule_object(monkeypatch):
    """Every run compiles the same rules: their facts (inputs, trigger, ...) are remembered per
    rule object, a copy of a rule (a preset's renamed pack) gets its own, and the memory is
    bounded."""
    import rules.compile as compile_mod
    from rules.schema import Rule

    calls = []

    @compile_mod.per_rule
    def reads(rule):
        calls.append(rule.id)
        return compile_mod.rule_inputs(rule)

    rule = Rule.model_validate({"id": "r", "tiers": [{"severity": "yellow",
                                                      "when": {"metric": "kl/mean", "above": 1}}]})
    renamed = rule.model_copy(update={"id": "r2"})
    assert [reads(rule), reads(rule), reads(renamed)] == [frozenset({"kl/mean"})] * 3
    assert calls == ["r", "r2"]
    monkeypatch.setattr(compile_mod, "MAX_RULES_KEPT", 2)
    third = rule.model_copy(update={"id": "r3"})
    reads(third)                        # the memory was full: emptied, then this one kept
    reads(rule)
    assert calls == ["r", "r2", "r3", "r"]
