"""TensorBoard event files (``events.out.tfevents.*``, or a directory of them): scalars as
records, one per step (values of one step merged, steps ascending, files merged).

A TFRecord reader (lengths and payloads checked against their masked CRC-32C, computed by the
google-crc32c package) and a small protobuf decoder for ``Event{step, summary.value{tag,
simple_value | scalar tensor}}``; no TensorFlow, TensorBoard or protobuf runtime needed.

The decoder walks a serialized Event in place (offsets into one buffer, no sub-message copies,
one-byte varints and the usual field keys read inline), as the records of a long run are many
and small (a few dozen bytes each). What it does not need (wall time, graphs, histograms,
images) is skipped, but its framing is still checked: a record whose framing breaks is reported
and skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from producers.recorded._common import Item, records_by_step

try:
    from google_crc32c import extend as _crc_extend, value as _crc_value
except ImportError:      # a broken install: rlwatch depends on google-crc32c
    _crc_extend = _crc_value = None

__all__ = ["MissingCRC32C", "ProtoError", "crc32c", "is_tfrecord", "iter_tensorboard",
           "masked_crc32c", "tensorboard_files"]

MISSING_CRC32C = ("reading TensorBoard event files needs the google-crc32c package, a dependency "
                  "of rlwatch: pip install google-crc32c")


class MissingCRC32C(ImportError):
    """google-crc32c is not installed (the message says how to install it)."""


class ProtoError(ValueError):
    pass


# -- CRC-32C -------------------------------------------------------------------------------------

def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it; ``crc`` continues an earlier checksum."""
    if _crc_extend is None:
        raise MissingCRC32C(MISSING_CRC32C)
    return _crc_extend(crc, bytes(data))


def _mask(c: int) -> int:
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits and add 0xa282ead8."""
    return _mask(crc32c(data))


# -- protobuf ------------------------------------------------------------------------------------

_F32 = struct.Struct("<f").unpack_from
_F64 = struct.Struct("<d").unpack_from


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """(value, next offset) of the varint at ``buf[i]``, which must end before ``end``."""
    shift = result = 0
    while True:
        if i >= end:
            raise ProtoError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


def _skip(buf: bytes, i: int, wt: int, end: int) -> int:
    """Offset after a field of wire type ``wt`` whose value starts at ``i``."""
    if wt == 0:
        return _varint(buf, i, end)[1]
    if wt == 1:
        i += 8
        if i > end:
            raise ProtoError("truncated fixed64")
        return i
    if wt == 2:
        ln, i = _varint(buf, i, end)
        i += ln
        if i > end:
            raise ProtoError("truncated length-delimited field")
        return i
    if wt == 5:
        i += 4
        if i > end:
            raise ProtoError("truncated fixed32")
        return i
    raise ProtoError(f"unsupported wire type {wt}")


def _fields(buf: bytes, i: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(key, start, stop, varint value) of each field of the message in ``buf[i:end]``: key is
    ``field << 3 | wire type``; ``buf[start:stop]`` holds a length-delimited or fixed value, the
    last item a varint's value (0 for the other wire types)."""
    while i < end:
        key = buf[i]
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(buf, i, end)
        wt = key & 7
        if wt == 2:
            ln = buf[i] if i < end else 0x80
            if ln < 0x80:
                i += 1
            else:
                ln, i = _varint(buf, i, end)
            stop = i + ln
            if stop > end:
                raise ProtoError("truncated length-delimited field")
            yield key, i, stop, 0
            i = stop
        elif wt == 0:
            v, i = _varint(buf, i, end)
            yield key, i, i, v
        else:
            stop = _skip(buf, i, wt, end)
            yield key, i, stop, 0
            i = stop


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# TensorProto dtype -> (struct format, size) of a scalar's tensor_content
_DT = {1: ("<f", 4), 2: ("<d", 8), 3: ("<i", 4), 9: ("<q", 8), 4: ("<B", 1), 5: ("<h", 2), 6: ("<b", 1)}


