"""The values of the worker's run-state table (``rlwatch-runs``): a run's ``to_state()`` as bytes.

A state is written as MessagePack (msgspec): 40 to 70 times quicker to write than the JSON text
earlier workers wrote (``bench/bench_state_codec.py``) and half its size, and, unlike fast JSON
writers such as orjson (NaN written as null), it keeps every float64 exactly, NaN and the
infinities included (alert values, thresholds and statistics hold them legitimately).

Reading takes either format, so states an older worker left in the changelog still load: JSON
text starts with ``{`` (0x7b), which never starts a MessagePack map (a map's first byte is a
fixmap 0x80-0x8f, map16 0xde or map32 0xdf; 0x00-0x7f are positive integers).

What MessagePack keeps that JSON did not: integer dict keys stay integers and tuples become
lists (as in JSON). ``RunState.to_state`` writes its keys as strings, so both formats give the
same dict back.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

__all__ = ["StateDecodeError", "decode_state", "encode_state"]

#: first bytes of a JSON text holding an object (earlier workers wrote ``json.dumps(...)``)
_JSON_FIRST = frozenset(b"{ \t\r\n")


class StateDecodeError(ValueError):
    """The stored value is no run state (corrupt, truncated, or not a map)."""


def _enc_hook(obj: Any) -> Any:
    # a float subclass (numpy's float64) is written as the float it is, as json.dumps did
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, int):
        return int(obj)
    raise TypeError(f"cannot store a {type(obj).__name__} in a run state")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder()


def encode_state(state: dict) -> bytes:
    """A run's state as MessagePack bytes (JSON text in the rare case MessagePack cannot hold a
    value: an integer beyond 64 bits, a string with a lone surrogate; :func:`decode_state` reads
    both)."""
    try:
        return _encoder.encode(state)
    except (TypeError, ValueError, OverflowError):   # UnicodeEncodeError is a ValueError
        return json.dumps(state, allow_nan=True, default=_unpacked).encode()


def _unpacked(obj: Any) -> Any:
    """For the JSON fallback: a part that came ready as MessagePack (``msgspec.Raw``, see
    ``RunState.to_state(packed=True)``) as the data it holds."""
    if isinstance(obj, msgspec.Raw):
        return _decoder.decode(obj)
    raise TypeError(f"cannot store a {type(obj).__name__} in a run state")


def decode_state(raw: bytes | bytearray | memoryview | str) -> dict:
    """The state dict of a stored value, MessagePack or JSON; :class:`StateDecodeError` when it
    is neither, or not a map."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    elif not isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw)
    if not raw:
        raise StateDecodeError("empty value")
    try:
        data = json.loads(raw) if raw[0] in _JSON_FIRST else _decoder.decode(raw)
    except Exception as exc:  # noqa: BLE001 - anything a corrupt value makes the readers raise
        kind = "JSON" if raw[0] in _JSON_FIRST else "MessagePack"
        raise StateDecodeError(f"unreadable {kind} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(data, dict):
        raise StateDecodeError(f"a {type(data).__name__}, not a map")
    return data
