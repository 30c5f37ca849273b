"""Line numbers for validation errors in YAML files (rules, routes). Pure."""

from __future__ import annotations

import yaml

__all__ = ["line_of"]

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
