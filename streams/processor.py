"""The core of rlwatch: an event and a run's state in, alerts out. Pure.

The same :class:`Processor` runs in ``rlwatch demo`` (in process), ``rlwatch replay`` (offline)
and ``rlwatch worker`` (inside a Faust agent, with the run states in a Faust table). It
imports no Kafka, Redis, Slack or clock: the time is an argument.

The processor holds the pack, checked once, and the pack as it applies to each set of run
overrides and targets (cached); everything about a run lives in its
:class:`streams.run.RunState`, which compiles those rules against its own statistics once and
takes each event through them (:meth:`RunState.apply`). Events over the limits raise
:class:`contract.events.EventError` (send them to the dead-letter topic with its reason).
"""

from __future__ import annotations

import gc
from typing import Iterable

from contract.alert import Alert
from contract.events import read_event
from contract.presets import get_preset
from rules.compile import rule_inputs, rule_trigger
from rules.engine import RuleEngine, RunRules
from rules.loader import with_preset
from rules.schema import Pack
from streams import run as _run
from streams.run import MAX_LATEST_METRICS, TARGET_TAG_PREFIX, RunState

__all__ = ["MAX_LATEST_METRICS", "Pipeline", "Processor", "TARGET_TAG_PREFIX", "read_routine",
           "tune_gc"]


def _no_routine(raw):
    return None


#: ``read_routine(raw)``: the commonest event of a fleet, a step of a rank other than 0, read
#: from its bytes by the native core (``streams._native.read_rank_step``, called straight: it
#: is called for every event) when it is plainly valid and has nothing unusual, for
#: :meth:`RunState.rank_step`; None for any other event or object (and always with the pure
#: core): read that one with :func:`contract.events.read_event`.
read_routine = _run.read_rank_step if _run.read_rank_step is not None else _no_routine

MAX_CACHED_RULES = 10_000


def tune_gc() -> None:
    """Garbage-collector settings for a long-running stream processor; call once after start-up
    (the worker, replay). What an event allocates is freed by reference counting (no cycles);
    the cyclic collector's frequent passes over every compiled rule and run state cost more
    than the processing itself, so they are made rare and start-up objects are frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


class Processor:
    """A rule pack, applied to runs. Holds no run state itself."""

    def __init__(self, pack: Pack, *, detect_presets: bool = True):
        self.pack = pack
        #: map runs that log a framework's own names onto the canonical ones (RunState)
        self.detect_presets = detect_presets
        self.engine = RuleEngine(pack)
        self.triggers = {r.id: rule_trigger(r) for r in self.engine.rules}
        self.inputs = {r.id: rule_inputs(r) for r in self.engine.rules}
        self._run_rules: dict[tuple, RunRules] = {}
        self._engines: dict[str | None, RuleEngine] = {None: self.engine}

    def resolve(self, run_id: str, targets: dict[str, float], preset: str | None = None) -> RunRules:
        """The pack as it applies to a run with these reported targets, and the scales of the
        framework its metric names came from (a preset found in its events), cached."""
        engine = self._engines.get(preset)
        if engine is None:
            engine = self._engines[preset] = RuleEngine(with_preset(self.pack, get_preset(preset)))
        # one RunRules for every run with the same overrides, targets and preset: its rules are
        # planned once (rules.compile.plan_rules) and each run only binds them
        key = (engine.overrides_for(run_id), tuple(sorted(targets.items())), preset)
        rr = self._run_rules.get(key)
        if rr is None:
            if len(self._run_rules) > MAX_CACHED_RULES:
                self._run_rules.clear()
            rr = self._run_rules[key] = engine.for_overrides(key[0], targets)
        return rr

    def rules_for(self, state: RunState) -> RunRules:
        if state.rules is not None:
            return state.rules
        return self.resolve(state.run_id, state.targets, state.preset)

    # -- state ----------------------------------------------------------------------------------
    def new_state(self, run_id: str) -> RunState:
        # compiled on first use (RunState.program): a run's first event usually reports its
        # targets, which would otherwise compile it twice
        return RunState(run_id, self.resolve, detect_preset=self.detect_presets)

    def load_state(self, data: dict) -> RunState:
        return RunState.from_state(data, self.resolve, detect_preset=self.detect_presets)

    # -- events ---------------------------------------------------------------------------------
    def process(self, state: RunState, event, now: float) -> list[Alert]:
        """Apply one validated event; return the alerts whose state changed."""
        return state.apply(event, now)

    def tick(self, state: RunState, now: float) -> list[Alert]:
        """Evaluate the liveness rules of a run at wall time ``now``."""
        return state.tick(now)


class Pipeline:
    """A :class:`Processor` with the run states kept in memory (demo and replay)."""

    def __init__(self, pack: Pack, *, detect_presets: bool = True):
        self.processor = Processor(pack, detect_presets=detect_presets)
        self.runs: dict[str, RunState] = {}
        self.routine = 0      # events feed_raw took as routine steps (RunState.rank_step)

    def state(self, run_id: str) -> RunState:
        st = self.runs.get(run_id)
        if st is None:
            st = self.runs[run_id] = self.processor.new_state(run_id)
        return st

    def feed(self, event, now: float) -> list[Alert]:
        return self.state(event.run_id).apply(event, now)

    def feed_raw(self, raw: bytes | str, now: float) -> list[Alert]:
        """One event from its JSON, as the worker takes it: a routine step of a rank other
        than 0 through :meth:`RunState.rank_step`; any other event read by
        :func:`contract.events.read_event` (which raises EventError for a bad one, ``now``
        filling a missing ``ts``) and applied. ``routine`` counts the first kind."""
        ev = read_routine(raw)
        if ev is not None:
            got = self.state(ev.run_id).rank_step(ev, now)
            if got is not None:
                self.routine += 1
                return got
        ev = read_event(raw, now)
        return self.state(ev.run_id).apply(ev, now)

    def tick(self, now: float) -> list[Alert]:
        out: list[Alert] = []
        for st in self.runs.values():
            out += st.tick(now)
        return out

    def feed_all(self, events: Iterable, now: float) -> list[Alert]:
        out: list[Alert] = []
        for e in events:
            out += self.feed(e, now)
        return out
