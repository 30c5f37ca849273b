"""Inhibition: while an alert of one kind fires, alerts of another kind with the same labels
are muted (their commands still go out). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from alerts.matchers import Matchers, field_value
from contract.alert import Alert

__all__ = ["DEFAULT_INHIBIT_RULES", "InhibitRule", "inhibited_by"]


@dataclass(frozen=True)
class InhibitRule:
    """While an alert matching ``source`` fires, alerts matching ``target`` with the same
    values of ``equal`` are muted (their commands still go out: only notifications are muted)."""

    source: Matchers
    target: Matchers
    equal: tuple[str, ...] = ("run",)


#: A black or red alert of a run mutes the run's lower tiers.
DEFAULT_INHIBIT_RULES: tuple[InhibitRule, ...] = (
    InhibitRule(Matchers.parse({"severity": "black"}), Matchers.parse({"severity": "<black"})),
    InhibitRule(Matchers.parse({"severity": "red"}), Matchers.parse({"severity": "<red"})),
)


def inhibited_by(alert: Alert, active: Iterable[Alert], rules: Iterable[InhibitRule]) -> Alert | None:
    """The firing alert that mutes ``alert``, or None. Only firing alerts are muted; a
    resolved notice follows its firing one (sent if and only if the firing was)."""
    if alert.state != "firing":
        return None
    rules = [r for r in rules if r.target.matches(alert)]
    if not rules:
        return None
    for src in active:
        if src.state != "firing" or src.fingerprint == alert.fingerprint:
            continue
        for r in rules:
            if r.source.matches(src) and all(field_value(src, n) == field_value(alert, n) for n in r.equal):
                return src
    return None
