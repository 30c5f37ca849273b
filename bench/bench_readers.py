"""Throughput of the TensorBoard reader (``python bench/bench_readers.py``).

Writes a synthetic TensorBoard event file (default ~50 MB; 30 scalar tags per step, one Event per
scalar as PyTorch's ``SummaryWriter.add_scalar`` does; three tags in four as ``simple_value``,
one in four as a TF2-style scalar tensor with plugin metadata) and reads it:

* ``new``: ``producers.recorded.tensorboard.iter_tensorboard`` (CRC-32C from google-crc32c);
* ``new, no CRC``: the same with ``verify_crc=False``, i.e. the protobuf decoding alone;
* ``old``: the reader as it was before it moved to ``producers/recorded/`` (a pure-Python
  table-driven CRC-32C and the previous decoding loop), loaded from git history when the
  repository has it (``--old-rev``), else left out.

Also the CRC-32C alone over the file's bytes: the pure-Python table (kept here only for this
comparison) beside google-crc32c.

Figures are MB of event file per second of CPU time of this process (``time.process_time``,
steadier than wall time on a shared machine), best of ``--rounds`` (default 3; the old reader
runs once).
Options: ``--mb N`` (file size, default 50), ``--rounds R``, ``--profile`` (cProfile of one
read by the new reader, top 15 by own time), ``--keep PATH`` (write the file there and keep it).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import struct
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import google_crc32c  # noqa: E402

from producers.recorded.tensorboard import iter_tensorboard  # noqa: E402

#: The last commit with the single-module reader (rlwatch/recorded.py).
OLD_REV = "99c8e16"

# -- the pure-Python CRC-32C the old reader used (for the comparison only) ----------------------


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


def crc32c_pure(data: bytes, crc: int = 0) -> int:
    table = _CRC_TABLE
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# -- a synthetic event file ----------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, wt: int, payload: bytes) -> bytes:
    key = _varint((num << 3) | wt)
    return key + _varint(len(payload)) + payload if wt == 2 else key + payload


def _masked(data: bytes) -> int:
    c = google_crc32c.value(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return (header + struct.pack("<I", _masked(header)) + payload
            + struct.pack("<I", _masked(payload)))


TAGS = [f"{group}/{name}" for group in ("train", "actor", "critic")
        for name in ("kl", "reward_mean", "reward_std", "entropy", "pg_loss", "vf_loss",
                     "grad_norm", "clip_frac", "lr", "response_length")]


def write_event_file(path: Path, mb: float) -> tuple[int, int]:
    """Write ~``mb`` MB of scalar events; returns (records, steps)."""
    target = int(mb * 1_000_000)
    meta = _field(1, 2, _field(1, 2, b"scalars"))
    size = records = step = 0
    with path.open("wb") as fh:
        first = _tfrecord(_field(1, 1, struct.pack("<d", 1.7e9)) + _field(3, 2, b"brain.Event:2"))
        fh.write(first)
        size += len(first)
        records += 1
        while size < target:
            step += 1
            chunk = []
            for i, tag in enumerate(TAGS):
                x = 0.001 * step + i
                if i % 4 == 3:
                    tensor = _field(1, 0, _varint(1)) + _field(5, 2, struct.pack("<f", x))
                    value = _field(1, 2, tag.encode()) + _field(9, 2, meta) + _field(8, 2, tensor)
                else:
                    value = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", x))
                ev = (_field(1, 1, struct.pack("<d", 1.7e9 + step)) + _field(2, 0, _varint(step))
                      + _field(5, 2, _field(1, 2, value)))
                chunk.append(_tfrecord(ev))
            blob = b"".join(chunk)
            fh.write(blob)
            size += len(blob)
            records += len(chunk)
    return records, step


# -- the old reader, from git history ------------------------------------------------------------


def load_old_reader(rev: str):
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:rlwatch/recorded.py"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("old_recorded")
    mod.__file__ = f"{rev}:rlwatch/recorded.py"
    sys.modules[mod.__name__] = mod     # dataclass/typing machinery looks the module up
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


# -- measuring -----------------------------------------------------------------------------------


def best_of(rounds: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(rounds):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old-rev", default=OLD_REV)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()

    tmp = None
    if args.keep:
        path = args.keep
    else:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "events.out.tfevents.1700000000.bench"
    try:
        n_records, n_steps = write_event_file(path, args.mb)
        mb = path.stat().st_size / 1e6
        print(f"file: {mb:.1f} MB, {n_records:,} records, {n_steps:,} steps x {len(TAGS)} tags")

        def read(reader, **kw):
            return lambda: list(reader(path, **kw))

        t_new, out_new = best_of(args.rounds, read(iter_tensorboard))
        t_nocrc, _ = best_of(args.rounds, read(iter_tensorboard, verify_crc=False))
        old = load_old_reader(args.old_rev)
        t_old = out_old = None
        if old is not None:
            t_old, out_old = best_of(1, read(old.iter_tensorboard))
        assert len(out_new) == n_steps and not any(isinstance(r, str) for _, r in out_new)
        if out_old is not None:
            assert out_old == out_new, "old and new readers disagree"

        print()
        print(f"{'reader':<34}{'CPU s':>10}{'MB/s':>10}")
        if t_old is not None:
            print(f"{'old (' + args.old_rev + ', pure-Python CRC)':<34}{t_old:>10.2f}{mb / t_old:>10.1f}")
        else:
            print(f"{'old':<34}{'n/a (no git history)':>20}")
        print(f"{'new (google-crc32c)':<34}{t_new:>10.2f}{mb / t_new:>10.1f}")
        print(f"{'new, verify_crc=False':<34}{t_nocrc:>10.2f}{mb / t_nocrc:>10.1f}")
        if t_old is not None:
            print(f"speed-up, old -> new: {t_old / t_new:.1f}x")

        data = path.read_bytes()
        sample = data[: min(len(data), 5_000_000)]
        t_pure, c1 = best_of(1, lambda: crc32c_pure(sample))
        t_lib, c2 = best_of(args.rounds, lambda: google_crc32c.value(data))
        assert c1 == google_crc32c.value(sample)
        print()
        print("CRC-32C alone, whole buffer in one call:")
        print(f"  pure-Python table (first {len(sample) / 1e6:.0f} MB){'':<6}{len(sample) / 1e6 / t_pure:>10.1f} MB/s")
        print(f"  google-crc32c ({google_crc32c.implementation}){'':<20}{mb / t_lib:>10.1f} MB/s")

        if args.profile:
            print()
            prof = cProfile.Profile()
            prof.enable()
            list(iter_tensorboard(path))
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
