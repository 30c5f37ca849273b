"""Load rule files (YAML) into validated packs; every error names the file and line.

``load_pack("rlhf")`` loads a built-in pack by name; any other string is a path. A pack may name
a diagnoses file (``diagnoses: diagnoses.yaml``, relative to the pack) whose texts load with it.
Packs can be combined (``merge_packs``): a later rule with the same id replaces the earlier one.

Strict: besides the schema (unknown keys, wrong types), a threshold naming no parameter of its
rule, an override of an unknown rule or parameter and ``disable`` of an unknown rule are errors;
a metric that neither the contract nor any preset knows is a warning (``Pack.warnings()``),
because user metrics are legal.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from contract.events import CANONICAL_METRICS
from contract.presets import PRESETS, Preset
from contract.yaml_lines import line_of, parse_yaml
from rules.schema import ActionSpec, Condition, Override, Pack, Rule, Threshold

__all__ = ["BUILTIN_PACKS", "RuleFileError", "load_pack", "load_pack_text", "merge_packs",
           "pack_warnings", "preset_override", "with_preset"]

BUILTIN_PACKS = ("rlhf",)


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file and line."""


def _known_metrics() -> frozenset[str]:
    names = set(CANONICAL_METRICS)
    for p in PRESETS.values():
        names.update(p.names)
        names.update(p.names.values())
    return frozenset(names)


KNOWN_METRICS = _known_metrics()


def _check_unique_ids(node: yaml.Node | None, source: str) -> None:
    """Repeated rule ids, reported at the line of the repetition."""
    if not isinstance(node, yaml.MappingNode):
        return
    rules = next((v for k, v in node.value if getattr(k, "value", None) == "rules"), None)
    if not isinstance(rules, yaml.SequenceNode):
        return
    seen: dict[str, int] = {}
    for item in rules.value:
        if not isinstance(item, yaml.MappingNode):
            continue
        for k, v in item.value:
            if getattr(k, "value", None) == "id" and isinstance(v, yaml.ScalarNode):
                line = v.start_mark.line + 1
                if v.value in seen:
                    raise RuleFileError(f"{source}:{line}: rules.id: rule id {v.value!r} is already "
                                        f"used on line {seen[v.value]}; ids must be unique")
                seen[v.value] = line


def _validation_error(exc: ValidationError, node, source: str, prefix: tuple = ()) -> RuleFileError:
    lines = []
    for err in exc.errors(include_url=False)[:8]:
        loc = prefix + tuple(err["loc"])
        line = line_of(node, loc)
        path = ".".join(str(p) for p in loc if not str(p).startswith(
            ("function-", "float", "Threshold", "str", "list", "literal")))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{source}:{line or '?'}: {path}: {msg}")
    return RuleFileError("\n".join(lines))


# -- diagnoses -----------------------------------------------------------------------------------

