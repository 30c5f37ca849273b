"""Rule evaluation: a pack, a run's view and its alert states in, alerts out. Pure.

:class:`RuleEngine` is built once per pack. :meth:`RuleEngine.for_run` applies the pack's
per-run overrides (targets, disabled rules, changed parameters) and the targets the run itself
reported, giving a :class:`RunRules`. :meth:`RunRules.evaluate` runs every enabled rule's tiers
against a :class:`~rules.conditions.RunView` at one step and returns the alerts whose state
changed (firing, escalated, resolved).
"""

from __future__ import annotations

import fnmatch
import math
import string
from dataclasses import dataclass
from typing import Callable, Iterable

from contract.alert import SEVERITIES, Alert
from rules.conditions import RunView, evaluate, leaves
from rules.schema import Condition, Pack, Rule, Tier
from rules.state import AlertState, advance

__all__ = ["RuleEngine", "RunRules", "render"]


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


@dataclass
class RunRules:
    """The pack as it applies to one run."""

    run_id: str
    rules: list[Rule]
    targets: dict[str, float]
    params: dict[str, dict[str, float]]

    def evaluate(self, view: RunView, states: dict[str, AlertState], *, step: int, ts: float,
                 rank: int | None, checkpoint_before: Callable[[int], dict | None] = lambda s: None,
                 only: Callable[[Rule], bool] = lambda r: True) -> list[Alert]:
        """Evaluate at one step; ``states`` (keyed ``rule/severity/rank``) is updated in place."""
        out: list[Alert] = []
        for rule in self.rules:
            if not only(rule):
                continue
            params = self.params.get(rule.id, rule.params)
            for tier in rule.tiers:
                verdict = evaluate(tier.when, view, self.targets, params)
                key = f"{rule.id}/{tier.severity}/{'' if rank is None else rank}"
                st = states.get(key)
                if st is None:
                    if not verdict.holds:
                        continue  # keep the state table small: only what has been true
                    st = states[key] = AlertState()
                if verdict.holds:
                    st.value, st.threshold, st.metric = verdict.value, verdict.threshold, verdict.metric
                    if st.status != "firing":
                        st.rank = verdict.rank   # the alert keeps the rank it fired for
                was_escalated = st.escalated
                change = advance(st, verdict.holds, step, ts, for_steps=tier.for_,
                                 for_seconds=tier.for_seconds, keep_firing_for=tier.keep_firing_for,
                                 escalate_after=tier.escalate_after)
                if change is None:
                    if st.status == "inactive":
                        del states[key]
                    continue
                severity = tier.severity
                if change == "escalated":
                    severity = SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)]
                out.append(self._alert(rule, tier, severity, st, verdict, view, step, ts, rank,
                                       params, "resolved" if change == "resolved" else "firing",
                                       checkpoint_before, escalated=change == "escalated"))
                if change == "resolved" and was_escalated:
                    # the escalated alert has its own fingerprint: resolve it too
                    up = SEVERITIES[min(SEVERITIES.index(severity) + 1, len(SEVERITIES) - 1)]
                    out.append(self._alert(rule, tier, up, st, verdict, view, step, ts, rank,
                                           params, "resolved", checkpoint_before, escalated=False))
                if st.status == "inactive":
                    del states[key]
        return out

    def _alert(self, rule: Rule, tier: Tier, severity: str, st: AlertState, verdict, view,
               step: int, ts: float, rank: int | None, params: dict[str, float], state: str,
               checkpoint_before, escalated: bool) -> Alert:
        value = verdict.value if state == "firing" else st.value
        threshold = verdict.threshold if state == "firing" else st.threshold
        metric = st.metric if st.metric is not None else verdict.metric
        if st.rank is not None:
            rank = st.rank   # a cross-rank check names the rank it is about
        # parameters and targets first: the alert's own fields win over a parameter that
        # happens to share their name (a rule may call a parameter "threshold")
        fields = {**params, **{f"target_{k}": v for k, v in self.targets.items()},
                  "value": value, "threshold": threshold, "onset_step": st.onset_step,
                  "step": step, "run_id": self.run_id, "rank": rank, "tier": severity,
                  "metric": metric, "detail": verdict.detail or "", "rule": rule.id}
        summary = render(rule.summary, **fields)
        if verdict.detail and state == "firing":
            summary = f"{summary} ({verdict.detail})"
        if escalated:
            summary = f"{summary}; escalated from {tier.severity} after {tier.escalate_after} steps"
        diagnosis = render(rule.diagnosis.strip(), **fields)
        if state == "firing":
            for note in rule.notes:
                v = evaluate(note.when, view, self.targets, params)
                text = note.text if v.holds else note.otherwise if v.holds is False else None
                if text:
                    diagnosis = f"{diagnosis}\n{render(text.strip(), **fields)}".strip()
        actions = tier.action_names() if state == "firing" else []
        rollback_to = None
        if "rollback" in actions and st.onset_step is not None:
            rollback_to = checkpoint_before(st.onset_step)
        return Alert(rule=rule.id, severity=severity, state=state, run_id=self.run_id,
                     rank=rank, step=step, onset_step=st.onset_step, value=_num(value),
                     threshold=_num(threshold), metric=metric, actions=actions,
                     adjust=tier.adjust_params() if state == "firing" else {},
                     rollback_to=rollback_to, summary=summary, diagnosis=diagnosis,
                     labels=dict(rule.labels), ts=ts)


def _num(x: float | None) -> float | None:
    return None if x is None else float(x)


class RuleEngine:
    """A pack, compiled once; cheap to specialise per run."""

    def __init__(self, pack: Pack):
        self.pack = pack
        self.rules = [r for r in pack.rules if r.enabled]

    def for_run(self, run_id: str, reported_targets: dict[str, float] | None = None) -> RunRules:
        targets = dict(self.pack.targets)
        disabled: set[str] = set()
        params = {r.id: dict(r.params) for r in self.rules}
        for ov in self.pack.overrides:
            if fnmatch.fnmatchcase(run_id, ov.runs):
                targets.update(ov.targets)
                disabled.update(ov.disable)
                for rid, p in ov.params.items():
                    params.setdefault(rid, {}).update(p)
        targets.update(reported_targets or {})
        return RunRules(run_id, [r for r in self.rules if r.id not in disabled], targets, params)

    def conditions(self) -> Iterable[Condition]:
        """Every leaf condition of every rule and note (to know which signals to keep)."""
        for r in self.rules:
            for t in r.tiers:
                yield from leaves(t.when)
            for n in r.notes:
                yield from leaves(n.when)

    def undefined_targets(self) -> list[str]:
        """Targets that conditions use but the pack gives no default for."""
        used = set()
        for c in self.conditions():
            for spec in (c.above, c.below, c.abs_above):
                if getattr(spec, "target", None):
                    used.add(spec.target)
        return sorted(used - set(self.pack.targets))

