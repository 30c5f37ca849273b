"""Compile a pack, as it applies to one run, into plain closures. Pure.

:func:`compile_rules` takes the rules with their thresholds resolved (targets, parameters,
overrides: :class:`rules.engine.RunRules`) and a :class:`Source` -- the statistics of one rank
of one run, implemented by ``streams`` -- and returns a :class:`Program`: every tier's
condition as a closure ``test() -> True | False | None`` that reads statistics the source
created once and shares between rules (same metric, signal, window), and an index from input
names to the rules that read them, so that an event touches only the rules whose inputs
arrived. Nothing is formatted or allocated per step: the numbers an alert shows come from
``explain()``, called only when an alert changes state.

It is done in two halves: :func:`plan_rules` works out everything that does not depend on a
run's statistics (thresholds, which reader each leaf asks for, the order of each ``all``), once
per :class:`rules.engine.RunRules`, which runs with the same overrides and targets share; and
:func:`bind_rules` binds those plans to one rank's statistics, once per run and rank.

``None`` means undecided (the metric was not logged at this step, its window has too few
points, a target is not set): it neither advances nor resets an alert.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from rules.schema import MIN_POINTS, READY_POINTS, Condition, Rule, Threshold, Tier, leaves

__all__ = ["CompiledRule", "CompiledTier", "Explained", "Program", "RuleList", "Source",
           "bind_rules", "compile_rules", "every_rule", "flat_tiers", "kl_lines", "nonfinite_only", "per_rule",
           "plan_rules", "resolve_threshold", "rule_inputs", "rule_trigger"]

Test = Callable[[], "bool | None"]
#: (holds, value, threshold, metric, detail, rank)
Explained = tuple
Explain = Callable[[], Explained]


class Source(Protocol):
    """The statistics of one rank of one run, as compiled conditions read them. Each method
    is called once per leaf at compile time and returns a reader called per evaluation."""

    def metric(self, metric: str, signal: str, window: int, smooth: int | None,
               cycle_metric: str | None, min_steps: int, min_points: int,
               ready_points: int, after_warmup_of: str | None,
               after_warmup_steps: int | None) -> Callable[[], float]:
        """Reads the signal now: NaN when undecided (not logged at this step, fewer than
        ``ready_points`` points, a warm-up of ``min_steps`` not over, counted from the metric's
        first step, or one of ``after_warmup_steps`` (``min_steps`` when None) counted from
        the last new high of ``after_warmup_of``); the raw value when it is not finite. The
        window holds at least ``min_points`` points."""

    def nonfinite(self, names: list[str] | None) -> Callable[[], list[str]]: ...
    def rank_stat(self, metric: str, stat: str) -> Callable[[], tuple[float, int | None]]: ...
    def hash_mismatch(self, name: str) -> Callable[[], list[int] | None]: ...
    def dist_stat(self, name: str, stat: str, window: int, cap: float | None) -> Callable[[], float]: ...
    def corr(self, x: str, y: str, window: int) -> Callable[[], float]: ...
    def group_stat(self, metric: str, stat: str, window: int) -> Callable[[], tuple[float, str | None]]: ...
    def sample_stat(self, field: str, stat: str) -> Callable[[], tuple[float, str | None]]: ...
    def seconds_since_event(self) -> Callable[[], float]: ...
    def holds(self) -> tuple[dict[str, int], Callable[[], int]]:
        """For branches held over steps (``for`` on an all/any branch): the dict, kept with
        the run's state, of each held branch's onset step by its key, and the reader of the
        step being evaluated."""

    # Optional: a source whose readers are native may also offer ``join(op, tests)``, the
    # native ``all``/``any``/``not`` ("all", "any", "not") of compiled tests, or None; its
    # readers a ``compare(kind, threshold)`` giving the native test of the reader against a
    # threshold; ``compare_call(read, kind, threshold, first)``, the native test of any
    # reader (of ``read()[0]`` when ``first``), or None; and ``nonfinite_test(names)``, the
    # test of a non-finite check (``bool(nonfinite(names)())``) in one call. All give exactly
    # the verdicts of the closures in this module.


def resolve_threshold(spec, targets: dict[str, float], params: dict[str, float]) -> float | None:
    """A threshold as a number; None when it names a target nobody set."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return params.get(spec)
    if isinstance(spec, Threshold):
        base = targets.get(spec.target) if spec.target else params.get(spec.param)
        factor = params.get(spec.factor) if isinstance(spec.factor, str) else spec.factor
        return None if base is None or factor is None else base * factor
    return float(spec)


