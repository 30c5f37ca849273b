"""GRPO histories from a second, independent generator, written as public TRL logs are.

The simulator (``producers/sim``) is the one the pack was tuned beside; a rule can come to fit
its shapes. This script draws runs another way: per-step rewards are the group statistics of
binary (verifiable) rewards, as TRL's GRPOTrainer logs them (``reward``, ``reward_std``,
``frac_reward_zero_std``, ``kl``, ``entropy``, ``completions/*``, ``grad_norm``, ...), with
healthy shapes the simulator does not make (a sigmoid climb, saturation near 100 % correct, a
cosine decay, an early dip, steady KL growth, reasoning-length growth, ...) and failures
injected in their simplest form (entropy decaying to 4 % with KL untouched, the reward crashing,
the spread collapsing under a reward model, ...). DPO shapes are written as TRL's DPOTrainer
logs them (implicit rewards of the chosen and rejected answers; one or several epochs), PPO
shapes as its PPOTrainer does (a reward model's score, KL summed over a sequence, a critic).
Each run is written logged every 1, 5 and 10 steps, in the real-logs format, with a
``labels.json`` that ``rlwatch backtest`` reads:

    python bench/shapes.py OUT [--seeds 8] [--seed-from 200] [--every 1,5,10] [--only a,b]
    rlwatch backtest OUT [--rules PACK]

Seeds are stable (the same seed writes the same file on any machine). Labels follow the
catalog's definitions (failure-modes.md); some healthy shapes are alarms by those definitions
(KL climbing past its target, answers lengthening with the reward): read the table per shape.
"""
from __future__ import annotations

import argparse
import json
import math
import zlib
from pathlib import Path

import numpy as np

HEALTHY = ("sigmoid", "saturate", "length_growth", "cosine", "entropy_rise", "early_dip",
           "kl_grow", "entropy_fall", "noisy_small", "plateau_early", "dpo_plain", "dpo_epochs",
           "ppo_plain", "ppo_value_fit")
#: failure shape -> its label (a catalog id, or a label rlwatch.backtest knows)
FAULTS = {
    "f_entropy_collapse": "entropy_collapse", "f_reward_crash": "reward_crash",
    "f_dead_signal": "reward_collapse", "f_entropy_blowup": "entropy_blowup",
    "f_kl_explode": "kl_above_target", "f_truncation": "truncation",
    "f_grad_explode": "grad_norm_anomaly", "f_degrade": "reward_degradation", "f_nan": "nan_inf",
    "f_rm_collapse": "reward_collapse", "f_dpo_chosen_decline": "dpo_chosen_decline",
    "f_dpo_grad_explode": "grad_norm_anomaly", "f_ppo_kl_blowup": "kl_above_target",
    "f_ppo_value_div": "value_loss_divergence", "f_ppo_no_eos": "truncation",
    "f_ppo_entropy_collapse": "entropy_collapse",
}
#: shapes written as TRL's DPOTrainer logs (preset trl-dpo); the others as its GRPOTrainer
DPO = ("dpo_plain", "dpo_epochs", "f_dpo_chosen_decline", "f_dpo_grad_explode")
#: shapes written as TRL's PPOTrainer logs (preset trl-ppo: KL summed over a sequence)
PPO = ("ppo_plain", "ppo_value_fit", "f_ppo_kl_blowup", "f_ppo_value_div", "f_ppo_no_eos",
       "f_ppo_entropy_collapse")


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _groups(p: float, size: int, groups: int, rng) -> tuple[float, float, float]:
    """Mean reward, mean within-group std and share of zero-std groups of binary rewards."""
    k = rng.binomial(size, min(max(p, 0.0), 1.0), size=groups)
    q = k / size
    std = np.sqrt(q * (1 - q) * size / (size - 1))
    return float(q.mean()), float(std.mean()), float(((k == 0) | (k == size)).mean())


def _draws(shape: str, seed: int):
    """(rng, u) of one run: its generator, stable across processes, and u(a, b), a uniform
    draw between a and b."""
    rng = np.random.default_rng(zlib.crc32(f"{shape}/{seed}".encode()))

    def u(a: float, b: float) -> float:
        return a + (b - a) * float(rng.random())
    return rng, u


