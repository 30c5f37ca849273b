"""Faults of the reward's level, rhythm and spread. Magnitudes: see the table in
``producers/sim/faults/__init__.py``."""

from __future__ import annotations

import math

from producers.sim.dynamics import healthy_frac_zero
from producers.sim.faults.base import Ctx, Injector
from producers.sim.frame import Frame
from producers.sim.noise import ramp, sig


def crash(f: Frame, frac: float) -> None:
    """Take ``frac`` of the reward's level above its floor away (GRPO: rewards are success rates,
    floor 0, and the groups lose their spread with them; PPO: floor -0.5)."""
    floor = 0.0 if f.grpo else -0.5
    f.reward_mu = floor + (f.reward_mu - floor) * (1.0 - frac)
    f.judge -= frac * max(f.judge - 0.1, 0.0)
    if f.grpo:
        f.r_std_mult *= max(0.05, 1.0 - frac)
        h = healthy_frac_zero(f)
        f.frac_zero = h + (0.95 - h) * frac


class RewardSpike(Injector):
    """Reward jumps within a few steps (a reward hack found).

    ``size``: the jump of the mean reward.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        j = sig((c.p - 6) / 1.2)
        f.reward_mu += c.size * j * (1.0 - 0.3 * ramp(c.p - 10, 60))
        f.r_std_mult *= 1.0 + 0.4 * j
        f.kl += 0.3 * c.T * j
        f.judge -= 0.05 * j
        f.sample_mode["hack"] = 0.7 * j


class RewardOscillation(Injector):
    """Reward swings step to step (learning rate too high).

    ``size``: the amplitude of the swings.
    """

    def __init__(self) -> None:
        self.osc = 0.0

    def latent(self, f: Frame, c: Ctx) -> None:
        amp = c.size * ramp(c.p, 30) * min(c.lr_factor, 2.0)
        self.osc = -0.7 * self.osc + amp * math.sqrt(1 - 0.49) * c.nz.g()
        f.reward_mu += self.osc
        f.clip_noise *= 1.0 + 0.6 * ramp(c.p, 30)
        f.kl_ppo_inc *= 1.5
        f.grad_mult *= 1.0 + 0.3 * ramp(c.p, 30)


class RewardPeriodic(Injector):
    """Reward rises and falls with a fixed period (beta controller / data cycle).

    ``size``: the amplitude. ``fault_params={"period": 50}`` sets the period in steps.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        period = float(c.fp.get("period", 50))
        r = ramp(c.since, 40)
        phase = 2 * math.pi * c.since / period
        f.reward_mu += c.size * r * math.sin(phase)
        f.beta_mult = 1.0 + 0.35 * r * math.sin(phase - math.pi / 2)
        f.kl *= 1.0 - 0.2 * r * math.sin(phase)


class RewardDegradation(Injector):
    """Reward trends down.

    ``size``: how far the mean reward falls in the end (GRPO: half of it).
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        s = c.since
        drop = 0.004 * s + 0.00002 * s * s
        f.reward_mu -= c.size * (1.0 if not f.grpo else 0.5) * math.tanh(drop / 0.6)
        f.judge -= 0.1 * ramp(s, 100)


class RewardCrash(Injector):
    """Reward level drops abruptly (within ~2 steps) and stays down.

    ``size``: the share of the reward's level above its floor that is lost.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        j = sig((c.since - 0.5) / 0.4)
        crash(f, c.size * j)
        f.kl += 0.3 * f.T * j


