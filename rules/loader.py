"""Load rule files (YAML) into validated packs; errors point at the line.

``load_pack("rlhf")`` loads a built-in pack by name; any other string is a path. Packs can
be combined (``merge_packs``): a later rule with the same id replaces the earlier one.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from contract.presets import Preset
from rules.schema import Override, Pack
from contract.yaml_lines import line_of, parse_yaml

__all__ = ["BUILTIN_PACKS", "RuleFileError", "load_pack", "load_pack_text", "merge_packs",
           "preset_override", "with_preset"]

BUILTIN_PACKS = ("rlhf",)


class RuleFileError(ValueError):
    """A rule file that cannot be used; the message names the file and line."""


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


def load_pack_text(text: str, source: str = "<rules>") -> Pack:
    node, data = parse_yaml(text, source, RuleFileError)
    if not isinstance(data, dict):
        raise RuleFileError(f"{source}:1: a rule file is a mapping with 'rules:' (got {type(data).__name__})")
    _check_unique_ids(node, source)
    try:
        return Pack.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors(include_url=False)[:8]:
            loc = tuple(err["loc"])
            line = line_of(node, loc)
            path = ".".join(str(p) for p in loc if not str(p).startswith(("function-", "float", "Threshold")))
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}:{line or '?'}: {path}: {msg}")
        raise RuleFileError("\n".join(lines)) from None


def load_pack(name_or_path: str | Path) -> Pack:
    """A built-in pack by name (``rlhf``) or a rule file by path."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_PACKS:
        text = resources.files("rules.packs").joinpath(f"{name_or_path}.yaml").read_text()
        return load_pack_text(text, f"<builtin:{name_or_path}>")
    path = Path(name_or_path)
    if not path.is_file():
        raise RuleFileError(f"{path}: no such rule file (built-in packs: {', '.join(BUILTIN_PACKS)})")
    return load_pack_text(path.read_text(), str(path))


def merge_packs(*packs: Pack) -> Pack:
    """One pack from several: later rules replace earlier ones with the same id."""
    rules: dict[str, Any] = {}
    targets: dict[str, float] = {}
    overrides = []
    for p in packs:
        targets.update(p.targets)
        overrides.extend(p.overrides)
        for r in p.rules:
            rules[r.id] = r
    return Pack(pack="+".join(p.pack for p in packs), targets=targets,
                rules=list(rules.values()), overrides=overrides)


def preset_override(preset: Preset) -> Override:
    """A preset's targets, parameters and disabled rules as an override of every run."""
    return Override(runs="*", targets=dict(preset.targets), disable=list(preset.disable),
                    params={k: dict(v) for k, v in preset.params.items()})


def with_preset(pack: Pack, preset: Preset | None) -> Pack:
    """``pack`` with ``preset``'s override first (the pack's own overrides still win)."""
    if preset is None:
        return pack
    return pack.model_copy(update={"overrides": [preset_override(preset), *pack.overrides]})