def dpo_run(shape: str, seed: int, steps: int) -> tuple[list[dict], int]:
    """(rows, onset) of a DPO run: implicit rewards (beta x log-ratio) of the chosen and the
    rejected answers averaged over a batch, as TRL's DPOTrainer logs them."""
    rng, u = _draws(shape, seed)

    batch = int(rng.choice([8, 16, 32, 64]))
    epochs = int(rng.choice([2, 3])) if shape == "dpo_epochs" else 1
    chosen_end, rejected_end = u(-0.2, 0.6), u(-3.0, -0.8)
    tau = u(0.1, 0.4) * steps
    lr_peak, warm = u(5e-7, 5e-6), int(u(0.0, 0.1) * steps)
    gn0 = u(5.0, 40.0)
    onset = int(u(0.35, 0.6) * steps)
    fall, grad_tau = u(0.01, 0.03), u(8, 25)
    rows = []
    for s in range(1, steps + 1):
        x = s / steps
        epoch = min(epochs - 1, int(x * epochs))
        prog = 1 - math.exp(-s / tau)
        # a later epoch sees the same pairs again: the margin grows on them (memorised)
        boost = 1.0 + 0.8 * epoch
        chosen = chosen_end * prog * boost
        rejected = rejected_end * prog * boost
        on, d = s >= onset, s - onset
        if on and shape == "f_dpo_chosen_decline":   # both answers lose probability
            chosen -= fall * d
            rejected -= 1.5 * fall * d
        sd = 1.0 / math.sqrt(batch)
        c = chosen + float(rng.normal(0, 0.6 * sd + 0.1 * abs(chosen) * sd))
        r = rejected + float(rng.normal(0, 0.6 * sd + 0.1 * abs(rejected) * sd))
        margin = c - r
        acc = float(rng.binomial(batch, min(0.99, _sig(2.0 * (chosen - rejected))))) / batch
        loss = float(math.log1p(math.exp(-margin))) if margin > -30 else -margin
        gn = gn0 * (0.3 + 0.7 * math.exp(-s / (0.3 * steps))) / boost
        gn *= math.exp(float(rng.normal(0, 0.3)))
        if on and shape == "f_dpo_grad_explode":
            gn *= math.exp(d / grad_tau)
        rows.append({"step": s, "metrics": {
            "loss": loss, "grad_norm": gn,
            "learning_rate": lr_peak * min(1.0, s / max(warm, 1)) * (1 - x),
            "rewards/chosen": c, "rewards/rejected": r, "rewards/accuracies": acc,
            "rewards/margins": margin,
            "logps/chosen": -250.0 + 10 * c, "logps/rejected": -260.0 + 10 * r,
            "logits/chosen": -1.5 + 0.1 * c, "logits/rejected": -1.5 + 0.1 * r,
            "epoch": x * epochs,
        }})
    return rows, onset


def ppo_run(shape: str, seed: int, steps: int) -> tuple[list[dict], int]:
    """(rows, onset) of a PPO run with a reward model: its score, the KL summed over a
    sequence (1-13 is normal), a critic, as TRL's PPOTrainer logs them."""
    rng, u = _draws(shape, seed)

    batch = int(rng.choice([16, 32, 64, 128]))
    s0 = u(-2.0, 0.5)
    s1 = s0 + u(0.5, 3.0)
    tau = u(0.1, 0.5) * steps
    kl_end, ent0 = u(2.0, 9.0), u(0.3, 1.5)
    v_end = u(0.05, 0.5)
    v_start = v_end * (u(5, 40) if shape == "ppo_value_fit" else u(1.0, 2.0))
    v_tau = u(0.05, 0.2) * steps
    eos_p, lr_peak = u(0.8, 1.0), u(1e-6, 1e-5)
    onset = int(u(0.35, 0.6) * steps)
    v_fold, e_tau = u(8, 20), u(15, 60)
    rows = []
    for s in range(1, steps + 1):
        x = s / steps
        prog = 1 - math.exp(-s / tau)
        score = s0 + (s1 - s0) * prog
        kl = kl_end * math.sqrt(prog)
        ent = ent0 * (1 - 0.2 * prog)
        vloss = v_end + (v_start - v_end) * math.exp(-s / v_tau)
        clip = u(0.05, 0.15)
        p_eos = eos_p
        on, d = s >= onset, s - onset
        if on and shape == "f_ppo_kl_blowup":       # the policy runs from the reference
            kl *= math.exp(d / 15)
            score += 0.02 * d
            clip *= 1 + min(2.0, d / 30)
        elif on and shape == "f_ppo_value_div":
            vloss *= math.exp(d / v_fold)
        elif on and shape == "f_ppo_no_eos":        # answers stop ending: the EOS is unlearnt
            p_eos = eos_p * math.exp(-d / 5)
            score = score - (score + 0.1) * min(1.0, d / 10)   # TRL's missing-EOS penalty
        elif on and shape == "f_ppo_entropy_collapse":
            f = 0.04 + 0.96 * math.exp(-d / e_tau)
            ent *= f
            kl *= 1 + 1.5 * (1 - f)
        noise = 1.0 / math.sqrt(batch)
        rows.append({"step": s, "metrics": {
            "objective/scores": score + float(rng.normal(0, 2.0 * noise)),
            "objective/kl": max(0.0, kl * math.exp(float(rng.normal(0, 0.35)))),
            "objective/entropy": 40.0 * ent * math.exp(float(rng.normal(0, 0.1))),
            "objective/non_score_reward": -0.05 * kl,
            "objective/rlhf_reward": score - 0.05 * kl,
            "policy/entropy_avg": ent * math.exp(float(rng.normal(0, 0.1))),
            "policy/approxkl_avg": 0.02 * math.exp(float(rng.normal(0, 0.4))),
            "policy/clipfrac_avg": min(1.0, clip * math.exp(float(rng.normal(0, 0.3)))),
            "loss/policy_avg": float(rng.normal(0, 0.02)),
            "loss/value_avg": vloss * math.exp(float(rng.normal(0, 0.08))),
            "val/clipfrac_avg": u(0.05, 0.3),
            "val/num_eos_tokens": float(rng.binomial(batch, min(1.0, p_eos))),
            "lr": lr_peak * (1 - x),
            "episode": s * batch,
        }})
    return rows, onset