def kl_lines(rules, targets: dict[str, float], params: dict[str, dict[str, float]]) -> dict[str, float]:
    """The yellow, red and black lines of ``kl_above_target`` on ``kl/mean`` (each tier's first
    ``above`` on kl/mean, alone or in an ``all``), resolved as the engine does: what the
    dashboard draws and ``/metrics`` exports. ``params``: rule id -> its parameters (a rule's
    own when absent)."""
    out: dict[str, float] = {}
    for rule in rules:
        if rule.id != "kl_above_target":
            continue
        p = params.get(rule.id, rule.params)
        for tier in rule.tiers:
            if tier.severity not in ("yellow", "red", "black"):
                continue
            conds = tier.when.all if tier.when.all is not None else [tier.when]
            th = next((c.above for c in conds if c.metric == "kl/mean" and c.above is not None), None)
            v = resolve_threshold(th, targets, p)
            if v is not None and math.isfinite(v):
                out[tier.severity] = float(v)
    return out


@dataclass
class CompiledTier:
    tier: Tier
    key: str                 # "rule/severity/" (the alert state key; a rank may follow)
    test: Test
    explain: Explain
    #: the test of the tier's ``keep_firing_while``: a firing alert does not resolve while
    #: it holds (None: the tier has none)
    keep: Test | None = None
    #: the tier's adjusts, each with the explain of its ``when`` (None: always sent)
    adjusts: tuple = ()

    def adjust_now(self) -> dict[str, float]:
        """What the tier's adjusts ask of the run as it fires now: those whose ``when`` holds."""
        out: dict[str, float] = {}
        for when, params in self.adjusts:
            if when is None or when()[0]:
                out.update(params)
        return out


@dataclass
class CompiledRule:
    rule: Rule
    index: int               # position in the pack: alerts come out in pack order
    params: dict[str, float]
    tiers: list[CompiledTier]
    notes: list[tuple[Explain, str, str | None]]
    inputs: frozenset[str] | None    # names of metrics, dists, groups it reads; None = every one
    trigger: str                     # step | ranks | samples | tick
    nonfinite_only: bool = False     # every condition only asks whether a metric is not finite


class RuleList(list):
    """Compiled rules in pack order, with their tiers flattened once for
    :func:`rules.engine.evaluate`: ``(test, state key, rule, tier)`` per tier."""

    __slots__ = ("_tiers", "_scan")

    def tiers(self) -> list[tuple]:
        try:
            return self._tiers
        except AttributeError:
            self._tiers = flat_tiers(self)
            return self._tiers

    def scan(self, scanner: Callable, rank: int | None = None):
        """``scanner(tests, keys)``, made once per scanner: a native reader of every tier's
        test at a step (see :func:`rules.engine.evaluate`). ``rank``: a rank's own rules,
        whose alert states are keyed with the rank after the tier's key."""
        suffix = state_suffix(rank)
        made = getattr(self, "_scan", None)
        if made is None or made[0] is not scanner or made[1] != suffix:
            tiers = self.tiers()
            made = self._scan = (scanner, suffix,
                                 scanner([t[0] for t in tiers], [t[1] + suffix for t in tiers]))
        return made[2]


def state_suffix(rank: int | None) -> str:
    """What a tier's alert-state key ends with: the rank, for a rank's own rules."""
    return "" if rank is None else str(rank)


def flat_tiers(rules) -> list[tuple]:
    return [(ct.test, ct.key, cr, ct) for cr in rules for ct in cr.tiers]


