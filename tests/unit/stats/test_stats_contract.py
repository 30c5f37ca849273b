"""The common contract of every statistic, discovered by introspection.

For every concrete ``Statistic`` subclass: round trips (pickle, deepcopy, to_state -> strict
JSON -> from_state / stat_from_state) give identical subsequent answers; non-finite and
non-numeric inputs are skipped and counted, never raise; empty statistics answer NaN (or the
documented neutral value); constructor arguments are validated; memory stays bounded.
"""

from __future__ import annotations

import copy
import json
import math
import pickle
import random

import numpy as np
import pytest
from _stats_helpers import hsettings, same, series
from hypothesis import given
from hypothesis import strategies as st

import streams.stats as S
from streams.stats.base import Stateful, Statistic, registered_types, stat_from_state

# ---- the table every statistic must appear in ----------------------------------------------

#: class name -> (constructor kwargs, [extra read-outs compared after round trips])
EXAMPLES: dict[str, tuple[dict, list]] = {
    "PageHinkley": (
        {"delta": 0.01, "threshold": 3.0, "min_instances": 3},
        ["detected", "change_count", "last_direction"],
    ),
    "Cusum": ({"k": 0.5, "h": 2.0, "warmup": 3}, ["detected", "change_count", "statistic"]),
}

#: invalid constructor arguments that must raise ValueError
BAD_ARGS: dict[str, list[dict]] = {
    "PageHinkley": [
        {"threshold": 0.0},
        {"delta": -1.0},
        {"direction": "sideways"},
        {"min_instances": 0},
    ],
    "Cusum": [{"h": 0.0}, {"k": -0.1}, {"warmup": 1}],
}


def _all_statistic_classes() -> list[type]:
    out, todo = [], [Statistic]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if not sub.__name__.startswith("_"):
                out.append(sub)
    return sorted(set(out), key=lambda c: c.__name__)


CLASSES = _all_statistic_classes()


def make(name: str):
    kwargs, _ = EXAMPLES[name]
    return registered_types()[name](**kwargs)


def readouts(stat) -> list:
    _, extra = EXAMPLES[type(stat).__name__]
    out = [stat.get(), stat.n_skipped]
    for e in extra:
        if isinstance(e, tuple):
            out.append(getattr(stat, e[0])(*e[1:]))
        else:
            out.append(getattr(stat, e))
    return out


def same_readouts(a: list, b: list) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))


# ---- discovery ------------------------------------------------------------------------------


def test_every_statistic_is_in_the_tables():
    names = {c.__name__ for c in CLASSES}
    assert names == set(EXAMPLES), "add new statistics to EXAMPLES (and BAD_ARGS)"
    assert names == set(BAD_ARGS)
    for name in names:
        assert registered_types()[name].__name__ == name
        assert name in S.__all__, f"{name} not exported from streams.stats"


def test_public_names_exist():
    for name in S.__all__:
        assert hasattr(S, name), name


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_docstring_has_example(cls):
    assert cls.__doc__ and ">>>" in cls.__doc__


# ---- round trips ----------------------------------------------------------------------------


def _json_copy(stat):
    state = stat.to_state()
    text = json.dumps(state, allow_nan=False)  # strict JSON: NaN/Inf must have been encoded
    loaded = json.loads(text)
    assert loaded["type"] == type(stat).__name__
    return stat_from_state(loaded), type(stat).from_state(json.loads(text))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@hsettings(40)
