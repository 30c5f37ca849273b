"""Readers of recorded runs, for ``rlwatch replay``: what the frameworks leave on disk, as
``{"step": int, "metrics": {name: float}}`` records (names as logged; a preset maps them).

* TRL / transformers ``trainer_state.json``: its ``log_history`` (entries of one step merged;
  the end-of-training summary left out). A ``.json`` list of records or contract events too.
* TensorBoard event files (``events.out.tfevents.*``, or a directory of them): a TFRecord reader
  (masked CRC-32C checked) and a minimal protobuf decoder for ``Event{wall_time, step,
  summary.value{tag, simple_value | scalar tensor}}``; no TensorFlow or TensorBoard needed.
  Values of one step are merged; steps come out ascending.
* Weights & Biases history exports: CSV (a ``_step`` or ``Step`` column; the UI's
  ``"<run> - <metric>"`` columns and their ``__MIN``/``__MAX`` companions are understood) and
  JSON lines (``wandb-history.jsonl``: ``_step``, ``_runtime``, ``_timestamp`` ...).
* Console logs: veRL's ``step:12 - actor/pg_loss:0.1 - critic/vf_loss:2.3`` lines, dicts
  printed by OpenRLHF and others (``{'train/kl': 0.01, ...}``, NumPy/torch scalar reprs
  included), and tqdm postfixes (``12/100 [00:10<01:30, kl=0.01, reward=0.5]``). Other lines
  are noise and ignored; a line that looks like metrics but does not parse is skipped and
  counted.

:func:`read_recorded` picks the reader by file name and content and returns ``(records,
skipped)``; :func:`iter_recorded` yields ``(position, record)`` or ``(position, reason)`` pairs
(position: line, row, entry or TFRecord number), the shape ``rlwatch.replay.iter_records``
yields. Contract events (``kind``/``schema``) found in JSON input pass through unchanged.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import re
import struct
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "crc32c",
    "iter_console_log",
    "iter_json_document",
    "iter_json_lines",
    "iter_recorded",
    "iter_tensorboard",
    "iter_wandb_csv",
    "masked_crc32c",
    "normalise_record",
    "read_recorded",
]

Item = tuple[int, "dict | str"]

#: Keys that count steps or time (or are run summaries), not training signals.
META_KEYS = frozenset({
    "step", "global_step", "_step", "train/global_step", "trainer/global_step", "epoch",
    "train/epoch", "total_flos", "_runtime", "_timestamp", "timestamp", "Step",
    "train_runtime", "train_samples_per_second", "train_steps_per_second",
})
STEP_KEYS = ("step", "_step", "global_step", "train/global_step", "trainer/global_step", "Step")
_SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})


# -- values --------------------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _step(v: Any) -> int | None:
    x = _num(v)
    if x is None or not math.isfinite(x) or x < 0 or not float(x).is_integer():
        return None
    return int(x)


def _metrics(d: dict, drop=META_KEYS) -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if k in drop or str(k).startswith("_"):
            continue
        x = _num(v) if not isinstance(v, str) else None   # a string in JSON is text, not a number
        if x is not None:
            out[str(k)] = x
    return out


def normalise_record(rec: dict) -> dict | None:
    """A logged dict as a replayable record, or None when it carries no step.

    Contract events and ``{"step", "metrics"}`` records are returned unchanged; a ``metrics``
    record without ``step`` gets it from ``_step``/``global_step``; a flat dict becomes
    ``{"step", "metrics"}`` with its numbers (bookkeeping keys such as ``_runtime`` left out).
    """
    if "kind" in rec or "schema" in rec:
        return rec
    if isinstance(rec.get("metrics"), dict):
        if "step" in rec:
            return rec
        step = next((s for s in (_step(rec.get(k)) for k in STEP_KEYS) if s is not None), None)
        return None if step is None else {**rec, "step": step}
    if "step" in rec:
        return rec          # replay's flat-dict handling (and its error messages) apply
    step = next((s for s in (_step(rec.get(k)) for k in STEP_KEYS) if s is not None), None)
    if step is None:
        return None
    return {"step": step, "metrics": _metrics(rec)}


# -- JSON ----------------------------------------------------------------------------------------

def iter_json_lines(text: str) -> Iterator[Item]:
    """One JSON object per line (rlwatch events, logged dicts, W&B ``wandb-history.jsonl``)."""
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


def _merge_by_step(items: Iterable[tuple[int, int, dict]]) -> Iterator[Item]:
    """(position, step, metrics) -> one record per step, ascending; later values win."""
    merged: dict[int, tuple[int, dict]] = {}
    for pos, step, metrics in items:
        if step in merged:
            merged[step][1].update(metrics)
        else:
            merged[step] = (pos, dict(metrics))
    for step in sorted(merged):
        pos, metrics = merged[step]
        if metrics:
            yield pos, {"step": step, "metrics": metrics}


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
        step = _step(row.get("step"))
        if step is None:
            errors.append((i, f"entry {i} has no usable step ({row.get('step')!r})"))
            continue
        good.append((i, step, _metrics(row)))
    yield from errors
    yield from _merge_by_step(good)


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
            yield 1, "a .json file must be a trainer_state.json (log_history) or a list of records"
        else:
            yield 1, norm
        return
    if not isinstance(data, list):
        yield 1, "a .json file must be a trainer_state.json (log_history) or a list of records"
        return
    for i, row in enumerate(data, 1):
        if not isinstance(row, dict):
            yield i, f"entry {i} is not an object"
            continue
        norm = normalise_record(row)
        if norm is not None:
            yield i, norm


# -- W&B CSV ---------------------------------------------------------------------------------------

_CSV_STEP_COLUMNS = ("_step", "step", "Step", "global_step", "train/global_step", "trainer/global_step")


def iter_wandb_csv(text: str) -> Iterator[Item]:
    """A W&B history export as CSV (or any CSV with a step column). Row numbers count the
    header as line 1."""
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        return
    header = [h.strip() for h in header]
    step_col = next((header.index(c) for c in _CSV_STEP_COLUMNS if c in header), None)
    if step_col is None:
        yield 1, f"no step column in the CSV header (one of {', '.join(_CSV_STEP_COLUMNS)})"
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
        step = _step(row[step_col])
        if step is None:
            yield n, f"bad step {row[step_col]!r}"
            continue
        metrics = {}
        for i, name in columns.items():
            if i < len(row) and row[i].strip():
                x = _num(row[i])
                if x is not None:
                    metrics[name] = x
        if metrics:
            yield n, {"step": step, "metrics": metrics}


# -- console logs ------------------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf|Infinity)"
# np.float64(0.1), np.float32(1e-3), tensor(0.1, device='cuda:0'), torch.tensor(2.)
_WRAPPED = re.compile(r"\b(?:np\.|numpy\.)?(?:float|int|uint)\d*\(\s*(" + _NUM + r")\s*\)"
                      r"|\b(?:torch\.)?tensor\(\s*(" + _NUM + r")\s*(?:,[^()]*)?\)")
_VERL_STEP = re.compile(r"(?:^|[\s(|\]])step:(\d+)(?:\s+-\s+|\s*$)")
_DICT_START = re.compile(r"\{\s*['\"][^'\"]+['\"]\s*:")
_DICT_PAIR = re.compile(r"['\"]([^'\"]+)['\"]\s*:\s*(" + _NUM + r")(?=\s*[,}])")
_TQDM = re.compile(r"(\d+)/(\d+)\s*\[[^\]]*?,\s*([A-Za-z_][\w/.]*\s*=[^\]]*)\]")
_TQDM_PAIR = re.compile(r"([A-Za-z_][\w/.]*)\s*=\s*(" + _NUM + r")(?=\s*(?:,|$))")
_STEP_IN_TEXT = re.compile(r"\b(?:global_step|step)\s*[:=]?\s*(\d+)\b", re.IGNORECASE)
_PROGRESS = re.compile(r"\b(\d+)/\d+\b")


def _unwrap(s: str) -> str:
    return _WRAPPED.sub(lambda m: m.group(1) or m.group(2), s)


def _dict_span(line: str, start: int) -> int | None:
    """End (exclusive) of the brace-balanced dict that opens at ``start``, or None if cut."""
    depth, quote = 0, None
    for i in range(start, len(line)):
        c = line[i]
        if quote:
            if c == quote and line[i - 1] != "\\":
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _parse_dict_text(s: str) -> dict | None:
    s = _unwrap(s)
    try:
        d = ast.literal_eval(s)
        if isinstance(d, dict):
            return d
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        pass
    pairs = _DICT_PAIR.findall(s)  # e.g. a repr with objects literal_eval refuses
    return {k: float(v) for k, v in pairs} if pairs else None


def _console_line(line: str) -> tuple[int, dict] | str | None:
    """(step, metrics), a reason when the line looks like metrics but does not parse, or None
    for a line that is not about metrics."""
    m = _VERL_STEP.search(line)
    if m:                                   # veRL: step:12 - actor/pg_loss:0.1 - ...
        metrics = {}
        for seg in line[m.end():].split(" - "):
            key, sep, val = seg.strip().rpartition(":")
            if not sep or not key:
                continue
            x = _num(_unwrap(val.strip()))
            if x is not None and val.strip() not in ("True", "False"):
                metrics[key.strip()] = x
        if not metrics:
            return "a veRL step line without a name:value pair that parsed"
        return int(m.group(1)), metrics
    d = _DICT_START.search(line)
    if d:                                   # a printed dict: {'train/kl': 0.01, ...}
        end = _dict_span(line, d.start())
        if end is None:
            return "a printed dict that is cut off"
        parsed = _parse_dict_text(line[d.start():end])
        if parsed is None:
            return "a printed dict that does not parse"
        metrics = {k: v for k, v in _metrics(parsed).items()}
        if not metrics:
            return None                     # a dict of settings, not of metrics
        step = next((s for s in (_step(parsed.get(k)) for k in STEP_KEYS) if s is not None), None)
        if step is None:
            outside = line[:d.start()] + " " + line[end:]
            sm = _STEP_IN_TEXT.search(outside) or _PROGRESS.search(outside)
            if sm is None:  # a made-up step would misplace the values: skip, and say so
                return "a printed dict without a step (no step/global_step key, no n/total)"
            step = int(sm.group(1))
        return step, metrics
    t = _TQDM.search(line)
    if t:                                   # tqdm postfix: 12/100 [00:10<01:30, kl=0.01, ...]
        metrics = {k: float(v) for k, v in _TQDM_PAIR.findall(_unwrap(t.group(3)))}
        if not metrics:
            return "a progress bar postfix without a name=value pair that parsed"
        return int(t.group(1)), metrics
    return None


def iter_console_log(text: str) -> Iterator[Item]:
    """veRL console lines, printed dicts (OpenRLHF) and tqdm postfixes; other lines are noise
    and ignored. Consecutive lines of one step are merged."""
    pending: tuple[int, int, dict] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        got = _console_line(line)
        if got is None:
            continue
        if isinstance(got, str):
            yield n, got
            continue
        step, metrics = got
        if pending is not None and pending[1] == step:
            pending[2].update(metrics)
        else:
            if pending is not None:
                yield pending[0], {"step": pending[1], "metrics": pending[2]}
            pending = (n, step, metrics)
    if pending is not None:
        yield pending[0], {"step": pending[1], "metrics": pending[2]}


# -- TensorBoard ---------------------------------------------------------------------------------------

def _crc32c_table() -> list[int]:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it."""
    table = _CRC_TABLE
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits and add 0xa282ead8."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class ProtoError(ValueError):
    pass


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ProtoError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: ints for varint/fixed, bytes
    for length-delimited (fixed64/fixed32 as raw bytes, decoded by the caller)."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            if i + 8 > n:
                raise ProtoError("truncated fixed64")
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            ln, i = _varint(buf, i)
            if i + ln > n:
                raise ProtoError("truncated length-delimited field")
            v, i = buf[i:i + ln], i + ln
        elif wt == 5:
            if i + 4 > n:
                raise ProtoError("truncated fixed32")
            v, i = buf[i:i + 4], i + 4
        else:
            raise ProtoError(f"unsupported wire type {wt}")
        yield field, wt, v


