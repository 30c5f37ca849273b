"""Alert record of the public contract (contract.md, section 3).

What the rule engine emits, what goes on the Kafka topic ``rlwatch.alerts``, what notifiers
render and what ``rlwatch replay --json`` prints, one per line. Pure.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticSerializationError

from contract.events import strict_json, to_jsonable

__all__ = ["SEVERITIES", "Alert", "Raw", "fingerprint", "read_json", "severity_rank", "splice_json"]

try:
    from msgspec import DecodeError as _DecodeError
    from msgspec import Raw
    from msgspec import ValidationError as _ValidationError
    from msgspec.json import Decoder as _Decoder
    from msgspec.json import decode as _decode
    from msgspec.json import encode as _encode
    # an alert's fields, each the JSON text it came in (Alert.from_json_keeping_snapshot)
    _FIELDS = _Decoder(dict[str, Raw])
except ImportError:  # pragma: no cover - msgspec is a dependency
    _decode = _FIELDS = None

    class Raw:  # (never made without msgspec; only for isinstance)
        pass


def read_json(raw: bytes | str) -> Any:
    """``json.loads``, through msgspec when it can read the text (strict JSON: what alerts are
    written as); anything else (a NaN literal from a foreign producer, say) goes to
    ``json.loads``, which also gives the error of text that is no JSON at all."""
    if _decode is not None:
        try:
            return _decode(raw)
        except _DecodeError:
            pass
    return json.loads(raw)

Severity = Literal["info", "yellow", "orange", "red", "black"]
SEVERITIES: tuple[str, ...] = ("info", "yellow", "orange", "red", "black")


def severity_rank(severity: str) -> int:
    """0 for info ... 4 for black."""
    return SEVERITIES.index(severity)


def fingerprint(rule: str, run_id: str, rank: int | None, severity: str) -> str:
    """Stable identity of an alert: the same (rule, run, rank, tier) always hashes the same."""
    key = json.dumps([rule, run_id, rank, severity], separators=(",", ":"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Alert(BaseModel):
    # ser_json_inf_nan: model_dump_json writes non-finite floats (fields and extras alike) as
    # the contract's strings, as strict_json does
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    rule: str
    severity: Severity
    state: Literal["firing", "resolved"]
    run_id: str
    step: int
    rank: int | None = None
    onset_step: int | None = None
    value: float | None = None
    threshold: float | None = None
    metric: str | None = None
    actions: list[str] = Field(default_factory=list)
    adjust: dict[str, float] = Field(default_factory=dict)
    rollback_to: dict[str, Any] | None = None
    summary: str = ""
    diagnosis: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    fingerprint: str = ""
    ts: float | None = None

    def model_post_init(self, __context: Any) -> None:
        if not self.fingerprint:
            self.fingerprint = fingerprint(self.rule, self.run_id, self.rank, self.severity)

    def to_json(self) -> str:
        """One strict-JSON line (non-finite values as the contract's strings).

        Written by pydantic's serializer in Rust: an alert carrying a snapshot (tens of
        kilobytes) in about a tenth of the time of ``model_dump`` and ``json.dumps``
        (``bench/bench_alert_json.py``). The text is the same JSON value as
        :func:`contract.events.strict_json` gives, in other spellings: non-ASCII characters
        as UTF-8 rather than ``\\u`` escapes, floats in Rust's shortest form (``0.00001``
        for ``1e-05``). Extras it cannot write (a lone surrogate in a text, a type JSON does
        not know) take ``strict_json``, which gives its own error for those it cannot write
        either.

        A snapshot kept as the JSON text it came in (:meth:`from_json_keeping_snapshot`) is
        written as that text."""
        extra = self.__pydantic_extra__
        if extra and isinstance(extra.get("snapshot"), Raw):
            head = self.model_copy()
            head.__pydantic_extra__ = {k: v for k, v in extra.items() if k != "snapshot"}
            return splice_json(head.to_json(), "snapshot", extra["snapshot"]).decode()
        try:
            return self.model_dump_json()
        except PydanticSerializationError:
            return self.to_json_standard()

    def to_json_standard(self) -> str:
        """The same alert through ``model_dump`` and :func:`strict_json` (``json.dumps``): how
        :meth:`to_json` writes what pydantic's serializer cannot, and all it did before."""
        data = self.model_dump(exclude_defaults=False)
        for key in ("value", "threshold"):
            v = data.get(key)
            if isinstance(v, float) and not math.isfinite(v):
                data[key] = to_jsonable(v)
        return strict_json(data)

    @classmethod
    def from_json(cls, raw: bytes | str) -> "Alert":
        """An alert from its JSON line (what :meth:`to_json` writes; msgspec reads it in about
        a third of ``json.loads``'s time, which counts for alerts carrying a snapshot)."""
        data = read_json(raw)
        for key in ("value", "threshold"):
            if isinstance(data.get(key), str):
                data[key] = float(data[key].replace("Infinity", "inf"))
        return cls.model_validate(data)

    @classmethod
    def from_json_keeping_snapshot(cls, raw: bytes | str) -> "Alert":
        """:meth:`from_json`, except that a snapshot is not read: it stays the JSON text it came
        in (a ``msgspec.Raw`` in the ``snapshot`` extra), checked as JSON but not made into
        Python objects. For a reader that only hands the snapshot on (the worker's alerts
        lane, to the incident it stores): reading a snapshot of tens of kilobytes, building
        the incident from it and writing it again took about 0.5 ms of CPU per alert, and
        the text it stores is the same JSON value (:func:`alerts.incidents.make_incident`).
        Text msgspec cannot read this way (not strict JSON, not an object) goes to
        :meth:`from_json`, which reads it or gives its error."""
        if _FIELDS is not None:
            try:
                fields = _FIELDS.decode(raw)
            except (_DecodeError, _ValidationError):
                fields = None
            if fields is not None and "snapshot" in fields:
                snapshot = fields.pop("snapshot")
                alert = cls.from_json(_encode(fields))
                alert.__pydantic_extra__["snapshot"] = snapshot
                return alert
        return cls.from_json(raw)


def splice_json(text: str | bytes, key: str, value: "Raw | bytes") -> bytes:
    """The JSON object ``text`` with ``key`` set to ``value``, a JSON text written as it is
    (``text`` must not hold ``key`` already)."""
    body = text.encode() if isinstance(text, str) else text
    head = body.rstrip()
    if not head.endswith(b"}"):
        raise ValueError("not a JSON object")
    sep = b"" if head[:-1].rstrip().endswith(b"{") else b","
    return b"".join((head[:-1], sep, _encode(key), b":", bytes(value), b"}"))
