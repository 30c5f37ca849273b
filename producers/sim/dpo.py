"""The healthy latent model of a DPO step (no generations: no samples, no dists).

The margin between the chosen and rejected implicit rewards grows with the effective training
time; the preference probability is its sigmoid; the chosen reward rises a little early and
then stays about level while the rejected one falls; gradients shrink as pairs get separated.
Metrics: ``dpo/pref_prob``, ``dpo/margin``, ``dpo/chosen_reward``, ``dpo/rejected_reward``,
``dpo/accuracy`` (the share of training pairs ranked right, also ``rm/train_acc``),
``rm/val_acc`` (held-out pairs), ``loss/policy``, ``kl/beta``, ``grad_norm/actor``,
``update_ratio/actor``, ``lr/actor``, ``gpu/mem_allocated_gb``.
"""

from __future__ import annotations

import math

from producers.sim.dynamics import BETA0, LR0, rm_accuracies
from producers.sim.frame import Frame, State
from producers.sim.healthy import Background
from producers.sim.noise import Noise, sig

__all__ = ["latent", "metrics", "spikes"]


def latent(f: Frame, st: State, bg: Background, nz: Noise) -> None:
    tau = f.tau
    u = 1.0 - math.exp(-tau / 300.0)
    slow = math.log1p(tau / 400.0)
    f.margin = 1.3 * u + 0.1 * slow + st.ar_step("margin", nz) + 0.05 * nz.g()
    f.chosen = 0.35 * u - 0.08 * slow + st.ar_step("chosen", nz)
    f.grad_level = math.exp(st.ar_step("grad", nz))
    f.mem_noise = st.ar_step("mem", nz) + 0.03 * nz.g()
    f.acc_ar = st.ar_step("acc", nz)
    f.rm_train, f.rm_val = rm_accuracies(tau, f.acc_ar, nz, lo=0.52, gain_train=0.30,
                                         gain_val=0.22)
    f.kl_beta = BETA0["dpo"] * f.beta_factor


def spikes(f: Frame, bg: Background, nz: Noise) -> None:
    g = bg.spike("grad", f.step)
    if g:
        f.grad_mult *= g


def metrics(f: Frame, bg: Background, nz: Noise) -> None:
    pref = sig(f.margin)
    loss = -math.log(max(pref, 1e-12)) * math.exp(0.03 * nz.g())
    grad = 0.8 * (0.5 + 0.5 * math.exp(-f.tau / 500.0)) * f.grad_level
    grad *= ((1.0 - pref) * 2.0 + 0.05) * f.grad_mult
    lr_eff = f.lr_sched * f.lr_factor * f.lr_mult
    train = min(f.rm_train, 1.0)
    f.m = {
        "dpo/pref_prob": pref,
        "dpo/margin": f.margin,
        "dpo/chosen_reward": f.chosen,
        "dpo/rejected_reward": f.chosen - f.margin,
        "dpo/accuracy": train,
        "loss/policy": loss,
        "kl/beta": f.kl_beta,
        "grad_norm/actor": grad,
        "update_ratio/actor": 8e-3 * lr_eff * math.exp(0.1 * nz.g()),
        "lr/actor": LR0["dpo"] * lr_eff,
        "gpu/mem_allocated_gb": 36.0 + f.mem_noise + f.mem_extra,
        "rm/train_acc": train,
        "rm/val_acc": min(f.rm_val, 1.0),
    }