@dataclass
class Program:
    """A run's rules compiled against one rank's statistics."""

    rules: list[CompiledRule]
    targets: dict[str, float]
    by_input: dict[str, list[CompiledRule]] = field(default_factory=dict)
    every_step: RuleList = field(default_factory=RuleList)
    by_trigger: dict[str, RuleList] = field(default_factory=dict)
    #: whether a rule reads a metric's signals (set by the source's owner, which then feeds
    #: them each step)
    reads_signals: bool = True
    #: a rank's routine steps may skip its rules (set by the source's owner with
    #: ``reads_signals``: streams.run.RunState.program)
    routine: bool = False
    _memo: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        #: every rule read on every step only asks "is any metric not finite?" (the rules of
        #: ranks other than 0 in the built-in pack): a step whose metrics are all finite, with
        #: no alert open, has nothing to evaluate
        self.finite_gate = all(cr.trigger != "step" or (cr.inputs is None and cr.nonfinite_only)
                               for cr in self.rules)
        for cr in self.rules:
            if cr.trigger != "step":
                self.by_trigger.setdefault(cr.trigger, RuleList()).append(cr)
            elif cr.inputs is None:
                self.every_step.append(cr)
            else:
                for name in cr.inputs:
                    self.by_input.setdefault(name, []).append(cr)

    def step_rules(self, names) -> list[CompiledRule]:
        """The step rules that read any of ``names``, in pack order (remembered per set of
        names: a run logs the same names step after step)."""
        if not self.by_input:
            return self.every_step
        key = tuple(names)
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) > 64:
                self._memo.clear()
            found = self._memo[key] = self._step_rules(key)
        return found

    def _step_rules(self, names) -> RuleList:
        hit = {cr.index: cr for cr in self.every_step}
        index = self.by_input
        for name in names:
            rules = index.get(name)
            if rules is not None:
                for cr in rules:
                    hit[cr.index] = cr
        return RuleList(hit[i] for i in sorted(hit))


#: rules whose facts :func:`per_rule` keeps, per function (a pack's rules, and those of the
#: presets' renamed packs, are far fewer)
MAX_RULES_KEPT = 10_000


def per_rule(fn: Callable[[Rule], Any]) -> Callable[[Rule], Any]:
    """``fn(rule)`` worked out once per rule object: what a rule's conditions say about when it
    is read does not change (rules are never changed in place), and every run compiles the
    same rules, its rank-0 program all of them (these facts were about a quarter of a run's
    compile time). The rule is kept with its fact, so its id cannot come back for another."""
    memo: dict[int, tuple[Rule, Any]] = {}

    @functools.wraps(fn)
    def cached(rule: Rule) -> Any:
        got = memo.get(id(rule))
        if got is None or got[0] is not rule:
            if len(memo) >= MAX_RULES_KEPT:
                memo.clear()
            got = memo[id(rule)] = (rule, fn(rule))
        return got[1]
    return cached


@per_rule
def rule_inputs(rule: Rule) -> frozenset[str] | None:
    """Names a step rule reads (metrics, dists, groups); None when it reads every metric."""
    names: set[str] = set()
    for cond in _conditions(rule):
        for leaf in leaves(cond):
            if leaf.nonfinite is not None:
                if leaf.nonfinite == "any":
                    return None
                names.update(leaf.nonfinite)
            for name in (leaf.metric, leaf.dist, leaf.groups, leaf.versus):
                if name is not None:
                    names.add(name)
            names.update(leaf.corr or ())
    return frozenset(names)


@per_rule
def rule_trigger(rule: Rule) -> str:
    srcs = set()
    for cond in _conditions(rule):
        for leaf in leaves(cond):
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


@per_rule
def nonfinite_only(rule: Rule) -> bool:
    """Whether every condition of the rule only asks whether a metric is not finite."""
    return all(leaf.nonfinite == "any" for c in _conditions(rule) for leaf in leaves(c))


def _conditions(rule: Rule) -> list[Condition]:
    """Every tier's conditions (``when`` and ``keep_firing_while``)."""
    return [c for t in rule.tiers for c in t.conditions()]


# -- leaves ---------------------------------------------------------------------------------------

_UNKNOWN: Explained = (None, None, None, None, None, None)


