"""Backtest: recorded runs through the same processor and rules as the live worker.

Reads JSON Lines of contract events, or lines ``{"step": N, "metrics": {...}}`` without the
envelope (the run id is then the file name), or a TRL ``trainer_state.json`` (its
``log_history``). A preset maps framework metric names onto canonical ones. A line that cannot
be used is reported with its line number and skipped; the rest is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from contract.alert import Alert
from contract.events import EventError, parse_event
from contract.presets import Preset
from rules.schema import Pack
from streams.processor import Pipeline

__all__ = ["ReplayResult", "iter_records", "replay"]

BASE_TS = 1_700_000_000.0


@dataclass
class ReplayResult:
    alerts: list[Alert] = field(default_factory=list)
    events: int = 0
    rejected: list[str] = field(default_factory=list)


def _envelope(record: dict, run_id: str, preset: Preset | None) -> dict:
    if "kind" in record or "schema" in record:
        ev = dict(record)
        if preset is not None and isinstance(ev.get("metrics"), dict):
            ev["metrics"] = preset.map_metrics(ev["metrics"])
        return ev
    metrics = record.get("metrics")
    if metrics is None:  # a flat logged dict: every number except the step is a metric
        metrics = {k: v for k, v in record.items()
                   if k != "step" and isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    if preset is not None and isinstance(metrics, dict):
        metrics = preset.map_metrics(metrics)
    step = record.get("step")
    return {"schema": 1, "kind": "step", "run_id": run_id, "step": step, "metrics": metrics,
            "ts": record.get("ts", BASE_TS + (step if isinstance(step, (int, float)) else 0))}


def iter_records(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(position, record) pairs, or (position, error text) for unusable entries: JSON Lines of
    events or logged dicts, trainer_state.json, TensorBoard, W&B exports, console logs."""
    from producers.recorded import iter_json_lines, iter_recorded

    if path.suffix == ".jsonl":   # whatever _kind() would guess from its content
        yield from iter_json_lines(path.read_text(encoding="utf-8", errors="replace"))
    else:
        yield from iter_recorded(path)


def replay(paths: list[str | Path], pack: Pack, preset: Preset | None = None,
           on_alert=None) -> ReplayResult:
    pipeline = Pipeline(pack)
    result = ReplayResult()
    for p in paths:
        path = Path(p)
        # a run's directory (TensorBoard logs, checkpoints) names the run better than a file
        run_id = path.name if path.is_dir() else (
            path.parent.name if path.name.startswith("events.out.tfevents") else path.stem)
        for lineno, rec in iter_records(path):
            if isinstance(rec, str):
                result.rejected.append(f"{path}:{lineno}: {rec}")
                continue
            if "step" not in rec and "kind" not in rec and "schema" not in rec:
                continue  # e.g. a trainer_state summary entry without a step
            try:
                event = parse_event(_envelope(rec, run_id, preset), BASE_TS)
            except EventError as exc:
                result.rejected.append(f"{path}:{lineno}: {exc.reason}")
                continue
            result.events += 1
            for alert in pipeline.feed(event, event.ts):
                result.alerts.append(alert)
                if on_alert is not None:
                    on_alert(alert)
    return result