class _Diagnosis(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: str = ""
    title: str = ""
    summary: str = ""
    causes: list[str] = []
    check_first: list[str] = []
    change: list[str] = []
    disambiguation: str = ""

    def text(self) -> str:
        parts = ["Probably:"] + [f"- {c}" for c in self.causes]
        parts += ["Check first:"] + [f"- {c}" for c in self.check_first]
        parts += ["Change:"] + [f"- {c}" for c in self.change]
        if self.disambiguation:
            parts += [f"Telling causes apart: {self.disambiguation}"]
        return "\n".join(parts) + "\n"


def _attach_diagnoses(pack: Pack, text: str, source: str) -> Pack:
    node, data = parse_yaml(text, source, RuleFileError)
    if not isinstance(data, dict):
        raise RuleFileError(f"{source}:1: a diagnoses file maps rule ids to texts")
    by_id = {r.id: r for r in pack.rules}
    default_summary = Rule.model_fields["summary"].default
    rules = []
    diags: dict[str, _Diagnosis] = {}
    for rid, entry in data.items():
        if rid not in by_id:
            raise RuleFileError(f"{source}:{line_of(node, (rid,)) or '?'}: {rid}: no rule of "
                                f"pack {pack.pack!r} has this id")
        try:
            diags[rid] = _Diagnosis.model_validate(entry)
        except ValidationError as exc:
            raise _validation_error(exc, node, source, (rid,)) from None
    for r in pack.rules:
        d = diags.get(r.id)
        if d is None:
            rules.append(r)
            continue
        update: dict[str, Any] = {}
        if not r.title:
            update["title"] = d.title
        if r.summary == default_summary and d.summary:
            update["summary"] = d.summary
        if not r.diagnosis:
            update["diagnosis"] = d.text()
        update["labels"] = {**({"seed": d.seed} if d.seed else {}), "pack": pack.pack, **r.labels}
        rules.append(r.model_copy(update=update))
    return _copy(pack, rules=rules)


def _copy(pack: Pack, **update) -> Pack:
    out = pack.model_copy(update=update)
    out._meta = dict(getattr(pack, "_meta", {}))
    return out


# -- references ---------------------------------------------------------------------------------

def _conditions(rule: Rule, i: int) -> Iterator[tuple[Condition, tuple]]:
    """Every condition of a rule (composites included) with its location in the file."""
    def walk(c: Condition, loc: tuple):
        yield c, loc
        for key in ("all", "any"):
            for j, child in enumerate(getattr(c, key) or ()):
                yield from walk(child, loc + (key, j))
        if c.not_ is not None:
            yield from walk(c.not_, loc + ("not_",))

    for j, t in enumerate(rule.tiers):
        yield from walk(t.when, ("rules", i, "tiers", j, "when"))
        if t.keep_firing_while is not None:
            yield from walk(t.keep_firing_while, ("rules", i, "tiers", j, "keep_firing_while"))
        for k, a in enumerate(t.actions):
            if isinstance(a, ActionSpec) and a.when is not None:
                yield from walk(a.when, ("rules", i, "tiers", j, "actions", k, "when"))
    for j, n in enumerate(rule.notes):
        yield from walk(n.when, ("rules", i, "notes", j, "when"))


def _param_refs(c: Condition) -> Iterator[tuple[str, str]]:
    """(key, parameter name) of every parameter a condition names."""
    for key in ("above", "below", "abs_above", "cap", "stalled_seconds"):
        spec = getattr(c, key)
        if isinstance(spec, str):
            yield key, spec
        elif isinstance(spec, Threshold):
            if spec.param is not None:
                yield key, spec.param
            if isinstance(spec.factor, str):
                yield key, spec.factor


def _metrics_of(c: Condition) -> Iterator[tuple[str, str]]:
    if c.metric is not None:
        yield "metric", c.metric
    if c.cycle_metric is not None:
        yield "cycle_metric", c.cycle_metric
    if c.versus is not None:
        yield "versus", c.versus
    if c.after_warmup_of is not None:
        yield "after_warmup_of", c.after_warmup_of
    if c.ranks is not None:
        yield "ranks", c.ranks
    if c.groups is not None:
        yield "groups", c.groups
    if isinstance(c.nonfinite, list):
        for m in c.nonfinite:
            yield "nonfinite", m


@functools.lru_cache(maxsize=1)
def _builtin_params() -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for name in BUILTIN_PACKS:
        for r in load_pack(name).rules:
            out[r.id] = frozenset(r.params)
    return out


def check_references(pack: Pack, node, source: str, known: dict[str, frozenset[str]],
                     ovr_source: list[tuple[str, Any, tuple]] | None = None) -> list[str]:
    """Errors (as ``file:line: ...`` lines) for parameters and rule ids that do not exist;
    ``known`` maps rule ids of other packs to their parameter names."""
    errors = []
    for i, rule in enumerate(pack.rules):
        for cond, loc in _conditions(rule, i):
            for key, name in _param_refs(cond):
                if name not in rule.params:
                    have = ", ".join(sorted(rule.params)) or "none"
                    errors.append(f"{source}:{line_of(node, loc + (key,)) or '?'}: "
                                  f"{'.'.join(map(str, loc + (key,)))}: {name!r} is not a parameter "
                                  f"of rule {rule.id!r} (its params: {have})")
    ids = {**known, **{r.id: frozenset(r.params) for r in pack.rules}}
    places = ovr_source or [(source, node, ("overrides", k)) for k in range(len(pack.overrides))]
    for ov, (src, n, loc) in zip(pack.overrides, places):
        for j, rid in enumerate(ov.disable):
            if rid not in ids:
                errors.append(f"{src}:{line_of(n, loc + ('disable', j)) or '?'}: disable: "
                              f"no rule {rid!r}")
        for rid, params in ov.params.items():
            if rid not in ids:
                errors.append(f"{src}:{line_of(n, loc + ('params', rid)) or '?'}: params: "
                              f"no rule {rid!r}")
                continue
            for p in params:
                if p not in ids[rid]:
                    have = ", ".join(sorted(ids[rid])) or "none"
                    errors.append(f"{src}:{line_of(n, loc + ('params', rid, p)) or '?'}: params."
                                  f"{rid}: {p!r} is not a parameter of rule {rid!r} (its params: {have})")
    return errors


def pack_warnings(pack: Pack) -> list[str]:
    """Warnings found while loading (metric names nobody knows), as ``file:line: ...``."""
    return list(getattr(pack, "_meta", {}).get("warnings", []))


def _metric_warnings(pack: Pack, node, source: str) -> list[str]:
    out = []
    for i, rule in enumerate(pack.rules):
        for cond, loc in _conditions(rule, i):
            for key, name in _metrics_of(cond):
                if name not in KNOWN_METRICS:
                    out.append(f"{source}:{line_of(node, loc + (key,)) or '?'}: warning: metric "
                               f"{name!r} (rule {rule.id}) is neither a canonical metric nor a "
                               "preset's name: check the spelling")
    return out


# -- loading ------------------------------------------------------------------------------------

def load_pack_text(text: str, source: str = "<rules>", base_dir: Path | None = None,
                   diagnoses_text: str | None = None) -> Pack:
    node, data = parse_yaml(text, source, RuleFileError)
    if not isinstance(data, dict):
        raise RuleFileError(f"{source}:1: a rule file is a mapping with 'rules:' (got {type(data).__name__})")
    _check_unique_ids(node, source)
    try:
        pack = Pack.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, node, source) from None
    pack._meta = {"overrides": [(source, node, ("overrides", k)) for k in range(len(pack.overrides))]}
    if pack.diagnoses:
        dsource = str(base_dir / pack.diagnoses) if base_dir is not None else pack.diagnoses
        if diagnoses_text is None:
            if base_dir is None or not (base_dir / pack.diagnoses).is_file():
                raise RuleFileError(f"{source}:{line_of(node, ('diagnoses',))}: diagnoses: no such "
                                    f"file {dsource}")
            diagnoses_text = (base_dir / pack.diagnoses).read_text()
        pack = _attach_diagnoses(pack, diagnoses_text, dsource)
    builtin = {} if pack.pack in BUILTIN_PACKS and source.startswith("<builtin") else _builtin_params()
    errors = check_references(pack, node, source, builtin, pack._meta["overrides"])
    if errors:
        raise RuleFileError("\n".join(errors[:12]))
    pack._meta["warnings"] = _metric_warnings(pack, node, source)
    return pack