def _comparison(cond: Condition, targets, params):
    """(kind, threshold) of a condition's above/below/abs_above."""
    for kind in ("above", "below", "abs_above"):
        spec = getattr(cond, kind)
        if spec is not None:
            return kind, resolve_threshold(spec, targets, params)
    return None, None


def _compare_value(read: Callable[[], float], kind: str, thr: float | None, metric: str,
                   src: Source | None = None) -> tuple[Test, Explain]:
    if thr is None:
        return (lambda: None), (lambda: (None, None, None, metric, None, None))
    native = getattr(read, "compare", None)   # a native reader's own test: the same verdicts
    call = getattr(src, "compare_call", None)
    if native is not None:
        test = native(kind, float(thr))
    elif call is not None and (test := call(read, kind, float(thr), False)) is not None:
        pass
    elif kind == "above":
        def test():
            v = read()
            if v > thr:
                return True
            if v <= thr:
                return False
            return None
    elif kind == "below":
        def test():
            v = read()
            if v < thr:
                return True
            if v >= thr:
                return False
            return None
    else:
        def test():
            v = abs(read())
            if v > thr:
                return True
            if v <= thr:
                return False
            return None

    def explain():
        v = read()
        return test(), (None if v != v else v), thr, metric, None, None
    return test, explain


def _compare_pair(read: Callable[[], tuple], kind: str, thr: float | None, metric: str,
                  detail: Callable[[object], str | None], src: Source | None = None) -> tuple[Test, Explain]:
    """Like _compare_value for readers that return (value, extra)."""
    call = getattr(src, "compare_call", None)
    test = None if thr is None or call is None else call(read, kind, float(thr), True)
    if test is None:
        test, _ = _compare_value(lambda: read()[0], kind, thr, metric)

    def explain():
        v, extra = read()
        return test(), (None if v != v else v), thr, metric, detail(extra), (
            extra if type(extra) is int else None)
    return test, explain


def _plan_leaf(c: Condition, targets, params) -> tuple:
    """What a leaf reads and how it compares, as data: ``(how, *args)``, for :func:`_bind`
    (everything that does not depend on the run's statistics, worked out once)."""
    kind, thr = _comparison(c, targets, params)
    if c.metric is not None:
        # a two-metric signal names its second metric where cycle_rise names its cycle metric
        return ("metric", (c.metric, c.signal, c.window, c.smooth, c.cycle_metric or c.versus,
                           c.min_steps, MIN_POINTS[c.signal], READY_POINTS[c.signal],
                           c.after_warmup_of,
                           # as many steps past the warm-up as from the start: one shared reader
                           None if c.after_warmup_steps == c.min_steps else c.after_warmup_steps),
                kind, thr, c.metric)
    if c.nonfinite is not None:
        return ("nonfinite", None if c.nonfinite == "any" else tuple(c.nonfinite))
    if c.ranks is not None:
        return ("ranks", (c.ranks, c.stat), kind, thr, c.ranks)
    if c.hashes is not None:
        return ("hashes", c.hashes, f"hashes.{c.hashes}")
    if c.dist is not None:
        cap = resolve_threshold(c.cap, targets, params)
        return ("dist", (c.dist, c.stat, c.window, cap), kind, thr, f"dists.{c.dist}")
    if c.corr is not None:
        x, y = c.corr
        return ("corr", (x, y, c.window), kind, thr, f"corr({x},{y})")
    if c.groups is not None:
        return ("groups", (c.groups, c.stat, c.window), kind, thr, f"groups.{c.groups}")
    if c.samples is not None:
        return ("samples", (c.samples, c.stat), kind, thr, f"samples.{c.samples}")
    if c.stalled_seconds is not None:
        return ("stalled", resolve_threshold(c.stalled_seconds, targets, params))
    return ("unknown",)


