"""The tiny base every streaming statistic builds on.

Contract (other packages depend on it):

* ``update(x)`` takes one number. Non-finite values (NaN, +/-Inf) and values that are not
  numbers at all are *ignored* and counted in ``n_skipped``; ``update`` never raises.
* ``get()`` returns a float, ``math.nan`` while the statistic is undefined.
* ``to_state()`` returns JSON-serialisable plain data (dicts, lists, str, int, float). Non-finite
  floats are encoded as ``None`` (NaN) and ``"Infinity"`` / ``"-Infinity"``, so the state survives
  strict JSON. ``from_state(to_state())`` gives an object that answers exactly like the original.
* Mergeable statistics also implement ``merge(other)`` (in place).

:func:`stat_from_state` rebuilds any registered statistic from its state (the ``"type"`` key).
Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, ClassVar

__all__ = ["Stateful", "Statistic", "registered_types", "stat_from_state"]

#: Bumped when the layout of ``to_state`` changes incompatibly.
STATE_VERSION = 1

_REGISTRY: dict[str, type[Stateful]] = {}


def _enc(v: Any) -> Any:
    """Plain-data, strict-JSON encoding of one value (recursively)."""
    if isinstance(v, float):
        if v != v:
            return None
        if v == math.inf:
            return "Infinity"
        if v == -math.inf:
            return "-Infinity"
        return float(v)
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, (list, tuple, deque)):
        return [_enc(e) for e in v]
    if isinstance(v, dict):
        return {str(k): _enc(e) for k, e in v.items()}
    # numpy scalars and anything float-like
    try:
        return _enc(float(v))
    except (TypeError, ValueError):  # pragma: no cover - programming error
        raise TypeError(f"cannot encode {type(v).__name__} in a statistic state") from None


def _dec(v: Any) -> Any:
    """Inverse of :func:`_enc` (``None`` -> NaN; the two infinity spellings -> floats)."""
    if v is None:
        return math.nan
    if isinstance(v, str):
        if v == "Infinity":
            return math.inf
        if v == "-Infinity":
            return -math.inf
        return v
    if isinstance(v, list):
        return [_dec(e) for e in v]
    if isinstance(v, dict):
        return {k: _dec(e) for k, e in v.items()}
    return v


def as_float(x: Any) -> float:
    """``float(x)`` or NaN when ``x`` is not a number (used where a value must be clean)."""
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return math.nan


class Stateful:
    """Anything whose state is plain data: registered by class name for :func:`stat_from_state`.

    Subclasses implement ``_params()`` (the constructor's keyword arguments), ``_dump()`` (the
    mutable state as plain Python values) and ``_load(state)`` (the inverse of ``_dump``).
    """

    __slots__ = ("n_skipped",)

    #: Whether the class is stored in the registry (private helpers set this to False).
    _register: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_register", True) and not cls.__name__.startswith("_"):
            _REGISTRY[cls.__name__] = cls

    # -- to be provided by subclasses ---------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        return {}

    def _dump(self) -> dict[str, Any]:
        return {}

    def _load(self, state: dict[str, Any]) -> None:
        pass

    # -- public ------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Plain, strict-JSON-serialisable state (carries ``"type"``)."""
        dump = self._dump()
        dump["n_skipped"] = self.n_skipped
        return {
            "type": type(self).__name__,
            "version": STATE_VERSION,
            "params": _enc(self._params()),
            "state": _enc(dump),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Any:
        """Rebuild from :meth:`to_state` output; answers exactly like the original."""
        if not isinstance(state, dict) or "type" not in state:
            raise ValueError("a statistic state must be a dict with a 'type' key")
        if state["type"] != cls.__name__:
            if cls in (Stateful, Statistic):
                return stat_from_state(state)
            raise ValueError(f"state of a {state['type']!r}, not of a {cls.__name__!r}")
        if state.get("version", STATE_VERSION) != STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        obj = cls(**_dec(state.get("params", {})))
        inner = _dec(state.get("state", {}))
        obj.n_skipped = int(inner.pop("n_skipped", 0))
        obj._load(inner)
        return obj

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({params})"


class Statistic(Stateful):
    """A statistic over a stream of floats. See the module docstring for the contract.

    ``update`` is the one place that coerces the input, skips non-finite values and counts them
    in ``n_skipped``; subclasses implement ``_add(x)``, called with finite floats only. (The
    hottest windowed statistics override ``update`` with the same check inlined, to save a call
    per value: see ``_window._LazyWindow.update``.)
    """

    __slots__ = ()

    def update(self, x: float) -> None:
        if type(x) is not float:
            x = as_float(x)
        if x - x != 0.0:  # NaN or +/-inf
            self.n_skipped += 1
            return
        self._add(x)

    def _add(self, x: float) -> None:  # pragma: no cover - abstract
        """``update`` for a finite float."""
        raise NotImplementedError

    def get(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


class _NewestValue:
    """Mixin for statistics that keep the newest finite value in ``_last`` (a slot the concrete
    class declares, set to NaN by its ``__init__``): the ``last`` property and its state."""

    __slots__ = ()
    _last: float

    @property
    def last(self) -> float:
        """The newest finite value (NaN before the first one)."""
        return self._last

    def _dump(self) -> dict[str, Any]:
        d = super()._dump()  # type: ignore[misc]
        d["last"] = self._last
        return d

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)  # type: ignore[misc]
        self._last = state["last"]


def stat_from_state(state: dict[str, Any]) -> Any:
    """Rebuild any registered statistic (or :class:`Stateful`) from its ``to_state()``."""
    if not isinstance(state, dict) or "type" not in state:
        raise ValueError("a statistic state must be a dict with a 'type' key")
    cls = _REGISTRY.get(state["type"])
    if cls is None:
        raise ValueError(f"unknown statistic type {state['type']!r}")
    return cls.from_state(state)


def registered_types() -> dict[str, type[Stateful]]:
    """Name -> class of every registered statistic (a copy)."""
    return dict(_REGISTRY)


# ---- small shared validators ----------------------------------------------------------------


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # accept integral floats (e.g. from JSON configs) but nothing else
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value > high or (high_open and value == high)):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value