def run(shape: str, seed: int, steps: int) -> tuple[list[dict], int]:
    """(rows, onset) of one run: rows as the real logs hold them, one per step from step 1."""
    if shape in DPO:
        return dpo_run(shape, seed, steps)
    if shape in PPO:
        return ppo_run(shape, seed, steps)
    rng, u = _draws(shape, seed)

    size, groups = int(rng.choice([4, 8, 16])), int(rng.choice([4, 8, 16, 32]))
    p0, p1 = u(0.1, 0.4), u(0.6, 0.85)
    mid, width = u(0.2, 0.6) * steps, u(0.05, 0.15) * steps
    l0, lmax = u(150, 450), int(rng.choice([512, 1024, 2048]))
    ent0, kl_end = u(0.2, 0.9), u(0.02, 0.08)
    lr_peak, warm = u(5e-7, 3e-6), int(u(0, 0.1) * steps)
    onset = int(u(0.35, 0.6) * steps)
    tau, frac_lost, blowup = u(15, 60), u(0.6, 0.95), u(5, 20)
    grad_tau, left = u(8, 25), u(0.01, 0.06)
    ceiling = u(0.97, 0.995)
    rows = []
    for s in range(1, steps + 1):
        x = s / steps
        lr = lr_peak * min(1.0, s / max(warm, 1))
        prog = _sig((s - mid) / width)
        p = p0 + (p1 - p0) * prog
        length = l0 * (1 - 0.15 * prog)
        ent = ent0 * (1 - 0.25 * x)
        kl = kl_end * (prog * 0.7 + 0.3 * x)
        gn = u(0.1, 0.3) * (1 + 2 * math.exp(-s / 20))
        if shape == "saturate":         # an easy set: the reward reaches 0.97-0.995 correct
            p = p0 + (ceiling - p0) * (1 - math.exp(-s / (0.2 * steps)))
        elif shape == "length_growth":  # a reasoning run: answers grow 2.8x with the reward
            length = l0 * (1 + 1.8 * x)
            p = p0 + (p1 - p0) * x
        elif shape == "cosine":         # cosine decay to 0: learning stops on a plateau
            lr = lr_peak * 0.5 * (1 + math.cos(math.pi * x))
            p = p0 + (p1 - p0) * (1 - math.exp(-3 * x))
        elif shape == "entropy_rise":   # clip-higher: entropy climbs slowly
            ent = ent0 * (1 + 0.8 * x)
        elif shape == "early_dip":      # format learning: the reward dips, then climbs
            p = max(0.02, p - 0.5 * p0 * math.exp(-((s - 0.08 * steps) / (0.04 * steps)) ** 2))
        elif shape == "kl_grow":        # KL climbing steadily, with no target in mind
            kl = 0.002 + 0.18 * x
        elif shape == "entropy_fall":   # a gradual entropy fall of 60 % over the run
            ent = ent0 * (1 - 0.6 * x)
        elif shape == "noisy_small":    # one group per step
            groups = 1
        elif shape == "plateau_early":  # learns within 30 steps, flat after
            p = p0 + (p1 - p0) * (1 - math.exp(-s / 10))
        on, d = s >= onset, s - onset
        if on and shape == "f_entropy_collapse":   # KL untouched
            ent *= 0.04 + 0.96 * math.exp(-d / tau)
            p = min(0.99, p + 0.1 * (1 - math.exp(-d / 30)))
        elif on and shape == "f_reward_crash":
            p *= 1 - frac_lost * min(1.0, d / 3)
            ent *= 1 + 2 * min(1.0, d / 10)
        elif on and shape == "f_dead_signal":      # every answer fails
            p *= math.exp(-d / 5)
        elif on and shape == "f_entropy_blowup":
            ent *= 1 + (blowup - 1) * min(1.0, d / 25)
            p *= 1 - 0.7 * min(1.0, d / 25)
        elif on and shape == "f_kl_explode":
            kl += 0.02 * math.exp(d / 12)
        elif on and shape == "f_truncation":
            length += (lmax - length) * min(1.0, d / 20)
        elif on and shape == "f_grad_explode":
            gn *= math.exp(d / grad_tau)
        elif on and shape == "f_degrade":
            p -= (p1 - p0) * 0.6 * min(1.0, d / 100)
        reward, std, zero = _groups(p, size, groups, rng)
        if shape == "f_rm_collapse":
            # a reward model's score: the policy finds one answer it over-scores; the spread
            # collapses to 1-6 % while the mean surges
            kept = 1.0 if not on else left + (1 - left) * math.exp(-d / 20)
            reward = 0.6 * reward + (1.5 * (1 - math.exp(-d / 50)) if on else 0.0) \
                + float(rng.normal(0, 0.05 * kept))
            std = (0.5 * std + 0.2) * kept * math.exp(float(rng.normal(0, 0.1)))
            zero = 0.0
        logged = length * math.exp(float(rng.normal(0, 0.05)))
        clipped = min(1.0, max(0.0, (length / lmax) ** 3 * 0.5 + float(rng.normal(0, 0.01))))
        if on and shape == "f_truncation":
            clipped = min(1.0, max(clipped, min(1.0, d / 20) + float(rng.normal(0, 0.02))))
        rows.append({"step": s, "metrics": {
            "reward": reward, "reward_std": std, "frac_reward_zero_std": zero,
            "kl": max(0.0, kl * math.exp(float(rng.normal(0, 0.15)))),
            "entropy": ent * math.exp(float(rng.normal(0, 0.05))),
            "completions/mean_length": min(logged, lmax),
            "completions/max_length": min(lmax, logged * u(1.5, 2.5)),
            "completions/clipped_ratio": clipped,
            "grad_norm": gn * math.exp(float(rng.normal(0, 0.3))),
            "loss": (float("nan") if on and shape == "f_nan"
                     else kl * 0.04 + float(rng.normal(0, 0.001))),
            "learning_rate": lr,
            "epoch": x,
        }})
    return rows, onset