def load_pack(name_or_path: str | Path) -> Pack:
    """A built-in pack by name (``rlhf``) or a rule file by path."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_PACKS:
        return _builtin(name_or_path).model_copy()
    path = Path(name_or_path)
    if not path.is_file():
        raise RuleFileError(f"{path}: no such rule file (built-in packs: {', '.join(BUILTIN_PACKS)})")
    return load_pack_text(path.read_text(), str(path), base_dir=path.parent)


@functools.lru_cache(maxsize=None)
def _builtin(name: str) -> Pack:
    folder = resources.files("rules.packs")
    text = folder.joinpath(f"{name}.yaml").read_text()
    node, data = parse_yaml(text, name, RuleFileError)
    diag = data.get("diagnoses") if isinstance(data, dict) else None
    return load_pack_text(text, f"<builtin:{name}>",
                          diagnoses_text=folder.joinpath(diag).read_text() if diag else None)


def merge_packs(*packs: Pack) -> Pack:
    """One pack from several: later rules replace earlier ones with the same id. The overrides
    are checked again against the merged rules (an override may name another pack's rule)."""
    rules: dict[str, Any] = {}
    targets: dict[str, float] = {}
    overrides, places = [], []
    for p in packs:
        targets.update(p.targets)
        overrides.extend(p.overrides)
        known = getattr(p, "_meta", {}).get("overrides") or []
        if len(known) != len(p.overrides):   # e.g. a preset's override put in front
            known = [("<rules>", None, ("overrides", k)) for k in range(len(p.overrides))]
        places.extend(known)
        for r in p.rules:
            rules[r.id] = r
    merged = Pack(pack="+".join(p.pack for p in packs), targets=targets,
                  rules=list(rules.values()), overrides=overrides)
    errors = check_references(merged, None, "<merged>", {}, places)
    errors = [e for e in errors if not e.startswith("<merged>")]   # rules were checked on load
    if errors:
        raise RuleFileError("\n".join(errors[:12]))
    merged._meta = {"overrides": places,
                    "warnings": [w for p in packs for w in pack_warnings(p)]}
    return merged


def preset_override(preset: Preset) -> Override:
    """A preset's targets, parameters and disabled rules as an override of every run."""
    return Override(runs="*", targets=dict(preset.targets), disable=list(preset.disable),
                    params={k: dict(v) for k, v in preset.params.items()})


def with_preset(pack: Pack, preset: Preset | None) -> Pack:
    """``pack`` with ``preset``'s override first (the pack's own overrides still win)."""
    if preset is None:
        return pack
    return _copy(pack, overrides=[preset_override(preset), *pack.overrides])
