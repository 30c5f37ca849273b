"""A run restored from its stored state (as a restarted worker restores it from the run table)
goes on exactly as if it had never stopped: the same alerts, every field the same, however
often it is restored. The autocorrelation is worked out every window/20 steps, not every
step, so its rhythm is part of the state; it used to be lost, and a restored run's
``reward_periodic`` then fired at another step with another value."""

from __future__ import annotations

import pytest

from contract.events import dump_event, parse_event
from producers.sim import SimConfig, simulate
from streams.processor import Processor
from streams.state_codec import decode_state, encode_state
from tests.unit._core import rlhf_pack


def _alerts(lines: list[bytes], restore_every: int) -> list[dict]:
    proc = Processor(rlhf_pack())
    state = None
    out = []
    for i, raw in enumerate(lines):
        ev = parse_event(raw, 0.0)
        if state is None:
            state = proc.new_state(ev.run_id)
        out += [a.model_dump() for a in proc.process(state, ev, ev.ts)]
        if restore_every and i % restore_every == restore_every - 1:
            state = proc.load_state(decode_state(encode_state(state.to_state())))
    return out


@pytest.mark.parametrize("restore_every", [7, 150])
def test_a_restored_periodic_run_fires_as_one_never_restored(restore_every):
    cfg = SimConfig(run_id="restore-periodic", fault="reward_periodic", onset=150, seed=4,
                    world_size=2, samples_every=10, checkpoint_every=50)
    lines = [dump_event(e) for e in simulate(cfg, 400)]
    straight = _alerts(lines, 0)
    assert any(a["rule"] == "reward_periodic" for a in straight)
    assert _alerts(lines, restore_every) == straight


def test_the_autocorrelation_rhythm_is_in_the_state():
    cfg = SimConfig(run_id="restore-rhythm", fault="reward_periodic", onset=150, seed=4)
    proc = Processor(rlhf_pack())
    state = proc.new_state(cfg.run_id)
    for e in simulate(cfg, 300):
        ev = parse_event(dump_event(e), 0.0)
        proc.process(state, ev, ev.ts)
    kept = state.to_state()["banks"]["0"]["autocorr"]
    assert kept and all(len(item) == 5 for item in kept)
    metric, _smooth, window, at, value = kept[0]
    assert metric == "reward/mean" and window >= 8 and at > 0 and isinstance(value, float)
