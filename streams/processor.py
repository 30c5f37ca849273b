"""The core of rlwatch: an event and a run's state in, alerts out. Pure.

The same :class:`Processor` runs in ``rlwatch demo`` (in process), ``rlwatch replay`` (offline)
and ``rlwatch worker`` (inside a Faust agent, with the run states in a Faust table). It
imports no Kafka, Redis, Slack or clock: the time is an argument.

* step events update the run's signals and evaluate the step rules (rank 0, or every rank for
  rules with ``scope: each_rank``); once every rank of a step has reported, the cross-rank rules;
* samples events evaluate the sample rules; checkpoint events are remembered for rollback;
* :meth:`Processor.tick` evaluates the liveness rules (``stalled_seconds``) with the time now.
"""

from __future__ import annotations

import math
from typing import Iterable

from rlwatch.alert import SEVERITIES, Alert
from rlwatch.events import CheckpointEvent, HeartbeatEvent, SamplesEvent, StepEvent
from rules.conditions import leaves
from rules.engine import RuleEngine, RunRules
from rules.schema import Pack, Rule
from streams import stats as S
from streams.run import MAX_LATEST_METRICS, RunState, sample_value

__all__ = ["Pipeline", "Processor", "TARGET_TAG_PREFIX"]

#: Events may carry per-run targets as tags, e.g. {"target.kl": "0.03"} (the SDK's targets=).
TARGET_TAG_PREFIX = "target."


def _inputs(rule: Rule) -> frozenset[str] | None:
    """Names a step rule reads (metrics, dists, groups); None when it reads every metric."""
    names: set[str] = set()
    for tier in rule.tiers:
        for leaf in leaves(tier.when):
            if leaf.nonfinite is not None:
                if leaf.nonfinite == "any":
                    return None
                names.update(leaf.nonfinite)
            for name in (leaf.metric, leaf.dist, leaf.groups):
                if name is not None:
                    names.add(name)
            names.update(leaf.corr or ())
    return frozenset(names)


def _trigger(rule: Rule) -> str:
    srcs = set()
    for tier in rule.tiers:
        for leaf in leaves(tier.when):
            if leaf.ranks is not None or leaf.hashes is not None:
                srcs.add("ranks")
            elif leaf.samples is not None:
                srcs.add("samples")
            elif leaf.stalled_seconds is not None:
                srcs.add("tick")
            else:
                srcs.add("step")
    for t in ("tick", "ranks", "samples"):
        if t in srcs:
            return t
    return "step"


class _View:
    """The :class:`rules.conditions.RunView` of one run at one evaluation."""

    def __init__(self, state: RunState, rank: int, now: float,
                 rank_step: dict[int, dict] | None = None):
        self.s, self.rank, self.now, self.rank_step = state, rank, now, rank_step or {}

    def metric_signal(self, metric, signal, window, cycle_metric, smooth):
        bank = self.s.banks.get(self.rank)
        if bank is None:
            return math.nan, 0, False
        return bank.get((metric, signal, window, cycle_metric, smooth), self.s.metrics)

    def nonfinite(self, names):
        items = self.s.metrics.items() if names is None else (
            (n, self.s.metrics[n]) for n in names if n in self.s.metrics)
        return sorted(n for n, x in items if not math.isfinite(x))

    def rank_stat(self, metric, stat):
        values = {r: e["m"][metric] for r, e in self.rank_step.items()
                  if metric in e["m"] and math.isfinite(e["m"][metric])}
        if len(values) < 2:
            return math.nan, None
        summary = S.rank_summary(values)
        return float(summary[stat]), summary.get("argmax_rank")

    def hash_mismatch(self, name):
        hashes = {r: e["h"][name] for r, e in self.rank_step.items() if name in e["h"]}
        if len(hashes) < 2 or 0 not in hashes:
            return None
        return S.hash_mismatch(hashes, reference_rank=0)

    def dist_stat(self, name, stat, window, cap):
        xs = self.s.dists.get(name)
        if xs is None:
            return math.nan
        value = self.s.step_dist_value(name, stat, cap)
        if stat == "ratio_to_start":
            base = self.s.dist_baselines.get(f"{name}|{stat}|{window}|{cap}")
            if base is None or not base.frozen or not base.mean:
                return math.nan
            return value / base.mean
        return value

    def corr(self, x, y, window):
        if x not in self.s.dists or y not in self.s.dists:
            return math.nan
        ema = self.s.corr_ema.get(f"{x}|{y}|{window}")
        return math.nan if ema is None else ema.get()

    def group_stat(self, metric, stat, window):
        if metric not in self.s.metrics and metric not in self.s.groups_step:
            return math.nan, None
        g = self.s.groups.get(f"{metric}|{window}")
        if g is None:
            return math.nan, None
        slopes, gap_trend = self.s.group_trends(f"{metric}|{window}", g)
        finite = {k: v for k, v in slopes.items() if math.isfinite(v)}
        if stat == "gap":
            return g.gap(), None
        if stat == "gap_slope":
            return gap_trend, _slopes_detail(finite)
        if not finite:
            return math.nan, None
        if stat == "min_slope":
            k = min(finite, key=finite.get)
            return finite[k], _slopes_detail(finite)
        if stat == "max_slope":
            k = max(finite, key=finite.get)
            return finite[k], _slopes_detail(finite)
        if stat == "spread_slope":
            return max(finite.values()) - min(finite.values()), _slopes_detail(finite)
        return math.nan, None

    def sample_stat(self, field, stat):
        return sample_value(self.s.samples, field, stat, self.s.prompts)

    def seconds_since_event(self):
        if not math.isfinite(self.s.last_event_ts):
            return math.nan
        return self.now - self.s.last_event_ts