class DeadReward(Injector):
    """Reward, its spread, KL and gradient norm exactly 0 step after step while the learning rate
    runs (a broken reward function: every group scores the same, nothing is learnt).

    No magnitude. ``fault_params={"value": 0.0}``: the constant reward. The default onset is
    step 0, as in the real run this mirrors; with a later onset the policy freezes where it was,
    so KL stays at its level instead of 0.
    """

    def learn(self, c: Ctx) -> float:
        return 0.0

    def latent(self, f: Frame, c: Ctx) -> None:
        value = float(c.fp.get("value", 0.0))
        f.reward_mu = value
        f.r_std_mult = 0.0
        f.frac_zero = 1.0
        f.grad_mult = 0.0
        f.sample_mode["constant_reward"] = value
        if c.onset <= 10:   # the policy never left its reference
            f.kl = 0.0
            f.sample_mode["zero_kl"] = 1.0

    def metrics(self, f: Frame, c: Ctx) -> None:
        m = f.m
        value = float(c.fp.get("value", 0.0))
        m["reward/mean"] = value
        m["reward/std"] = 0.0
        m["reward/frac_zero_std"] = 1.0
        for k in ("advantages/mean", "advantages/std", "grad_norm/actor", "update_ratio/actor",
                  "ppo/clip_frac"):
            if k in m:
                m[k] = 0.0
        if f.kl == 0.0:
            for k in ("kl/mean", "kl/token_max", "kl/token_p99", "loss/policy"):
                m[k] = 0.0
        f.groups = {"reward/mean": {k: value for k in f.groups.get("reward/mean", {})}}


class RewardShape(Injector):
    """Per-sample rewards become bimodal (a subset exploits the RM).

    ``size``: the share of samples in the exploiting mode.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.bimodal = c.size * ramp(c.p, 30)


class CategoryImbalance(Injector):
    """Creative reward keeps improving while safety stalls then falls.

    ``size``: how far creative rises (safety falls 0.86 x that, beyond its stall).
    """

    def __init__(self) -> None:
        self.r0: float | None = None

    def latent(self, f: Frame, c: Ctx) -> None:
        if self.r0 is None:
            self.r0 = f.r_trend
        stall = f.r_trend - self.r0
        f.group_delta["safety"] = -stall - 0.86 * c.size * ramp(c.since, 80)
        f.group_delta["creative"] = c.size * ramp(c.since, 80)


class PromptExtremeReward(Injector):
    """One prompt keeps getting extreme reward.

    ``size``: how many reward deviations away. ``fault_params={"direction": "low"}``: extremely
    low instead of high.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.sample_mode["extreme"] = c.size
        f.sample_mode["extreme_sign"] = -1.0 if c.fp.get("direction", "high") == "low" else 1.0

    def batch(self, f: Frame, c: Ctx) -> None:
        f.rewards[0] = f.reward_mu + f.sample_mode["extreme_sign"] * c.size * f.r_std


class Stagnation(Injector):
    """Reward and KL freeze (beta far too high).

    ``size``: the factor beta is raised by; the milder, the more learning is left.
    """

    def learn(self, c: Ctx) -> float:
        return 0.15 * max(0.0, 12.0 - c.size) / 8.0

    def latent(self, f: Frame, c: Ctx) -> None:
        r10, r30 = ramp(c.since, 10), ramp(c.since, 30)
        calm = 1.0 - (0.75 + 0.17 * c.q) * r30   # a policy pinned to the reference wanders less
        f.reward_mu -= (1.0 - calm) * f.reward_wander
        f.kl *= math.exp((calm - 1.0) * f.kl_noise)
        f.beta_mult = 1.0 + (c.size - 1.0) * r10
        f.kl *= 1.0 - 0.6 * r30
        f.clip_noise *= 1.0 - 0.5 * r30


class GrpoZeroVariance(Injector):
    """Most GRPO groups have zero reward variance.

    ``size``: the share of zero-variance groups reached.
    """

    def learn(self, c: Ctx) -> float:
        return 0.1

    def latent(self, f: Frame, c: Ctx) -> None:
        s_ = ramp(c.since, 20)
        f.reward_mu = f.reward_mu * (1 - s_) + 0.02 * s_
        f.r_std_mult *= 1.0 - 0.9 * s_
        f.grad_mult *= (1 - s_) + 0.003
        f.frac_zero = healthy_frac_zero(f) * (1 - s_) + c.size * s_
