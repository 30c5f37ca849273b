"""Rule unit tests, in the spirit of ``promtool test rules``. Pure.

A test file::

    rules: rlhf                    # a built-in pack or a rule file (relative to this file)
    tests:
      - name: KL blow-up pauses
        run_id: r1                 # optional
        targets: {kl: 0.05}        # optional per-run targets
        interval: 1                # seconds between steps (for `for_seconds` rules)
        series:                    # metric -> values, one per step from step 0
          kl/mean: "0.02x20 0.02+0.02x10"   # promtool notation: a x n = n+1 copies of a;
                                          # a+b x n = a, a+b, ..., a+n*b; _ = not logged
          reward/mean: [1.0, 1.1, NaN]    # or a plain list
        groups:                    # optional: per-category values of a group metric, per step
          reward/mean: {math: "0.5+0.01x50", code: "0.5x50"}
        expect:                    # alerts that must fire (firing state), within `within` steps
          - {rule: kl_above_target, severity: red, step: 24, within: 3}
          - {rule: kl_above_target, severity: red, state: resolved, step: 40, within: 5}
        absent: [nan_inf]          # rules that must not fire at all (any severity)
        # or: absent: [{rule: nan_inf, severity: red}]   (that tier only)
        # or: absent: [{rule: reward_crash, state: resolved}]   (must not resolve)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from contract.events import parse_event
from rules.loader import RuleFileError, load_pack
from rules.schema import Override, Pack
from streams.processor import Pipeline

__all__ = ["TestOutcome", "expand_series", "run_rule_tests"]


def _value(tok: str) -> float | None:
    if tok == "_":
        return None
    low = tok.lower()
    if low in ("nan", "inf", "+inf", "-inf"):
        return float(low)
    return float(tok)


def expand_series(spec) -> list[float | None]:
    """Values per step from a list or a promtool-style string (see the module doc). A token that
    is none of the forms raises ValueError naming it."""
    if isinstance(spec, list):
        return [None if v in (None, "_") else float(v) for v in spec]
    out: list[float | None] = []
    for tok in str(spec).split():
        try:
            head, sep, n = tok.rpartition("x")
            if sep and head and n.isdigit():
                count = int(n)
                # the +/- between start and increment (not an exponent's sign, as in 1e-3)
                idx = max((i for i in range(1, len(head))
                           if head[i] in "+-" and head[i - 1] not in "eE"), default=-1)
                if idx > 0:
                    start, inc = float(head[:idx]), float(head[idx:])
                    out.extend(start + inc * i for i in range(count + 1))
                else:
                    out.extend([_value(head)] * (count + 1))
            else:
                out.append(_value(tok))
        except ValueError:
            raise ValueError(f"series token {tok!r} is not a value, '_', 'a x n' (n+1 copies, as 'NaNx3') "
                             "or 'a+b x n' (a ramp)") from None
    return out


@dataclass
class TestOutcome:
    name: str
    passed: bool
    problems: list[str] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


#: the states an expectation names: an alert firing (the default), or resolved
STATES = ("firing", "resolved")


def _well_formed(exp) -> bool:
    """An expectation is ``{rule, severity?, state?, step?, within?}``, its steps whole numbers."""
    return (isinstance(exp, dict) and isinstance(exp.get("rule"), str)
            and set(exp) <= {"rule", "severity", "state", "step", "within"}
            and exp.get("state", "firing") in STATES
            and (exp.get("step") is None or _whole(exp["step"])) and _whole(exp.get("within", 0)))


def _shown(a) -> str:
    """An alert as a test's outcome names it: ``rule/severity@step``, ``(resolved)`` after it."""
    return f"{a.rule}/{a.severity}@{a.step}{' (resolved)' if a.state == 'resolved' else ''}"


