"""The healthy latent model of a PPO / GRPO step: learning curves, noise, batch statistics.

* The learning curves (reward rises fast then slowly, KL creeps up to a plateau below the
  target, entropy declines slowly, value loss falls, length drifts) are functions of the
  effective training time ``tau``, the integral of the (warmed-up, adjustable) learning rate, so
  ``apply_adjust({"lr": 0.5})`` really slows the run.
* Noise is a mix of slow AR(1) wander (``State.ar``) and per-step noise.
* Batch statistics (``reward/mean``, ``reward/std``, ``response/*``) are computed from a batch of
  256 responses whose first 64 values are the ``dists``; metrics are correlated (returns follow
  reward and KL, the value loss follows the value/returns mismatch, GPU memory follows lengths).

Healthy levels scale with the KL target: PPO KL plateaus at ~0.3-0.45 x target, GRPO at ~0.35 x
target with rare single-step spikes (< 1.8 x target).

:func:`latent` runs every step (it advances the AR wander); :func:`batch` and :func:`metrics` run
only on logged steps and draw from the step's own generator, so thinning the log changes no
logged value.
"""

from __future__ import annotations

import math

import numpy as np

from producers.sim.frame import Frame, State
from producers.sim.healthy import Background
from producers.sim.noise import Noise

__all__ = ["BATCH", "BETA0", "CATEGORIES", "DIST_N", "LR0", "batch", "healthy_frac_zero",
           "latent", "metrics", "rm_accuracies"]

CATEGORIES = ("safety", "knowledge", "creative")
GROUP_OFFSETS = {"safety": 0.12, "knowledge": -0.08, "creative": -0.04}
BATCH = 256          # responses per simulated step (metrics are statistics of it)
DIST_N = 64          # per-sample values reported in dists
PPO_EPOCHS = 4
LR0 = {"ppo": 1.0e-6, "grpo": 1.0e-6, "dpo": 5.0e-7}
BETA0 = {"ppo": 0.05, "grpo": 0.04, "dpo": 0.1}


def latent(f: Frame, st: State, bg: Background, nz: Noise) -> None:
    """The healthy curves and this step's noise, into ``f``."""
    tau, T = f.tau, f.T
    slow = math.log1p(tau / 400.0)
    if f.grpo:
        u = 1.0 - math.exp(-tau / 200.0)
        f.r_trend = min(0.28 + 0.42 * u + 0.05 * slow, 0.92)
        kl = T * (0.005 + 0.30 * (1.0 - math.exp(-tau / 250.0)) + 0.04 * slow)
        f.entropy = 0.9 * (0.7 + 0.3 * math.exp(-tau / 800.0))
        f.L = 230.0 - 40.0 * (1.0 - math.exp(-tau / 300.0))
        f.judge = 0.50 + 0.22 * u + 0.02 * slow
        f.clip = 0.15
    else:
        u = 1.0 - math.exp(-tau / 250.0)
        f.r_trend = 0.3 + 0.75 * u + 0.30 * slow
        kl = T * (0.004 + 0.28 * (1.0 - math.exp(-tau / 300.0)) + 0.06 * slow)
        f.entropy = 2.3 * (0.78 + 0.22 * math.exp(-tau / 1200.0))
        f.L = 290.0 - 30.0 * (1.0 - math.exp(-tau / 400.0))
        f.judge = 0.52 + 0.20 * u + 0.02 * slow
        f.clip = 0.17
    if bg.kl_plateau is not None:
        kl = T * (0.002 + bg.kl_plateau * (1.0 - math.exp(-tau / bg.kl_time)))
    if bg.entropy_level is not None:
        f.entropy = bg.entropy_level * (0.6 + 0.4 * math.exp(-tau / 1500.0))
    f.judge_trend = f.judge
    f.r_std = 0.55 - 0.08 * u if not f.grpo else math.sqrt(f.r_trend * (1 - f.r_trend) / 7.0)
    f.kl = kl * st.kl_scale
    f.epoch = f.step % PPO_EPOCHS
    f.kl_beta = BETA0[f.algo] * f.beta_factor

    f.reward_wander = st.ar_step("reward", nz)
    f.reward_mu = f.r_trend + f.reward_wander
    f.kl_noise = st.ar_step("kl", nz) + 0.07 * nz.g()
    f.kl *= math.exp(f.kl_noise)
    e_noise = st.ar_step("entropy", nz) + 0.012 * nz.g()
    if bg.entropy_level is not None:   # low entropy wanders more, relative to its level
        e_noise *= 4.0
    f.entropy *= math.exp(e_noise)
    f.L *= math.exp(st.ar_step("length", nz))
    # the judge agrees with the reward on a healthy run: it shares the reward's wander
    f.judge += 0.35 * f.reward_wander + st.ar_step("judge", nz) + 0.012 * nz.g()
    f.clip_noise = math.exp(st.ar_step("clip", nz) + 0.06 * nz.g())
    f.grad_level = math.exp(st.ar_step("grad", nz) + 0.1 * nz.g())
    f.value_ar = st.ar_step("value", nz)
    f.vloss_noise = math.exp(st.ar_step("vloss", nz) + 0.08 * nz.g())
    f.mem_noise = st.ar_step("mem", nz) + 0.03 * nz.g()
    f.acc_ar = st.ar_step("acc", nz)


