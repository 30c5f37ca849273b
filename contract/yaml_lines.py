"""Line numbers for validation errors in YAML files (rules, routes). Pure."""

from __future__ import annotations

from typing import Any

import yaml

#: libyaml's parser when PyYAML was built with it (the same documents, about ten times
#: quicker than the pure-Python one: the built-in pack took 0.9 s of every worker's start)
_Loader = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader

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
    """(node tree for line numbers, data); invalid YAML raises ``error`` naming the line.
    The text is parsed once: the data is constructed from the node tree (as ``safe_load``
    does)."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return node, (None if node is None else loader.construct_document(node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise error(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    finally:
        loader.dispose()
