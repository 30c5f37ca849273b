"""Simulated multi-rank PPO / GRPO / DPO training runs with fault injection.

Used by ``rlwatch demo``, the tests and the benchmarks. A run is the events of the public
contract (``contract.md`` section 1) as plain dicts: one ``step`` event per rank and logged step,
``samples`` events every ``samples_every`` steps and ``checkpoint`` events every
``checkpoint_every`` steps.

Where to read what:

* ``config.py``: :class:`SimConfig` (fault, onset, magnitude, logging interval, healthy variant);
* ``faults/__init__.py``: the fault table, one row per catalog id of failure-modes.md:
  injector, algorithms, clock, magnitude range; the injectors in ``faults/*.py``;
* ``healthy.py``: the variety of healthy runs (warm-up, value head fitting, one-step spikes,
  low entropy, KL growing from zero);
* ``dynamics.py`` / ``dpo.py``: the healthy latent model of a PPO / GRPO and a DPO step;
* ``samples.py``: generated texts; ``run.py``: the loop, adjust and rollback.
"""

from producers.sim.config import HEALTHY_FEATURES, SimConfig
from producers.sim.faults import (
    FAULT_ALGOS,
    FAULT_DESCRIPTIONS,
    FAULTS,
    ONSET_RANGE,
    Fault,
    Injector,
    Range,
    effective_algo,
)
from producers.sim.run import Simulator, simulate

__all__ = [
    "FAULTS",
    "FAULT_ALGOS",
    "FAULT_DESCRIPTIONS",
    "HEALTHY_FEATURES",
    "ONSET_RANGE",
    "Fault",
    "Injector",
    "Range",
    "SimConfig",
    "Simulator",
    "effective_algo",
    "simulate",
]
