"""What a simulated run is asked to be: :class:`SimConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ALGOS", "HEALTHY_FEATURES", "SimConfig"]

ALGOS = ("ppo", "grpo", "dpo")

#: Features of healthy training that a rule must not mistake for a fault
#: (``SimConfig.healthy_variant``; see ``producers/sim/healthy.py``).
HEALTHY_FEATURES = ("lr_warmup", "value_fit", "spikes", "low_entropy_drift", "kl_from_zero")


@dataclass
class SimConfig:
    """One simulated run.

    ``onset``: the step at which the fault starts developing; ``None`` draws it from the
    fault's onset range (``FAULTS[fault].onset``, 200-400 for most faults) by ``seed``.

    ``magnitude``: where the fault's size lies inside its magnitude range
    (``FAULTS[fault].magnitude``): 0 is the mildest, 1 the strongest; ``None`` draws it
    uniformly from [0, 1] by ``seed``. The drawn value is ``Simulator.magnitude``, the size in
    the range's own unit ``Simulator.size``. Ignored by faults without a range.

    ``log_every``: only every k-th step is emitted (step events, their dists, and the samples
    events of those steps), as real runs log; the run itself still advances every step, so a
    logged step has the same values as in a run logging every step. Checkpoints keep their own
    schedule.

    ``healthy_variant``: the healthy background of the run (faulty runs too). ``None`` or
    ``"plain"``: a 20-step warm-up from 20 % of the learning rate and smooth learning curves.
    A feature name of ``HEALTHY_FEATURES``, several (a tuple or a comma-separated string),
    ``"all"``, or ``"random"`` (each feature present with probability 1/2, drawn by ``seed``).
    ``Simulator.healthy_features`` says which are on.

    Onset, magnitude and healthy features are drawn from ``seed`` and the fault id only, so the
    same seed gives the same draw whatever the ``run_id``; the noise depends on both.
    """

    run_id: str
    algo: str = "ppo"            # "ppo" | "grpo" | "dpo"
    fault: str = "healthy"
    onset: int | None = None     # step at which the fault starts developing; None: drawn
    world_size: int = 1          # ranks; each emits its own step event, rank 0 carries everything
    seed: int = 0
    kl_target: float = 0.1       # per-token KL target a healthy run stays below
    samples_every: int = 10      # a samples event (8 samples) every N steps; 0: never
    checkpoint_every: int = 100  # a checkpoint event every N steps; 0: never
    dists_every: int = 1         # dists.reward / dists.response_length every N steps; 0: never
    max_length: int = 1024       # response length cap
    magnitude: float | None = None   # position in the fault's magnitude range; None: drawn
    log_every: int = 1           # emit every k-th step only
    healthy_variant: str | tuple[str, ...] | None = None
    fault_params: dict[str, Any] = field(default_factory=dict)  # optional variants (faults/)

    def check(self) -> None:
        """Raise ``ValueError`` on a setting no run can have."""
        if self.algo not in ALGOS:
            raise ValueError(f"unknown algo {self.algo!r} (expected one of {', '.join(ALGOS)})")
        if self.world_size < 1:
            raise ValueError("world_size must be >= 1")
        if self.kl_target <= 0:
            raise ValueError("kl_target must be > 0")
        if self.log_every < 1:
            raise ValueError("log_every must be >= 1")
        if self.onset is not None and self.onset < 0:
            raise ValueError("onset must be >= 0")
        if self.magnitude is not None and not 0.0 <= float(self.magnitude) <= 1.0:
            raise ValueError("magnitude must lie in [0, 1] (0 mildest, 1 strongest) or be None")