def _bind_leaf(plan: tuple, src: Source) -> tuple[Test, Explain]:
    """A leaf's test and explain over ``src``, from its :func:`_plan_leaf`."""
    how = plan[0]
    if how == "metric":
        _, args, kind, thr, label = plan
        return _compare_value(src.metric(*args), kind, thr, label)
    if how == "nonfinite":
        names = None if plan[1] is None else list(plan[1])
        bad = src.nonfinite(names)
        quick = getattr(src, "nonfinite_test", None)
        if quick is not None:
            test = quick(names)
        else:
            def test():
                return bool(bad())

        def explain():
            b = bad()
            return (bool(b), math.nan if b else 0.0, None, b[0] if b else None,
                    ", ".join(b) if b else None, None)
        return test, explain
    if how == "ranks":
        _, args, kind, thr, label = plan
        return _compare_pair(src.rank_stat(*args), kind, thr, label,
                             lambda r: None if r is None else f"rank {r}", src)
    if how == "hashes":
        read = src.hash_mismatch(plan[1])
        name = plan[2]

        def test():
            b = read()
            return None if b is None else bool(b)

        def explain():
            b = read()
            if b is None:
                return None, None, None, name, None, None
            return (bool(b), float(len(b)), 0.0, name,
                    ("ranks " + ", ".join(map(str, b)) + " differ from rank 0") if b else None,
                    b[0] if b else None)
        return test, explain
    if how == "dist":
        _, args, kind, thr, label = plan
        return _compare_value(src.dist_stat(*args), kind, thr, label, src)
    if how == "corr":
        _, args, kind, thr, label = plan
        return _compare_value(src.corr(*args), kind, thr, label, src)
    if how == "groups":
        _, args, kind, thr, label = plan
        return _compare_pair(src.group_stat(*args), kind, thr, label, _slopes_detail, src)
    if how == "samples":
        _, args, kind, thr, label = plan
        return _compare_pair(src.sample_stat(*args), kind, thr, label, lambda d: d, src)
    if how == "stalled":
        return _compare_value(src.seconds_since_event(), "above", plan[1], "heartbeat", src)
    return (lambda: None), (lambda: _UNKNOWN)


def _slopes_detail(slopes) -> str | None:
    finite = {k: v for k, v in (slopes or {}).items() if v == v}
    if not finite:
        return None
    return "slope per step by category: " + ", ".join(f"{k} {v:+.2g}" for k, v in sorted(finite.items()))


# -- composites -----------------------------------------------------------------------------------

#: Rough cost of reading a signal (microseconds per step, measured on the fleet benchmark): an
#: ``all`` reads its cheap branches first, so that a false one spares the dear ones.
_SIGNAL_COST = {
    "value": 1, "delta": 1, "ema": 1, "cycle_rise": 1, "median": 6, "min": 6, "max": 6,
    "range": 6, "start": 1, "ratio_to_start": 7, "ratio_to_start_max": 7, "start_z": 8, "trend_z": 10,
    "trend_tau": 10, "ratio_to_median": 12, "follow_z": 13, "shift_z": 16, "level_ratio": 16,
    "shift_rel": 16, "shift_gain": 17, "drawdown_gain": 30, "level_to_max": 16, "range_pos": 19, "gain_t": 20, "ratio_to_max": 21,
    "sign_flip_rate": 50, "diff_ratio": 50, "over_max_z": 60, "shift_dz": 60, "jump_dz": 60, "jump_t": 60,
    "noise_ratio": 80,
}
#: Signals whose numbers depend on when they are read (running float sums re-added from scratch
#: after a gap, a value recomputed every few points): an ``all`` holding one keeps its order,
#: so that skipping a read never changes a number.
_READ_TIMED = frozenset({"mean", "std", "zscore", "slope", "rel_trend", "trend_gain", "flat_range", "autocorr",
                         "robust_z", "rel_drop", "rel_rise", "level_change"})


def _cost(c: Condition) -> tuple[float, bool]:
    """(rough cost, whether its numbers depend on when it is read) of a condition."""
    parts = c.all if c.all is not None else c.any if c.any is not None else (
        [c.not_] if c.not_ is not None else None)
    if parts is not None:
        got = [_cost(x) for x in parts]
        return sum(g[0] for g in got), any(g[1] for g in got)
    if c.metric is not None:
        return _SIGNAL_COST.get(c.signal, 30), c.signal in _READ_TIMED or c.signal not in _SIGNAL_COST
    if c.nonfinite is not None or c.corr is not None:
        return 1, False
    if c.dist is not None:
        return 3, False
    return 30, True      # groups (trends recomputed every few steps), ranks, samples, liveness