def spikes(f: Frame, bg: Background, nz: Noise) -> None:
    """One-step excursions of a healthy run (after any fault's effect on the latent state)."""
    if f.grpo and nz.u() < 0.004:     # GRPO: a rare single-step KL spike, < 1.8 x target
        f.kl = max(f.kl, min(f.kl * (2.0 + 1.5 * nz.u()), 1.8 * f.T))   # never lowers a KL fault
        f.token_mult *= 2.0
        f.token_cap = 9.5
    k = bg.spike("kl", f.step)
    if k:
        f.kl *= k
    r = bg.spike("reward", f.step)
    if r:
        f.reward_mu += r * (0.018 + f.r_std * f.r_std_mult / 16.0)
    g = bg.spike("grad", f.step)
    if g:
        f.grad_mult *= g


def batch(f: Frame, rng: np.random.Generator) -> None:
    """Draw the step's responses: lengths and per-sample rewards."""
    max_len = f.max_len
    r_sd = f.r_std * f.r_std_mult
    cv = 0.35
    sl = math.sqrt(math.log(1 + cv * cv))
    mu_l = math.log(max(f.L, 8.0)) - sl * sl / 2
    zl = rng.standard_normal(BATCH)
    lengths = np.exp(mu_l + sl * zl)
    if f.long_frac > 0:
        m = rng.random(BATCH) < f.long_frac
        lengths[m] = rng.normal(780.0, 110.0, int(m.sum()))
    tr = rng.random(BATCH) < f.runaway
    lengths[tr] = max_len
    f.lengths = np.clip(np.rint(lengths), 8, max_len)
    f.reward_mu += sum(f.group_delta.values()) / 3.0   # categories move the batch mean
    e = rng.standard_normal(BATCH)
    rho = f.rho
    mix = rho * zl + math.sqrt(max(0.0, 1 - rho * rho)) * e
    rewards = f.reward_mu + r_sd * mix
    if f.grpo:
        rewards = np.clip(rewards, -0.5, 1.5)
    if f.bimodal > 0:
        hb = rng.random(BATCH) < f.bimodal
        rewards[hb] += 6.0 * f.r_std if not f.grpo else 1.2
    if f.returns_extreme > 0:
        xm = rng.random(BATCH) < f.returns_extreme
        k_ = int(xm.sum())
        rewards[xm] = rng.choice([-1.0, 1.0], k_) * rng.uniform(40, 100, k_)
    f.rewards = rewards


def healthy_frac_zero(f: Frame) -> float:
    """GRPO: the share of groups whose rewards are all equal, on a healthy run."""
    return 0.12 + 0.3 * max(0.0, f.r_trend - 0.28)


def rm_accuracies(tau: float, acc_ar: float, nz: Noise, lo: float = 0.60,
                  gain_train: float = 0.25, gain_val: float = 0.17) -> tuple[float, float]:
    """(train, validation) accuracy of a reward model still learning (no overfit), before the
    cap at 1."""
    u = 1.0 - math.exp(-tau / 300.0)
    return (lo + gain_train * u + acc_ar + 0.006 * nz.g(),
            lo + gain_val * u + acc_ar + 0.008 * nz.g())


