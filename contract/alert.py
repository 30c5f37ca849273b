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

__all__ = ["SEVERITIES", "Alert", "fingerprint", "read_json", "severity_rank"]

try:
    from msgspec import DecodeError as _DecodeError
    from msgspec.json import decode as _decode
except ImportError:  # pragma: no cover - msgspec is a dependency
    _decode = None


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
        either."""
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
