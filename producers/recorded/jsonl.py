"""JSON lines: one object per line (rlwatch contract events, ``{"step", "metrics"}`` records,
logged dicts, W&B's ``wandb-history.jsonl`` with its ``_step``/``_runtime``/``_timestamp``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from producers.recorded._common import Item, normalise_record

__all__ = ["iter_json_lines"]


def iter_json_lines(text: str) -> Iterator[Item]:
    """One JSON object per line; contract events pass through unchanged, logged dicts become
    ``{"step", "metrics"}`` records, lines without a step are left out."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            yield n, f"bad JSON: {exc.msg}"
            continue
        except ValueError as exc:   # e.g. an integer with more digits than Python converts
            yield n, f"bad JSON: {exc}"
            continue
        if not isinstance(rec, dict):
            yield n, "a line must be a JSON object"
            continue
        norm = normalise_record(rec)
        if norm is not None:
            yield n, norm