def _run_one(pack: Pack, case: dict) -> TestOutcome:
    name = case.get("name", "unnamed")
    run_id = case.get("run_id", "test-run")
    try:
        series = {m: expand_series(v) for m, v in (case.get("series") or {}).items()}
    except (TypeError, ValueError) as exc:
        return TestOutcome(name, False, [f"bad series: {exc}"])
    groups = case.get("groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(c, dict) and c for c in groups.values()):
        return TestOutcome(name, False, ["groups: a group metric -> {category: series} each"])
    try:
        cats = {(m, c): expand_series(v) for m, by in groups.items() for c, v in by.items()}
    except (TypeError, ValueError) as exc:
        return TestOutcome(name, False, [f"bad group series: {exc}"])
    if not series and not cats:
        return TestOutcome(name, False, ["the test has no series"])
    if case.get("targets"):
        pack = pack.model_copy(update={"overrides": [*pack.overrides,
                                                     Override(runs=run_id, targets=case["targets"])]})
    pipeline = Pipeline(pack)
    interval = float(case.get("interval", 1.0))
    n = max(len(v) for v in [*series.values(), *cats.values()])
    seen = []
    for step in range(n):
        metrics = {m: v[step] for m, v in series.items() if step < len(v) and v[step] is not None}
        by_group: dict[str, dict[str, float]] = {}
        for (m, c), v in cats.items():
            if step < len(v) and v[step] is not None:
                by_group.setdefault(m, {})[c] = v[step]
        if not metrics and not by_group:   # nothing logged at this step: no event, as from a
            continue                       # run logging sparsely
        ts = 1_700_000_000.0 + step * interval
        raw = {"schema": 1, "kind": "step", "run_id": run_id, "step": step, "ts": ts,
               "metrics": metrics}
        if by_group:
            raw["groups"] = by_group
        ev = parse_event(raw, ts)
        seen += pipeline.feed(ev, ts)
    firing = [a for a in seen if a.state == "firing"]
    problems = []
    for exp in case.get("expect") or []:
        if not _well_formed(exp):
            problems.append(f"expect: {exp!r} is not {{rule, severity?, state?, step?, within?}} "
                            "with whole-number steps")
            continue
        within = exp.get("within", 0)
        at = exp.get("step")
        state = exp.get("state", "firing")
        match = [a for a in seen if a.rule == exp["rule"] and a.state == state
                 and ("severity" not in exp or a.severity == exp["severity"])
                 and (at is None or at <= a.step <= at + within)]
        if not match:
            got = [_shown(a) for a in seen if a.rule == exp["rule"]]
            problems.append(f"expected {exp['rule']}/{exp.get('severity', 'any')}"
                            f"{'' if state == 'firing' else ' ' + state} at step "
                            f"{at if at is not None else 'any'}"
                            f"{f' (+{within})' if within else ''}; got {got or 'nothing'}")
    for item in case.get("absent") or []:
        if isinstance(item, str):
            rule, severity, state = item, None, "firing"
        elif (isinstance(item, dict) and isinstance(item.get("rule"), str)
              and set(item) <= {"rule", "severity", "state"}
              and item.get("state", "firing") in STATES):
            rule, severity, state = item["rule"], item.get("severity"), item.get("state", "firing")
        else:
            problems.append(f"absent: {item!r} is neither a rule id nor {{rule, severity?, "
                            f"state?}} (state: {' or '.join(STATES)})")
            continue
        hits = [_shown(a) for a in seen if a.rule == rule and a.state == state
                and (severity is None or a.severity == severity)]
        if hits:
            what = f"{rule}/{severity}" if severity else rule
            verb = "fire" if state == "firing" else "resolve"
            problems.append(f"{what} must not {verb}; it did: {hits}")
    return TestOutcome(name, not problems, problems, [f"{a.rule}/{a.severity}@{a.step}" for a in firing])


def run_rule_tests(path: str | Path) -> list[TestOutcome]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RuleFileError(f"{path}: cannot read the test file: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tests"), list):
        raise RuleFileError(f"{path}: a rule test file has 'rules:' and a list 'tests:'")
    rules = doc.get("rules", "rlhf")
    candidate = path.parent / str(rules)
    pack = load_pack(candidate if candidate.is_file() else rules)
    return [_run_one(pack, case) for case in doc["tests"]]
