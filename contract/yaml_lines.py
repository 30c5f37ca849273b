"""Line numbers for validation errors in YAML files (rules, routes). Pure."""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["line_of", "parse_yaml"]

#: pydantic field names that stand for YAML keys which are Python keywords
ALIASES = {"not_": "not", "continue_": "continue"}


def line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """The 1-based line of the YAML node at pydantic location ``loc`` (best effort)."""
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            want = ALIASES.get(key, key)
            match = next((v for k, v in node.value if getattr(k, "value", None) == want), None)
            if match is None:
                break
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            continue  # union branch names and the like: no YAML node of their own
        line = node.start_mark.line + 1
    return line


def parse_yaml(text: str, source: str, error: type[Exception]) -> tuple[yaml.Node | None, Any]:
    """(node tree for line numbers, data); invalid YAML raises ``error`` naming the line."""
    try:
        return yaml.compose(text), yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
