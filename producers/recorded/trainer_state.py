"""JSON documents: TRL / transformers ``trainer_state.json`` (its ``log_history``, entries of one
step merged, the end-of-training summary left out), a list of records or contract events, or
JSON lines saved under a ``.json`` name."""

from __future__ import annotations

import json
from collections.abc import Iterator

from producers.recorded._common import Item, merge_by_step, metrics_of, normalise_record, step_of
from producers.recorded.jsonl import iter_json_lines

__all__ = ["iter_json_document", "iter_trainer_state"]

_SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})
_NOT_A_DOCUMENT = "a .json file must be a trainer_state.json (log_history) or a list of records"


def iter_trainer_state(data: dict) -> Iterator[Item]:
    """``trainer_state.json``: the ``log_history`` entries, one record per step."""
    rows = data.get("log_history")
    if not isinstance(rows, list):
        yield 1, "a trainer_state.json must have a log_history list"
        return
    good: list[tuple[int, int, dict]] = []
    errors: list[Item] = []
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            errors.append((i, f"entry {i} is not an object"))
            continue
        if _SUMMARY_KEYS & row.keys():
            continue                       # the end-of-training summary
        step = step_of(row.get("step"))
        if step is None:
            errors.append((i, f"entry {i} has no usable step ({row.get('step')!r})"))
            continue
        good.append((i, step, metrics_of(row)))
    yield from errors
    yield from merge_by_step(good)


def iter_json_document(text: str) -> Iterator[Item]:
    """A ``.json`` file: a trainer_state.json, a list of records/events, or (liberally) JSON
    lines saved under a ``.json`` name."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) > 1 and lines[0].lstrip().startswith("{"):
            yield from iter_json_lines(text)
            return
        yield exc.lineno, f"bad JSON: {exc}"
        return
    if isinstance(data, dict) and "log_history" in data:
        yield from iter_trainer_state(data)
        return
    if isinstance(data, dict):
        norm = normalise_record(data)
        if norm is None:
            yield 1, _NOT_A_DOCUMENT
        else:
            yield 1, norm
        return
    if not isinstance(data, list):
        yield 1, _NOT_A_DOCUMENT
        return
    for i, row in enumerate(data, 1):
        if not isinstance(row, dict):
            yield i, f"entry {i} is not an object"
            continue
        norm = normalise_record(row)
        if norm is not None:
            yield i, norm
