"""Faults of what the policy learns to produce: reward hacking, length, texts, entropy.
Magnitudes: see the table in ``producers/sim/faults/__init__.py``."""

from __future__ import annotations

import math

from producers.sim.faults.base import Ctx, Injector
from producers.sim.faults.reward import crash
from producers.sim.frame import Frame
from producers.sim.noise import ramp


class RewardCollapse(Injector):
    """Reward std collapses while the mean rises and length grows (hacking).

    ``size``: the fraction of the reward's spread left in the end.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        p = c.p
        f.r_std_mult *= c.size + (1.0 - c.size) * math.exp(-p / 22.0)
        f.reward_mu += 0.9 * ramp(p, 50)
        f.L += 60.0 * ramp(p, 60)
        f.entropy *= 1.0 - 0.45 * ramp(p, 80)
        f.judge -= 0.2 * ramp(p, 60)
        f.kl += 0.4 * c.T * ramp(p, 60)
        f.frac_zero = 0.95 * ramp(p, 25)
        f.sample_mode["hack"] = 0.9 * ramp(p, 30)
        f.sample_mode["identical"] = 1.0


class RewardQualityDivergence(Injector):
    """Reward rises while judge/score falls.

    ``size``: how far the judge's score falls (the reward rises 2.4 x that).
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.reward_mu += 2.4 * c.size * ramp(c.p, 70)
        f.judge -= c.size * ramp(c.p, 60)
        f.kl += 0.3 * c.T * ramp(c.p, 70)


class ProxyDivergence(Injector):
    """The optimised reward climbs while the true score (judge/score) stays flat or falls.

    ``size``: how far the reward climbs; the judge stops following the reward at the onset and,
    for the stronger half of the range, falls by up to 0.1.
    """

    def __init__(self) -> None:
        self.judge0: float | None = None

    def latent(self, f: Frame, c: Ctx) -> None:
        if self.judge0 is None:
            self.judge0 = f.judge_trend
        r = ramp(c.p, 100)
        f.reward_mu += c.size * r
        noise = f.judge - f.judge_trend - 0.35 * f.reward_wander   # the judge's own noise
        f.judge = self.judge0 + noise - 0.2 * max(0.0, c.q - 0.5) * ramp(c.p, 80)
        f.kl += 0.2 * c.T * r


class LengthHacking(Injector):
    """Response length grows steadily while reward rises.

    ``size``: the time constant (in progress steps) of the growth toward 88 % of max_length.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        p = c.p
        f.L += (0.88 * f.max_len - f.L) * ramp(p, c.size)
        f.reward_mu += 0.25 * ramp(p, 150)
        f.rho = 0.5 * ramp(p, 100)
        f.judge -= 0.1 * ramp(p, 150)


class TruncationRising(Injector):
    """More and more responses hit max_length (EOS ever later).

    ``size``: the share of responses that never stop, in the end.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.runaway += c.size * ramp(c.since, 120)


class LengthShape(Injector):
    """A mode of very long responses appears (bimodal lengths).

    ``size``: the share of responses in the long mode.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.long_frac = c.size * ramp(c.since, 40)


class RewardLengthCorr(Injector):
    """Per-sample reward becomes strongly correlated with length.

    ``size``: the correlation reached.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.rho = c.size * ramp(c.p, 40)
        f.L += 40.0 * ramp(c.p, 80)
        f.reward_mu += 0.1 * ramp(c.p, 80)


class ToolWords(Injector):
    """The same token ('Certainly') is the KL peak in most sequences.

    ``size``: the share of responses opening with it.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        share = c.size * ramp(c.p, 25)
        f.sample_mode["tool"] = share
        f.reward_mu += 0.15 * share
        f.kl += 0.25 * c.T * share


class DegenerateText(Injector):
    """Responses become heavily repetitive.

    ``size``: the share of repetitive responses.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        r60 = ramp(c.p, 60)
        f.sample_mode["degenerate"] = c.size * ramp(c.p, 30)
        f.entropy *= 1.0 - 0.35 * r60
        f.L += 250.0 * r60
        f.reward_mu -= 0.3 * r60
        f.judge -= 0.2 * r60
        f.kl += 0.5 * c.T * r60


class EntropyCollapse(Injector):
    """Policy entropy decays to near zero over ~100-200 steps.

    ``size``: the time constant (in progress steps) of the decay to 6 % of the level.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        factor = 0.06 + 0.94 * math.exp(-c.p / c.size)
        f.entropy *= factor
        f.kl += 0.5 * c.T * (1.0 - factor)
        f.r_std_mult *= 0.5 + 0.5 * factor
        f.sample_mode["degenerate"] = 0.5 * (1.0 - factor) ** 2


class EntropyBlowup(Injector):
    """Entropy rises several-fold within a few dozen steps while the reward crashes (the policy
    drifts toward noise).

    ``size``: the factor entropy rises by (95 % of it within ~36 steps), capped at 10.5 nats
    (uniform over a 36k-token vocabulary). The reward loses 60-95 % of its level (more for a
    larger magnitude).
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        r = ramp(c.since, 12)
        f.entropy = min(f.entropy * (1.0 + (c.size - 1.0) * r), max(f.entropy, 10.5))
        crash(f, (0.6 + 0.35 * c.q) * ramp(c.since, 8))
        f.kl += c.T * (0.5 + c.size / 10.0) * r
        f.token_mult *= 1.0 + 2.0 * r
        f.runaway += 0.2 * r
        f.sample_mode["gibberish"] = 0.8 * r
