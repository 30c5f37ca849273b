"""Faults of learning from preferences: the reward model and DPO's implicit reward.
Magnitudes: see the table in ``producers/sim/faults/__init__.py``."""

from __future__ import annotations

from producers.sim.dynamics import rm_accuracies
from producers.sim.faults.base import ALWAYS, Ctx, Injector
from producers.sim.frame import Frame
from producers.sim.noise import ramp


class RmOverfit(Injector):
    """Reward-model train accuracy > 0.95 while validation accuracy < 0.70.

    ``size``: how far validation accuracy falls (train rises toward 0.985). PPO / GRPO runs of
    this fault log ``rm/train_acc`` and ``rm/val_acc`` from the first step.
    """

    lead = ALWAYS

    def latent(self, f: Frame, c: Ctx) -> None:
        if f.rm_train is None:
            f.rm_train, f.rm_val = rm_accuracies(f.tau, f.acc_ar, c.nz)
        if c.since >= 0:
            s_ = ramp(c.since, 35)
            f.rm_train += (0.985 - f.rm_train) * s_
            f.rm_val -= c.size * s_
            if f.algo != "dpo":   # the policy exploits the overfit reward model
                f.reward_mu += 0.3 * ramp(c.since, 60)
                f.judge -= 0.1 * ramp(c.since, 60)


class DpoSaturation(Injector):
    """DPO preference probability saturates above 0.99.

    ``size``: how far the margin between chosen and rejected grows.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        r = ramp(c.p, 40)
        f.margin += c.size * r
        # the implicit reward separates every pair (held-out pairs too, though less)
        f.rm_train += (0.995 - f.rm_train) * r
        f.rm_val += (0.80 - f.rm_val) * r


class DpoChosenDecline(Injector):
    """DPO: the chosen responses' implicit reward falls while the margin grows (likelihood
    displacement: both answers lose probability).

    ``size``: the fall of the chosen reward per progress step (the margin grows 0.4 x that).
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.chosen -= c.size * c.p
        f.margin += 0.4 * c.size * c.p
