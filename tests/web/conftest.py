"""Helpers of the dashboard tests: simulated runs fed into a Fleet the way the worker feeds it
(through the core, with the fleet store's records), free ports."""

from __future__ import annotations

import functools

import pytest

from contract.events import parse_event
from producers.sim import SimConfig, Simulator
from rules.loader import load_pack
from streams.fleet_store import FleetWriter, MemoryFleetStore, summary_of
from streams.processor import Pipeline


class FakeClock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def sim_events(run_id: str, steps: int, fault: str = "healthy", algo: str = "ppo", start: int = 0,
               t0: float = 1_000_000.0, onset: int = 50, seed: int = 3, world_size: int = 1,
               kl_target: float = 0.05):
    """Parsed events of a simulated run (rank 0 only unless world_size > 1). The simulator reports
    its KL target (``target.kl``); 0.05 is the pack's own, so the lines read the same either way."""
    sim = Simulator(SimConfig(run_id=run_id, algo=algo, fault=fault, onset=onset, seed=seed, kl_target=kl_target,
                              samples_every=10, checkpoint_every=50, world_size=world_size))
    for step in range(start, start + steps):
        for raw in sim.step(step, t0 + step):
            yield parse_event(raw, t0 + step)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _now(coro):
    """Run a coroutine that never waits (the in-memory store), inside or outside an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the coroutine waited: use a real event loop")


@functools.lru_cache(maxsize=1)
def builtin_pack():
    return load_pack("rlhf")


class Feed:
    """The worker's path in process: events through the core (:class:`Pipeline`), the summary
    and the event to the dashboard's Fleet, alerts as markers, records into a fleet store."""

    def __init__(self, fleet, clock=None, store=None, pack=None):
        self.fleet = fleet
        self.pipeline = Pipeline(pack or builtin_pack())
        self.store = store if store is not None else MemoryFleetStore()
        self.writer = FleetWriter(self.store, summary_of,
                                  local=fleet, clock=clock or fleet.clock, writer="test-worker")
        self.alerts = []

    def events(self, events, flush_every: int = 10) -> list:
        out = []
        for i, ev in enumerate(events):
            if hasattr(self.fleet.clock, "t") and ev.ts is not None:
                self.fleet.clock.t = ev.ts
            alerts = self.pipeline.feed(ev, ev.ts if ev.ts is not None else self.fleet.clock())
            self.writer.note(self.pipeline.state(ev.run_id), ev)
            for a in alerts:
                self.fleet.observe_alert(a)
            out += alerts
            if flush_every and i % flush_every == 0:
                self.flush()
        self.flush()
        self.alerts += out
        return out

    def flush(self) -> None:
        _now(self.writer.flush())
        self.fleet.set_records(_now(self.store.all()))

    def summary(self, run_id: str) -> dict:
        return summary_of(self.pipeline.state(run_id))