def metrics(f: Frame, bg: Background, nz: Noise) -> None:
    """The step's metrics (``f.m``) and per-category rewards (``f.groups``)."""
    grpo, T, step = f.grpo, f.T, f.step
    lengths, rewards = f.lengths, f.rewards
    truncated = lengths >= f.max_len
    length_mean = float(lengths.mean())
    length_max = float(lengths.max())
    trunc_frac = float(truncated.mean())
    kl = f.kl

    token_max = (1.2 + 45.0 * kl) * math.exp(0.15 * nz.g()) * f.token_mult
    if f.token_cap is not None:
        token_max = min(token_max, f.token_cap)
    f.token_max = token_max
    token_p99 = (0.04 + 9.0 * kl) * math.exp(0.1 * nz.g()) * f.p99_mult
    lr_eff = f.lr_sched * f.lr_factor * f.lr_mult
    clip_base = (f.clip * (0.6 + 0.4 * bg.warmup_fraction(step))
                 * math.sqrt(f.lr_factor * f.lr_mult))
    clip_frac = clip_base * (1.0 + 0.04 * f.epoch) * f.clip_noise
    if f.clip_target is not None:
        clip_frac = max(clip_frac, f.clip_target * f.clip_noise)
    clip_frac = min(max(clip_frac, 0.0), 0.98)
    kl_ppo = (0.003 + f.kl_ppo_inc * f.epoch) * f.lr_factor * f.lr_mult * math.exp(0.1 * nz.g())
    grad_actor = (1.0 if not grpo else 0.35) * (0.55 + 0.45 * math.exp(-f.tau / 600.0))
    grad_actor *= f.grad_level * f.grad_mult
    upd_actor = 1.0e-2 * lr_eff * math.exp(0.1 * nz.g())
    mem_base = 48.0 if not grpo else 40.0
    mem = mem_base + 0.012 * length_mean + 0.0015 * length_max + f.mem_noise + f.mem_extra
    kl_beta = f.kl_beta * f.beta_mult

    m: dict[str, float] = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "kl/mean": kl,
        "kl/token_max": token_max,
        "kl/token_p99": token_p99,
        "kl/beta": kl_beta,
        "entropy/mean": f.entropy,
        "ppo/clip_frac": clip_frac,
        "response/length_mean": length_mean,
        "response/length_max": length_max,
        "response/truncated_frac": trunc_frac,
        "response/eos_frac": 1.0 - trunc_frac,
        "grad_norm/actor": grad_actor,
        "update_ratio/actor": upd_actor,
        "lr/actor": LR0[f.algo] * lr_eff,
        "gpu/mem_allocated_gb": mem,
        "judge/score": min(max(f.judge, 0.0), 1.0),
    }
    if f.rm_train is not None:
        m["rm/train_acc"] = min(f.rm_train, 1.0)
        m["rm/val_acc"] = min(f.rm_val, 1.0)
    if grpo:
        fz = healthy_frac_zero(f) if f.frac_zero is None else max(f.frac_zero, healthy_frac_zero(f))
        fz = min(max(fz + 0.03 * nz.g(), 0.0), 1.0)
        m["reward/frac_zero_std"] = fz
        m["advantages/mean"] = 0.004 * nz.g()
        m["advantages/std"] = math.sqrt(max(1.0 - fz, 0.0)) * (0.97 + 0.01 * nz.g())
        m["loss/policy"] = kl_beta * kl + 0.01 * nz.g()
    else:
        m.update(_critic(f, bg, nz, rewards, length_mean, kl_beta, kl))
        m["kl/ppo"] = kl_ppo
        m["ppo/epoch"] = float(f.epoch)
        m["loss/policy"] = -0.008 + 0.012 * nz.g()
    f.m = m

    scale = 1.0 if not grpo else 0.4
    total = sum(f.group_delta.values())
    f.groups = {"reward/mean": {
        c: m["reward/mean"] + scale * GROUP_OFFSETS[c] + f.group_delta[c] - total / 3.0
        + (0.04 if not grpo else 0.02) * nz.g()
        for c in CATEGORIES
    }}


def _critic(f: Frame, bg: Background, nz: Noise, rewards: np.ndarray, length_mean: float,
            kl_beta: float, kl: float) -> dict[str, float]:
    """PPO's value head against the returns of the batch."""
    tau_c = f.tau_c
    penalty = kl_beta * kl * length_mean * 0.1
    returns = rewards - penalty
    returns_mean = float(returns.mean())
    returns_std = float(returns.std()) * 1.02
    returns_abs_max = float(np.abs(returns).max()) * 1.03
    err, std_factor = bg.value_fit(f.step)
    if "value_fit" in bg.features:
        vmean = returns_mean * (1.0 + err) + f.value_ar + f.value_shift
    else:
        vmean = returns_mean * (1.0 - 0.5 * math.exp(-tau_c / 80.0)) + f.value_ar + f.value_shift
    vstd = (returns_std * (0.55 + 0.35 * (1.0 - math.exp(-tau_c / 120.0))) * f.value_std_mult
            * std_factor)
    vloss = (0.03 + 0.3 * math.exp(-tau_c / 150.0)) * f.vloss_noise
    vloss += 0.5 * (vmean - returns_mean) ** 2
    vloss += 0.5 * max(0.0, vstd - returns_std) ** 2
    if f.returns_extreme > 0:
        vloss *= max(1.0, (returns_std / (f.r_std * 1.02)) ** 2)
    vloss *= f.vloss_mult
    lr_c = f.lr_sched * f.lr_critic_factor
    return {
        "loss/value": vloss,
        "value/mean": vmean,
        "value/std": vstd,
        "returns/mean": returns_mean,
        "returns/std": returns_std,
        "returns/abs_max": returns_abs_max,
        "advantages/mean": returns_mean - vmean + 0.005 * nz.g(),
        "advantages/std": math.sqrt(2 * vloss + 0.05 * returns_std ** 2 + 1e-4),
        "value/clip_frac": min(0.95, (0.04 + 0.5 * vloss / (vloss + 0.5)) * f.clip_noise),
        "grad_norm/critic": 1.5 * (vloss / 0.05) ** 0.25 * f.grad_level,
        "update_ratio/critic": 1.2e-2 * lr_c * math.exp(0.1 * nz.g()),
        "lr/critic": 5.0e-6 * lr_c,
    }
