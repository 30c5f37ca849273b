"""The state a simulated run carries between steps, and the frame of one step.

:class:`State` is what integrates over steps (the effective training time, the fault's
progress, the slow AR(1) wander) and what a rollback restores. :class:`Frame` holds one step:
the latent quantities of the healthy model, the knobs through which a fault acts on them, the
drawn batch, and the metrics. Injectors (``producers/sim/faults/``) edit a frame in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from producers.sim.noise import AR, Noise

__all__ = ["Frame", "State"]


@dataclass
class State:
    tau: float = 0.0        # effective training time: the integral of the learning rate
    tau_c: float = 0.0      # the same for the critic's learning rate
    kl_scale: float = 1.0   # how far KL has followed a beta adjustment
    p: float = 0.0          # the fault's progress since its onset (in its clock's units)
    ar: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in AR})

    def ar_step(self, name: str, nz: Noise) -> float:
        phi, sd = AR[name]
        x = phi * self.ar[name] + sd * math.sqrt(1.0 - phi * phi) * nz.g()
        self.ar[name] = x
        return x

    def copy(self) -> State:
        return State(self.tau, self.tau_c, self.kl_scale, self.p, dict(self.ar))


@dataclass
class Frame:
    """One step. The first block is given, the second is the healthy model's, the third the knobs
    a fault turns (their defaults are the healthy values), the last the step's outputs."""

    # given
    step: int
    since: int                  # steps since the onset (< 0: before it)
    algo: str
    T: float                    # the KL target
    max_len: int
    tau: float
    tau_c: float
    lr_sched: float             # learning rate as a fraction of its peak (warm-up)
    lr_factor: float = 1.0      # adjust multipliers
    lr_critic_factor: float = 1.0
    beta_factor: float = 1.0
    kl_scale: float = 1.0       # how far KL has followed a beta adjustment

    # the healthy latent model (filled by dynamics)
    r_trend: float = 0.0        # the reward's learning curve
    reward_wander: float = 0.0  # its slow wander (part of reward_mu)
    reward_mu: float = 0.0      # the batch's mean reward
    r_std: float = 0.0          # the within-batch reward spread
    kl: float = 0.0
    kl_noise: float = 0.0       # the log-noise part of kl
    entropy: float = 0.0
    L: float = 0.0              # mean response length
    judge: float = 0.0          # external quality score
    judge_trend: float = 0.0    # its learning curve (judge without noise)
    clip: float = 0.0
    clip_noise: float = 1.0
    grad_level: float = 1.0
    value_ar: float = 0.0
    vloss_noise: float = 1.0
    mem_noise: float = 0.0
    acc_ar: float = 0.0         # wander of reward-model accuracies
    kl_beta: float = 0.0
    epoch: int = 0
    n_epochs: int = 4
    margin: float = 0.0         # DPO: chosen minus rejected implicit reward
    chosen: float = 0.0         # DPO: chosen implicit reward
    rm_train: float | None = None  # reward-model accuracies (emitted when set)
    rm_val: float | None = None

    # knobs
    token_mult: float = 1.0     # kl/token_max
    token_cap: float | None = None
    p99_mult: float = 1.0       # kl/token_p99
    rho: float = 0.0            # per-sample reward-length correlation
    bimodal: float = 0.0        # share of samples exploiting the reward model
    long_frac: float = 0.0      # share of very long responses
    runaway: float = 0.004      # share of responses that never emit EOS
    returns_extreme: float = 0.0  # share of samples with absurd rewards (data problem)
    clip_target: float | None = None
    kl_ppo_inc: float = 0.0015  # kl/ppo growth per PPO epoch
    lr_mult: float = 1.0
    grad_mult: float = 1.0
    vloss_mult: float = 1.0
    value_shift: float = 0.0
    value_std_mult: float = 1.0
    mem_extra: float = 0.0
    frac_zero: float | None = None  # GRPO share of zero-variance groups (None: healthy)
    r_std_mult: float = 1.0
    beta_mult: float = 1.0
    group_delta: dict[str, float] = field(default_factory=lambda: {
        "safety": 0.0, "knowledge": 0.0, "creative": 0.0})
    sample_mode: dict[str, Any] = field(default_factory=dict)  # what the samples show

    # outputs
    token_max: float = 0.0      # the batch's peak token KL (samples draw theirs below it)
    lengths: np.ndarray | None = None
    rewards: np.ndarray | None = None
    m: dict[str, float] = field(default_factory=dict)
    groups: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def grpo(self) -> bool:
        return self.algo == "grpo"