def _slopes_detail(slopes: dict[str, float]) -> str | None:
    if not slopes:
        return None
    return "slope per step by category: " + ", ".join(f"{k} {v:+.2g}" for k, v in sorted(slopes.items()))


def _resolve_open(state: RunState, step: int, ts: float, reason: str) -> list[Alert]:
    """Resolved notices for every firing alert of a run (escalated ones too)."""
    out = []
    for key, st in state.alerts.items():
        if st.status != "firing":
            continue
        rule, severity, rank = key.split("/")
        severities = [severity]
        if st.escalated:
            severities.append(SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)])
        for sev in severities:
            out.append(Alert(rule=rule, severity=sev, state="resolved", run_id=state.run_id,
                             rank=st.rank if st.rank is not None else (int(rank) if rank else None),
                             step=step, onset_step=st.onset_step, value=st.value,
                             threshold=st.threshold, metric=st.metric,
                             summary=f"{rule} closed: {reason}", ts=ts))
    return out


class Processor:
    """A compiled rule pack, applied to runs. Holds no run state itself."""

    def __init__(self, pack: Pack):
        self.pack = pack
        self.engine = RuleEngine(pack)
        bank_keys, rank_metrics, dist_keys, corr_keys, group_keys = set(), set(), set(), set(), set()
        for c in self.engine.conditions():
            if c.metric is not None:
                bank_keys.add((c.metric, c.signal, c.window, c.cycle_metric, c.smooth))
            elif c.ranks is not None:
                rank_metrics.add(c.ranks)
            elif c.dist is not None:
                cap = c.cap if isinstance(c.cap, (int, float)) or c.cap is None else None
                dist_keys.add((c.dist, c.stat, c.window, cap))
            elif c.corr is not None:
                corr_keys.add((c.corr[0], c.corr[1], c.window))
            elif c.groups is not None:
                group_keys.add((c.groups, c.window))
        self.bank_keys = sorted(bank_keys, key=str)
        # ranks other than 0 only need the signals of rules that watch every rank
        each = set()
        for r in self.engine.rules:
            if r.scope == "each_rank":
                for t in r.tiers:
                    each.update((c.metric, c.signal, c.window, c.cycle_metric, c.smooth)
                                for c in leaves(t.when) if c.metric is not None)
        self.rank_bank_keys = sorted(each, key=str)
        self.rank_metrics = sorted(rank_metrics)
        self.dist_keys = sorted(dist_keys, key=str)
        self.corr_keys = sorted(corr_keys)
        self.group_keys = sorted(group_keys)
        self.triggers = {r.id: _trigger(r) for r in self.engine.rules}
        self.inputs = {r.id: _inputs(r) for r in self.engine.rules}
        self._run_rules: dict[tuple, RunRules] = {}

    # -- state ----------------------------------------------------------------------------------
    def new_state(self, run_id: str) -> RunState:
        return RunState(run_id, self.bank_keys, self.rank_metrics, self.rank_bank_keys)

    def load_state(self, data: dict) -> RunState:
        return RunState.from_state(data, self.bank_keys, self.rank_metrics, self.rank_bank_keys)

    def rules_for(self, state: RunState) -> RunRules:
        key = (state.run_id, tuple(sorted(state.targets.items())))
        rr = self._run_rules.get(key)
        if rr is None:
            if len(self._run_rules) > 10_000:
                self._run_rules.clear()
            rr = self._run_rules[key] = self.engine.for_run(state.run_id, state.targets)
        return rr

    # -- events ---------------------------------------------------------------------------------
    def process(self, state: RunState, event, now: float) -> list[Alert]:
        """Apply one validated event; return the alerts whose state changed."""
        gen = event.tags.get("generation") if event.tags else None
        if gen is not None and gen.isdigit() and int(gen) > state.generation:
            # the run rolled back to a checkpoint: its steps start over, its open alerts close
            closed = _resolve_open(state, event.step, event.ts if event.ts is not None else now,
                                   "the run rolled back to a checkpoint")
            state.new_generation(int(gen))
            return closed + self._process(state, event, now)
        return self._process(state, event, now)

    def _process(self, state: RunState, event, now: float) -> list[Alert]:
        ts = event.ts if event.ts is not None else now
        state.now_ts = ts
        fresh = state.seen(event.rank, event.step, ts, event.kind)
        self._take_tags(state, event.tags)
        if isinstance(event, CheckpointEvent):
            state.add_checkpoint(event.step, event.path)
            return []
        if isinstance(event, HeartbeatEvent):
            return []
        if not fresh:
            return []  # duplicate or out-of-order step: already counted, never re-evaluated
        if isinstance(event, SamplesEvent):
            state.update_samples(event)
            out = self._evaluate(state, "samples", event.rank, event.step, ts, now)
            state.samples = []
            return out
        return self._step(state, event, ts, now)

    def _step(self, state: RunState, event: StepEvent, ts: float, now: float) -> list[Alert]:
        state.metrics, state.dists = event.metrics, event.dists
        state.step_memo = {}
        state.groups_step = event.groups
        if event.rank == 0 or self.rank_bank_keys:
            state.bank(event.rank).update(event.metrics)
        alerts: list[Alert] = []
        if event.rank == 0:
            latest = state.latest_metrics
            if len(latest) + len(event.metrics) <= MAX_LATEST_METRICS:
                latest.update(event.metrics)
            else:   # nearly full: known names stay current, new ones only while there is room
                for k, v in event.metrics.items():
                    if k in latest or len(latest) < MAX_LATEST_METRICS:
                        latest[k] = v
            state.update_step_derivatives(event, self.dist_keys, self.corr_keys, self.group_keys)
        alerts += self._evaluate(state, "step", event.rank, event.step, ts, now)
        for step in state.take_rank_values(event):
            rank_step = state.pop_rank_step(step)
            alerts += self._evaluate(state, "ranks", 0, step, ts, now, rank_step)
        state.metrics, state.dists, state.groups_step = {}, {}, {}
        return alerts

    def tick(self, state: RunState, now: float) -> list[Alert]:
        """Evaluate the liveness rules of a run at wall time ``now``."""
        step = max(state.last_step.values(), default=0)
        return self._evaluate(state, "tick", 0, step, now, now)

    def _evaluate(self, state: RunState, trigger: str, rank: int, step: int, ts: float,
                  now: float, rank_step: dict | None = None) -> list[Alert]:
        rr = self.rules_for(state)
        view = _View(state, rank, now, rank_step)

        present = state.metrics.keys() | state.dists.keys() | state.groups_step.keys()

        def applies(rule: Rule) -> bool:
            if self.triggers[rule.id] != trigger:
                return False
            if trigger != "step":
                return True
            if rank != 0 and rule.scope != "each_rank":
                return False
            needed = self.inputs[rule.id]
            # a rule none of whose inputs were logged would only hold its state: skip it
            return needed is None or not needed.isdisjoint(present)

        shown_rank = None if trigger in ("ranks", "tick") or rank == 0 else rank
        return rr.evaluate(view, state.alerts, step=step, ts=ts, rank=shown_rank,
                           checkpoint_before=state.checkpoint_before, only=applies)

    def _take_tags(self, state: RunState, tags: dict[str, str]) -> None:
        if not tags:
            return
        state.tags.update({k: v for k, v in tags.items() if not k.startswith(TARGET_TAG_PREFIX)})
        for k, v in tags.items():
            if k.startswith(TARGET_TAG_PREFIX):
                try:
                    state.targets[k[len(TARGET_TAG_PREFIX):]] = float(v)
                except ValueError:
                    pass


class Pipeline:
    """A :class:`Processor` with the run states kept in memory (demo and replay)."""

    def __init__(self, pack: Pack):
        self.processor = Processor(pack)
        self.runs: dict[str, RunState] = {}

    def state(self, run_id: str) -> RunState:
        st = self.runs.get(run_id)
        if st is None:
            st = self.runs[run_id] = self.processor.new_state(run_id)
        return st

    def feed(self, event, now: float) -> list[Alert]:
        return self.processor.process(self.state(event.run_id), event, now)

    def tick(self, now: float) -> list[Alert]:
        out: list[Alert] = []
        for st in self.runs.values():
            out += self.processor.tick(st, now)
        return out

    def feed_all(self, events: Iterable, now: float) -> list[Alert]:
        out: list[Alert] = []
        for e in events:
            out += self.feed(e, now)
        return out
