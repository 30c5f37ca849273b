"""Strict parsers of events side by side (how contract.events.parse_event was chosen).

Over the events of the fleet of ``bench_fleet_replay.py`` (12 interleaved 8-rank runs: rank 0
sends about 32 metrics, per-sample dists and groups; ranks 1-7 five metrics, hashes, batch ids
and tags; one run sends "NaN" for half its steps), in CPU microseconds per event and as a
fraction of ``json.loads``' time on the same lines, for each group of events:

* ``json.loads`` / ``orjson.loads`` / msgspec's untyped decode: no checks, the floors;
* pydantic ``model_validate_json`` of the contract's StepEvent (its strict validators included);
* msgspec's typed decode of a step (``contract.events.WireStep``), with the run-id ``pattern``
  it had before (msgspec calls Python's re from C per event) and without it (now: a set of the
  ids already seen free of whitespace is checked in Python instead);
* building the StepEvent from a decoded step: ``msgspec.structs.asdict`` + the former
  ``_construct`` (``object.__setattr__`` four times, ``set(values)``), and now (the struct's
  fields read into a dict literal, pydantic's slot setters bound once, a copy of a set of the
  field names);
* the fast path of plain steps as it was (typed decode with pattern + asdict + _construct) and
  as it is (``contract.events._wire_step``);
* ``parse_event`` itself; with ``--rev REV`` also ``parse_event`` of ``contract/events.py`` at
  git revision REV (the before figure of a change), both in the same run.

A row shows "-" for a group whose lines it does not parse (the typed decoders refuse "NaN" text
among the numbers; parse_event decodes those a second time with text allowed there).

    python bench/bench_parse.py [--runs 12] [--steps 400] [--repeats 5] [--rev HEAD~1]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Literal, Union

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import contract.events as ce  # noqa: E402
from bench_fleet_replay import fleet_lines  # noqa: E402
from contract.events import StepEvent, parse_event  # noqa: E402

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency
    msgspec = None


def _before_decoder():
    """contract.events.WireStep as it was, with the pattern on run_id and incarnation."""
    M = msgspec
    name = Annotated[str, M.Meta(max_length=ce.MAX_NAME_LEN)]
    ident = Annotated[str, M.Meta(min_length=1, pattern=r"^[^\s]+\Z")]
    numbers = Annotated[dict[name, float], M.Meta(max_length=ce.MAX_METRICS)]
    strings = Annotated[dict[name, Annotated[str, M.Meta(max_length=ce.MAX_TAG_VALUE_LEN)]],
                        M.Meta(max_length=ce.MAX_TAGS)]
    run_id = Annotated[ident, M.Meta(max_length=256)]
    incarnation = Annotated[ident, M.Meta(max_length=ce.MAX_INCARNATION_LEN)]
    dist = Annotated[list[float], M.Meta(max_length=ce.MAX_DIST_LEN)]
    fields = [
        ("schema_", Literal[1], M.field(name="schema")),
        ("run_id", run_id),
        ("step", Annotated[int, M.Meta(ge=0, le=ce.MAX_STEP)]),
        ("rank", Annotated[int, M.Meta(ge=0, le=1_000_000)], 0),
        ("world_size", Union[Annotated[int, M.Meta(ge=1, le=1_000_000)], None], None),
        ("ts", Union[float, None], None),
        ("tags", strings, {}),
        ("incarnation", Union[incarnation, None], None),
        ("kind", Literal["step"]),
        ("metrics", numbers, {}),
        ("dists", dict[name, dist], {}),
        ("groups", dict[name, numbers], {}),
        ("hashes", strings, {}),
        ("batch_ids", list[str], []),
    ]
    struct = M.defstruct("WireStepBefore", fields, kw_only=True, forbid_unknown_fields=True,
                         gc=False)
    return M.json.Decoder(struct)


def _construct_before(cls, values: dict):
    """contract.events._construct as it was."""
    ev = object.__new__(cls)
    object.__setattr__(ev, "__dict__", values)
    object.__setattr__(ev, "__pydantic_fields_set__", set(values))
    object.__setattr__(ev, "__pydantic_extra__", {})
    object.__setattr__(ev, "__pydantic_private__", None)
    return ev


def _build_now(w, received_at: float = 0.0):
    """What _wire_step does after decoding (the ids' whitespace check included)."""
    run_id, inc = w.run_id, w.incarnation
    if not (run_id in ce._KNOWN_IDS or ce._new_ident(run_id)):
        return None
    if inc is not None and not (inc in ce._KNOWN_IDS or ce._new_ident(inc)):
        return None
    ts = w.ts
    ev = ce._new(StepEvent)
    ce._set_dict(ev, {"schema_": 1, "run_id": run_id, "step": w.step, "rank": w.rank,
                      "world_size": w.world_size, "ts": received_at if ts is None else ts,
                      "tags": w.tags, "incarnation": inc, "kind": "step",
                      "metrics": w.metrics, "dists": w.dists, "groups": w.groups,
                      "hashes": w.hashes, "batch_ids": w.batch_ids})
    ce._set_fields_set(ev, ce._STEP_FIELDS.copy())
    ce._set_extra(ev, {})
    ce._set_private(ev, None)
    return ev


def _events_at(rev: str):
    """contract/events.py at git revision ``rev``, imported as a module of its own."""
    text = subprocess.run(["git", "show", f"{rev}:contract/events.py"], cwd=HERE.parent,
                          check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "events_at_rev.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("events_at_rev", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["events_at_rev"] = mod      # msgspec resolves the structs' annotations here
    spec.loader.exec_module(mod)
    return mod


def per_event(fn, lines) -> float:
    """CPU microseconds per line of one pass."""
    t = time.process_time()
    for raw in lines:
        fn(raw)
    return (time.process_time() - t) / len(lines) * 1e6


def parses_all(fn, lines) -> bool:
    try:
        return all(fn(raw) is not None for raw in lines)
    except Exception:   # a decoder refusing a line: the row does not apply to the group
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rev", help="also time parse_event of contract/events.py at this revision")
    args = ap.parse_args()

    lines = fleet_lines(args.runs, args.steps)
    groups: dict[str, list[bytes]] = {"rank 0 step": [], "rank N step": [], "non-finite": [],
                                      "samples": []}
    for raw in lines:
        d = json.loads(raw)
        if d["kind"] == "samples":
            groups["samples"].append(raw)
        elif d["kind"] != "step":
            continue
        elif any(isinstance(v, str) for v in d.get("metrics", {}).values()):
            groups["non-finite"].append(raw)
        else:
            groups["rank 0 step" if d.get("rank", 0) == 0 else "rank N step"].append(raw)
    groups["all events"] = lines

    rows = [("json.loads (no checks)", json.loads), ("orjson.loads (no checks)", orjson.loads)]
    structs: dict[str, list] = {}
    if msgspec is not None:
        before = _before_decoder()
        for name in ("rank 0 step", "rank N step"):
            structs[name] = [ce._WIRE_STEP.decode(raw) for raw in groups[name]]
        rows += [
            ("msgspec untyped (no checks)", msgspec.json.Decoder().decode),
            ("pydantic model_validate_json", StepEvent.model_validate_json),
            ("typed decode, pattern (before)", before.decode),
            ("typed decode, no pattern (now)", ce._WIRE_STEP.decode),
            ("build: asdict+_construct (before)",
             lambda w: _construct_before(StepEvent, msgspec.structs.asdict(w))),
            ("build: fields+slot setters (now)", _build_now),
            ("plain-step path (before)",
             lambda r: _construct_before(StepEvent, msgspec.structs.asdict(before.decode(r)))),
            ("plain-step path (now, _wire_step)", lambda r: ce._wire_step(r, 0.0)),
        ]
    if args.rev:
        old = _events_at(args.rev)
        rows.append((f"parse_event at {args.rev}", lambda r: old.parse_event(r, 0.0)))
    rows.append(("parse_event (now)", lambda r: parse_event(r, 0.0)))

    inputs = {}   # (row, group) -> the inputs it parses, or None when it does not apply
    for row, fn in rows:
        for g, ls in groups.items():
            src = structs.get(g) if row.startswith("build:") else ls
            inputs[row, g] = src if src and parses_all(fn, src) else None
    best = {key: math.inf for key, v in inputs.items() if v is not None}
    for _ in range(args.repeats):   # round robin: a change of load skews every row alike
        for row, fn in rows:
            for g in groups:
                if inputs[row, g] is not None:
                    best[row, g] = min(best[row, g], per_event(fn, inputs[row, g]))

    sizes = {g: sum(map(len, ls)) / max(len(ls), 1) for g, ls in groups.items()}
    print(f"fleet: {args.runs} runs x {args.steps} steps x 8 ranks; CPU us per event, best of "
          f"{args.repeats}; (x) = time / json.loads' time on the same lines")
    print(f"{'':34s}" + "".join(f"{g:>20s}" for g in groups))
    print(f"{'events (bytes on average)':34s}"
          + "".join(f"{f'{len(ls)} ({sizes[g]:.0f} B)':>20s}" for g, ls in groups.items()))
    for row, _ in rows:
        cells = []
        for g in groups:
            us = best.get((row, g))
            if us is None:
                cells.append(f"{'-':>20s}")
            elif row.startswith("build:"):
                cells.append(f"{us:12.2f}        ")
            else:
                cells.append(f"{us:12.2f} ({us / best['json.loads (no checks)', g]:4.2f})")
        print(f"{row:34s}" + "".join(cells))


if __name__ == "__main__":
    main()
