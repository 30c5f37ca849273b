"""The run keeps its extreme prompt (prompt_extreme_reward) up to date as samples arrive,
without a pass over every prompt per samples event: always the prompt a full look finds."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from streams import run as run_mod
from streams.run import RunState, extreme_prompt


def _event(rng, prompts, n, nan_every=0):
    samples = []
    for i in range(n):
        reward = rng.choice([rng.gauss(0, 1), rng.choice([0.0, 1.0, -1.0])])
        if nan_every and rng.random() < 1 / nan_every:
            reward = math.nan
        samples.append(SimpleNamespace(prompt_id=rng.choice(prompts), reward=reward))
    return SimpleNamespace(samples=samples)


@pytest.mark.parametrize("seed", range(25))
def test_the_extreme_prompt_is_the_one_a_full_look_finds(seed, monkeypatch):
    rng = random.Random(seed)
    monkeypatch.setattr(run_mod, "MAX_PROMPTS", rng.choice([5, 20, 2000]))   # evictions too
    prompts = [f"p{i}" for i in range(rng.choice([3, 12, 60]))]
    st = RunState("r")
    looks = 0
    for k in range(300):
        st._tally(_event(rng, prompts, rng.randint(0, 12), nan_every=rng.choice([0, 50])))
        if rng.random() < 0.02:
            st.reset(None)
        if rng.random() < 0.7:        # read now and then, as samples rules do
            looks += 1
            assert st.extreme_prompt() == extreme_prompt(st.prompts), k
            best = st.extreme_prompt()
            want = run_mod.sample_value([], "prompt_id", "prompt_extreme", st.prompts)
            got = run_mod._prompt_value(st.prompts, best)
            assert got == want or (got[0] != got[0] and want[0] != want[0])
    assert looks > 100


def test_ties_go_to_the_first_prompt_in_order():
    st = RunState("r")
    ev = SimpleNamespace(samples=[SimpleNamespace(prompt_id=p, reward=r)
                                  for p, r in [("a", 1.0), ("b", -1.0), ("c", 0.0)] * 3])
    st._tally(ev)
    assert st.extreme_prompt() == "a" == extreme_prompt(st.prompts)   # |z| of a and b tie
    st._tally(SimpleNamespace(samples=[SimpleNamespace(prompt_id=p, reward=r)
                                       for p, r in [("b", -1.0), ("a", 1.0), ("c", 0.0)] * 3]))
    assert st.extreme_prompt() == extreme_prompt(st.prompts) == "a"


def test_a_restored_run_looks_again():
    st = RunState("r")
    st._tally(_event(random.Random(1), ["x", "y"], 12))
    assert st.extreme_prompt() is not None
    st.prompts = {"z": [3, 6.0, 6.0]}       # as from_state sets it
    assert st.extreme_prompt() == "z"


def test_an_earlier_prompt_that_draws_level_takes_over():
    st = RunState("r")
    st.prompts = {"a": [3, 3.0, 3.0], "b": [3, 6.0, 6.0]}
    assert st.extreme_prompt() == "b"
    st.prompts["a"][1] = 6.0              # a's mean z is now 2.0 too: a comes first
    st._follow_extreme("a", 2.0)
    assert st.extreme_prompt() == "a" == extreme_prompt(st.prompts)
