"""Backtest: recorded runs through the same processor and rules as the live worker.

Reads JSON Lines of contract events, or lines ``{"step": N, "metrics": {...}}`` without the
envelope (the run id is then the file name), or a TRL ``trainer_state.json`` (its
``log_history``). A preset maps framework metric names onto canonical ones; without one, each
file's preset is found from its metric names (:func:`contract.presets.guess_preset`) unless
``detect=False``. A line that cannot be used is reported with its line number and skipped; the
rest is replayed.

"0 alerts" must never mean "nothing was watched": :class:`ReplayResult` says, per run, which
preset was used and which rules had their inputs (:attr:`RunCoverage.watched`), and
:func:`coverage_lines` turns that into the lines ``rlwatch replay`` prints (a loud warning when
no rule with named inputs had any).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from contract.alert import Alert
from contract.events import EventError, SamplesEvent, StepEvent, parse_event
from contract.presets import Preset, guess_preset
from rules.loader import with_preset
from rules.schema import Pack
from streams.processor import Pipeline

__all__ = ["ReplayResult", "RunCoverage", "coverage_lines", "iter_records", "read_steps", "replay"]

BASE_TS = 1_700_000_000.0


@dataclass
class RunCoverage:
    """What the rules could see of one replayed run."""

    run_id: str
    preset: str | None = None        # the preset used for the run's names
    detected: bool = False           # found from the names (not given)
    evidence: str = ""               # why that preset (or why none)
    metrics: set[str] = field(default_factory=set)    # names after the preset, as the rules saw them
    first_step: int | None = None
    last_step: int | None = None
    steps_logged: int = 0
    samples: bool = False
    ranks: int = 1
    watched: list[str] = field(default_factory=list)      # rules that had (some of) their inputs
    any_metric: list[str] = field(default_factory=list)   # rules that read any metric (nan_inf)
    unwatched: list[str] = field(default_factory=list)    # rules with none of their inputs
    known: bool = True               # False: the processor did not say what its rules read

    @property
    def blind(self) -> bool:
        """True when no rule with named inputs saw any of them: silence means nothing here."""
        return self.known and not self.watched


@dataclass
class ReplayResult:
    alerts: list[Alert] = field(default_factory=list)
    events: int = 0
    rejected: list[str] = field(default_factory=list)
    runs: dict[str, RunCoverage] = field(default_factory=dict)


def _metrics_of(record: dict) -> dict | None:
    if "kind" in record or "schema" in record:
        m = record.get("metrics")
        return m if isinstance(m, dict) else None
    metrics = record.get("metrics")
    if metrics is None:  # a flat logged dict: every number except the step is a metric
        metrics = {k: v for k, v in record.items()
                   if k != "step" and isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    return metrics if isinstance(metrics, dict) else None


def _envelope(record: dict, run_id: str, preset: Preset | None) -> dict:
    if "kind" in record or "schema" in record:
        ev = dict(record)
        if preset is not None and isinstance(ev.get("metrics"), dict):
            ev["metrics"] = preset.map_metrics(ev["metrics"])
        return ev
    metrics = _metrics_of(record)
    if preset is not None and isinstance(metrics, dict):
        metrics = preset.map_metrics(metrics)
    step = record.get("step")
    return {"schema": 1, "kind": "step", "run_id": run_id, "step": step, "metrics": metrics,
            "ts": record.get("ts", BASE_TS + (step if isinstance(step, (int, float)) else 0))}


def iter_records(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(position, record) pairs, or (position, error text) for unusable entries: JSON Lines of
    events or logged dicts, trainer_state.json, TensorBoard, W&B exports, console logs."""
    from producers.recorded import iter_json_lines, iter_recorded

    if path.suffix == ".jsonl":   # whatever detect_kind() would guess from its content
        yield from iter_json_lines(path.read_text(encoding="utf-8", errors="replace"))
    else:
        yield from iter_recorded(path)


def read_steps(path: str | Path, preset: Preset | None = None, *, detect: bool = True
               ) -> tuple[Preset | None, list[tuple[int, dict[str, float]]]]:
    """The step metrics of a recorded run as the rules see them: ``(preset used, [(step,
    {canonical name: value})])`` for rank 0, ascending, one entry per step (the first wins).
    Without ``preset`` and with ``detect``, the preset is found from the names."""
    items = [rec for _, rec in iter_records(Path(path)) if isinstance(rec, dict)]
    if preset is None and detect:
        keys: set[str] = set()
        for rec in items:
            m = _metrics_of(rec)
            if m:
                keys.update(map(str, m))
        preset = guess_preset(keys).preset
    out: dict[int, dict[str, float]] = {}
    for rec in items:
        if rec.get("kind", "step") != "step" or int(rec.get("rank", 0) or 0) != 0:
            continue
        step, m = rec.get("step"), _metrics_of(rec)
        if not isinstance(step, (int, float)) or isinstance(step, bool) or not m:
            continue
        if preset is not None:
            m = preset.map_metrics(m)
        vals = {}
        for k, v in m.items():
            try:
                vals[k] = float(v)
            except (TypeError, ValueError):
                continue
        out.setdefault(int(step), vals)
    return preset, sorted(out.items())


