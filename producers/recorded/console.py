"""Console logs: veRL's ``step:12 - actor/pg_loss:0.1 - critic/vf_loss:2.3`` lines, dicts
printed by OpenRLHF and others (``{'train/kl': 0.01, ...}``, NumPy/torch scalar reprs
included), and tqdm postfixes (``12/100 [00:10<01:30, kl=0.01, reward=0.5]``). Other lines are
noise and ignored; a line that looks like metrics but does not parse is skipped and counted."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from producers.recorded._common import Item, first_step, metrics_of, num

__all__ = ["iter_console_log"]

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
            x = num(_unwrap(val.strip()))
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
        metrics = metrics_of(parsed)
        if not metrics:
            return None                     # a dict of settings, not of metrics
        step = first_step(parsed)
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
