"""The simulator's public names; the simulator itself lives in ``producers/sim/``."""

from producers.sim import (
    FAULT_ALGOS,
    FAULT_DESCRIPTIONS,
    FAULTS,
    HEALTHY_FEATURES,
    ONSET_RANGE,
    Fault,
    Injector,
    Range,
    SimConfig,
    Simulator,
    effective_algo,
    simulate,
)

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