def _run_id_of(path: Path) -> str:
    # a run's directory (TensorBoard logs, checkpoints) names the run better than a file
    return path.name if path.is_dir() else (
        path.parent.name if path.name.startswith("events.out.tfevents") else path.stem)


def _rule_reads(rule) -> dict | None:
    """What a rule reads, by kind: {"metric": set, "dist": set, "groups": set, "any": bool,
    "samples": bool, "ranks": bool, "tick": bool}; None when the rule's shape is not known."""
    try:
        try:
            from rules.schema import leaves
        except ImportError:       # before the compiled core: the leaves lived beside the evaluator
            from rules.conditions import leaves

        out = {"metric": set(), "dist": set(), "groups": set(), "any": False,
               "samples": False, "ranks": False, "tick": False}
        conds = [c for t in rule.tiers
                 for c in (t.when, getattr(t, "keep_firing_while", None)) if c is not None]
        for cond in conds:
            for leaf in leaves(cond):
                nf = getattr(leaf, "nonfinite", None)
                if nf == "any":
                    out["any"] = True
                elif nf:
                    out["metric"].update(nf)
                if getattr(leaf, "metric", None):
                    out["metric"].add(leaf.metric)
                if getattr(leaf, "dist", None):
                    out["dist"].add(leaf.dist)
                if getattr(leaf, "corr", None):
                    out["dist"].update(leaf.corr)
                if getattr(leaf, "groups", None):
                    out["groups"].add(leaf.groups)
                if getattr(leaf, "samples", None):
                    out["samples"] = True
                if getattr(leaf, "ranks", None) or getattr(leaf, "hashes", None):
                    out["ranks"] = True
                if getattr(leaf, "stalled_seconds", None) is not None:
                    out["tick"] = True
        return out
    except Exception:  # noqa: BLE001 - the rule language changed shape: fall back
        return None


def _coverage(pipeline: Pipeline, cov: RunCoverage, seen: dict[str, set[str]]) -> None:
    """Fill ``cov.watched`` / ``unwatched`` from what the pipeline's rules read."""
    proc = pipeline.processor
    state = pipeline.runs.get(cov.run_id)
    try:
        rules = list(proc.rules_for(state).rules) if state is not None else list(proc.pack.rules)
    except Exception:  # noqa: BLE001 - coverage is a report; never let it break a replay
        rules = list(getattr(getattr(proc, "pack", None), "rules", []))
    if not rules:
        cov.known = False
        return
    inputs = getattr(proc, "inputs", {}) or {}
    triggers = getattr(proc, "triggers", {}) or {}
    for rule in rules:
        reads = _rule_reads(rule)
        if reads is None:     # only the processor's merged view of the names a rule reads
            trig = triggers.get(rule.id, "step")
            needed = inputs.get(rule.id, frozenset())
            if trig == "tick":
                continue
            if trig == "samples":
                (cov.watched if cov.samples else cov.unwatched).append(rule.id)
            elif trig == "ranks":
                (cov.watched if cov.ranks > 1 else cov.unwatched).append(rule.id)
            elif needed is None:
                (cov.any_metric if cov.metrics else cov.unwatched).append(rule.id)
            elif needed & (seen["metric"] | seen["dist"] | seen["groups"]):
                cov.watched.append(rule.id)
            else:
                cov.unwatched.append(rule.id)
            continue
        if reads["tick"] and not (reads["metric"] or reads["dist"] or reads["samples"]):
            continue            # liveness needs a clock: nothing to say about it in a replay
        hit = bool(reads["metric"] & seen["metric"] or reads["dist"] & seen["dist"]
                   or reads["groups"] & seen["groups"] or (reads["samples"] and cov.samples)
                   or (reads["ranks"] and cov.ranks > 1))
        if hit:
            cov.watched.append(rule.id)
        elif reads["any"] and cov.metrics:
            cov.any_metric.append(rule.id)
        else:
            cov.unwatched.append(rule.id)


