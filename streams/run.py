"""Everything rlwatch remembers about one run, and the view the rules read. Pure.

:class:`RunState` is small, bounded and serialisable (it lives in a Faust table between events
and survives a worker restart): the signal banks of the ranks that rules watch, the alert
states, the checkpoints the run reported, the last steps and times seen per rank, a short
buffer of per-rank values for cross-rank checks, and a few per-prompt tallies.

What belongs to the event being processed (its metrics, dists, samples) is set on the state
for the duration of one evaluation and never serialised.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from rlwatch.events import SamplesEvent, StepEvent
from streams import stats as S
from streams.signals import SignalBank, SignalKey
from streams.text import repetition_score

__all__ = ["RunState"]

MAX_CHECKPOINTS = 64
MAX_PROMPTS = 2000
MAX_PENDING_STEPS = 8
MAX_LATEST_METRICS = 512   # metric names remembered per run (a run logging ever new names)
GROUP_TREND_EVERY = 10


def _finite(xs: list[float]) -> list[float]:
    return [x for x in xs if math.isfinite(x)]


class RunState:
    def __init__(self, run_id: str, bank_keys: list[SignalKey], rank_metrics: list[str],
                 rank_bank_keys: list[SignalKey] | None = None):
        self.run_id = run_id
        self.bank_keys = bank_keys
        self.rank_bank_keys = rank_bank_keys or []
        self.rank_metrics = rank_metrics
        self.banks: dict[int, SignalBank] = {}
        self.alerts: dict[str, Any] = {}          # key -> rules.state.AlertState
        self.checkpoints: list[tuple[int, str]] = []
        self.last_step: dict[int, int] = {}
        self.last_other: dict[str, dict[int, int]] = {}   # samples: rank -> last step
        self.generation = 0        # bumped by the SDK after each rollback
        self.last_seen: dict[int, float] = {}
        self.last_event_ts: float = math.nan
        self.world_size: int = 1
        self.targets: dict[str, float] = {}
        self.tags: dict[str, str] = {}
        self.events = 0
        self.duplicates = 0
        # per step: rank -> {"m": {metric: value}, "h": {name: hash}}
        self.pending: dict[int, dict[int, dict]] = {}
        self.dist_baselines: dict[str, S.WarmupBaseline] = {}
        self.corr_ema: dict[str, S.EMA] = {}
        self.groups: dict[str, S.GroupTrends] = {}
        self.prompts: dict[str, list[float]] = {}   # prompt_id -> [count, sum z, sum |z|]
        # the evaluation at hand (not serialised)
        self.now_ts: float = math.nan
        self.metrics: dict[str, float] = {}
        self.dists: dict[str, list[float]] = {}
        self.groups_step: dict[str, dict[str, float]] = {}
        self.step_memo: dict = {}      # per-step values several rules share
        self.hashes_step: int | None = None
        self.samples: list = []
        self.latest_metrics: dict[str, float] = {}
        self._group_cache: dict[str, tuple] = {}

    # -- bookkeeping -------------------------------------------------------------------------
    def bank(self, rank: int) -> SignalBank:
        b = self.banks.get(rank)
        if b is None:
            b = self.banks[rank] = SignalBank(self.bank_keys if rank == 0 else self.rank_bank_keys)
        return b

    def seen(self, rank: int, step: int, ts: float, kind: str = "step") -> bool:
        """Record an event of ``rank`` at ``step``; False if that kind of event of that step
        was already seen (a duplicate, or a step arriving after a later one)."""
        self.events += 1
        self.last_seen[rank] = ts
        self.last_event_ts = ts if not math.isfinite(self.last_event_ts) else max(self.last_event_ts, ts)
        book = self.last_step if kind == "step" else self.last_other.setdefault(kind, {})
        last = book.get(rank)
        if last is not None and step <= last:
            self.duplicates += 1
            return False
        book[rank] = step
        return True

    def new_generation(self, generation: int) -> None:
        """The run rolled back to a checkpoint: forget the steps seen and the open alerts
        (their conditions are evaluated afresh on the re-trained steps)."""
        self.generation = generation
        self.last_step.clear()
        self.last_other.clear()
        self.pending.clear()
        self.alerts.clear()

    def add_checkpoint(self, step: int, path: str) -> None:
        self.checkpoints.append((step, path))
        self.checkpoints.sort()
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def checkpoint_before(self, step: int) -> dict | None:
        """The newest checkpoint saved strictly before ``step`` (the last healthy one)."""
        best = None
        for s, p in self.checkpoints:
            if s < step:
                best = (s, p)
        return None if best is None else {"step": best[0], "checkpoint": best[1]}

    def take_rank_values(self, event: StepEvent) -> list[int]:
        """Buffer what cross-rank checks need; return the steps now complete (all ranks in)."""
        if event.world_size:
            self.world_size = max(self.world_size, event.world_size)
        if self.world_size <= 1:
            return []
        entry = {"m": {m: event.metrics[m] for m in self.rank_metrics if m in event.metrics},
                 "h": dict(event.hashes)}
        self.pending.setdefault(event.step, {})[event.rank] = entry
        done = [s for s, ranks in self.pending.items() if len(ranks) >= self.world_size]
        # steps that will never complete (a rank missed them): give up on the oldest
        while len(self.pending) > MAX_PENDING_STEPS:
            oldest = min(self.pending)
            if oldest not in done:
                done.append(oldest)
            break
        return sorted(done)

    def pop_rank_step(self, step: int) -> dict[int, dict]:
        return self.pending.pop(step, {})

    # -- state ----------------------------------------------------------------------------------
    def to_state(self) -> dict:
        return {
            "run_id": self.run_id,
            "banks": {str(r): b.to_state() for r, b in self.banks.items()},
            "alerts": {k: v.to_state() for k, v in self.alerts.items()},
            "checkpoints": self.checkpoints,
            "last_step": {str(k): v for k, v in self.last_step.items()},
            "last_other": {kind: {str(r): s for r, s in d.items()} for kind, d in self.last_other.items()},
            "last_seen": {str(k): v for k, v in self.last_seen.items()},
            "last_event_ts": None if math.isnan(self.last_event_ts) else self.last_event_ts,
            "world_size": self.world_size,
            "generation": self.generation,
            "targets": self.targets,
            "tags": self.tags,
            "events": self.events,
            "duplicates": self.duplicates,
            "pending": {str(s): {str(r): e for r, e in ranks.items()} for s, ranks in self.pending.items()},
            "dist_baselines": {k: v.to_state() for k, v in self.dist_baselines.items()},
            "corr_ema": {k: v.to_state() for k, v in self.corr_ema.items()},
            "groups": {k: v.to_state() for k, v in self.groups.items()},
            "prompts": self.prompts,
            "latest_metrics": {k: v for k, v in self.latest_metrics.items() if math.isfinite(v)},
        }

    @classmethod
    def from_state(cls, state: dict, bank_keys: list[SignalKey], rank_metrics: list[str],
                   rank_bank_keys: list[SignalKey] | None = None) -> "RunState":
        from rules.state import AlertState

        rs = cls(state["run_id"], bank_keys, rank_metrics, rank_bank_keys)
        for r, b in state.get("banks", {}).items():
            rs.bank(int(r)).load(b)
        rs.alerts = {k: AlertState.from_state(v) for k, v in state.get("alerts", {}).items()}
        rs.checkpoints = [tuple(c) for c in state.get("checkpoints", [])]
        rs.last_step = {int(k): v for k, v in state.get("last_step", {}).items()}
        rs.last_other = {kind: {int(r): s for r, s in d.items()}
                         for kind, d in state.get("last_other", {}).items()}
        rs.last_seen = {int(k): v for k, v in state.get("last_seen", {}).items()}
        ts = state.get("last_event_ts")
        rs.last_event_ts = math.nan if ts is None else ts
        rs.world_size = state.get("world_size", 1)
        rs.generation = state.get("generation", 0)
        rs.targets = state.get("targets", {})
        rs.tags = state.get("tags", {})
        rs.events = state.get("events", 0)
        rs.duplicates = state.get("duplicates", 0)
        rs.pending = {int(s): {int(r): e for r, e in ranks.items()}
                      for s, ranks in state.get("pending", {}).items()}
        rs.dist_baselines = {k: S.stat_from_state(v) for k, v in state.get("dist_baselines", {}).items()}
        rs.corr_ema = {k: S.stat_from_state(v) for k, v in state.get("corr_ema", {}).items()}
        rs.groups = {k: S.GroupTrends.from_state(v) for k, v in state.get("groups", {}).items()}
        rs.prompts = state.get("prompts", {})
        rs.latest_metrics = state.get("latest_metrics", {})
        return rs

    # -- per-event derived values ---------------------------------------------------------------
    def step_dist_value(self, name: str, stat: str, cap: float | None) -> float:
        """A statistic of this step's per-sample array, computed once per step."""
        key = (name, stat, cap)
        value = self.step_memo.get(key)
        if value is None:
            xs = self.dists.get(name)
            value = self.step_memo[key] = math.nan if xs is None else dist_value(xs, stat, cap)
        return value

    def update_step_derivatives(self, event: StepEvent, dist_keys: list[tuple],
                                corr_keys: list[tuple], group_keys: list[tuple]) -> None:
        """Update the per-run statistics that come from a step's dists and groups."""
        for name, stat, window, cap in dist_keys:
            if name not in event.dists:
                continue
            value = self.step_dist_value(name, stat, cap)
            key = f"{name}|{stat}|{window}|{cap}"
            base = self.dist_baselines.get(key)
            if base is None:
                base = self.dist_baselines[key] = S.WarmupBaseline(window)
            base.update(value)
        for x, y, window in corr_keys:
            if x in event.dists and y in event.dists:
                r = S.spearman(event.dists[x], event.dists[y])
                key = f"{x}|{y}|{window}"
                ema = self.corr_ema.get(key)
                if ema is None:
                    ema = self.corr_ema[key] = S.EMA(span=window)
                ema.update(r)
        for metric, window in group_keys:
            if metric in event.groups:
                g = self.groups.get(f"{metric}|{window}")
                if g is None:
                    g = self.groups[f"{metric}|{window}"] = S.GroupTrends(window)
                g.update(event.groups[metric])

    def group_trends(self, key: str, g) -> tuple[dict[str, float], float]:
        """Per-category slopes and the gap's slope, recomputed every GROUP_TREND_EVERY steps
        (Theil-Sen over a window is quadratic; category trends move slowly)."""
        step = self.last_step.get(0, 0)
        cached = self._group_cache.get(key)
        if cached is None or step - cached[0] >= GROUP_TREND_EVERY or step < cached[0]:
            cached = self._group_cache[key] = (step, g.slopes(), g.gap_trend())
        return cached[1], cached[2]

    def update_samples(self, event: SamplesEvent) -> None:
        """Tally per-prompt reward extremes (z against the batch) for prompt_extreme_reward."""
        self.samples = event.samples
        rewards = [s.reward for s in event.samples if s.reward is not None and math.isfinite(s.reward)]
        if len(rewards) < 3:
            return
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) or 1e-12
        for s in event.samples:
            if s.prompt_id is None or s.reward is None or not math.isfinite(s.reward):
                continue
            z = (s.reward - mean) / std
            tally = self.prompts.get(s.prompt_id)
            if tally is None:
                if len(self.prompts) >= MAX_PROMPTS:
                    self.prompts.pop(next(iter(self.prompts)))
                tally = self.prompts[s.prompt_id] = [0, 0.0, 0.0]
            tally[0] += 1
            tally[1] += z
            tally[2] += abs(z)


