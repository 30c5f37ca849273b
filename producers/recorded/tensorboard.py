"""TensorBoard event files (``events.out.tfevents.*``, or a directory of them): scalars as
records, one per step (values of one step merged, steps ascending, files merged).

A TFRecord reader (lengths and payloads checked against their masked CRC-32C, computed by the
google-crc32c package) and a small protobuf decoder for ``Event{step, summary.value{tag,
simple_value | scalar tensor}}``; no TensorFlow, TensorBoard or protobuf runtime needed.

The records of a long run are many and small (a few dozen bytes each), so the per-record work
is kept short: the decoder walks a serialized Event in place (offsets into one buffer, no
sub-message copies, one-byte varints and the usual field keys read inline); a record header
(length and its CRC) already checked in this file is not checked again; the usual encodings of
a scalar tensor, and metadata bytes seen before, are recognised by their bytes. What the reader
does not need (wall time, graphs, histograms, images) is skipped, but its framing is still
checked: a record whose framing breaks is reported and skipped. ``bench/bench_readers.py``
measures it.
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


def _plugin_name(buf: bytes, i: int, end: int, plugin: object) -> object:
    """SummaryMetadata in ``buf[i:end]``: its plugin_data.plugin_name (the last plugin_data
    wins; one without a name gives None), or ``plugin`` when it has no plugin_data."""
    for key, s, e, _ in _fields(buf, i, end):
        if key == 0x0A:                                  # plugin_data
            plugin = next((buf[ps:pe].decode("utf-8", "replace")
                           for pk, ps, pe, _ in _fields(buf, s, e) if pk == 0x0A), None)
    return plugin


#: Writers repeat the same metadata bytes with every value: their plugin name, decoded once.
_PLUGIN_CACHE: dict[bytes, object] = {}
_NO_PLUGIN_DATA = object()
_UNSEEN = object()

#: The usual encodings of a scalar float TensorProto, up to the value: dtype DT_FLOAT (08 01),
#: an optional empty shape (12 00), then packed float_val (2a 04), tensor_content (22 04) or an
#: unpacked float_val (2d); the same for DT_DOUBLE (08 02; 32 08, 22 08, 31). Any other
#: encoding takes the general path, which gives the same value for these.
_F32_TENSORS = frozenset(b"\x08\x01" + shape + value for shape in (b"", b"\x12\x00")
                         for value in (b"\x2a\x04", b"\x22\x04", b"\x2d"))
_F64_TENSORS = frozenset(b"\x08\x02" + shape + value for shape in (b"", b"\x12\x00")
                         for value in (b"\x32\x08", b"\x22\x08", b"\x31"))


def _event_scalars(buf: bytes) -> tuple[int | None, list[tuple[str, float]]]:
    """(step, [(tag, value)]) of one serialized tensorflow.Event.

    The hot loop of the reader: Event, Summary and Summary.Value are walked in this one
    function, one-byte keys and lengths read inline; the rest goes through :func:`_varint`,
    :func:`_skip`, :func:`_tensor_scalar` and :func:`_plugin_name`.
    """
    step = None
    out: list[tuple[str, float]] = []
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
            continue
        if key == 0x10:                                  # step
            v = buf[i] if i < n else 0x80
            if v < 0x80:
                i += 1
            elif i + 1 < n and buf[i + 1] < 0x80:     # steps 128 to 16383
                v = (v & 0x7F) | (buf[i + 1] << 7)
                i += 2
            else:
                v, i = _varint(buf, i, n)
            step = v - (1 << 64) if v >= 1 << 63 else v
            continue
        if key != 0x2A:                                  # not the summary
            i = _skip(buf, i, key & 7, n)
            continue
        ln = buf[i] if i < n else 0x80
        if ln < 0x80:
            i += 1
        else:
            ln, i = _varint(buf, i, n)
        send = i + ln
        if send > n:
            raise ProtoError("truncated length-delimited field")
        while i < send:                                  # Summary: its values
            key = buf[i]
            if key < 0x80:
                i += 1
            else:
                key, i = _varint(buf, i, send)
            if key != 0x0A:
                i = _skip(buf, i, key & 7, send)
                continue
            ln = buf[i] if i < send else 0x80
            if ln < 0x80:
                i += 1
            else:
                ln, i = _varint(buf, i, send)
            vend = i + ln
            if vend > send:
                raise ProtoError("truncated length-delimited field")
            tag = x = tensor = None
            plugin = None
            while i < vend:                              # Summary.Value
                key = buf[i]
                if key < 0x80:
                    i += 1
                else:
                    key, i = _varint(buf, i, vend)
                if key == 0x15:                          # simple_value
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
                        meta = buf[i:stop]
                        got = _PLUGIN_CACHE.get(meta, _UNSEEN)
                        if got is _UNSEEN:
                            got = _plugin_name(buf, i, stop, _NO_PLUGIN_DATA)
                            if len(_PLUGIN_CACHE) >= 1024:
                                _PLUGIN_CACHE.clear()
                            _PLUGIN_CACHE[meta] = got
                        if got is not _NO_PLUGIN_DATA:
                            plugin = got
                    i = stop
                else:
                    i = _skip(buf, i, key & 7, vend)
            if x is None and tensor is not None and plugin in (None, "", "scalars"):
                ts, te = tensor
                if buf[ts:te - 4] in _F32_TENSORS:
                    x = _F32(buf, te - 4)[0]
                elif buf[ts:te - 8] in _F64_TENSORS:
                    x = _F64(buf, te - 8)[0]
                else:
                    x = _tensor_scalar(buf, ts, te)
            if tag is not None and x is not None:
                out.append((tag, float(x)))
    return step, out


# -- TFRecord framing ----------------------------------------------------------------------------

_HEADER = struct.Struct("<QI").unpack_from
_U32 = struct.Struct("<I").unpack_from


def _read_events(data: bytes, verify: bool, merged: dict[int, tuple[int, dict]],
                 errors: list[Item]) -> None:
    """The records of one file: scalars merged into ``merged`` ({step: (record number,
    metrics)}), reasons appended to ``errors``; stops where the framing breaks."""
    if verify and _crc_value is None:
        raise MissingCRC32C(MISSING_CRC32C)
    crc = _crc_value
    event_scalars = _event_scalars
    good_headers: set[bytes] = set()
    i, n, k = 0, len(data), 0
    while i < n:
        k += 1
        if i + 12 > n:
            errors.append((k, f"truncated record header at byte {i} (a file still being written?)"))
            return
        length, len_crc = _HEADER(data, i)
        if verify:
            header = data[i:i + 12]
            if header not in good_headers:     # a run's records have few distinct lengths
                c = crc(header[:8])
                if (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF != len_crc:
                    errors.append((k, f"bad length CRC at byte {i}: not a TFRecord file, or "
                                      "corrupted from here on"))
                    return
                good_headers.add(header)
        start = i + 12
        end = start + length
        if end + 4 > n:
            errors.append((k, f"truncated record at byte {i} (a file still being written?)"))
            return
        payload = data[start:end]
        i = end + 4
        if verify:
            c = crc(payload)
            if (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF != _U32(data, end)[0]:
                errors.append((k, f"bad data CRC in record {k} (skipped)"))
                continue
        try:
            step, scalars = event_scalars(payload)
        except (ProtoError, struct.error) as exc:
            errors.append((k, f"record {k} is not a valid Event: {exc}"))
            continue
        if not scalars:
            continue
        if step is None:
            step = 0                  # proto3 leaves out a zero step
        elif step < 0:
            errors.append((k, f"record {k} has a negative step {step}"))
            continue
        entry = merged.get(step)
        if entry is None:
            merged[step] = (k, dict(scalars))
        else:
            entry[1].update(scalars)


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
    """Scalars of TensorBoard event files, one record per step (ascending), files merged;
    first the reasons of the records that could not be used.

    Raises :class:`MissingCRC32C` when google-crc32c is not installed (and ``verify_crc``)."""
    if isinstance(paths, (str, Path)):
        paths = [Path(paths)]
    merged: dict[int, tuple[int, dict]] = {}
    errors: list[Item] = []
    for path in paths:
        _read_events(Path(path).read_bytes(), verify_crc, merged, errors)
    yield from errors
    yield from records_by_step(merged)