@given(data=series(max_size=30), cut=st.integers(0, 30))
def test_round_trips_give_identical_answers(cls, data, cut):
    stat = make(cls.__name__)
    head, tail = data[:cut], data[cut:]
    for x in head:
        stat.update(x)
    if head and cut % 2:
        stat.get()  # exercise caches / lazy state before copying
    copies = [
        pickle.loads(pickle.dumps(stat)),
        copy.deepcopy(stat),
        pickle.loads(pickle.dumps(stat, protocol=2)),
        *_json_copy(stat),
    ]
    for x in tail + [1.0, 2.0, 2.0, 5.0]:
        stat.update(x)
        want = readouts(stat)
        for c in copies:
            c.update(x)
            assert same_readouts(readouts(c), want), (type(c).__name__, readouts(c), want)
    final = json.dumps(stat.to_state(), allow_nan=False)
    for c in copies:
        assert (
            json.loads(json.dumps(c.to_state(), allow_nan=False))["params"]
            == json.loads(final)["params"]
        )


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@hsettings(25)
@given(data=series(max_size=40), every=st.integers(2, 3))
def test_answers_do_not_depend_on_when_they_are_read(cls, data, every):
    """Lazy statistics replay pending updates in order: reading after every update or only
    every few updates (fewer than the window) gives bit-identical answers."""
    eager, lazy = make(cls.__name__), make(cls.__name__)
    for i, x in enumerate(data):
        eager.update(x)
        lazy.update(x)
        want = readouts(eager)
        if i % every == 0:
            assert same_readouts(readouts(lazy), want), (readouts(lazy), want)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_from_state_rejects_other_types(cls):
    other = "Cusum" if cls.__name__ != "Cusum" else "PageHinkley"
    state = make(other).to_state()
    with pytest.raises(ValueError):
        cls.from_state(state)
    with pytest.raises(ValueError):
        stat_from_state({"type": "NoSuchStatistic", "params": {}, "state": {}})
    with pytest.raises(ValueError):
        stat_from_state({"params": {}})


# ---- inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_nonfinite_and_junk_are_skipped_never_raise(cls):
    stat = make(cls.__name__)
    ref = make(cls.__name__)
    junk = [
        math.nan,
        math.inf,
        -math.inf,
        float("nan"),
        np.nan,
        np.float32("inf"),
        None,
        "abc",
        [1.0],
        object(),
        10**400,
    ]
    for i, x in enumerate([0.5, 1.5, 3.0, 2.0, 7.0, 1.0, 4.0, 4.0, 2.5, 6.0]):
        stat.update(x)
        ref.update(x)
        stat.update(junk[i % len(junk)])
    assert stat.n_skipped == 10
    assert ref.n_skipped == 0
    assert same_readouts(readouts(stat)[2:], readouts(ref)[2:])
    assert same(stat.get(), ref.get())


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_numeric_types_are_converted(cls):
    a, b = make(cls.__name__), make(cls.__name__)
    vals = [1, 2.5, 3, 0.25, 8, 4, 4, 1]
    for v in vals:
        a.update(v)
        b.update(np.float32(v) if isinstance(v, float) else np.int64(v))
    assert same(a.get(), b.get())
    json.dumps(b.to_state(), allow_nan=False)  # no numpy scalars leak into the state


EMPTY_NEUTRAL = {"PageHinkley": 0.0, "Cusum": 0.0}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_empty_is_nan(cls):
    stat = make(cls.__name__)
    want = EMPTY_NEUTRAL.get(cls.__name__, math.nan)
    assert same(stat.get(), want)
    stat.update(math.nan)
    assert same(stat.get(), want)
    assert stat.n_skipped == 1


@pytest.mark.parametrize("name", sorted(BAD_ARGS))
def test_bad_arguments_raise_valueerror(name):
    cls = registered_types()[name]
    for kwargs in BAD_ARGS[name]:
        with pytest.raises(ValueError):
            cls(**kwargs)


# ---- bounded memory -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_memory_is_bounded(cls):
    rnd = random.Random(3)
    stat = make(cls.__name__)
    sizes = []
    for n in (200, 2000):
        for _ in range(n):
            stat.update(rnd.gauss(0.0, 1.0) if rnd.random() < 0.9 else rnd.choice([0.0, 1.0]))
            if rnd.random() < 0.3:
                stat.get()
        sizes.append(len(pickle.dumps(stat)))
    assert sizes[1] <= sizes[0] * 1.2 + 200, sizes


# ---- the docstring examples run ---------------------------------------------------------------


def _stats_modules():
    import importlib
    import pkgutil

    return [
        importlib.import_module(f"streams.stats.{m.name}") for m in pkgutil.iter_modules(S.__path__)
    ]


@pytest.mark.parametrize("module", _stats_modules(), ids=lambda m: m.__name__)
def test_doctests(module):
    import doctest

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
