"""Recorded runs: what training frameworks leave on disk, read as ``{"step": int, "metrics":
{name: float}}`` records (names as logged; a preset maps them) for ``rlwatch replay``, which
turns them into contract events. One module per format:

* :mod:`.jsonl`: JSON lines (contract events, records, logged dicts, ``wandb-history.jsonl``);
* :mod:`.trainer_state`: TRL / transformers ``trainer_state.json`` and other ``.json`` documents;
* :mod:`.wandb`: Weights & Biases history exports as CSV;
* :mod:`.console`: veRL, OpenRLHF and tqdm console logs;
* :mod:`.tensorboard`: TensorBoard event files.

:func:`read_recorded` picks the reader by file name and content and returns ``(records,
skipped)``; :func:`iter_recorded` yields ``(position, record)`` or ``(position, reason)`` pairs
(position: line, row, entry or TFRecord number), the shape ``rlwatch.replay.iter_records``
yields. Contract events (``kind``/``schema``) found in JSON input pass through unchanged.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path

from producers.recorded._common import Item, normalise_record
from producers.recorded.console import iter_console_log
from producers.recorded.jsonl import iter_json_lines
from producers.recorded.tensorboard import (
    MissingCRC32C,
    crc32c,
    is_tfrecord,
    iter_tensorboard,
    masked_crc32c,
    tensorboard_files,
)
from producers.recorded.trainer_state import iter_json_document, iter_trainer_state
from producers.recorded.wandb import CSV_STEP_COLUMNS, iter_wandb_csv

__all__ = [
    "MissingCRC32C",
    "crc32c",
    "detect_kind",
    "iter_console_log",
    "iter_json_document",
    "iter_json_lines",
    "iter_recorded",
    "iter_tensorboard",
    "iter_trainer_state",
    "iter_wandb_csv",
    "masked_crc32c",
    "normalise_record",
    "read_recorded",
]


def detect_kind(path: Path) -> str:
    """tensorboard | json | jsonl | csv | console, from the name, then the content."""
    name = path.name.lower()
    if "tfevents" in name:
        return "tensorboard"
    with path.open("rb") as fh:
        head = fh.read(4096)
    if is_tfrecord(head):
        return "tensorboard"
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    text = head.decode("utf-8", "replace")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first.startswith("{"):
        try:
            json.loads(first)
            return "jsonl"
        except json.JSONDecodeError:
            pass
    if re.match(r"\[\s*(?:\{|\]|$)", text.lstrip()) or (first.startswith("{") and '"log_history"' in text):
        return "json"
    if "," in first and any(c in [h.strip() for h in next(csv.reader([first]))] for c in CSV_STEP_COLUMNS):
        return "csv"
    return "console"


def iter_recorded(path: str | Path) -> Iterator[Item]:
    """``(position, record)`` or ``(position, reason)`` for a recorded run in any format here.

    ``path``: a file, or a directory (its ``trainer_state.json``, else its TensorBoard event
    files, merged).
    """
    path = Path(path)
    if path.is_dir():
        state = path / "trainer_state.json"
        if state.is_file():
            yield from iter_json_document(state.read_text(encoding="utf-8", errors="replace"))
            return
        files = tensorboard_files(path)
        if not files:
            yield 0, f"{path} is a directory without trainer_state.json or TensorBoard event files"
            return
        yield from iter_tensorboard(files)
        return
    kind = detect_kind(path)
    if kind == "tensorboard":
        yield from iter_tensorboard(path)
        return
    text = path.read_text(encoding="utf-8", errors="replace")
    if kind == "json":
        yield from iter_json_document(text)
    elif kind == "jsonl":
        yield from iter_json_lines(text)
    elif kind == "csv":
        if path.suffix.lower() == ".tsv":
            text = text.replace("\t", ",")
        yield from iter_wandb_csv(text)
    else:
        yield from iter_console_log(text)


def read_recorded(path: str | Path) -> tuple[list[dict], int]:
    """``(records, skipped)``: every usable record of a recorded run and how many entries
    (lines, rows, TFRecords) could not be used."""
    records: list[dict] = []
    skipped = 0
    for _, rec in iter_recorded(path):
        if isinstance(rec, str):
            skipped += 1
        else:
            records.append(rec)
    return records, skipped