def dist_value(xs: list[float], stat: str, cap: float | None) -> float:
    """One number about one step's per-sample array."""
    f = _finite(xs)
    if not f:
        return math.nan
    if stat == "bimodality":
        return S.bimodality_coefficient(f)
    if stat == "skewness":
        return S.skewness(f)
    if stat == "mean":
        return sum(f) / len(f)
    if stat == "std":
        if len(f) < 2:
            return math.nan
        m = sum(f) / len(f)
        return math.sqrt(sum((x - m) ** 2 for x in f) / (len(f) - 1))
    if stat == "median":
        return S.quantiles(f, [0.5])[0]
    if stat == "p99":
        return S.quantiles(f, [0.99])[0]
    if stat == "max":
        return max(f)
    if stat == "tail_mass":
        return math.nan if cap is None else S.tail_mass(f, cap)
    if stat == "frac_at_cap":
        return math.nan if cap is None else S.frac_at_cap(f, cap)
    if stat == "ratio_to_start":
        return sum(f) / len(f)
    raise ValueError(f"unknown dist stat {stat!r}")


def sample_value(samples: list, field: str, stat: str, prompts: dict) -> tuple[float, str | None]:
    """One number about the latest samples (and the per-prompt tallies)."""
    if stat == "prompt_extreme":
        best, best_id = math.nan, None
        for pid, (n, zsum, _) in prompts.items():
            if n >= 3:
                mz = zsum / n
                if math.isnan(best) or abs(mz) > abs(best):
                    best, best_id = mz, pid
        if best_id is None:
            return math.nan, None
        return abs(best), f"prompt {best_id!r} mean reward z {best:+.2f} over {int(prompts[best_id][0])} samples"
    if not samples:
        return math.nan, None
    if stat == "top_share":
        values = [getattr(s, field, None) for s in samples]
        values = [v for v in values if v]
        if len(values) < 3:
            return math.nan, None
        token, count = Counter(values).most_common(1)[0]
        return count / len(samples), f"token {token!r} is the KL peak in {count} of {len(samples)} samples"
    if stat == "repetition":
        texts = [getattr(s, field, None) or "" for s in samples]
        texts = [t for t in texts if t]
        if not texts:
            return math.nan, None
        scores = [repetition_score(t) for t in texts]
        worst = max(range(len(scores)), key=scores.__getitem__)
        return sum(scores) / len(scores), f"worst sample: {texts[worst][:80]!r}"
    raise ValueError(f"unknown samples stat {stat!r}")