def write(out: Path, seeds: int, seed_from: int, every: list[int], only: set[str] | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    labels = {}
    for shape in (*HEALTHY, *FAULTS):
        if only and shape not in only:
            continue
        label = FAULTS.get(shape, "healthy")
        for seed in range(seed_from, seed_from + seeds):
            steps = (200, 400, 800)[zlib.crc32(f"steps/{seed}".encode()) % 3]
            rows, onset = run(shape, seed, steps)
            for k in every:
                kept = rows[k - 1::k]
                name = f"{shape if label != 'healthy' else 'h_' + shape}_s{seed}_e{k}.jsonl"
                with open(out / name, "w") as fh:
                    for row in kept:
                        fh.write(json.dumps(row) + "\n")
                first = (None if label == "healthy"
                         else next(r["step"] for r in kept if r["step"] >= onset))
                preset = "trl-dpo" if shape in DPO else "trl-ppo" if shape in PPO else "trl-grpo"
                labels[name] = {"preset": preset, "label": label, "onset": first, "source": shape}
    (out / "labels.json").write_text(json.dumps(labels, indent=1) + "\n")
    return len(labels)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seeds", type=int, default=8, help="runs per shape")
    ap.add_argument("--seed-from", type=int, default=200)
    ap.add_argument("--every", default="1,5,10", help="logging intervals, comma-separated")
    ap.add_argument("--only", default=None, help="shapes, comma-separated (default: all)")
    a = ap.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None
    unknown = (only or set()) - set(HEALTHY) - set(FAULTS)
    if unknown:
        raise SystemExit(f"shapes.py: unknown shape(s) {', '.join(sorted(unknown))}; one of "
                         f"{', '.join((*HEALTHY, *FAULTS))}")
    n = write(a.out, a.seeds, a.seed_from, [int(k) for k in a.every.split(",")], only)
    print(f"{n} runs in {a.out}")


if __name__ == "__main__":
    main()