def _tensor_scalar(buf: bytes, i: int, end: int) -> float | None:
    """A scalar TensorProto's value (tf.summary.scalar / TF2 writers), else None."""
    dtype, content, dims = 0, None, []
    vals: dict[int, list[float]] = {}
    for key, s, e, v in _fields(buf, i, end):
        f, wt = key >> 3, key & 7
        if key == 0x08:                                  # dtype
            dtype = v
        elif key == 0x12:                                # tensor_shape
            for dkey, ds, de, _ in _fields(buf, s, e):
                if dkey == 0x12:                         # dim: its size
                    size = next((x for k, _, _, x in _fields(buf, ds, de) if k == 0x08), 0)
                    dims.append(size)
        elif key == 0x22:                                # tensor_content
            content = buf[s:e]
        elif f in (5, 6, 7, 10):       # float_val, double_val, int_val, int64_val
            out = vals.setdefault(f, [])
            if wt == 2:                # packed
                if f == 5:
                    out += [x[0] for x in struct.iter_unpack("<f", buf[s:s + (e - s) // 4 * 4])]
                elif f == 6:
                    out += [x[0] for x in struct.iter_unpack("<d", buf[s:s + (e - s) // 8 * 8])]
                else:
                    j = s
                    while j < e:
                        x, j = _varint(buf, j, e)
                        out.append(float(_signed64(x)))
            elif wt == 5:
                out.append(_F32(buf, s)[0])
            elif wt == 1:
                out.append(_F64(buf, s)[0])
            elif wt == 0:
                out.append(float(_signed64(v)))
    if any(d != 1 for d in dims):
        return None
    if content is not None and dtype in _DT:
        fmt, size = _DT[dtype]
        return float(struct.unpack(fmt, content)[0]) if len(content) == size else None
    for f in (5, 6, 7, 10):
        if len(vals.get(f, ())) == 1:
            return float(vals[f][0])
    return None


def _plugin_name(buf: bytes, i: int, end: int, plugin: str | None) -> str | None:
    """SummaryMetadata in ``buf[i:end]``: its plugin_data.plugin_name (the last plugin_data
    wins; one without a name gives None), or ``plugin`` when it has no plugin_data."""
    for key, s, e, _ in _fields(buf, i, end):
        if key == 0x0A:                                  # plugin_data
            plugin = next((buf[ps:pe].decode("utf-8", "replace")
                           for pk, ps, pe, _ in _fields(buf, s, e) if pk == 0x0A), None)
    return plugin


def _summary(buf: bytes, i: int, end: int, out: list[tuple[str, float]]) -> None:
    """Append (tag, value) of each scalar Summary.Value in ``buf[i:end]`` to ``out``."""
    while i < end:
        key = buf[i]
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(buf, i, end)
        if key != 0x0A:                                  # not a value
            i = _skip(buf, i, key & 7, end)
            continue
        ln = buf[i] if i < end else 0x80
        if ln < 0x80:
            i += 1
        else:
            ln, i = _varint(buf, i, end)
        vend = i + ln
        if vend > end:
            raise ProtoError("truncated length-delimited field")
        tag = x = None
        tensor = None
        plugin = None
        while i < vend:
            key = buf[i]
            if key < 0x80:
                i += 1
            else:
                key, i = _varint(buf, i, vend)
            if key == 0x15:                              # simple_value
                if i + 4 > vend:
                    raise ProtoError("truncated fixed32")
                x = _F32(buf, i)[0]
                i += 4
            elif key == 0x0A or key == 0x42 or key == 0x4A:   # tag, tensor, metadata
                ln = buf[i] if i < vend else 0x80
                if ln < 0x80:
                    i += 1
                else:
                    ln, i = _varint(buf, i, vend)
                stop = i + ln
                if stop > vend:
                    raise ProtoError("truncated length-delimited field")
                if key == 0x0A:
                    tag = buf[i:stop].decode("utf-8", "replace")
                elif key == 0x42:
                    tensor = (i, stop)
                else:
                    plugin = _plugin_name(buf, i, stop, plugin)
                i = stop
            else:
                i = _skip(buf, i, key & 7, vend)
        if x is None and tensor is not None and plugin in (None, "", "scalars"):
            x = _tensor_scalar(buf, tensor[0], tensor[1])
        if tag is not None and x is not None:
            out.append((tag, float(x)))


def _event_scalars(buf: bytes) -> tuple[int | None, list[tuple[str, float]]]:
    """(step, [(tag, value)]) of one serialized tensorflow.Event."""
    step = None
    scalars: list[tuple[str, float]] = []
    i, n = 0, len(buf)
    while i < n:
        key = buf[i]
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(buf, i, n)
        if key == 0x09:                                  # wall_time
            i += 8
            if i > n:
                raise ProtoError("truncated fixed64")
        elif key == 0x10:                                # step
            v = buf[i] if i < n else 0x80
            if v < 0x80:
                i += 1
            else:
                v, i = _varint(buf, i, n)
            step = _signed64(v)
        elif key == 0x2A:                                # summary
            ln = buf[i] if i < n else 0x80
            if ln < 0x80:
                i += 1
            else:
                ln, i = _varint(buf, i, n)
            stop = i + ln
            if stop > n:
                raise ProtoError("truncated length-delimited field")
            _summary(buf, i, stop, scalars)
            i = stop
        else:
            i = _skip(buf, i, key & 7, n)
    return step, scalars


# -- TFRecord framing ----------------------------------------------------------------------------

_HEADER = struct.Struct("<QI").unpack_from
_U32 = struct.Struct("<I").unpack_from


def _tfrecords(data: bytes, verify: bool = True) -> Iterator[tuple[int, bytes | str]]:
    """(record number, payload) or (record number, reason); stops where the framing breaks."""
    if verify and _crc_value is None:
        raise MissingCRC32C(MISSING_CRC32C)
    crc = _crc_value
    i, n, k = 0, len(data), 0
    while i < n:
        k += 1
        if i + 12 > n:
            yield k, f"truncated record header at byte {i} (a file still being written?)"
            return
        length, len_crc = _HEADER(data, i)
        if verify:
            c = crc(data[i:i + 8])
            if (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF != len_crc:
                yield k, f"bad length CRC at byte {i}: not a TFRecord file, or corrupted from here on"
                return
        start = i + 12
        end = start + length
        if end + 4 > n:
            yield k, f"truncated record at byte {i} (a file still being written?)"
            return
        payload = data[start:end]
        i = end + 4
        if verify:
            c = crc(payload)
            if (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF != _U32(data, end)[0]:
                yield k, f"bad data CRC in record {k} (skipped)"
                continue
        yield k, payload


def is_tfrecord(head: bytes) -> bool:
    """True when the first 12 bytes are a TFRecord header with a valid length CRC.

    Without google-crc32c, a header whose length fits in 32 bits followed by an Event's first
    field (its wall time) counts, so that reading the file says what is missing.
    """
    if len(head) < 12:
        return False
    if _crc_value is None:
        return struct.unpack("<Q", head[:8])[0] < 1 << 32 and head[12:13] == b"\x09"
    return masked_crc32c(head[:8]) == struct.unpack("<I", head[8:12])[0]


def tensorboard_files(directory: Path) -> list[Path]:
    """The TensorBoard event files under ``directory`` (recursively), sorted by path."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and "tfevents" in p.name)


def iter_tensorboard(paths: Path | Iterable[Path], *, verify_crc: bool = True) -> Iterator[Item]:
    """Scalars of TensorBoard event files, one record per step (ascending), files merged.

    Raises :class:`MissingCRC32C` when google-crc32c is not installed (and ``verify_crc``)."""
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    merged: dict[int, tuple[int, dict]] = {}
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
                entry = merged.get(step)
                if entry is None:
                    merged[step] = (k, dict(scalars))
                else:
                    entry[1].update(scalars)
    yield from errors
    yield from records_by_step(merged)
