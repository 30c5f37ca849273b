"""Which alerts a route, an inhibition rule, an enforcement entry or a silence applies to. Pure.

One matcher syntax everywhere: a mapping of *field* to *pattern* (or a list of patterns).

* Fields: ``severity``, ``rule``, ``run`` (or ``run_id``), ``rank``, ``state``, ``metric``,
  ``fingerprint``; any other name is one of the alert's ``labels`` (``labels.NAME`` also works).
  A field the alert lacks reads as the empty string, as in Alertmanager.
* A pattern is a shell glob (``exp-*``, ``kl_*``, ``red``), case-sensitive. A list matches when
  any of its patterns matches. A pattern starting with ``!`` must *not* match.
* ``severity`` also takes an order comparison: ``">=red"``, ``">orange"``, ``"<=yellow"``.
* The empty mapping matches every alert.

>>> from contract.alert import Alert
>>> a = Alert(rule="kl_above_target", severity="red", state="firing", run_id="exp-7", step=3)
>>> Matchers.parse({"run": "exp-*", "severity": ">=red"}).matches(a)
True
>>> Matchers.parse({"rule": ["!kl_*"]}).matches(a)
False
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.alert import SEVERITIES, Alert

__all__ = ["FIELDS", "Matchers", "RUN_FIELDS", "field_value", "parse_matcher_args"]

FIELDS = ("severity", "rule", "run", "run_id", "rank", "state", "metric", "fingerprint")
_COMPARE = re.compile(r"^(>=|<=|>|<)\s*([a-z]+)$")


#: the names a matcher or an inhibition rule may give the run id
RUN_FIELDS = frozenset({"run", "run_id"})


def field_value(alert: Alert, name: str) -> str:
    """The value of ``name`` on ``alert``, as a string ("" when absent)."""
    if name in RUN_FIELDS:
        return alert.run_id
    if name == "rank":
        return "" if alert.rank is None else str(alert.rank)
    if name in ("severity", "rule", "state", "metric", "fingerprint"):
        v = getattr(alert, name)
        return "" if v is None else str(v)
    name = name.removeprefix("labels.")
    return str(alert.labels.get(name, ""))


def _check_pattern(name: str, pattern: str) -> None:
    if not isinstance(pattern, str):
        raise ValueError(f"{name}: a pattern is a string, got {type(pattern).__name__}")
    body = pattern.removeprefix("!")
    if name != "severity":
        return
    m = _COMPARE.match(body)
    word = m.group(2) if m else body
    if not any(ch in word for ch in "*?[") and word not in SEVERITIES:
        raise ValueError(f"severity: unknown severity {word!r} (one of {', '.join(SEVERITIES)})")


def _one(name: str, pattern: str, value: str) -> bool:
    if name == "severity":
        m = _COMPARE.match(pattern)
        if m:
            if value not in SEVERITIES:
                return False
            op, than = m.group(1), SEVERITIES.index(m.group(2))
            v = SEVERITIES.index(value)
            return {">=": v >= than, "<=": v <= than, ">": v > than, "<": v < than}[op]
    return fnmatch.fnmatchcase(value, pattern)


@dataclass(frozen=True)
class Matchers:
    """A conjunction of field patterns (see the module docstring)."""

    terms: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def parse(cls, spec: Mapping[str, Any] | None) -> Matchers:
        """From ``{field: pattern | [patterns]}``; a ``ValueError`` names what is wrong."""
        if not spec:
            return cls()
        if not isinstance(spec, Mapping):
            raise ValueError(f"matchers are a mapping of field -> pattern, got {type(spec).__name__}")
        terms = []
        for name, pats in spec.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"a matcher field must be a non-empty string, got {name!r}")
            if isinstance(pats, (str, int)) and not isinstance(pats, bool):
                pats = [str(pats)]
            if not isinstance(pats, (list, tuple)) or not pats:
                raise ValueError(f"{name}: give a pattern or a non-empty list of patterns")
            pats = [str(p) if isinstance(p, int) and not isinstance(p, bool) else p for p in pats]
            for p in pats:
                _check_pattern(name, p)
            terms.append((name, tuple(pats)))
        return cls(tuple(terms))

    def matches(self, alert: Alert) -> bool:
        for name, pats in self.terms:
            value = field_value(alert, name)
            positive = [p for p in pats if not p.startswith("!")]
            if any(_one(name, p[1:], value) for p in pats if p.startswith("!")):
                return False
            if positive and not any(_one(name, p, value) for p in positive):
                return False
        return True

    def to_dict(self) -> dict[str, list[str]]:
        return {name: list(pats) for name, pats in self.terms}

    def __str__(self) -> str:
        if not self.terms:
            return "{}"
        return "{" + ", ".join(f"{n}={'|'.join(p)}" for n, p in self.terms) + "}"


def parse_matcher_args(args: Iterable[str]) -> dict[str, list[str]]:
    """Command-line matchers ``name=glob`` / ``name!=glob`` into the mapping form.

    >>> parse_matcher_args(["run=exp-*", "severity=>=red", "rule!=kl_*"])
    {'run': ['exp-*'], 'severity': ['>=red'], 'rule': ['!kl_*']}
    """
    out: dict[str, list[str]] = {}
    for arg in args:
        m = re.match(r"^([A-Za-z_][\w.\-/]*)\s*(!=|=)\s*(.+)$", arg)
        if not m:
            raise ValueError(f"matcher {arg!r}: write name=pattern or name!=pattern")
        name, op, pat = m.groups()
        out.setdefault(name, []).append(("!" if op == "!=" else "") + pat.strip().strip("\"'"))
    Matchers.parse(out)  # validate
    return out