def _plan(c: Condition, targets, params) -> tuple:
    """A condition as data for :func:`_bind`: ``("all", parts, order, every)``, ``("any",
    parts, every)``, ``("not", part)``, ``("held", part, steps, key)`` or a leaf's
    :func:`_plan_leaf`. ``order``: the order an ``all`` reads its parts in (cheap ones first,
    unless a number depends on when it is read). ``every``: a held branch is below, so every
    part is read at every evaluation (its count must see every point). ``key``: a held branch's
    count is kept under a digest of what it tests, so that a count stored by a worker goes on
    after a restart with the branch unchanged wherever the pack was edited around it (two
    identical branches, in one rule or two, have one verdict and so one count)."""
    if c.all is not None or c.any is not None:
        parts = [_plan(x, targets, params) for x in (c.all if c.all is not None else c.any)]
        every = any(_has_held(x) for x in parts)
        if c.all is not None:
            costs = [_cost(x) for x in c.all]
            order = list(range(len(parts)))
            if not any(timed for _, timed in costs):
                order.sort(key=lambda i: costs[i][0])   # the result does not depend on the order
            out = ("all", parts, order, every)
        else:
            out = ("any", parts, every)
        if c.for_ is not None and c.for_ > 1:
            key = hashlib.sha1(repr((out, c.for_)).encode()).hexdigest()[:16]
            return ("held", out, c.for_, key)
        return out
    if c.not_ is not None:
        return ("not", _plan(c.not_, targets, params))
    return _plan_leaf(c, targets, params)


def _has_held(plan: tuple) -> bool:
    """Whether a held branch is in ``plan`` (itself included)."""
    how = plan[0]
    return (how == "held" or (how in ("all", "any") and plan[-1])
            or (how == "not" and _has_held(plan[1])))


def _bind(plan: tuple, src: Source) -> tuple[Test, Explain]:
    """The test and explain of a condition's :func:`_plan` over the statistics of ``src``."""
    how = plan[0]
    if how in ("all", "any"):
        parts = [_bind(x, src) for x in plan[1]]
        if plan[-1]:
            test = every_of(how, [p[0] for p in parts])
        else:
            tests = [parts[i][0] for i in plan[2]] if how == "all" else [p[0] for p in parts]
            test = _join(src, how, tests) or (all_of if how == "all" else any_of)(tests)

        def explain():
            got = [e() for _, e in parts]
            hit = [g for g in got if g[0]] if how == "any" else []
            return (test(), *_first_numbers(hit or got))
        return test, explain
    if how in ("not", "held"):
        inner_test, inner_explain = _bind(plan[1], src)
        if how == "held":
            test = held_of(inner_test, plan[2], plan[3], src)
        else:
            test = _join(src, "not", [inner_test]) or not_of(inner_test)

        def explain():
            e = inner_explain()
            return (test(), *e[1:])
        return test, explain
    return _bind_leaf(plan, src)


def all_of(tests: list[Test]) -> Test:
    """False at the first false test (the later ones are not read); else None when one was
    undecided; else True. (The native ``join("all", ...)`` must give the same.)"""
    def test():
        unknown = False
        for t in tests:
            h = t()
            if h is False:
                return False
            if h is None:
                unknown = True
        return None if unknown else True
    return test


def any_of(tests: list[Test]) -> Test:
    """True at the first true test; else False when one was decided; else None: a branch on a
    metric this run does not log (grad_norm/critic in a GRPO run) must not hold a pending
    ``for`` open or keep a firing alert from resolving."""
    def test():
        decided = False
        for t in tests:
            h = t()
            if h:
                return True
            if h is not None:
                decided = True
        return False if decided else None
    return test


def every_of(how: str, tests: list[Test]) -> Test:
    """``all_of`` or ``any_of`` of ``tests`` (the same verdict), each read every time."""
    def test():
        got = [t() for t in tests]
        if how == "all":
            return False if False in got else None if None in got else True
        return True if True in got else False if False in got else None
    return test