def replay(paths: list[str | Path], pack: Pack, preset: Preset | None = None,
           on_alert=None, *, detect: bool = True) -> ReplayResult:
    """Replay recorded runs through ``pack``; alerts in the order they fire.

    ``preset``: the names' framework for every file (``pack`` should already carry its
    override, as ``rules.loader.with_preset`` makes it). None with ``detect``: each file's
    preset is found from its metric names and applied to the pack for that file.
    """
    pipelines: dict[str | None, Pipeline] = {}
    run_pipeline: dict[str, Pipeline] = {}
    seen: dict[str, dict[str, set[str]]] = {}
    result = ReplayResult()

    def pipeline_for(p: Preset | None, detected: bool) -> Pipeline:
        key = p.name if (p is not None and detected) else None
        if key not in pipelines:
            # replay maps names itself (or, without detect, deliberately not at all)
            pipelines[key] = Pipeline(with_preset(pack, p) if detected else pack,
                                      detect_presets=False)
        return pipelines[key]

    for p in paths:
        path = Path(p)
        run_id = _run_id_of(path)
        items = list(iter_records(path))
        use, detected, evidence = preset, False, ""
        if preset is None and detect:
            keys: set[str] = set()
            for _, rec in items:
                if isinstance(rec, dict):
                    m = _metrics_of(rec)
                    if m:
                        keys.update(map(str, m))
            guess = guess_preset(keys)
            use, detected, evidence = guess.preset, guess.preset is not None, guess.reason
        elif preset is not None:
            evidence = "given"
        pipeline = pipeline_for(use, detected)
        for lineno, rec in items:
            if isinstance(rec, str):
                result.rejected.append(f"{path}:{lineno}: {rec}")
                continue
            if "step" not in rec and "kind" not in rec and "schema" not in rec:
                continue  # e.g. a trainer_state summary entry without a step
            try:
                event = parse_event(_envelope(rec, run_id, use), BASE_TS)
            except EventError as exc:
                result.rejected.append(f"{path}:{lineno}: {exc.reason}")
                continue
            result.events += 1
            cov = result.runs.get(event.run_id)
            if cov is None:
                cov = result.runs[event.run_id] = RunCoverage(
                    event.run_id, use.name if use is not None else None, detected, evidence)
            run_pipeline[event.run_id] = pipeline
            names = seen.setdefault(event.run_id, {"metric": set(), "dist": set(), "groups": set()})
            if isinstance(event, StepEvent):
                cov.metrics.update(event.metrics)
                names["metric"].update(event.metrics)
                names["dist"].update(event.dists or {})
                names["groups"].update(event.groups or {})
                if event.rank == 0:
                    cov.steps_logged += 1
                    cov.first_step = event.step if cov.first_step is None else min(cov.first_step, event.step)
                    cov.last_step = event.step if cov.last_step is None else max(cov.last_step, event.step)
                cov.ranks = max(cov.ranks, (event.rank or 0) + 1, event.world_size or 1)
            elif isinstance(event, SamplesEvent):
                cov.samples = True
            for alert in pipeline.feed(event, event.ts):
                result.alerts.append(alert)
                if on_alert is not None:
                    on_alert(alert)
    for run_id, cov in result.runs.items():
        _coverage(run_pipeline[run_id], cov, seen[run_id])
    return result


def coverage_lines(result: ReplayResult, *, limit: int = 12) -> list[str]:
    """What ``rlwatch replay`` says about each run besides its alerts: the preset, the rules that
    had their inputs, and a loud warning for a run that no rule could watch."""
    lines = []
    for cov in result.runs.values():
        if cov.preset is None:
            how = f"no preset ({cov.evidence})" if cov.evidence else "no preset"
        else:
            how = f"preset {cov.preset}" + (f" (found from the metric names: {cov.evidence})"
                                            if cov.detected else "")
        lines.append(f"rlwatch: run {cov.run_id}: {how}")
        if not cov.known:
            lines.append(f"rlwatch: run {cov.run_id}: cannot tell which rules had their inputs")
            continue
        n_all = len(cov.watched) + len(cov.unwatched) + len(cov.any_metric)
        shown = ", ".join(cov.watched[:limit]) + (f", ... ({len(cov.watched) - limit} more)"
                                                  if len(cov.watched) > limit else "")
        lines.append(f"rlwatch: run {cov.run_id}: {len(cov.watched)} of {n_all} rules had their "
                     f"inputs" + (f": {shown}" if cov.watched else ""))
        if cov.blind:
            names = sorted(cov.metrics)
            listed = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
            hint = ("no rule of the pack reads these metrics: add rules for them (--rules)"
                    if cov.preset is not None else
                    "pass --preset NAME (trl-grpo, trl-ppo, trl-dpo, tinker, verl, openrlhf, "
                    "nemo-rl) or log the canonical names (contract.md section 2)")
            lines.append(
                f"rlwatch: WARNING: run {cov.run_id}: NO RULE HAD ITS INPUTS, so no alert here "
                f"means nothing was watched, not that the run is healthy. Metric names seen: "
                f"{listed or 'none'}; {hint}.")
    return lines
