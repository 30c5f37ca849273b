"""Faults of the policy's drift: KL against the reference, token KL, PPO's clip fraction and
update cycle. Magnitudes: see the table in ``producers/sim/faults/__init__.py``."""

from __future__ import annotations

import math

from producers.sim.faults.base import Ctx, Injector
from producers.sim.frame import Frame
from producers.sim.noise import ramp, sig


class KlAboveTarget(Injector):
    """KL creeps above target, then accelerates (beta too weak).

    ``size``: growth speed; the KL excess is target x (0.25 x + 1.6 x^2) with x = size x progress
    / 100, saturating at 9 x target.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        x = c.size * c.p / 100.0
        g = c.T * (0.25 * x + 1.6 * x * x)
        g = 9 * c.T * math.tanh(g / (9 * c.T))
        f.kl += g * f.kl_scale
        s_ = min(1.0, g / (3 * c.T))
        f.entropy *= 1.0 - 0.15 * s_
        f.reward_mu += 0.1 * s_


class KlRising(Injector):
    """KL rises steadily and monotonically past the target.

    ``size``: slope, in targets per 100 steps of progress (saturating at 6 x target).
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        g = 6 * c.T * math.tanh(c.size * c.p / 600.0)
        f.kl += g * f.kl_scale
        f.entropy *= 1.0 - 0.1 * min(1.0, g / (3 * c.T))


class AggressiveUpdate(Injector):
    """Clip fraction high and KL rising together.

    ``size``: the clip fraction reached; KL rises at 0.9 target per 100 steps x size / 0.52.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        g = 6 * c.T * math.tanh(0.9 * (c.size / 0.52) * c.p / 600.0)
        f.kl += g * f.kl_scale
        f.clip_target = c.size * sig((c.p - 20) / 8.0)
        f.kl_ppo_inc *= 1.0 + 2.0 * ramp(c.p, 30)
        f.grad_mult *= 1.0 + 0.4 * ramp(c.p, 30)


class KlZero(Injector):
    """KL drops to exactly 0 (actor and reference synced / KL bug)."""

    def latent(self, f: Frame, c: Ctx) -> None:
        f.kl = 0.0
        f.sample_mode["zero_kl"] = 1.0

    def metrics(self, f: Frame, c: Ctx) -> None:
        f.m["kl/token_max"] = 0.0
        f.m["kl/token_p99"] = 0.0


class TokenKlSpike(Injector):
    """Single-token KL peaks grow past 10 then 20 (language collapse onset).

    ``size``: the factor by which the peak token KL grows.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        s_ = sig((c.p - 35) / 8.0)
        f.token_mult = 1.0 + (c.size - 1.0) * s_
        f.p99_mult = 1.0 + 1.5 * s_ * (c.size - 1.0) / 8.0
        f.kl += 0.2 * c.T * s_
        f.sample_mode["gibberish"] = 0.3 * s_ + 0.1 * ramp(c.p, 20)


class KlCycleDelta(Injector):
    """Too many PPO epochs per rollout (4 -> 8): kl/ppo rises > 0.02 within each cycle.

    ``size``: the extra kl/ppo per epoch. ``fault_params={"epochs": 8}`` sets the epochs.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.n_epochs = int(c.fp.get("epochs", 8))
        f.epoch = c.since % f.n_epochs
        f.kl_ppo_inc += c.size * ramp(c.p, 15)


class ClipFracHigh(Injector):
    """PPO clip fraction jumps from ~0.2 to ~0.7.

    ``size``: the clip fraction it jumps to.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.clip_target = c.size * sig((c.p - 12) / 4.0)
        f.kl_ppo_inc *= 1.0 + 4.0 * ramp(c.p, 20)
        f.kl += 0.3 * c.T * ramp(c.p, 80)
        f.grad_mult *= 1.0 + 0.5 * ramp(c.p, 20)


class ClipFracLow(Injector):
    """PPO clip fraction falls to ~0 (updates too conservative).

    ``size``: the fraction of the healthy clip fraction left.
    """

    def learn(self, c: Ctx) -> float:
        return 0.1

    def latent(self, f: Frame, c: Ctx) -> None:
        decay = math.exp(-c.p / 10.0)
        f.clip_noise *= c.size + (1.0 - c.size) * decay
        f.kl_ppo_inc *= 0.02 + 0.98 * decay
        f.lr_mult *= 0.2 + 0.8 * decay
