"""Rule evaluation: compiled rules and a run's alert states in, alerts out. Pure.

:class:`RuleEngine` is built once per pack. :meth:`RuleEngine.for_run` applies the pack's
per-run overrides (targets, disabled rules, changed parameters) and the targets the run itself
reported, giving a :class:`RunRules`, which :meth:`RunRules.compile` turns into a
:class:`rules.compile.Program` over one rank's statistics. :func:`evaluate` runs some compiled
rules at one step and returns the alerts whose state changed (firing, escalated, resolved);
the text of an alert is rendered only then.
"""

from __future__ import annotations

import fnmatch
import math
import string
from dataclasses import dataclass, field
from typing import Callable, Iterable

from contract.alert import SEVERITIES, Alert
from rules.compile import (CompiledRule, CompiledTier, Program, RuleList, Source, bind_rules,
                           every_rule, flat_tiers, plan_rules, state_suffix)
from rules.schema import Condition, Pack, Rule, Threshold, leaves
from rules.state import AlertState, advance

__all__ = ["RuleEngine", "RunRules", "advance_hits", "evaluate", "render"]


class _SafeFormatter(string.Formatter):
    """str.format that never raises: unknown fields stay as written, None/NaN read 'n/a'."""

    def get_value(self, key, args, kwargs):
        if isinstance(key, str) and key not in kwargs:
            return "{" + key + "}"
        return super().get_value(key, args, kwargs)

    def format_field(self, value, format_spec):
        if value is None or (isinstance(value, float) and math.isnan(value) and format_spec):
            return "n/a" if value is None else "NaN"
        try:
            return super().format_field(value, format_spec)
        except (ValueError, TypeError):
            return str(value)


_FMT = _SafeFormatter()


def render(template: str, **fields) -> str:
    try:
        return _FMT.format(template, **fields)
    except (ValueError, IndexError, KeyError):
        return template


def _up(severity: str) -> str:
    return SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)]


@dataclass
class RunRules:
    """The pack as it applies to a run: shared by every run with the same overrides, reported
    targets and preset (:meth:`rules.engine.RuleEngine.for_run`), and never changed."""

    rules: list[Rule]
    targets: dict[str, float]
    params: dict[str, dict[str, float]]
    positions: dict[str, int]
    #: the rules planned (rules.compile.plan_rules), per ``keep``: each run binds them
    _plans: dict = field(default_factory=dict, repr=False, compare=False)

    def compile(self, src: Source, keep: Callable[[Rule], bool] = every_rule) -> Program:
        plans = self._plans.get(keep)
        if plans is None:
            if len(self._plans) >= 8:     # (a ``keep`` made afresh per call is planned afresh)
                self._plans.clear()
            plans = self._plans[keep] = plan_rules(self.rules, self.params, self.targets,
                                                  self.positions, keep)
        return bind_rules(plans, self.targets, src)


def evaluate(run_id: str, rules: Iterable[CompiledRule], targets: dict[str, float],
             states: dict[str, AlertState], *, step: int, ts: float, rank: int | None,
             checkpoint_before: Callable[[int], dict | None] = lambda s: None,
             scanner: Callable | None = None) -> list[Alert]:
    """Evaluate ``rules`` at one step; ``states`` (keyed ``rule/severity/rank``) is updated in
    place and keeps only alerts that are pending or firing.

    ``scanner(tests, keys)``, when given (the native ``Scan``), reads all the tests of a
    :class:`RuleList` at once and names the tiers to take through the state machine: those
    whose test holds or that have a state (under the rank's key, for a rank's own rules). The
    loop below is its reference: a tier with no state whose test does not hold changes
    nothing."""
    if scanner is not None and type(rules) is RuleList:
        return advance_hits(run_id, rules, rules.scan(scanner, rank)(states), states, targets,
                            step, ts, checkpoint_before, rank)
    out: list[Alert] = []
    keyed = rank is not None
    get = states.get
    for test, key, cr, ct in (rules.tiers() if type(rules) is RuleList else flat_tiers(rules)):
        holds = test()
        if keyed:
            key = f"{key}{rank}"
        st = get(key)
        if st is None:
            if not holds:
                continue
            st = states[key] = AlertState()
        _advance(run_id, cr, ct, st, key, holds, states, targets, step, ts, rank,
                 checkpoint_before, out)
    return out


