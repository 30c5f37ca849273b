"""Weights & Biases history exports as CSV (or any CSV with a step column): a ``_step`` or
``Step`` column; the UI's ``"<run> - <metric>"`` columns and their ``__MIN``/``__MAX`` companions
are understood. W&B's ``wandb-history.jsonl`` is plain JSON lines: :mod:`.jsonl` reads it."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from producers.recorded._common import META_KEYS, Item, num, step_of

__all__ = ["CSV_STEP_COLUMNS", "iter_wandb_csv"]

CSV_STEP_COLUMNS = ("_step", "step", "Step", "global_step", "train/global_step",
                    "trainer/global_step")


def iter_wandb_csv(text: str) -> Iterator[Item]:
    """A W&B history export as CSV (or any CSV with a step column). Row numbers count the
    header as line 1."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        return
    header = [h.strip() for h in header]
    step_col = next((header.index(c) for c in CSV_STEP_COLUMNS if c in header), None)
    if step_col is None:
        yield 1, f"no step column in the CSV header (one of {', '.join(CSV_STEP_COLUMNS)})"
        return
    columns: dict[int, str] = {}
    runs: list[str] = []
    ignored_runs: set[str] = set()
    for i, name in enumerate(header):
        if i == step_col or name in META_KEYS or name.startswith("_"):
            continue
        if name.endswith(("__MIN", "__MAX")):
            continue
        if " - " in name:                   # the W&B UI export: "<run name> - <metric>"
            run, metric = name.rsplit(" - ", 1)
            if not runs:
                runs.append(run)
            if run != runs[0]:
                ignored_runs.add(run)
                continue
            name = metric
        columns[i] = name
    if ignored_runs:
        yield 1, (f"several runs in one W&B export: read {runs[0]!r}, left out "
                  f"{', '.join(sorted(ignored_runs))} (export one run per file)")
    for n, row in enumerate(reader, 2):
        if not any(c.strip() for c in row):
            continue
        if len(row) <= step_col:
            yield n, f"row has {len(row)} columns, the step is column {step_col + 1}"
            continue
        step = step_of(row[step_col])
        if step is None:
            yield n, f"bad step {row[step_col]!r}"
            continue
        metrics = {}
        for i, name in columns.items():
            if i < len(row) and row[i].strip():
                x = num(row[i])
                if x is not None:
                    metrics[name] = x
        if metrics:
            yield n, {"step": step, "metrics": metrics}