def held_of(inner: Test, steps: int, key: str, src: Source) -> Test:
    """``inner`` held at every point it was decided over ``steps`` steps (a tier's ``for``,
    for one branch): the onset step of its current true spell is kept in the run's state
    under ``key``; a false point ends the spell, an undecided one changes nothing."""
    onsets, now = src.holds()

    def test():
        h = inner()
        if h is None:
            return None
        if not h:
            onsets.pop(key, None)
            return False
        step = now()
        return step - onsets.setdefault(key, step) + 1 >= steps
    return test


def not_of(inner: Test) -> Test:
    def test():
        h = inner()
        return None if h is None else not h
    return test


def _join(src: Source, op: str, tests: list[Test]) -> Test | None:
    """The source's native ``all``/``any``/``not`` of ``tests`` when it has one (the same
    verdicts as the closures here, read in the same order), else None."""
    join = getattr(src, "join", None)
    return None if join is None else join(op, tests)


def _first_numbers(parts: list[Explained]) -> tuple:
    for p in parts:
        if p[1] is not None:
            return p[1:]
    return (None, None, None, None, None)


def every_rule(rule: Rule) -> bool:
    """The ``keep`` of :func:`compile_rules` that keeps every rule."""
    return True


def plan_rules(rules: list[Rule], params: dict[str, dict[str, float]], targets: dict[str, float],
               positions: dict[str, int] | None = None,
               keep: Callable[[Rule], bool] = every_rule) -> list[tuple]:
    """The rules ``keep`` picks, thresholds resolved with ``targets`` and ``params``, as plans:
    ``(rule, position, params, tiers, notes, inputs, trigger, nonfinite only)``, each tier a
    ``(tier, state key, plan, plan of its keep_firing_while or None, its adjusts as (plan of
    their when or None, factors))`` and each note a
    ``(plan, text, otherwise)``. Nothing in them depends on a run's statistics:
    :class:`rules.engine.RunRules` keeps them, and every run with the same rules, parameters
    and targets binds the same plans (:func:`bind_rules`).
    Planning was about a third of compiling a run, and compiling is most of restoring one."""
    out = []
    for i, rule in enumerate(rules):
        if not keep(rule):
            continue
        p = params.get(rule.id, rule.params)
        out.append((rule, positions.get(rule.id, i) if positions else i, p,
                    [(t, f"{rule.id}/{t.severity}/", _plan(t.when, targets, p),
                      None if t.keep_firing_while is None else _plan(t.keep_firing_while, targets, p),
                      tuple((None if a.when is None else _plan(a.when, targets, p), a.adjust)
                            for a in t.actions if not isinstance(a, str)))
                     for t in rule.tiers],
                    [(_plan(n.when, targets, p), n.text, n.otherwise) for n in rule.notes],
                    rule_inputs(rule), rule_trigger(rule), nonfinite_only(rule)))
    return out


def bind_rules(plans: list[tuple], targets: dict[str, float], src: Source) -> Program:
    """The planned rules (:func:`plan_rules`) as closures over the statistics of ``src``."""
    return Program([CompiledRule(rule, position, p,
                                 [CompiledTier(t, key, *_bind(plan, src),
                                               None if keep is None else _bind(keep, src)[0],
                                               tuple((None if w is None else _bind(w, src)[1], adj)
                                                     for w, adj in adjusts))
                                  for t, key, plan, keep, adjusts in tiers],
                                 [(_bind(plan, src)[1], text, otherwise) for plan, text, otherwise in notes],
                                 inputs, trigger, only_nonfinite)
                    for rule, position, p, tiers, notes, inputs, trigger, only_nonfinite in plans],
                   targets)


def compile_rules(rules: list[Rule], params: dict[str, dict[str, float]],
                  targets: dict[str, float], src: Source, positions: dict[str, int] | None = None,
                  keep: Callable[[Rule], bool] = every_rule) -> Program:
    """The rules (thresholds resolved with ``targets`` and ``params``) as closures over ``src``;
    ``keep`` picks the rules to compile (e.g. only the ones every rank evaluates)."""
    return bind_rules(plan_rules(rules, params, targets, positions, keep), targets, src)