_DT = {1: ("<f", 4), 2: ("<d", 8), 3: ("<i", 4), 9: ("<q", 8), 4: ("<B", 1), 5: ("<h", 2), 6: ("<b", 1)}


def _tensor_scalar(buf: bytes) -> float | None:
    """A scalar TensorProto's value (tf.summary.scalar / TF2 writers), else None."""
    dtype, content, dims = 0, None, []
    vals: dict[int, list[float]] = {}
    for f, wt, v in _fields(buf):
        if f == 1 and wt == 0:
            dtype = v
        elif f == 2 and wt == 2:
            for sf, swt, sv in _fields(v):
                if sf == 2 and swt == 2:
                    size = next((x for ff, ww, x in _fields(sv) if ff == 1 and ww == 0), 0)
                    dims.append(size)
        elif f == 4 and wt == 2:
            content = v
        elif f in (5, 6, 7, 10):       # float_val, double_val, int_val, int64_val
            out = vals.setdefault(f, [])
            if wt == 2:                # packed
                if f == 5:
                    out += [x[0] for x in struct.iter_unpack("<f", v[:len(v) // 4 * 4])]
                elif f == 6:
                    out += [x[0] for x in struct.iter_unpack("<d", v[:len(v) // 8 * 8])]
                else:
                    j = 0
                    while j < len(v):
                        x, j = _varint(v, j)
                        out.append(float(x - (1 << 64) if x >= 1 << 63 else x))
            elif wt == 5:
                out.append(struct.unpack("<f", v)[0])
            elif wt == 1:
                out.append(struct.unpack("<d", v)[0])
            elif wt == 0:
                out.append(float(v - (1 << 64) if v >= 1 << 63 else v))
    if any(d != 1 for d in dims):
        return None
    if content is not None and dtype in _DT:
        fmt, size = _DT[dtype]
        return float(struct.unpack(fmt, content)[0]) if len(content) == size else None
    for f in (5, 6, 7, 10):
        if len(vals.get(f, ())) == 1:
            return float(vals[f][0])
    return None


def _event_scalars(buf: bytes) -> tuple[int | None, list[tuple[str, float]]]:
    """(step, [(tag, value)]) of one serialized tensorflow.Event."""
    step = None
    scalars: list[tuple[str, float]] = []
    for f, wt, v in _fields(buf):
        if f == 2 and wt == 0:
            step = v - (1 << 64) if v >= 1 << 63 else v
        elif f == 5 and wt == 2:                       # summary
            for sf, swt, value in _fields(v):
                if sf != 1 or swt != 2:
                    continue
                tag, x, tensor, plugin = None, None, None, None
                for vf, vwt, vv in _fields(value):
                    if vf == 1 and vwt == 2:
                        tag = vv.decode("utf-8", "replace")
                    elif vf == 2 and vwt == 5:
                        x = struct.unpack("<f", vv)[0]
                    elif vf == 8 and vwt == 2:
                        tensor = vv
                    elif vf == 9 and vwt == 2:         # metadata.plugin_data.plugin_name
                        for mf, mwt, mv in _fields(vv):
                            if mf == 1 and mwt == 2:
                                plugin = next((pv.decode("utf-8", "replace") for pf, pw, pv in _fields(mv)
                                               if pf == 1 and pw == 2), None)
                if x is None and tensor is not None and plugin in (None, "", "scalars"):
                    x = _tensor_scalar(tensor)
                if tag is not None and x is not None:
                    scalars.append((tag, float(x)))
    return step, scalars


def _tfrecords(data: bytes, verify: bool = True) -> Iterator[tuple[int, bytes | str]]:
    """(record number, payload) or (record number, reason); stops where the framing breaks."""
    i, n, k = 0, len(data), 0
    while i < n:
        k += 1
        if i + 12 > n:
            yield k, f"truncated record header at byte {i} (a file still being written?)"
            return
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (len_crc,) = struct.unpack("<I", data[i + 8:i + 12])
        if verify and masked_crc32c(header) != len_crc:
            yield k, f"bad length CRC at byte {i}: not a TFRecord file, or corrupted from here on"
            return
        start, end = i + 12, i + 12 + length
        if end + 4 > n:
            yield k, f"truncated record at byte {i} (a file still being written?)"
            return
        payload = data[start:end]
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        i = end + 4
        if verify and masked_crc32c(payload) != data_crc:
            yield k, f"bad data CRC in record {k} (skipped)"
            continue
        yield k, payload


def is_tfrecord(head: bytes) -> bool:
    """True when the first 12 bytes are a TFRecord header with a valid length CRC."""
    if len(head) < 12:
        return False
    return masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


def iter_tensorboard(paths: Path | Iterable[Path], *, verify_crc: bool = True) -> Iterator[Item]:
    """Scalars of TensorBoard event files, one record per step (ascending), files merged."""
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    good: list[tuple[int, int, dict]] = []
    errors: list[Item] = []
    for path in paths:
        data = Path(path).read_bytes()
        for k, payload in _tfrecords(data, verify_crc):
            if isinstance(payload, str):
                errors.append((k, payload))
                continue
            try:
                step, scalars = _event_scalars(payload)
            except (ProtoError, struct.error, UnicodeDecodeError) as exc:
                errors.append((k, f"record {k} is not a valid Event: {exc}"))
                continue
            if scalars:
                if step is None:
                    step = 0   # proto3 leaves out a zero step
                if step < 0:
                    errors.append((k, f"record {k} has a negative step {step}"))
                    continue
                good.append((k, step, dict(scalars)))
    yield from errors
    yield from _merge_by_step(good)


# -- dispatch ------------------------------------------------------------------------------------------

def _tb_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and "tfevents" in p.name)


def _kind(path: Path) -> str:
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
    if "," in first and any(c in [h.strip() for h in next(csv.reader([first]))] for c in _CSV_STEP_COLUMNS):
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
        files = _tb_files(path)
        if not files:
            yield 0, f"{path} is a directory without trainer_state.json or TensorBoard event files"
            return
        yield from iter_tensorboard(files)
        return
    kind = _kind(path)
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
