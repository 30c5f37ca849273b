"""Event format of the public contract (contract.md, section 1).

Training workers publish JSON events to the Kafka topic ``rlwatch.events`` keyed by ``run_id``.
This module is the one place that turns bytes into typed events and back:

* :func:`parse_event` validates strictly and explains itself: every rejection is an
  :class:`EventError` whose ``reason`` says what was wrong, so the processor can send the raw
  message to the dead-letter topic with that reason and carry on.
* NaN and +/-Inf metric values are legal data (they are signals). On the wire they are the
  strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``; bare ``NaN`` tokens are accepted too.
* :func:`dump_event` writes strict JSON (non-finite numbers as those strings).

One fast path lives outside: the native core's reader of a routine step of a rank other than
0 (``native/src/wire.rs``, ``streams.processor.read_routine``), which takes only what this
module accepts, with the same values (``tests/unit/test_native_wire.py`` holds it to that),
and leaves everything else to :func:`read_event`.

Pure: no I/O, no clock. The receive time is an argument.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticSerializationError
from pydantic_core import to_json as _to_json

try:   # the fast path of parse_event; the standard library reads everything it reads
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson = None
try:   # the fastest path of parse_event: plain step events decoded and checked in C
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; without it orjson's path serves
    _msgspec = None

__all__ = [
    "CANONICAL_METRICS",
    "MAX_EVENT_BYTES",
    "MAX_METRICS",
    "MAX_NAME_LEN",
    "MAX_STEP",
    "MAX_TAGS",
    "CheckpointEvent",
    "Event",
    "EventError",
    "HeartbeatEvent",
    "Sample",
    "SamplesEvent",
    "StepEvent",
    "WireSample",
    "WireSamples",
    "WireStep",
    "dump_event",
    "encode_number",
    "parse_event",
    "model_of",
    "read_event",
    "record_json",
    "sample_fields",
    "samples_event",
    "step_event",
    "strict_json",
    "to_jsonable",
]

#: Largest accepted event, in bytes of JSON. Bigger payloads are rejected (and dead-lettered).
MAX_EVENT_BYTES = 1_000_000
#: Largest number of values in one per-sample array of ``dists``.
MAX_DIST_LEN = 65_536
#: Largest step: the largest integer a float holds exactly (JSON readers in other languages).
MAX_STEP = 2**53
#: Most metrics in one event, and the longest metric, dist, group or tag name.
MAX_METRICS = 4096
MAX_NAME_LEN = 256
#: Most tags in one event, and the longest tag value.
MAX_TAGS = 64
MAX_TAG_VALUE_LEN = 1024
#: Longest ``incarnation`` (a fresh id per start of the training program).
MAX_INCARNATION_LEN = 64

#: The canonical metric names (contract section 2), and the few more the built-in pack reads.
CANONICAL_METRICS = frozenset({
    "reward/mean", "reward/std", "reward/frac_zero_std", "kl/mean", "kl/token_max",
    "kl/token_p99", "kl/beta", "kl/ppo", "entropy/mean", "loss/policy", "loss/value", "loss/total",
    "value/mean", "value/std", "returns/mean", "returns/std", "returns/abs_max",
    "advantages/mean", "advantages/std", "ppo/clip_frac", "value/clip_frac", "ppo/epoch",
    "response/length_mean", "response/length_max", "response/truncated_frac",
    "response/eos_frac", "response/eos_count", "grad_norm/actor", "grad_norm/critic",
    "update_ratio/actor", "update_ratio/critic", "lr/actor", "lr/critic",
    "gpu/mem_allocated_gb", "judge/score", "rm/train_acc", "rm/val_acc", "dpo/pref_prob",
})

_NONFINITE_IN = {
    "nan": math.nan,
    "+nan": math.nan,
    "-nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-inf": -math.inf,
    "-infinity": -math.inf,
}


class EventError(ValueError):
    """An event that cannot be accepted. ``reason`` is one human-readable line."""

    def __init__(self, reason: str):
        reason = reason.replace("\r", "\\r").replace("\n", "\\n")   # always one line
        super().__init__(reason)
        self.reason = reason


def _number(value: Any, where: str) -> float:
    """One metric value: a JSON number, or one of the non-finite spellings. Never a bool."""
    if isinstance(value, bool):
        raise ValueError(f"{where} must be a number, got a boolean")
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{where} is an integer too large for a float") from None
    if isinstance(value, str):
        special = _NONFINITE_IN.get(value.strip().lower())
        if special is not None:
            return special
        raise ValueError(
            f"{where} must be a number (or \"NaN\", \"Infinity\", \"-Infinity\"), got {value!r}"
        )
    raise ValueError(f"{where} must be a number, got {type(value).__name__}")


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=False)

    schema_: Literal[1] = Field(alias="schema")
    run_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\s]+$")
    step: int = Field(ge=0, le=MAX_STEP)
    rank: int = Field(default=0, ge=0, le=1_000_000)
    world_size: int | None = Field(default=None, ge=1, le=1_000_000)
    ts: float | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    #: a fresh id per start of the training program: a new one means the run was relaunched
    incarnation: str | None = Field(default=None, min_length=1, max_length=MAX_INCARNATION_LEN,
                                    pattern=r"^[^\s]+$")

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if len(v) > MAX_TAGS:
                raise ValueError(f"{len(v)} tags, more than {MAX_TAGS}")
            for k, x in v.items():
                if len(str(k)) > MAX_NAME_LEN:
                    raise ValueError(f"tag name {str(k)[:40]!r}... is longer than {MAX_NAME_LEN}")
                if isinstance(x, str) and len(x) > MAX_TAG_VALUE_LEN:
                    raise ValueError(f"tag {k!r} is longer than {MAX_TAG_VALUE_LEN} characters")
        return v

    @field_validator("schema_", mode="before")
    @classmethod
    def _schema(cls, v: Any) -> Any:
        if isinstance(v, bool) or v != 1:
            raise ValueError(f"unsupported schema {v!r} (this version reads schema 1)")
        return v

    @field_validator("step", "rank", "world_size", mode="before")
    @classmethod
    def _integral(cls, v: Any) -> Any:
        # Strict integers: a bool or a fractional float is a client bug, not a step number.
        if isinstance(v, bool):
            raise ValueError("must be an integer, got a boolean")
        if isinstance(v, float):
            if not v.is_integer():
                raise ValueError(f"must be an integer, got {v}")
            return int(v)
        if isinstance(v, str):
            raise ValueError(f"must be an integer, got the string {v!r}")
        return v

    @field_validator("ts", mode="before")
    @classmethod
    def _finite_ts(cls, v: Any) -> Any:
        if v is None:
            return v
        try:
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        except OverflowError:
            ok = False
        if not ok:
            raise ValueError(f"must be a finite number of seconds since the epoch, got {str(v)[:40]!r}")
        return v


class StepEvent(_Base):
    """Metrics of one optimisation step, from one rank."""

    kind: Literal["step"] = "step"
    metrics: dict[str, float] = Field(default_factory=dict)
    dists: dict[str, list[float]] = Field(default_factory=dict)
    groups: dict[str, dict[str, float]] = Field(default_factory=dict)
    hashes: dict[str, str] = Field(default_factory=dict)
    batch_ids: list[str] = Field(default_factory=list)

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError(f"must be an object of name -> number, got {type(v).__name__}")
        if len(v) > MAX_METRICS:
            raise ValueError(f"{len(v)} metrics, more than {MAX_METRICS}")
        for k in v:
            if len(k) > MAX_NAME_LEN:
                raise ValueError(f"metric name {k[:40]!r}... is longer than {MAX_NAME_LEN}")
        return {str(k): _number(x, f"metric {k!r}") for k, x in v.items()}

    @field_validator("dists", mode="before")
    @classmethod
    def _dists(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError(f"must be an object of name -> list of numbers, got {type(v).__name__}")
        out = {}
        for k, xs in v.items():
            if not isinstance(xs, list):
                raise ValueError(f"dist {k!r} must be a list of numbers")
            if len(xs) > MAX_DIST_LEN:
                raise ValueError(f"dist {k!r} has {len(xs)} values, more than {MAX_DIST_LEN}")
            out[str(k)] = [_number(x, f"dist {k!r}[{i}]") for i, x in enumerate(xs)]
        return out

    @field_validator("groups", mode="before")
    @classmethod
    def _groups(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("must be an object of metric -> {group: number}")
        out = {}
        for k, g in v.items():
            if not isinstance(g, dict):
                raise ValueError(f"group {k!r} must be an object of category -> number")
            out[str(k)] = {str(c): _number(x, f"group {k!r}.{c}") for c, x in g.items()}
        return out


class Sample(BaseModel):
    """One generated response of a step."""

    model_config = ConfigDict(extra="allow")

    prompt_id: str | None = None
    prompt: str | None = None
    response: str | None = None
    reward: float | None = None
    length: int | None = None
    truncated: bool | None = None
    category: str | None = None
    kl: float | None = None
    token_kl_max: float | None = None
    token_kl_argmax: str | None = None

    @field_validator("reward", "kl", "token_kl_max", mode="before")
    @classmethod
    def _num(cls, v: Any) -> Any:
        return None if v is None else _number(v, "value")


class SamplesEvent(_Base):
    """Generated texts of a step."""

    kind: Literal["samples"]
    samples: list[Sample] = Field(default_factory=list)


class CheckpointEvent(_Base):
    """A checkpoint the run saved (the pipeline keeps the last healthy one for rollback)."""

    kind: Literal["checkpoint"]
    path: str = Field(min_length=1)


class HeartbeatEvent(_Base):
    """Liveness only."""

    kind: Literal["heartbeat"]


Event = Annotated[
    Union[StepEvent, SamplesEvent, CheckpointEvent, HeartbeatEvent], Field(discriminator="kind")
]
_EVENT = TypeAdapter(Event)
_KINDS = ("step", "samples", "checkpoint", "heartbeat")


def _explain(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False)[:5]:
        path = e["loc"][1:] if e["loc"] and e["loc"][0] in _KINDS else e["loc"]
        loc = ".".join(str(x) for x in path)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            parts.append(f"missing required field {loc!r}")
        elif e["type"] == "union_tag_invalid":
            parts.append(f"unknown kind {e.get('input', {}).get('kind')!r} "
                         "(expected step, samples, checkpoint or heartbeat)")
        elif e["type"] == "union_tag_not_found":
            parts.append("missing required field 'kind'")
        else:
            parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


_RUN_ID = re.compile(r"[^\s]+")
_STEP_KEYS = frozenset({"schema", "kind", "run_id", "step", "rank", "world_size", "ts", "tags",
                        "incarnation", "metrics", "dists", "groups", "hashes", "batch_ids"})


def _numbers(d: Any) -> dict | None:
    """``d`` as name -> float when it is plainly that (else None: the strict path decides).
    Numbers may be the contract's non-finite spellings ("NaN", ...), read as :func:`_number`
    reads them."""
    if type(d) is not dict or len(d) > MAX_METRICS:
        return None
    if not d:
        return d
    kinds = set(map(type, d.values()))
    if not kinds <= _NUMBER_OR_TEXT or max(map(len, d)) > MAX_NAME_LEN:
        return None
    if str in kinds:
        return _spelt_numbers(d)
    if int in kinds:
        d = {k: float(v) for k, v in d.items()}
    return d


def _spelt_numbers(d: dict) -> dict | None:
    """``d`` (numbers and text) with each text a non-finite spelling replaced by its float;
    None when a text is not one (the strict path words the reason)."""
    out = {}
    for k, v in d.items():
        if type(v) is str:
            v = _NONFINITE_IN.get(v.strip().lower())
            if v is None:
                return None
        out[k] = float(v)
    return out


def _spelt_list(xs: list) -> list | None:
    """:func:`_spelt_numbers` for the values of a dist."""
    out = []
    for v in xs:
        if type(v) is str:
            v = _NONFINITE_IN.get(v.strip().lower())
            if v is None:
                return None
        out.append(float(v))
    return out


_NUMBER_TYPES = frozenset({float, int})
_NUMBER_OR_TEXT = frozenset({float, int, str})
_FLOAT = frozenset({float})


def _strings(d: Any, limit: int) -> bool:
    if type(d) is not dict or len(d) > MAX_TAGS:
        return False
    for k, x in d.items():
        if type(x) is not str or len(x) > limit or len(k) > MAX_NAME_LEN:
            return False
    return True


#: (in Sample's order: a sample built from them dumps its fields in the model's order)
_SAMPLE_KEYS = {"prompt_id": str, "prompt": str, "response": str, "reward": float, "length": int,
                "truncated": bool, "category": str, "kl": float, "token_kl_max": float,
                "token_kl_argmax": str}


def _fast_samples(d: dict, received_at: float) -> SamplesEvent | None:
    """A samples event built without pydantic when every sample is plainly valid."""
    head = _fast_envelope(d, received_at, _SAMPLES_KEYS)
    samples = d.get("samples", [])
    if head is None or type(samples) is not list:
        return None
    out = []
    for item in samples:
        if type(item) is not dict:
            return None
        values = {}
        for k, v in item.items():
            want = _SAMPLE_KEYS.get(k)
            if want is None:
                return None
            if v is not None and type(v) is not want:
                if want is float and type(v) is int:
                    v = float(v)
                else:
                    return None
            values[k] = v
        smp = object.__new__(Sample)
        object.__setattr__(smp, "__dict__", {**_SAMPLE_DEFAULTS, **values})
        object.__setattr__(smp, "__pydantic_fields_set__", set(values))
        object.__setattr__(smp, "__pydantic_extra__", {})
        object.__setattr__(smp, "__pydantic_private__", None)
        out.append(smp)
    head["kind"], head["samples"] = "samples", out
    return _construct(SamplesEvent, head)


_SAMPLE_DEFAULTS = dict.fromkeys(_SAMPLE_KEYS)
_SAMPLES_KEYS = frozenset({"schema", "kind", "run_id", "step", "rank", "world_size", "ts",
                           "tags", "incarnation", "samples"})
_HEARTBEAT_KEYS = _SAMPLES_KEYS - {"samples"}
_CHECKPOINT_KEYS = _HEARTBEAT_KEYS | {"path"}


def _fast_heartbeat(d: dict, received_at: float) -> HeartbeatEvent | None:
    """A heartbeat built without pydantic when every field is plainly valid and it has no
    other (a final heartbeat's ``final`` is one: the model keeps it as an extra field). Every
    rank of a fleet sends one every few seconds (read through the model: 5.8 µs each here;
    this way: 4.1)."""
    head = _fast_envelope(d, received_at, _HEARTBEAT_KEYS)
    if head is None:
        return None
    head["kind"] = "heartbeat"
    return _construct(HeartbeatEvent, head, _HEARTBEAT_FIELDS)


def _fast_checkpoint(d: dict, received_at: float) -> CheckpointEvent | None:
    """A checkpoint event built without pydantic when every field is plainly valid."""
    head = _fast_envelope(d, received_at, _CHECKPOINT_KEYS)
    path = d.get("path")
    if head is None or type(path) is not str or not path:
        return None
    head.update(kind="checkpoint", path=path)
    return _construct(CheckpointEvent, head, _CHECKPOINT_FIELDS)


def _slot_setter(name: str):
    """The setter ``object.__setattr__(obj, name, value)`` finds on a model (pydantic's slot
    descriptor), bound once: the same store without the lookup per event."""
    found = next((k.__dict__[name] for k in BaseModel.__mro__ if name in k.__dict__), None)
    if found is None or not hasattr(found, "__set__"):   # pragma: no cover - another pydantic
        return lambda obj, value: object.__setattr__(obj, name, value)
    return found.__set__


_new = object.__new__
_set_dict = _slot_setter("__dict__")
_set_fields_set = _slot_setter("__pydantic_fields_set__")
_set_extra = _slot_setter("__pydantic_extra__")
_set_private = _slot_setter("__pydantic_private__")


def _construct(cls, values: dict, fields_set: set | None = None):
    """A model of ``values`` (already valid, in the model's field order) without validation.
    ``fields_set`` (copied, never shared: pydantic adds to it on assignment) is the set of
    ``values``' names when the caller has it at hand."""
    ev = _new(cls)
    _set_dict(ev, values)
    _set_fields_set(ev, set(values) if fields_set is None else fields_set.copy())
    _set_extra(ev, {})
    _set_private(ev, None)
    return ev


def _fast_envelope(d: dict, received_at: float, keys: frozenset) -> dict | None:
    """The envelope fields of an event when they are plainly valid, else None."""
    if d.get("schema") != 1 or type(d["schema"]) is not int or not keys.issuperset(d):
        return None
    run_id, step = d.get("run_id"), d.get("step")
    if (type(run_id) is not str or not 0 < len(run_id) <= 256 or not _RUN_ID.fullmatch(run_id)
            or type(step) is not int or not 0 <= step <= MAX_STEP):
        return None
    rank = d.get("rank", 0)
    world = d.get("world_size")
    ts = d.get("ts")
    if type(rank) is not int or not 0 <= rank <= 1_000_000:
        return None
    if world is not None and (type(world) is not int or not 1 <= world <= 1_000_000):
        return None
    if ts is None:
        ts = received_at
    elif type(ts) is int:
        ts = float(ts)
    elif type(ts) is not float or ts - ts != 0.0:
        return None
    inc = d.get("incarnation")
    if inc is not None and (type(inc) is not str or not 0 < len(inc) <= MAX_INCARNATION_LEN
                            or not _RUN_ID.fullmatch(inc)):
        return None
    tags = d.get("tags", {})
    if not _strings(tags, MAX_TAG_VALUE_LEN):
        return None
    return {"schema_": 1, "run_id": run_id, "step": step, "rank": rank, "world_size": world,
            "ts": ts, "tags": tags, "incarnation": inc}


def _fast_step(d: dict, received_at: float) -> StepEvent | None:
    """A step event built without pydantic when every field is plainly valid; None when
    anything is unusual (a non-finite spelling, a wrong type, an unknown key), so that the
    strict path gives the reason."""
    head = _fast_envelope(d, received_at, _STEP_KEYS)
    if head is None:
        return None
    hashes = d.get("hashes", {})
    if not _strings(hashes, MAX_TAG_VALUE_LEN):
        return None
    metrics = _numbers(d.get("metrics", {}))
    if metrics is None:
        return None
    dists = d.get("dists", {})
    if type(dists) is not dict:
        return None
    if dists:
        out = {}
        for k, xs in dists.items():
            if type(xs) is not list or len(xs) > MAX_DIST_LEN or len(k) > MAX_NAME_LEN:
                return None
            kinds = set(map(type, xs))
            if kinds <= _FLOAT:
                out[k] = xs
            elif kinds <= _NUMBER_TYPES:
                out[k] = list(map(float, xs))
            elif kinds <= _NUMBER_OR_TEXT:
                xs = _spelt_list(xs)
                if xs is None:
                    return None
                out[k] = xs
            else:
                return None
        dists = out
    groups = d.get("groups", {})
    if type(groups) is not dict:
        return None
    if groups:
        out = {}
        for k, g in groups.items():
            g = _numbers(g)
            if g is None or len(k) > MAX_NAME_LEN:
                return None
            out[k] = g
        groups = out
    batch_ids = d.get("batch_ids", [])
    if type(batch_ids) is not list or not all(type(b) is str for b in batch_ids):
        return None
    head.update(kind="step", metrics=metrics, dists=dists, groups=groups, hashes=hashes,
                batch_ids=batch_ids)
    return _construct(StepEvent, head, _STEP_FIELDS)


#: every field of a step event: the fields set of one built by the fast paths
_STEP_FIELDS = set(StepEvent.model_fields)
_SAMPLES_FIELDS = set(SamplesEvent.model_fields)
_HEARTBEAT_FIELDS = set(HeartbeatEvent.model_fields)
_CHECKPOINT_FIELDS = set(CheckpointEvent.model_fields)
_SAMPLE_FIELDS = tuple(Sample.model_fields)





if _msgspec is not None:
    # Plain step events, decoded and checked in C: every check of the contract's step event
    # that msgspec can make (types, ranges, lengths, counts, no unknown key). The run id and
    # incarnation have no whitespace: _wire_step checks that (a msgspec pattern calls Python's
    # re per event; a fleet sends the same few hundred ids again and again). It accepts only
    # what the pydantic models accept, with the same values; anything else (a non-finite
    # spelling, an integral float, an extra key, any error) fails here and takes the slower
    # paths, which word the reason.
    _Name = Annotated[str, _msgspec.Meta(max_length=MAX_NAME_LEN)]
    _Ident = Annotated[str, _msgspec.Meta(min_length=1)]
    _RunId = Annotated[_Ident, _msgspec.Meta(max_length=256)]
    _Incarnation = Annotated[_Ident, _msgspec.Meta(max_length=MAX_INCARNATION_LEN)]
    _Numbers = Annotated[dict[_Name, float], _msgspec.Meta(max_length=MAX_METRICS)]
    _Strings = Annotated[dict[_Name, Annotated[str, _msgspec.Meta(max_length=MAX_TAG_VALUE_LEN)]],
                         _msgspec.Meta(max_length=MAX_TAGS)]
    _Dist = Annotated[list[float], _msgspec.Meta(max_length=MAX_DIST_LEN)]
    _Step = Annotated[int, _msgspec.Meta(ge=0, le=MAX_STEP)]
    _Rank = Annotated[int, _msgspec.Meta(ge=0, le=1_000_000)]
    _World = Annotated[int, _msgspec.Meta(ge=1, le=1_000_000)]

    class _WireEnvelope(_msgspec.Struct, kw_only=True, forbid_unknown_fields=True, gc=False):
        # the fields every event has, in the order of the models' fields (the order
        # model_dump and dump_event write); each kind's fields follow
        schema_: Literal[1] = _msgspec.field(name="schema")
        run_id: _RunId
        step: _Step
        rank: _Rank = 0
        world_size: Union[_World, None] = None
        ts: Union[float, None] = None
        tags: _Strings = {}
        incarnation: Union[_Incarnation, None] = None

    class WireStep(_WireEnvelope, kw_only=True, forbid_unknown_fields=True, gc=False):
        """A plain step event as :func:`read_event` gives it: decoded and checked in C, with
        :class:`StepEvent`'s fields and values (``schema_`` is 1, ``ts`` filled in), without
        the pydantic model around them (building one took as long as the decoding). The core
        reads either alike; :func:`step_event` makes the model of one."""
        kind: Literal["step"]
        metrics: _Numbers = {}
        dists: dict[_Name, _Dist] = {}
        groups: dict[_Name, _Numbers] = {}
        hashes: _Strings = {}
        batch_ids: list[str] = []

    # The same event with text allowed among the numbers: a run that diverged sends "NaN"
    # (and the other non-finite spellings) in every event, which WireStep refuses.
    _Spelt = Union[float, str]
    _SpeltNumbers = Annotated[dict[_Name, _Spelt], _msgspec.Meta(max_length=MAX_METRICS)]
    _SpeltDist = Annotated[list[_Spelt], _msgspec.Meta(max_length=MAX_DIST_LEN)]

    class _WireSpeltStep(WireStep, kw_only=True, forbid_unknown_fields=True, gc=False):
        metrics: _SpeltNumbers = {}
        dists: dict[_Name, _SpeltDist] = {}
        groups: dict[_Name, _SpeltNumbers] = {}

    class _WireKept(_msgspec.Struct, gc=False):
        # what a recorder reads again of a step event it kept as its bytes (the other fields
        # are skipped without being decoded)
        metrics: _Numbers = {}
        batch_ids: list[str] = []

    class _WireSpeltKept(_WireKept, gc=False):
        metrics: _SpeltNumbers = {}

    class WireSample(_msgspec.Struct, kw_only=True, forbid_unknown_fields=True, gc=False):
        """One sample of a :class:`WireSamples`: :class:`Sample`'s fields, in its order, with
        its values (no extra field: a sample with one takes the slower paths)."""
        prompt_id: Union[str, None] = None
        prompt: Union[str, None] = None
        response: Union[str, None] = None
        reward: Union[float, None] = None
        length: Union[int, None] = None
        truncated: Union[bool, None] = None
        category: Union[str, None] = None
        kl: Union[float, None] = None
        token_kl_max: Union[float, None] = None
        token_kl_argmax: Union[str, None] = None

    class WireSamples(_WireEnvelope, kw_only=True, forbid_unknown_fields=True, gc=False):
        """A plain samples event as :func:`read_event` gives it, as :class:`WireStep` is for
        a step: :class:`SamplesEvent`'s fields and values, its samples :class:`WireSample`
        (a pydantic model per sample took most of the reading); :func:`samples_event` makes
        the model of one."""
        kind: Literal["samples"]
        samples: list[WireSample] = []

    _WIRE_STEP = _msgspec.json.Decoder(WireStep)
    _WIRE_SAMPLES = _msgspec.json.Decoder(WireSamples)
    _WIRE_KEPT = _msgspec.json.Decoder(_WireKept)
    _WIRE_SPELT_KEPT = _msgspec.json.Decoder(_WireSpeltKept)
    _WIRE_SPELT_STEP = _msgspec.json.Decoder(_WireSpeltStep)
    _WIRE_ERRORS = (_msgspec.ValidationError, _msgspec.DecodeError)
    _WIRE_INVALID = _msgspec.ValidationError
    #: how WireStep's refusal of a text among the numbers begins (only a hint: with any other
    #: wording the event takes the slower paths, with the same outcome)
    _TEXT_FOR_NUMBER = "Expected `float`, got `str`"


#: Run ids and incarnations already seen to have no whitespace (``_RUN_ID``), so that an id a
#: fleet sends again and again is checked by one set lookup. Bounded: emptied when full.
_KNOWN_IDS: set[str] = set()
_MAX_KNOWN_IDS = 4096


def _new_ident(s: str) -> bool:
    """Whether ``s`` (a run id or incarnation not in ``_KNOWN_IDS``) has no whitespace, by the
    same test as the other paths; remembered when it has none."""
    if _RUN_ID.fullmatch(s) is None:
        return False
    if len(_KNOWN_IDS) >= _MAX_KNOWN_IDS:
        _KNOWN_IDS.clear()
    _KNOWN_IDS.add(s)
    return True


def _unspelt(metrics: dict, dists: dict, groups: dict) -> tuple:
    """The numbers of a step decoded by ``_WireSpeltStep`` with each text replaced by the
    non-finite value it spells (as :func:`_number` reads it); three Nones when a text is not
    a non-finite spelling (the slower paths word the reason)."""
    if str in set(map(type, metrics.values())):
        metrics = _spelt_numbers(metrics)
        if metrics is None:
            return None, None, None
    for k, xs in dists.items():
        if str in set(map(type, xs)):
            xs = _spelt_list(xs)
            if xs is None:
                return None, None, None
            dists[k] = xs
    for k, g in groups.items():
        if str in set(map(type, g.values())):
            g = _spelt_numbers(g)
            if g is None:
                return None, None, None
            groups[k] = g
    return metrics, dists, groups


def _wire_step(raw: bytes | bytearray | str, received_at: float):
    """A plain step or samples event decoded and checked by msgspec (:class:`WireStep`,
    :class:`WireSamples`), with the values the models give; None when it is not plainly
    valid (the slower paths decide, and word any reason)."""
    try:
        w = _WIRE_STEP.decode(raw)
    except _WIRE_INVALID as exc:
        why = str(exc)
        if why in _SAMPLES_HINTS:
            try:
                w = _WIRE_SAMPLES.decode(raw)
            except _WIRE_ERRORS:
                return None
        elif not why.startswith(_TEXT_FOR_NUMBER):
            return None
        else:
            try:
                w = _WIRE_SPELT_STEP.decode(raw)
            except _WIRE_ERRORS:
                return None
            metrics, dists, groups = _unspelt(w.metrics, w.dists, w.groups)
            if metrics is None:
                return None
            w.metrics, w.dists, w.groups = metrics, dists, groups
    except _WIRE_ERRORS:
        return None
    run_id, inc = w.run_id, w.incarnation
    if not (run_id in _KNOWN_IDS or _new_ident(run_id)):
        return None
    if inc is not None and not (inc in _KNOWN_IDS or _new_ident(inc)):
        return None
    if w.ts is None:
        w.ts = received_at
    return w


#: how WireStep's refusal of a samples event begins, its "kind" before or after its samples
#: (only hints: with any other wording the event takes the slower paths, with the same outcome)
_SAMPLES_HINTS = frozenset({"Invalid enum value 'samples' - at `$.kind`",
                            "Object contains unknown field `samples`"})


def _envelope(w) -> dict:
    """The fields every event has, of a :class:`WireStep` or :class:`WireSamples`, as its
    model holds them."""
    return {"schema_": 1, "run_id": w.run_id, "step": w.step, "rank": w.rank,
            "world_size": w.world_size, "ts": w.ts, "tags": w.tags, "incarnation": w.incarnation}


def step_event(w) -> StepEvent:
    """The :class:`StepEvent` of a :class:`WireStep`: the same fields and values, as the model
    (built without validating again: the decoder checked what the model checks)."""
    return _construct(StepEvent, {**_envelope(w), "kind": "step", "metrics": w.metrics,
                                  "dists": w.dists, "groups": w.groups, "hashes": w.hashes,
                                  "batch_ids": w.batch_ids}, _STEP_FIELDS)


def samples_event(w) -> SamplesEvent:
    """The :class:`SamplesEvent` of a :class:`WireSamples`: the same fields and values, as
    the model, its samples :class:`Sample` (built without validating again)."""
    samples = []
    for smp in w.samples:
        values = {k: getattr(smp, k) for k in _SAMPLE_FIELDS}
        samples.append(_construct(Sample, values, {k for k, v in values.items() if v is not None}))
    return _construct(SamplesEvent, {**_envelope(w), "kind": "samples", "samples": samples},
                      _SAMPLES_FIELDS)


def sample_fields(sample) -> dict:
    """A sample's fields that are set (not None), in :class:`Sample`'s order (a model's extra
    fields after them): ``Sample.model_dump(exclude_none=True)``, for a :class:`WireSample`
    too."""
    if isinstance(sample, BaseModel):
        return sample.model_dump(exclude_none=True)
    return {k: v for k in _SAMPLE_FIELDS if (v := getattr(sample, k)) is not None}


def kept_step_values(raw: bytes) -> tuple[dict[str, float], list[str]]:
    """The metrics and batch ids of a step event that :func:`parse_event` accepted, read
    again from its bytes (streams.snapshot keeps steps that way): the values ``parse_event``
    gave, without decoding the rest of the event (its dists above all)."""
    if _msgspec is not None:
        try:
            w = _WIRE_KEPT.decode(raw)
            return w.metrics, w.batch_ids
        except _WIRE_INVALID as exc:
            if str(exc).startswith(_TEXT_FOR_NUMBER):
                # non-finite spellings ("NaN"): every event of a run that diverged has them,
                # and those runs' alerts are the ones whose snapshots read the most steps
                try:
                    w = _WIRE_SPELT_KEPT.decode(raw)
                except _WIRE_ERRORS:
                    w = None
                metrics = None if w is None else _spelt_numbers(w.metrics)
                if metrics is not None:
                    return metrics, w.batch_ids
        except _WIRE_ERRORS:
            pass     # the whole parse words what is wrong
    ev = parse_event(raw, 0.0)
    return ev.metrics, ev.batch_ids


def parse_event(raw: bytes | str | dict, received_at: float) -> StepEvent | SamplesEvent | CheckpointEvent | HeartbeatEvent:
    """Validate one event. ``received_at`` fills ``ts`` when the event has none.

    Raises :class:`EventError` with a one-line reason for anything malformed. The event of
    :func:`read_event`, with the model of a plain step or samples event built (:func:`model_of`).
    """
    ev = read_event(raw, received_at)
    return ev if isinstance(ev, BaseModel) else model_of(ev)


def model_of(w) -> StepEvent | SamplesEvent:
    """The model of an event :func:`read_event` gave without one (:class:`WireStep`,
    :class:`WireSamples`)."""
    return step_event(w) if w.kind == "step" else samples_event(w)


def read_event(raw: bytes | str | dict, received_at: float):
    """Validate one event as the core reads it: a plain step event as a :class:`WireStep`, a
    plain samples event as a :class:`WireSamples`, any other event as its model
    (:func:`model_of` makes the model of the first two). ``received_at`` fills ``ts`` when the
    event has none.

    Raises :class:`EventError` with a one-line reason for anything malformed. Plain step
    events (no extra keys; numbers as numbers or non-finite spellings) and plain samples
    events (no extra keys; numbers as numbers) are decoded and checked in C by msgspec; the
    other plain events take orjson and type checks; anything else, and
    every rejection, goes through the pydantic models, which word the reasons. Each path
    accepts only what the models accept, with the same values. ``bench/bench_parse.py``
    measures the paths side by side.
    """
    data = raw if type(raw) is dict else None
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) > MAX_EVENT_BYTES:
            raise EventError(f"event is {len(raw)} bytes, over the {MAX_EVENT_BYTES}-byte limit")
    elif isinstance(raw, str):
        if len(raw) > MAX_EVENT_BYTES // 4 and len(raw.encode()) > MAX_EVENT_BYTES:
            raise EventError(f"event is {len(raw)} bytes, over the {MAX_EVENT_BYTES}-byte limit")
    if data is None and _msgspec is not None and isinstance(raw, (bytes, bytearray, str)):
        ev = _wire_step(raw, received_at)
        if ev is not None:
            return ev   # else not a plain step event: the paths below decide (and word why)
    if data is None and _orjson is not None and isinstance(raw, (bytes, bytearray, str)):
        try:
            data = _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            data = None   # bare NaN tokens, bad UTF-8, bad JSON: the standard path says which
    if type(data) is dict:
        kind = data.get("kind")
        try:
            if kind == "step":
                ev = _fast_step(data, received_at)
            elif kind == "samples":
                ev = _fast_samples(data, received_at)
            elif kind == "heartbeat":
                ev = _fast_heartbeat(data, received_at)
            elif kind == "checkpoint":
                ev = _fast_checkpoint(data, received_at)
            else:
                ev = None
        except OverflowError:   # an integer too large for a float: the models word it
            ev = None
        return _strict(data, received_at) if ev is None else ev
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventError(f"event is not UTF-8 text: {exc}") from None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise EventError(f"bad JSON: {exc}") from None
        except ValueError as exc:   # e.g. an integer with more digits than Python converts
            raise EventError(f"bad JSON: {exc}") from None
    return _strict(raw, received_at)


def _strict(raw: Any, received_at: float):
    if not isinstance(raw, dict):
        raise EventError(f"an event must be a JSON object, got {type(raw).__name__}")
    if "schema" not in raw:
        raise EventError("missing required field 'schema' (expected 1)")
    if "run_id" not in raw:
        raise EventError("missing required field 'run_id'")
    try:
        event = _EVENT.validate_python(raw)
    except ValidationError as exc:
        raise EventError(_explain(exc)) from None
    except (OverflowError, ValueError, TypeError) as exc:   # anything the validators missed
        raise EventError(f"invalid event: {exc}") from None
    if event.ts is None:
        event.ts = received_at
    return event


def encode_number(x: float) -> float | str:
    """A float as strict JSON allows: non-finite values become the contract's strings."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def to_jsonable(obj: Any) -> Any:
    """Replace non-finite floats anywhere in ``obj`` by the contract's strings."""
    if isinstance(obj, float):
        return encode_number(obj)
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


def strict_json(data: Any) -> str:
    """Compact strict JSON of ``data``, non-finite floats as the contract's strings. Most data
    has none: it is written as it is, and walked (:func:`to_jsonable`) only when json refuses
    a non-finite value, which gives the same text as walking it first."""
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(to_jsonable(data), separators=(",", ":"), allow_nan=False)


def record_json(data: Any) -> bytes:
    """Compact strict JSON of a record rlwatch built itself (an incident, a fleet record):
    the same value as :func:`strict_json` gives (non-finite floats as the contract's strings),
    written by pydantic-core's serializer in Rust, about ten times faster on a record holding
    a snapshot (``bench/bench_alert_json.py``); non-ASCII text as UTF-8, floats in Rust's
    shortest spelling. Not for a user's data: it also writes types JSON has none of (dates,
    sets, bytes), which :func:`strict_json` refuses. What it cannot write at all (a lone
    surrogate in a text, an unknown type) takes :func:`strict_json`, which writes it or
    raises its own error."""
    try:
        return _to_json(data, inf_nan_mode="strings")
    except PydanticSerializationError:
        return strict_json(data).encode()


def dump_event(event: BaseModel | dict) -> bytes:
    """Strict JSON bytes of an event (the form that goes on the wire): a model, a
    :class:`WireStep`, a :class:`WireSamples` or a dict."""
    if _msgspec is not None and isinstance(event, (WireStep, WireSamples)):
        event = model_of(event)
    data = event.model_dump(by_alias=True, exclude_none=True) if isinstance(event, BaseModel) else event
    return strict_json(data).encode()