def advance_hits(run_id: str, rules: RuleList, hits: list, states: dict[str, AlertState],
                 targets: dict[str, float], step: int, ts: float,
                 checkpoint_before: Callable[[int], dict | None],
                 rank: int | None = None) -> list[Alert]:
    """The tiers a native scan of ``rules`` named (``(index, verdict)``, see :func:`evaluate`)
    through their alert states, at a step of the run's rules (``rank`` None) or of a rank's
    own (their states keyed with the rank); the alerts of the changes."""
    out: list[Alert] = []
    tiers = rules.tiers()
    suffix = state_suffix(rank)
    for i, holds in hits:
        _, key, cr, ct = tiers[i]
        key += suffix
        st = states.get(key)
        if st is None:
            st = states[key] = AlertState()
        _advance(run_id, cr, ct, st, key, holds, states, targets, step, ts, rank,
                 checkpoint_before, out)
    return out


def _advance(run_id: str, cr: CompiledRule, ct: CompiledTier, st: AlertState, key: str, holds,
             states: dict[str, AlertState], targets, step: int, ts: float, rank: int | None,
             checkpoint_before, out: list[Alert]) -> None:
    """One tier's verdict through its alert state; the alerts of a change go to ``out``."""
    tier = ct.tier
    was_escalated = st.escalated
    change = advance(st, holds, step, ts, for_steps=tier.for_,
                     for_seconds=tier.for_seconds, keep_firing_for=tier.keep_firing_for,
                     escalate_after=tier.escalate_after, for_points=tier.for_points, keep=ct.keep)
    if change is not None:
        out += _announce(run_id, cr, ct, st, change, targets, step, ts, rank,
                         checkpoint_before, was_escalated)
    if st.status == "inactive" and not st.adjusts:
        del states[key]      # (a state that sent adjusts stays: it counts them for at_most)


def _announce(run_id: str, cr: CompiledRule, ct: CompiledTier, st: AlertState, change: str,
              targets, step, ts, rank, checkpoint_before, was_escalated: bool) -> list[Alert]:
    tier = ct.tier
    if change == "resolved":
        out = [_alert(run_id, cr, tier, tier.severity, st, targets, step, ts, rank, "resolved",
                      checkpoint_before)]
        if was_escalated:
            out.append(_alert(run_id, cr, tier, _up(tier.severity), st, targets, step, ts, rank,
                              "resolved", checkpoint_before))
        return out
    _holds, value, threshold, metric, detail, who = ct.explain()
    st.value, st.threshold, st.detail = value, threshold, detail
    if metric is not None:
        st.metric = metric
    if change == "firing":
        st.rank = who
    severity = _up(tier.severity) if change == "escalated" else tier.severity
    adjust = ct.adjust_now()
    withheld = None
    if adjust:
        limit = tier.adjust_limit()
        if limit is not None and st.adjusts >= limit:
            adjust, withheld = {}, adjust    # its factors would compound past the rule's most
        else:
            st.adjusts += 1
    alert = _alert(run_id, cr, tier, severity, st, targets, step, ts, rank, "firing",
                   checkpoint_before, escalated=change == "escalated", adjust=adjust,
                   withheld=withheld)
    st.summary = alert.summary[:300]
    return [alert]


