"""Helpers of the dashboard tests: simulated runs fed into a Fleet, free ports."""

from __future__ import annotations

import socket

import pytest

from producers.simulator import SimConfig, Simulator
from contract.events import parse_event


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeClock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def sim_events(run_id: str, steps: int, fault: str = "healthy", algo: str = "ppo", start: int = 0,
               t0: float = 1_000_000.0, onset: int = 50, seed: int = 3, world_size: int = 1):
    """Parsed events of a simulated run (rank 0 only unless world_size > 1)."""
    sim = Simulator(SimConfig(run_id=run_id, algo=algo, fault=fault, onset=onset, seed=seed,
                              samples_every=10, checkpoint_every=50, world_size=world_size))
    for step in range(start, start + steps):
        for raw in sim.step(step, t0 + step):
            yield parse_event(raw, t0 + step)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