def _alert(run_id: str, cr: CompiledRule, tier, severity: str, st: AlertState, targets,
           step: int, ts: float, rank: int | None, state: str, checkpoint_before,
           escalated: bool = False, adjust: dict[str, float] | None = None,
           withheld: dict[str, float] | None = None) -> Alert:
    """The alert of a change; ``adjust``: what a firing one asks the run to change (none when
    ``withheld``: the tier's adjust already sent as many times as its ``at_most``)."""
    rule = cr.rule
    if st.rank is not None:
        rank = st.rank   # a cross-rank check names the rank it is about
    # parameters and targets first: the alert's own fields win over a parameter that
    # happens to share their name (a rule may call a parameter "threshold")
    fields = {**cr.params, **{f"target_{k}": v for k, v in targets.items()},
              "value": st.value, "threshold": st.threshold, "onset_step": st.onset_step,
              "step": step, "run_id": run_id, "rank": rank, "tier": severity,
              "metric": st.metric, "detail": st.detail or "", "rule": rule.id}
    if state == "resolved":
        # the firing text ("... is above the red threshold") would now be false
        name = rule.title or rule.id
        summary = render("{name}: back under the {tier} threshold at step {step} (fired at step "
                         "{onset_step} with {metric} {value:.4g})", name=name, **fields)
    else:
        summary = render(rule.summary, **fields)
    if st.detail and state == "firing":
        summary = f"{summary} ({st.detail})"
    if escalated:
        summary = f"{summary}; escalated from {tier.severity} after {tier.escalate_after} steps"
    if withheld:
        factors = ", ".join(f"{k} x{v:g}" for k, v in withheld.items())
        summary = (f"{summary}; not adjusted again ({factors}): this run was sent that "
                   f"{st.adjusts} times already, the rule's most")
    diagnosis = render(rule.diagnosis.strip(), **fields)
    if state == "firing":
        for explain, text, otherwise in cr.notes:
            holds = explain()[0]
            note = text if holds else otherwise if holds is False else None
            if note:
                diagnosis = f"{diagnosis}\n{render(note.strip(), **fields)}".strip()
    actions = tier.action_names() if state == "firing" else []
    if not adjust:       # none held (an adjust's `when`), or none left (its `at_most`)
        actions = [a for a in actions if a != "adjust"]
    rollback_to = None
    if "rollback" in actions and st.onset_step is not None:
        rollback_to = checkpoint_before(st.onset_step)
    return Alert(rule=rule.id, severity=severity, state=state, run_id=run_id,
                 rank=rank, step=step, onset_step=st.onset_step, value=_num(st.value),
                 threshold=_num(st.threshold), metric=st.metric, actions=actions,
                 adjust=(adjust or {}) if state == "firing" else {},
                 rollback_to=rollback_to, summary=summary, diagnosis=diagnosis,
                 labels=dict(rule.labels), ts=ts)


def _num(x: float | None) -> float | None:
    return None if x is None else float(x)


class RuleEngine:
    """A pack, checked once; cheap to specialise per run."""

    def __init__(self, pack: Pack):
        self.pack = pack
        self.rules = [r for r in pack.rules if r.enabled]
        self.positions = {r.id: i for i, r in enumerate(self.rules)}

    def overrides_for(self, run_id: str) -> tuple[int, ...]:
        """The positions of the pack's overrides whose ``runs`` pattern matches ``run_id``."""
        return tuple(i for i, ov in enumerate(self.pack.overrides)
                     if fnmatch.fnmatchcase(run_id, ov.runs))

    def for_run(self, run_id: str, reported_targets: dict[str, float] | None = None) -> RunRules:
        return self.for_overrides(self.overrides_for(run_id), reported_targets)

    def for_overrides(self, matching: tuple[int, ...],
                      reported_targets: dict[str, float] | None = None) -> RunRules:
        """The pack with the overrides at ``matching`` (:meth:`overrides_for`) applied, then the
        targets a run reported."""
        targets = dict(self.pack.targets)
        disabled: set[str] = set()
        params = {r.id: dict(r.params) for r in self.rules}
        for i in matching:
            ov = self.pack.overrides[i]
            targets.update(ov.targets)
            disabled.update(ov.disable)
            for rid, p in ov.params.items():
                params.setdefault(rid, {}).update(p)
        targets.update(reported_targets or {})
        return RunRules([r for r in self.rules if r.id not in disabled], targets, params,
                        self.positions)

    def conditions(self) -> Iterable[Condition]:
        """Every leaf condition of every rule and note."""
        for r in self.rules:
            for t in r.tiers:
                for c in t.conditions():
                    yield from leaves(c)
            for n in r.notes:
                yield from leaves(n.when)

    def undefined_targets(self) -> list[str]:
        """Targets that conditions use but the pack gives no default for."""
        used = set()
        for c in self.conditions():
            for spec in (c.above, c.below, c.abs_above, c.cap):
                if isinstance(spec, Threshold) and spec.target:
                    used.add(spec.target)
        return sorted(used - set(self.pack.targets))
