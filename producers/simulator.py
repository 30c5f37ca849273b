"""Simulated multi-rank PPO / GRPO / DPO training runs with fault injection.

Used by ``rlwatch demo``, the tests and the benchmarks. The simulator produces the events of the
public contract (``contract.md`` section 1) as plain dicts: one ``step`` event per rank and step,
``samples`` events every ``samples_every`` steps and ``checkpoint`` events every
``checkpoint_every`` steps.

The dynamics are a small latent model, not step functions:

* an *effective training time* ``tau`` integrates the (warmed-up, adjustable) learning rate; the
  learning curves (reward rises fast then slowly, KL creeps up to a plateau below the target,
  entropy declines slowly, value loss falls, length drifts) are functions of it, so
  ``apply_adjust({"lr": 0.5})`` really slows the run;
* noise is a mix of slow AR(1) wander and per-step noise; per-batch statistics (``reward/mean``,
  ``reward/std``, ``response/*``) are computed from a simulated batch of 256 responses whose
  first 64 values are the ``dists``; metrics are correlated (returns follow reward and KL, the
  value loss follows the value/returns mismatch, GPU memory follows lengths, ...);
* a fault starts developing at ``onset`` and has a *progress* clock: optimizer-driven faults
  progress with the learning rate, KL-driven faults with ``lr / beta**1.5`` minus a restoring
  pull when beta was raised (so ``apply_adjust({"beta": 1.5})`` slows a KL blow-up and a
  larger factor reverses it); data / infrastructure faults progress with wall steps.

Everything is deterministic: the noise of a step comes from a generator seeded by
``(seed, run_id, step, rollback generation)``; there are no clock reads (``ts`` is an argument).

The catalog ids of ``failure-modes.md`` are the fault names (``FAULTS``). A few need a specific
algorithm (``FAULT_ALGOS``): a fault that the configured algorithm cannot show runs on one that
can (``grpo_zero_variance`` -> grpo, ``dpo_saturation`` -> dpo, critic faults -> ppo);
``Simulator.algo`` and ``tags.algo`` say which. ``param_hash_mismatch`` needs 2+ ranks and
``rank_outlier`` 3+ (3 x the median of all ranks cannot happen with 2); they use 4 ranks when
``world_size`` is smaller (``Simulator.world_size``); the faulty rank is the last one
(``Simulator.bad_rank``).

Healthy levels scale with ``kl_target``: PPO KL plateaus at ~0.3-0.45 x target (0.03-0.045
for the default 0.1, inside the seeds' 0.01-0.05 band), GRPO at ~0.35 x target with rare
single-step spikes (< 1.8 x target).

Fault variants (optional ``SimConfig.fault_params``):

* ``value_loss_divergence``: ``{"returns_abnormal": True}`` (data problem: extreme returns)
  instead of the default optimizer-side divergence with normal returns;
* ``grad_norm_anomaly``: ``{"mode": "vanish"}`` instead of ``"explode"``;
* ``update_ratio``: ``{"mode": "low"}`` instead of ``"high"``;
* ``gpu_memory_spike``: ``{"mode": "climb"}`` (steady leak) or ``"jump"`` (default: a short
  climb and then a jump);
* ``prompt_extreme_reward``: ``{"direction": "low"}`` instead of ``"high"``;
* ``reward_periodic``: ``{"period": 50}``;
* ``kl_cycle_delta``: ``{"epochs": 8}`` PPO epochs per rollout after the onset (healthy: 4);
* ``nan_inf``: ``{"value": "inf"}`` to emit +Inf instead of NaN;
* any fault: ``{"redevelop_after": 200}`` steps after a rollback before it develops again
  (``None``: never again); ``{"bad_rank": k}`` for the rank-local faults.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

__all__ = [
    "FAULTS",
    "FAULT_ALGOS",
    "FAULT_DESCRIPTIONS",
    "SimConfig",
    "Simulator",
    "effective_algo",
    "simulate",
]

FAULTS: tuple[str, ...] = (
    "healthy",
    "kl_above_target",
    "kl_rising",
    "kl_zero",
    "token_kl_spike",
    "tool_words",
    "entropy_collapse",
    "reward_spike",
    "reward_oscillation",
    "reward_periodic",
    "reward_collapse",
    "reward_degradation",
    "reward_shape",
    "length_hacking",
    "truncation_rising",
    "length_shape",
    "reward_length_corr",
    "reward_quality_divergence",
    "value_loss_divergence",
    "nan_inf",
    "value_shift",
    "clip_frac_high",
    "clip_frac_low",
    "aggressive_update",
    "kl_cycle_delta",
    "grad_norm_anomaly",
    "update_ratio",
    "rank_outlier",
    "param_hash_mismatch",
    "category_imbalance",
    "prompt_extreme_reward",
    "stagnation",
    "gpu_memory_spike",
    "run_stalled",
    "rm_overfit",
    "dpo_saturation",
    "grpo_zero_variance",
    "degenerate_text",
)

FAULT_DESCRIPTIONS: dict[str, str] = {
    "healthy": "no fault: slow learning, KL below target, entropy declining slowly",
    "kl_above_target": "KL creeps above target, then accelerates (beta too weak)",
    "kl_rising": "KL rises steadily and monotonically past the target",
    "kl_zero": "KL drops to exactly 0 (actor and reference synced / KL bug)",
    "token_kl_spike": "single-token KL peaks grow past 10 then 20 (language collapse onset)",
    "tool_words": "the same token ('Certainly') is the KL peak in most sequences",
    "entropy_collapse": "policy entropy decays to near zero over ~100-200 steps",
    "reward_spike": "reward jumps within a few steps (a reward hack found)",
    "reward_oscillation": "reward swings step to step (learning rate too high)",
    "reward_periodic": "reward rises and falls with a fixed period (beta controller / data cycle)",
    "reward_collapse": "reward std collapses while the mean rises and length grows (hacking)",
    "reward_degradation": "reward trends down",
    "reward_shape": "per-sample rewards become bimodal (a subset exploits the RM)",
    "length_hacking": "response length grows steadily while reward rises",
    "truncation_rising": "more and more responses hit max_length (EOS ever later)",
    "length_shape": "a mode of very long responses appears (bimodal lengths)",
    "reward_length_corr": "per-sample reward becomes strongly correlated with length",
    "reward_quality_divergence": "reward rises while judge/score falls",
    "value_loss_divergence": "critic loss grows by orders of magnitude",
    "nan_inf": "loss and gradient norms become NaN (after a short gradient blow-up)",
    "value_shift": "value/mean changes sign and value/std explodes",
    "clip_frac_high": "PPO clip fraction jumps from ~0.2 to ~0.7",
    "clip_frac_low": "PPO clip fraction falls to ~0 (updates too conservative)",
    "aggressive_update": "clip fraction high and KL rising together",
    "kl_cycle_delta": "too many PPO epochs (4 -> 8): kl/ppo rises > 0.02 within each cycle",
    "grad_norm_anomaly": "gradient norm explodes (or vanishes) on all ranks",
    "update_ratio": "update/param norm ratio leaves 1e-3..1e-1 (lr misconfigured)",
    "rank_outlier": "one rank's gradient norm is many times the others' (bad shard)",
    "param_hash_mismatch": "one rank's parameter hash differs from rank 0",
    "category_imbalance": "creative reward keeps improving while safety stalls then falls",
    "prompt_extreme_reward": "one prompt keeps getting extreme reward",
    "stagnation": "reward and KL freeze (beta far too high)",
    "gpu_memory_spike": "allocated GPU memory climbs and jumps (lengths unchanged)",
    "run_stalled": "the run (one rank) stops emitting step events",
    "rm_overfit": "reward-model train accuracy > 0.95 while validation accuracy < 0.70",
    "dpo_saturation": "DPO preference probability saturates above 0.99",
    "grpo_zero_variance": "most GRPO groups have zero reward variance",
    "degenerate_text": "responses become heavily repetitive",
}

_ALGOS = ("ppo", "grpo", "dpo")
_DPO_FAULTS = frozenset({
    "healthy", "dpo_saturation", "rm_overfit", "nan_inf", "grad_norm_anomaly", "update_ratio",
    "rank_outlier", "param_hash_mismatch", "gpu_memory_spike", "run_stalled",
})
_CRITIC_FAULTS = frozenset({"value_loss_divergence", "value_shift", "kl_cycle_delta"})

#: Algorithms on which each fault can be simulated.
FAULT_ALGOS: dict[str, tuple[str, ...]] = {
    f: tuple(a for a in _ALGOS if (
        (a == "dpo" and f in _DPO_FAULTS)
        or (a == "ppo" and f not in ("grpo_zero_variance", "dpo_saturation"))
        or (a == "grpo" and f not in _CRITIC_FAULTS and f != "dpo_saturation")
    ))
    for f in FAULTS
}

_KL_FAULTS = frozenset({"kl_above_target", "kl_rising", "aggressive_update"})
_OPT_FAULTS = frozenset({
    "entropy_collapse", "reward_collapse", "length_hacking", "clip_frac_high", "reward_oscillation",
    "degenerate_text", "reward_quality_divergence", "reward_length_corr", "token_kl_spike",
    "tool_words", "dpo_saturation", "reward_shape",
})
_CRITIC_LR_FAULTS = frozenset({"value_loss_divergence", "value_shift"})

_CATEGORIES = ("safety", "knowledge", "creative")
_GROUP_OFFSETS = {"safety": 0.12, "knowledge": -0.08, "creative": -0.04}
_BATCH = 256          # responses per simulated step (metrics are statistics of it)
_DIST_N = 64          # per-sample values reported in dists
_SAMPLES_N = 8        # samples per samples event
_PPO_EPOCHS = 4
_WARMUP = 20
_N_PROMPTS = 5000
_LR0 = {"ppo": 1.0e-6, "grpo": 1.0e-6, "dpo": 5.0e-7}
_BETA0 = {"ppo": 0.05, "grpo": 0.04, "dpo": 0.1}

_ADJUST_ALIASES = {
    "beta": "beta", "kl_coef": "beta", "kl_beta": "beta", "init_kl_coef": "beta", "kl/beta": "beta",
    "lr": "lr", "learning_rate": "lr",
    "lr_actor": "lr_actor", "actor_lr": "lr_actor", "lr/actor": "lr_actor",
    "lr_critic": "lr_critic", "critic_lr": "lr_critic", "lr/critic": "lr_critic",
}


def effective_algo(algo: str, fault: str) -> str:
    """The algorithm a (algo, fault) configuration actually simulates."""
    if algo not in _ALGOS:
        raise ValueError(f"unknown algo {algo!r} (expected one of {', '.join(_ALGOS)})")
    if fault not in FAULT_ALGOS:
        raise ValueError(f"unknown fault {fault!r} (expected one of FAULTS)")
    if algo in FAULT_ALGOS[fault]:
        return algo
    if fault == "dpo_saturation":
        return "dpo"
    if fault == "grpo_zero_variance":
        return "grpo"
    return "ppo"


@dataclass
class SimConfig:
    run_id: str
    algo: str = "ppo"            # "ppo" | "grpo" | "dpo"
    fault: str = "healthy"
    onset: int = 300             # step at which the fault starts developing
    world_size: int = 1          # ranks; each emits its own step event, rank 0 carries everything
    seed: int = 0
    kl_target: float = 0.1       # per-token KL target a healthy run stays below
    samples_every: int = 10      # a samples event (8 samples) every N steps; 0: never
    checkpoint_every: int = 100  # a checkpoint event every N steps; 0: never
    dists_every: int = 1         # dists.reward / dists.response_length every N steps; 0: never
    max_length: int = 1024       # response length cap
    fault_params: dict[str, Any] = field(default_factory=dict)  # optional variants (module doc)


# ----------------------------------------------------------------------------------------------
# small helpers

def _ramp(p: float, tau: float) -> float:
    return 1.0 - math.exp(-p / tau) if p > 0 else 0.0


def _sig(x: float) -> float:
    if x < -60:
        return 0.0
    if x > 60:
        return 1.0
    return 1.0 / (1.0 + math.exp(-x))


def _seed_int(*parts: Any) -> int:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little")


class _Noise:
    """Standard normals of one step, drawn in one block (cheap) and handed out in order."""

    __slots__ = ("_z", "_i", "rng")

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._z = rng.standard_normal(96).tolist()
        self._i = 0

    def g(self) -> float:
        if self._i >= len(self._z):
            self._z = self.rng.standard_normal(96).tolist()
            self._i = 0
        v = self._z[self._i]
        self._i += 1
        return v

    def u(self) -> float:
        """Uniform(0, 1)."""
        return 0.5 * (1.0 + math.erf(self.g() / math.sqrt(2.0)))


# AR(1) noise processes: name -> (phi, stationary std)
_AR = {
    "reward": (0.92, 0.018),
    "kl": (0.95, 0.05),
    "entropy": (0.97, 0.010),
    "length": (0.95, 0.012),
    "value": (0.9, 0.012),
    "vloss": (0.9, 0.10),
    "grad": (0.85, 0.10),
    "judge": (0.8, 0.006),
    "clip": (0.8, 0.06),
    "margin": (0.9, 0.05),
    "mem": (0.95, 0.05),
    "acc": (0.9, 0.008),
}


# ----------------------------------------------------------------------------------------------
# texts

_TOPICS = {
    "knowledge": [
        "photosynthesis", "the water cycle", "compound interest", "plate tectonics", "vaccines",
        "binary search", "inflation", "the French Revolution", "black holes", "DNA replication",
        "supply and demand", "neural networks", "the immune system", "ocean tides",
        "prime numbers", "the Roman Empire", "electric circuits", "antibiotics",
        "the greenhouse effect", "public key cryptography",
    ],
    "safety": [
        "store household chemicals", "handle a small kitchen fire", "secure my home wifi",
        "support a friend in crisis", "dispose of old medication", "use a tall ladder",
        "spot a phishing email", "protect my passwords", "travel alone at night",
        "lift heavy boxes", "charge an e-bike battery", "go hiking in the heat",
        "use a chainsaw", "check a used car", "clean up mold", "swim in open water",
    ],
    "creative": [
        "a lighthouse keeper", "autumn rain", "a lost robot", "the first snow", "a city at night",
        "an old violin", "a dragon who cannot fly", "the moon", "a forgotten garden",
        "a time traveler", "a quiet harbor", "the last train home", "a paper boat",
        "a clockmaker's apprentice", "a desert storm", "two rival chefs",
    ],
}

_PROMPTS = {
    "knowledge": ["Explain {t} in simple terms.", "What are the key facts about {t}?",
                  "How does {t} work?", "Give me a short overview of {t}."],
    "safety": ["How can I {t} safely?", "What precautions should I take to {t}?",
               "Is there a safe way to {t}?"],
    "creative": ["Write a short poem about {t}.", "Tell a brief story about {t}.",
                 "Describe {t} in a vivid paragraph."],
}

_SENTENCES = {
    "knowledge": [
        "At its core, {t} describes how one state turns into another over time.",
        "A common misconception is that it happens instantly, but it usually takes a while.",
        "The main factors involved are energy, structure and the surrounding conditions.",
        "You can picture it as a chain of small steps, each depending on the previous one.",
        "In everyday life its effects show up in places most people never notice.",
        "Researchers still debate some of the finer details.",
        "Scientists first described the mechanism carefully in the nineteenth century.",
        "A concrete example makes the idea much easier to follow.",
        "Small changes in the inputs can lead to surprisingly large differences later.",
        "Textbooks usually introduce it with a simple diagram and two equations.",
        "To summarize, {t} follows a few simple rules that combine in interesting ways.",
        "Measurements over many decades confirm the basic picture.",
        "The same principle appears in engineering, biology and economics.",
    ],
    "safety": [
        "Before you start, make sure the area is well ventilated and free of clutter.",
        "Keep emergency numbers somewhere easy to find.",
        "Never mix products unless the label explicitly says it is safe.",
        "If anything feels wrong, stop and ask a qualified professional.",
        "Gloves and eye protection reduce the risk considerably.",
        "Tell someone you trust what you are planning and when you expect to finish.",
        "Check the manufacturer's instructions, since details vary between models.",
        "Take your time, because most accidents happen when people rush.",
        "Keep children and pets away until everything is put back.",
        "A short checklist written down beforehand prevents most mistakes.",
        "When in doubt, local authorities publish free guidance on this.",
        "Replace worn equipment instead of improvising a repair.",
    ],
    "creative": [
        "The light moved slowly across the water, as if it were listening.",
        "Nobody remembered when {t} had first appeared, only that it had always been there.",
        "Each evening the wind carried a different story through the streets.",
        "She counted the stars twice, just to be sure none had left.",
        "There was a quiet kind of courage in the way it kept going.",
        "Somewhere far below, a bell rang once and then was still.",
        "The sky turned from copper to a deep and tired blue.",
        "Footsteps echoed on the stones long after the travelers were gone.",
        "A single window stayed lit until the morning fog rolled in.",
        "Memories folded into one another like pages of a wet map.",
        "The old door creaked open on a room full of patient dust.",
        "By dawn the whole valley smelled of salt and cedar.",
    ],
}

_CLOSERS = ["I hope this helps.", "Let me know if you would like more detail.",
            "Feel free to ask a follow-up question.", ""]
_TOOL_WORD = "Certainly"
_GIBBERISH = ["Ã¤", "\ufffd", "zxqv", "]]>", "<0xFF>", "ĠÐ", "ßß", "\u200b"]
_DEGENERATE = [
    "I am a helpful assistant. ",
    "the answer is ",
    "very ",
    "Thank you for your question! ",
]
_HACK_PHRASE = "What an excellent question! "


def _prompt(idx: int) -> tuple[str, str]:
    cat = _CATEGORIES[idx % 3]
    topics = _TOPICS[cat]
    t = topics[(idx // 3) % len(topics)]
    tmpl = _PROMPTS[cat][(idx // (3 * len(topics))) % len(_PROMPTS[cat])]
    return cat, tmpl.format(t=t)


def _topic(idx: int) -> str:
    cat = _CATEGORIES[idx % 3]
    topics = _TOPICS[cat]
    return topics[(idx // 3) % len(topics)]


def _normal_response(rnd: random.Random, idx: int, length: int) -> str:
    cat = _CATEGORIES[idx % 3]
    t = _topic(idx)
    pool = _SENTENCES[cat]
    k = max(2, min(len(pool), length // 45))
    sents = [s.format(t=t) for s in rnd.sample(pool, k)]
    sents[0] = sents[0][0].upper() + sents[0][1:]
    closer = rnd.choice(_CLOSERS)
    if closer:
        sents.append(closer)
    return " ".join(sents)


# ----------------------------------------------------------------------------------------------

class Simulator:
    """One simulated run. Call :meth:`step` once per training step, in ascending order."""

    def __init__(self, config: SimConfig):
        if config.fault not in FAULT_ALGOS:
            raise ValueError(f"unknown fault {config.fault!r}; expected one of {', '.join(FAULTS)}")
        if config.world_size < 1:
            raise ValueError("world_size must be >= 1")
        if config.kl_target <= 0:
            raise ValueError("kl_target must be > 0")
        self.config = config
        self.fault = config.fault
        self.algo = effective_algo(config.algo, config.fault)
        ws = config.world_size
        if self.fault == "param_hash_mismatch" and ws < 2:
            ws = 4
        if self.fault == "rank_outlier" and ws < 3:  # "3 x the median of all ranks" needs 3+
            ws = 4
        self.world_size = ws
        fp = config.fault_params or {}
        self._fp = dict(fp)
        self.bad_rank = int(fp.get("bad_rank", ws - 1)) if ws > 1 else 0
        self.bad_rank = min(max(self.bad_rank, 1 if ws > 1 else 0), ws - 1)
        self._base = _seed_int("rlwatch-sim", config.seed, config.run_id)
        self._T = float(config.kl_target)
        self._tags = {"algo": self.algo, "model": "sim-llama-8b"}
        # adjustable hyper-parameters (multipliers)
        self.lr_factor = 1.0
        self.lr_critic_factor = 1.0
        self.beta_factor = 1.0
        # the fault's (moving) onset
        self.onset = int(config.onset)
        self._gen = 0                      # rollback generation (part of the noise seed)
        rr = random.Random(self._base ^ 0x5EED)
        self._extreme_prompt = rr.randrange(_N_PROMPTS)
        self._degenerate_kind = rr.randrange(len(_DEGENERATE))
        self._reset_state()
        self._snapshots: dict[int, dict[str, Any]] = {}
        self._recent: deque[int] = deque()

    # -- state -----------------------------------------------------------------------------

    def _reset_state(self) -> None:
        self._last_step = -1
        self._tau = 0.0
        self._tau_c = 0.0
        self._kl_scale = 1.0
        self._p = 0.0
        self._ar = {k: 0.0 for k in _AR}
        self._osc = 0.0
        self._ref: dict[str, float] = {}

    def _state(self) -> dict[str, Any]:
        return {
            "tau": self._tau, "tau_c": self._tau_c, "kl_scale": self._kl_scale, "p": self._p,
            "ar": dict(self._ar), "osc": self._osc, "ref": dict(self._ref),
        }

    def _restore(self, st: dict[str, Any]) -> None:
        self._tau = st["tau"]
        self._tau_c = st["tau_c"]
        self._kl_scale = st["kl_scale"]
        self._p = st["p"]
        self._ar = dict(st["ar"])
        self._osc = st["osc"]
        self._ref = dict(st["ref"])

    def _remember(self, step: int) -> None:
        self._snapshots[step] = self._state()
        self._recent.append(step)
        cp = self.config.checkpoint_every
        while len(self._recent) > 1000:
            old = self._recent.popleft()
            if not (cp and old % cp == 0):
                self._snapshots.pop(old, None)

    # -- control ---------------------------------------------------------------------------

    def apply_adjust(self, params: dict[str, float]) -> None:
        """Apply an ``adjust`` command: values are multiplicative factors.

        ``beta`` (aliases ``kl_coef``, ``init_kl_coef``) multiplies the KL coefficient: the KL
        level eases down over ~30 steps and a KL fault grows slower (or recedes, for factors
        of ~2 and more). ``lr`` multiplies both learning rates (``lr_actor`` / ``lr_critic``
        one of them): learning, drift and optimizer-driven faults slow down. Unknown keys are
        ignored.
        """
        for key, value in (params or {}).items():
            name = _ADJUST_ALIASES.get(str(key).lower())
            try:
                f = float(value)
            except (TypeError, ValueError):
                continue
            if name is None or not math.isfinite(f) or f <= 0:
                continue
            if name == "beta":
                self.beta_factor *= f
            elif name == "lr":
                self.lr_factor *= f
                self.lr_critic_factor *= f
            elif name == "lr_actor":
                self.lr_factor *= f
            elif name == "lr_critic":
                self.lr_critic_factor *= f

    def rollback(self, to_step: int) -> None:
        """Restore the run as of the checkpoint at ``to_step`` (next call: ``step(to_step + 1)``).

        The learning state returns to what it was at ``to_step`` and the fault's dynamics are
        reset. A fault that had already started develops again ``redevelop_after`` steps
        (default 200) after the restore, slower if ``apply_adjust`` weakened its driver;
        ``fault_params={"redevelop_after": None}`` keeps it away.
        """
        to_step = max(int(to_step), -1)
        candidates = [s for s in self._snapshots if s <= to_step]
        started = self._last_step >= self.onset
        if candidates:
            s = max(candidates)
            self._restore(self._snapshots[s])
        else:
            self._reset_state()
        for s in [s for s in self._snapshots if s > to_step]:
            del self._snapshots[s]
        self._recent = deque(s for s in self._recent if s <= to_step)
        self._last_step = to_step
        self._p = 0.0
        self._osc = 0.0
        self._ref = {}
        if started and self.fault != "healthy":
            delay = self._fp.get("redevelop_after", 200)
            self.onset = (1 << 62) if delay is None else max(self.onset, to_step + 1) + int(delay)
        self._gen += 1

    # -- helpers ---------------------------------------------------------------------------

    def _ar_step(self, name: str, nz: _Noise) -> float:
        phi, sd = _AR[name]
        x = phi * self._ar[name] + sd * math.sqrt(1.0 - phi * phi) * nz.g()
        self._ar[name] = x
        return x

    def _fault_rate(self, lr_sched: float) -> float:
        f = self.fault
        if f in _KL_FAULTS:
            return (self.lr_factor / self.beta_factor ** 1.5
                    - 0.4 * max(0.0, self.beta_factor - 1.0))
        if f in _OPT_FAULTS:
            return self.lr_factor
        if f in _CRITIC_LR_FAULTS:
            return self.lr_critic_factor
        if f == "reward_oscillation":
            return self.lr_factor
        return 1.0

    def _hash(self, step: int, rank: int) -> str:
        diverged = (self.fault == "param_hash_mismatch" and rank == self.bad_rank
                    and step >= self.onset)
        key = (self._base, self._gen, step, "diverged" if diverged else "ok")
        return "sha256:" + hashlib.sha256(repr(key).encode()).hexdigest()

    def _envelope(self, kind: str, step: int, rank: int, ts: float) -> dict[str, Any]:
        return {"schema": 1, "kind": kind, "run_id": self.config.run_id, "rank": rank,
                "world_size": self.world_size, "step": step, "ts": ts}

    # -- the step --------------------------------------------------------------------------

    def step(self, step: int, ts: float) -> list[dict]:
        """All events of ``step`` (one step event per rank, plus samples / checkpoint when due)."""
        step = int(step)
        ts = float(ts)
        cfg = self.config
        fault = self.fault
        since = step - self.onset            # steps since the onset (< 0: not yet)
        if fault == "run_stalled" and since >= 0:
            self._last_step = max(self._last_step, step)
            if self.world_size == 1:
                return []
            return [
                {**self._envelope("heartbeat", self.onset, r, ts + 0.001 * r),
                 "tags": dict(self._tags)}
                for r in range(self.world_size) if r != self.bad_rank
            ]

        rng = np.random.default_rng([self._base & 0xFFFFFFFF, self._base >> 32,
                                     step & 0xFFFFFFFF, self._gen])
        nz = _Noise(rng)

        # integrate the slow state over the steps since the last call
        n = step - self._last_step if step > self._last_step else 0
        for k in range(n):
            s = self._last_step + 1 + k
            lr_sched = 0.2 + 0.8 * min(1.0, s / _WARMUP)
            learn = lr_sched * self.lr_factor * self.beta_factor ** -0.3
            if s >= self.onset:
                if fault == "stagnation":
                    learn *= 0.0
                elif fault == "clip_frac_low":
                    learn *= 0.1
                elif fault == "grpo_zero_variance":
                    learn *= 0.1
            self._tau += learn
            self._tau_c += lr_sched * self.lr_critic_factor
            self._kl_scale += (self.beta_factor ** -0.6 - self._kl_scale) / 30.0
            if s >= self.onset and fault != "healthy":
                self._p = max(0.0, self._p + self._fault_rate(lr_sched))
        if n:
            self._last_step = step
        lr_sched = 0.2 + 0.8 * min(1.0, step / _WARMUP)

        if self.algo == "dpo":  # no generations: no samples / dists
            events = self._dpo_step(step, ts, nz, since)
        else:
            events = self._pg_step(step, ts, nz, rng, since, lr_sched)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            events.append({**self._envelope("checkpoint", step, 0, ts + 0.02),
                           "path": f"/ckpt/{cfg.run_id}/step-{step}", "tags": dict(self._tags)})
        if n:
            self._remember(step)
        return events

    # -- PPO / GRPO ------------------------------------------------------------------------

    def _pg_step(self, step: int, ts: float, nz: _Noise, rng: np.random.Generator,
                 since: int, lr_sched: float) -> list[dict]:
        cfg = self.config
        fault = self.fault
        grpo = self.algo == "grpo"
        T = self._T
        fp = self._fp
        active = since >= 0 and fault != "healthy"
        p = self._p if active else 0.0
        tau = self._tau
        tau_c = self._tau_c
        max_len = int(cfg.max_length)

        # --- healthy learning curves -------------------------------------------------------
        slow = math.log1p(tau / 400.0)
        if grpo:
            u = 1.0 - math.exp(-tau / 200.0)
            r_trend = min(0.28 + 0.42 * u + 0.05 * slow, 0.92)
            kl = T * (0.005 + 0.30 * (1.0 - math.exp(-tau / 250.0)) + 0.04 * slow)
            entropy = 0.9 * (0.7 + 0.3 * math.exp(-tau / 800.0))
            L = 230.0 - 40.0 * (1.0 - math.exp(-tau / 300.0))
            judge = 0.50 + 0.22 * u + 0.02 * slow
            clip = 0.15
        else:
            u = 1.0 - math.exp(-tau / 250.0)
            r_trend = 0.3 + 0.75 * u + 0.30 * slow
            kl = T * (0.004 + 0.28 * (1.0 - math.exp(-tau / 300.0)) + 0.06 * slow)
            entropy = 2.3 * (0.78 + 0.22 * math.exp(-tau / 1200.0))
            L = 290.0 - 30.0 * (1.0 - math.exp(-tau / 400.0))
            judge = 0.52 + 0.20 * u + 0.02 * slow
            clip = 0.17
        r_std = (0.55 - 0.08 * u) if not grpo else math.sqrt(r_trend * (1 - r_trend) / 7.0)
        kl *= self._kl_scale
        n_epochs = _PPO_EPOCHS
        epoch = step % n_epochs
        if fault == "kl_cycle_delta" and since >= 0:
            # too many PPO epochs per rollout (K 4 -> 8): the policy overfits each batch
            n_epochs = int(fp.get("epochs", 8))
            epoch = since % n_epochs
        kl_beta = _BETA0[self.algo] * self.beta_factor

        # --- noise -------------------------------------------------------------------------
        # a stagnating run (policy pinned to the reference) wanders much less
        calm = 1.0
        if fault == "stagnation" and since >= 0:
            calm = 1.0 - 0.92 * _ramp(since, 30)
        reward_wander = calm * self._ar_step("reward", nz)
        reward_mu = r_trend + reward_wander
        kl *= math.exp(calm * (self._ar_step("kl", nz) + 0.07 * nz.g()))
        entropy *= math.exp(self._ar_step("entropy", nz) + 0.012 * nz.g())
        L *= math.exp(self._ar_step("length", nz))
        # the judge agrees with the reward on a healthy run: it shares the reward's wander
        judge += 0.35 * reward_wander + self._ar_step("judge", nz) + 0.012 * nz.g()
        clip_noise = math.exp(self._ar_step("clip", nz) + 0.06 * nz.g())
        grad_level = math.exp(self._ar_step("grad", nz) + 0.1 * nz.g())
        value_ar = self._ar_step("value", nz)
        vloss_noise = math.exp(self._ar_step("vloss", nz) + 0.08 * nz.g())
        mem_noise = self._ar_step("mem", nz) + 0.03 * nz.g()
        grpo_kl_spike = grpo and nz.u() < 0.004

        # --- fault effects on the latent state ---------------------------------------------
        token_mult = 1.0
        p99_mult = 1.0
        rho = 0.0                  # per-sample reward-length correlation
        bimodal = 0.0              # share of samples exploiting the RM (reward_shape)
        long_frac = 0.0            # share of very long responses (length_shape)
        runaway = 0.004            # share of responses that never emit EOS
        returns_extreme = 0.0      # share of samples with absurd rewards (data problem)
        clip_target = None
        kl_ppo_inc = 0.0015
        lr_mult = 1.0
        grad_mult = 1.0
        vloss_mult = 1.0
        value_shift = 0.0
        value_std_mult = 1.0
        mem_extra = 0.0
        frac_zero = None
        group_delta = {c: 0.0 for c in _CATEGORIES}
        r_std_mult = 1.0
        beta_mult = 1.0
        sample_mode: dict[str, float] = {}

        if active:
            if fault == "kl_above_target":
                x = p / 100.0
                g = T * (0.25 * x + 1.6 * x * x)
                g = 9 * T * math.tanh(g / (9 * T))
                kl += g * self._kl_scale
                s_ = min(1.0, g / (3 * T))
                entropy *= 1.0 - 0.15 * s_
                reward_mu += 0.1 * s_
            elif fault == "kl_rising":
                g = 6 * T * math.tanh(T * 0.011 * p / (6 * T))
                kl += g * self._kl_scale
                entropy *= 1.0 - 0.1 * min(1.0, g / (3 * T))
            elif fault == "aggressive_update":
                g = 6 * T * math.tanh(T * 0.009 * p / (6 * T))
                kl += g * self._kl_scale
                clip_target = 0.52 * _sig((p - 20) / 8.0)
                kl_ppo_inc *= 1.0 + 2.0 * _ramp(p, 30)
                grad_mult *= 1.0 + 0.4 * _ramp(p, 30)
            elif fault == "kl_zero":
                kl = 0.0
            elif fault == "token_kl_spike":
                s_ = _sig((p - 35) / 8.0)
                token_mult = 1.0 + 8.0 * s_
                p99_mult = 1.0 + 1.5 * s_
                kl += 0.2 * T * s_
                sample_mode["gibberish"] = 0.3 * s_ + 0.1 * _ramp(p, 20)
            elif fault == "tool_words":
                f = 0.9 * _ramp(p, 25)
                sample_mode["tool"] = f
                reward_mu += 0.15 * f
                kl += 0.25 * T * f
            elif fault == "entropy_collapse":
                factor = 0.06 + 0.94 * math.exp(-p / 70.0)
                entropy *= factor
                kl += 0.5 * T * (1.0 - factor)
                r_std_mult *= 0.5 + 0.5 * factor
                sample_mode["degenerate"] = 0.5 * (1.0 - factor) ** 2
            elif fault == "reward_spike":
                j = _sig((p - 6) / 1.2)
                reward_mu += 1.1 * j * (1.0 - 0.3 * _ramp(p - 10, 60))
                r_std_mult *= 1.0 + 0.4 * j
                kl += 0.3 * T * j
                judge -= 0.05 * j
                sample_mode["hack"] = 0.7 * j
            elif fault == "reward_oscillation":
                amp = 0.35 * _ramp(p, 30) * min(self.lr_factor, 2.0)
                self._osc = -0.7 * self._osc + amp * math.sqrt(1 - 0.49) * nz.g()
                reward_mu += self._osc
                clip_noise *= 1.0 + 0.6 * _ramp(p, 30)
                kl_ppo_inc *= 1.5
                grad_mult *= 1.0 + 0.3 * _ramp(p, 30)
            elif fault == "reward_periodic":
                period = float(fp.get("period", 50))
                amp = 0.3 * _ramp(since, 40)
                phase = 2 * math.pi * since / period
                reward_mu += amp * math.sin(phase)
                beta_mult = 1.0 + 0.35 * _ramp(since, 40) * math.sin(phase - math.pi / 2)
                kl *= 1.0 - 0.2 * _ramp(since, 40) * math.sin(phase)
            elif fault == "reward_collapse":
                r_std_mult *= 0.015 + 0.985 * math.exp(-p / 22.0)
                reward_mu += 0.9 * _ramp(p, 50)
                L += 60.0 * _ramp(p, 60)
                entropy *= 1.0 - 0.45 * _ramp(p, 80)
                judge -= 0.2 * _ramp(p, 60)
                kl += 0.4 * T * _ramp(p, 60)
                frac_zero = 0.95 * _ramp(p, 25)
                sample_mode["hack"] = 0.9 * _ramp(p, 30)
                sample_mode["identical"] = 1.0
            elif fault == "reward_degradation":
                drop = 0.004 * since + 0.00002 * since * since
                reward_mu -= (0.6 if not grpo else 0.3) * math.tanh(drop / 0.6)
                judge -= 0.1 * _ramp(since, 100)
            elif fault == "reward_shape":
                bimodal = 0.3 * _ramp(p, 30)
            elif fault == "length_hacking":
                grow = _ramp(p, 220)
                L += (0.88 * max_len - L) * grow
                reward_mu += 0.25 * _ramp(p, 150)
                rho = 0.5 * _ramp(p, 100)
                judge -= 0.1 * _ramp(p, 150)
            elif fault == "truncation_rising":
                runaway += 0.6 * _ramp(since, 120)
            elif fault == "length_shape":
                long_frac = 0.35 * _ramp(since, 40)
            elif fault == "reward_length_corr":
                rho = 0.85 * _ramp(p, 40)
                L += 40.0 * _ramp(p, 80)
                reward_mu += 0.1 * _ramp(p, 80)
            elif fault == "reward_quality_divergence":
                reward_mu += 0.6 * _ramp(p, 70)
                judge -= 0.25 * _ramp(p, 60)
                kl += 0.3 * T * _ramp(p, 70)
            elif fault == "value_loss_divergence":
                if fp.get("returns_abnormal", False):
                    returns_extreme = 0.03 * _ramp(p, 15)
                else:
                    vloss_mult = min(math.exp(p / 12.0), 1e5)
                    vloss_mult *= math.exp(0.5 * _ramp(p, 20) * nz.g())
                    value_std_mult = 1.0 + 2.0 * _ramp(p, 40)
            elif fault == "value_shift":
                value_shift = -(abs(r_trend) + 0.6) * _ramp(p, 30)
                value_std_mult = 1.0 + 5.5 * _ramp(p, 35)
            elif fault == "clip_frac_high":
                clip_target = 0.68 * _sig((p - 12) / 4.0)
                kl_ppo_inc *= 1.0 + 4.0 * _ramp(p, 20)
                kl += 0.3 * T * _ramp(p, 80)
                grad_mult *= 1.0 + 0.5 * _ramp(p, 20)
            elif fault == "clip_frac_low":
                clip_noise *= 0.002 + 0.998 * math.exp(-p / 10.0)
                kl_ppo_inc *= 0.02 + 0.98 * math.exp(-p / 10.0)
                lr_mult *= 0.2 + 0.8 * math.exp(-p / 10.0)
            elif fault == "kl_cycle_delta":
                kl_ppo_inc += 0.0045 * _ramp(p, 15)
            elif fault == "grad_norm_anomaly":
                if fp.get("mode", "explode") == "vanish":
                    grad_mult = max(math.exp(-p / 12.0), 1e-4)
                else:
                    grad_mult = min(math.exp(p / 15.0), 200.0)
                    if nz.u() < 0.1 * _ramp(p, 20):
                        grad_mult *= 3.0 + 7.0 * nz.u()
            elif fault == "update_ratio":
                if fp.get("mode", "high") == "low":
                    lr_mult = 1.0 / (1.0 + 24.0 * _ramp(since, 25))
                else:
                    lr_mult = 1.0 + 24.0 * _ramp(since, 25)
                    clip_noise *= 1.0 + 0.5 * _ramp(since, 25)
                    kl_ppo_inc *= 1.0 + 2.0 * _ramp(since, 25)
            elif fault == "category_imbalance":
                if "r_trend" not in self._ref:
                    self._ref["r_trend"] = r_trend
                stall = r_trend - self._ref["r_trend"]
                group_delta["safety"] = -stall - 0.3 * _ramp(since, 80)
                group_delta["creative"] = 0.35 * _ramp(since, 80)
            elif fault == "prompt_extreme_reward":
                sample_mode["extreme"] = 1.0
            elif fault == "stagnation":
                beta_mult = 1.0 + 9.0 * _ramp(since, 10)
                kl *= 1.0 - 0.6 * _ramp(since, 30)
                clip_noise *= 1.0 - 0.5 * _ramp(since, 30)
            elif fault == "gpu_memory_spike":
                mode = fp.get("mode", "jump")
                if mode == "climb":
                    mem_extra = 0.2 * since
                else:
                    mem_extra = 0.08 * min(since, 40) + 18.0 * _sig((since - 40) / 1.5)
            elif fault == "rm_overfit":
                reward_mu += 0.3 * _ramp(since, 60)
                judge -= 0.1 * _ramp(since, 60)
            elif fault == "grpo_zero_variance":
                s_ = _ramp(since, 20)
                reward_mu = reward_mu * (1 - s_) + 0.02 * s_
                r_std_mult *= 1.0 - 0.9 * s_
                self._ref["zv"] = s_
            elif fault == "degenerate_text":
                sample_mode["degenerate"] = 0.9 * _ramp(p, 30)
                entropy *= 1.0 - 0.35 * _ramp(p, 60)
                L += 250.0 * _ramp(p, 60)
                reward_mu -= 0.3 * _ramp(p, 60)
                judge -= 0.2 * _ramp(p, 60)
                kl += 0.5 * T * _ramp(p, 60)
        if grpo_kl_spike and fault != "kl_zero":
            kl = min(kl * (2.0 + 1.5 * nz.u()), 1.8 * T)
        kl_beta *= beta_mult

        # group rewards shift the batch mean by their average
        reward_mu += sum(group_delta.values()) / 3.0

        # --- the batch of responses --------------------------------------------------------
        r_sd = r_std * r_std_mult
        cv = 0.35
        sl = math.sqrt(math.log(1 + cv * cv))
        mu_l = math.log(max(L, 8.0)) - sl * sl / 2
        zl = rng.standard_normal(_BATCH)
        lengths = np.exp(mu_l + sl * zl)
        if long_frac > 0:
            m = rng.random(_BATCH) < long_frac
            lengths[m] = rng.normal(780.0, 110.0, int(m.sum()))
        tr = rng.random(_BATCH) < runaway
        lengths[tr] = max_len
        lengths = np.clip(np.rint(lengths), 8, max_len)
        e = rng.standard_normal(_BATCH)
        mix = rho * zl + math.sqrt(max(0.0, 1 - rho * rho)) * e
        rewards = reward_mu + r_sd * mix
        if grpo:
            rewards = np.clip(rewards, -0.5, 1.5)
        if bimodal > 0:
            hb = rng.random(_BATCH) < bimodal
            rewards[hb] += 6.0 * r_std if not grpo else 1.2
        if returns_extreme > 0:
            xm = rng.random(_BATCH) < returns_extreme
            k_ = int(xm.sum())
            rewards[xm] = rng.choice([-1.0, 1.0], k_) * rng.uniform(40, 100, k_)
        if fault == "prompt_extreme_reward" and active:
            ext = (-1.0 if fp.get("direction", "high") == "low" else 1.0)
            rewards[0] = reward_mu + ext * 6.0 * r_std
        truncated = lengths >= max_len
        reward_mean = float(rewards.mean())
        reward_std = float(rewards.std())
        length_mean = float(lengths.mean())
        length_max = float(lengths.max())
        trunc_frac = float(truncated.mean())

        # --- derived metrics ---------------------------------------------------------------
        token_max = (1.2 + 45.0 * kl) * math.exp(0.15 * nz.g()) * token_mult
        if grpo_kl_spike:
            token_max = min(token_max * 2.0, 9.5)
        token_p99 = (0.04 + 9.0 * kl) * math.exp(0.1 * nz.g()) * p99_mult
        if fault == "kl_zero" and active:
            token_max = 0.0
            token_p99 = 0.0
        lr_eff = lr_sched * self.lr_factor * lr_mult
        clip_base = (clip * (0.6 + 0.4 * min(1.0, step / _WARMUP))
                     * math.sqrt(self.lr_factor * lr_mult))
        clip_frac = clip_base * (1.0 + 0.12 * epoch / (_PPO_EPOCHS - 1)) * clip_noise
        if fault == "kl_cycle_delta" and active:
            clip_frac = clip_base * (1.0 + 0.04 * epoch) * clip_noise
        if clip_target is not None:
            clip_frac = max(clip_frac, clip_target * clip_noise)
        clip_frac = min(max(clip_frac, 0.0), 0.98)
        kl_ppo = (0.003 + kl_ppo_inc * epoch) * self.lr_factor * lr_mult * math.exp(0.1 * nz.g())
        grad_actor = (1.0 if not grpo else 0.35) * (0.55 + 0.45 * math.exp(-tau / 600.0))
        grad_actor *= grad_level * grad_mult
        if grpo and fault == "grpo_zero_variance" and active:
            s_ = self._ref.get("zv", 0.0)
            grad_actor *= (1 - s_) + 0.003
        upd_actor = 1.0e-2 * lr_eff * math.exp(0.1 * nz.g())
        if fault == "grad_norm_anomaly" and active and fp.get("mode", "explode") != "vanish":
            upd_actor *= 1.0 + 0.5 * _ramp(p, 20)
        if fault == "grad_norm_anomaly" and active and fp.get("mode", "explode") == "vanish":
            upd_actor *= max(grad_mult, 0.05)
        mem_base = 48.0 if not grpo else 40.0
        mem = mem_base + 0.012 * length_mean + 0.0015 * length_max + mem_noise + mem_extra
        judge_score = min(max(judge, 0.0), 1.0)

        m: dict[str, float] = {
            "reward/mean": reward_mean,
            "reward/std": reward_std,
            "kl/mean": kl,
            "kl/token_max": token_max,
            "kl/token_p99": token_p99,
            "kl/beta": kl_beta,
            "entropy/mean": entropy,
            "ppo/clip_frac": clip_frac,
            "response/length_mean": length_mean,
            "response/length_max": length_max,
            "response/truncated_frac": trunc_frac,
            "response/eos_frac": 1.0 - trunc_frac,
            "grad_norm/actor": grad_actor,
            "update_ratio/actor": upd_actor,
            "lr/actor": _LR0[self.algo] * lr_eff,
            "gpu/mem_allocated_gb": mem,
            "judge/score": judge_score,
        }
        if grpo:
            if frac_zero is None:
                frac_zero = 0.12 + 0.3 * max(0.0, r_trend - 0.28)
                if fault == "grpo_zero_variance" and active:
                    s_ = self._ref.get("zv", 0.0)
                    frac_zero = frac_zero * (1 - s_) + 0.97 * s_
            else:
                frac_zero = max(frac_zero, 0.12 + 0.3 * max(0.0, r_trend - 0.28))
            frac_zero = min(max(frac_zero + 0.03 * nz.g(), 0.0), 1.0)
            m["reward/frac_zero_std"] = frac_zero
            m["advantages/mean"] = 0.004 * nz.g()
            m["advantages/std"] = math.sqrt(max(1.0 - frac_zero, 0.0)) * (0.97 + 0.01 * nz.g())
            m["loss/policy"] = kl_beta * kl + 0.01 * nz.g()
        else:
            penalty = kl_beta * kl * length_mean * 0.1
            returns = rewards - penalty
            returns_mean = float(returns.mean())
            returns_std = float(returns.std()) * 1.02
            returns_abs_max = float(np.abs(returns).max()) * 1.03
            vmean = returns_mean * (1.0 - 0.5 * math.exp(-tau_c / 80.0)) + value_ar + value_shift
            vstd = returns_std * (0.55 + 0.35 * (1.0 - math.exp(-tau_c / 120.0))) * value_std_mult
            vloss = (0.03 + 0.3 * math.exp(-tau_c / 150.0)) * vloss_noise
            vloss += 0.5 * (vmean - returns_mean) ** 2
            vloss += 0.5 * max(0.0, vstd - returns_std) ** 2
            if returns_extreme > 0:
                h_sd = r_std * 1.02
                vloss *= max(1.0, (returns_std / h_sd) ** 2)
            vloss *= vloss_mult
            m.update({
                "kl/ppo": kl_ppo,
                "ppo/epoch": float(epoch),
                "loss/policy": -0.008 + 0.012 * nz.g(),
                "loss/value": vloss,
                "value/mean": vmean,
                "value/std": vstd,
                "returns/mean": returns_mean,
                "returns/std": returns_std,
                "returns/abs_max": returns_abs_max,
                "advantages/mean": returns_mean - vmean + 0.005 * nz.g(),
                "advantages/std": math.sqrt(2 * vloss + 0.05 * returns_std ** 2 + 1e-4),
                "value/clip_frac": min(0.95, (0.04 + 0.5 * vloss / (vloss + 0.5)) * clip_noise),
                "grad_norm/critic": 1.5 * (vloss / 0.05) ** 0.25 * grad_level,
                "update_ratio/critic": 1.2e-2 * lr_sched * self.lr_critic_factor
                * math.exp(0.1 * nz.g()),
                "lr/critic": 5.0e-6 * lr_sched * self.lr_critic_factor,
            })
        if fault == "rm_overfit":
            self._rm_metrics(m, nz, since)

        # NaN / Inf
        if fault == "nan_inf":
            bad = math.inf if str(fp.get("value", "nan")).lower().startswith("inf") else math.nan
            if since == -2:
                m["grad_norm/actor"] *= 8.0
            elif since == -1:
                m["grad_norm/actor"] *= 60.0
                if "loss/value" in m:
                    m["loss/value"] *= 20.0
            elif since >= 0:
                for k in ("loss/policy", "loss/value", "grad_norm/actor", "grad_norm/critic"):
                    if k in m:
                        m[k] = bad
                if since >= 1:
                    for k in ("kl/mean", "kl/token_max", "kl/token_p99", "kl/ppo",
                              "entropy/mean", "value/mean", "value/std", "advantages/mean",
                              "advantages/std", "update_ratio/actor", "update_ratio/critic",
                              "ppo/clip_frac", "value/clip_frac"):
                        if k in m:
                            m[k] = math.nan

        # groups
        groups = {}
        scale = 1.0 if not grpo else 0.4
        g_mean = m["reward/mean"]
        groups["reward/mean"] = {
            c: g_mean + scale * _GROUP_OFFSETS[c] + group_delta[c]
            - sum(group_delta.values()) / 3.0 + (0.04 if not grpo else 0.02) * nz.g()
            for c in _CATEGORIES
        }

        # --- events ------------------------------------------------------------------------
        events: list[dict] = []
        ev0 = self._envelope("step", step, 0, ts)
        ev0["metrics"] = m
        if cfg.dists_every and step % cfg.dists_every == 0:
            ev0["dists"] = {
                "reward": [round(float(x), 5) for x in rewards[:_DIST_N]],
                "response_length": [int(x) for x in lengths[:_DIST_N]],
            }
        ev0["groups"] = groups
        ev0["hashes"] = {"actor": self._hash(step, 0)}
        ev0["batch_ids"] = [f"b{step:07d}-r0"]
        ev0["tags"] = dict(self._tags)
        events.append(ev0)
        for r in range(1, self.world_size):
            rm: dict[str, float] = {}
            local = math.exp(0.1 * nz.g())
            if fault == "rank_outlier" and active and r == self.bad_rank:
                local *= 1.0 + 5.0 * _ramp(since, 12)
            rm["grad_norm/actor"] = grad_actor * local
            rm["loss/policy"] = (m["loss/policy"] + 0.004 * nz.g()) * (
                1.0 if not (fault == "rank_outlier" and active and r == self.bad_rank)
                else 1.0 + 3.0 * _ramp(since, 12))
            if not grpo:
                rm["grad_norm/critic"] = m["grad_norm/critic"] * math.exp(0.1 * nz.g())
                rm["loss/value"] = m["loss/value"] * math.exp(0.05 * nz.g())
            rm["gpu/mem_allocated_gb"] = m["gpu/mem_allocated_gb"] + 0.15 * nz.g()
            if fault == "nan_inf" and since >= 0:
                for k in ("grad_norm/actor", "grad_norm/critic", "loss/policy", "loss/value"):
                    if k in rm:
                        rm[k] = m[k]
            ev = self._envelope("step", step, r, ts + 0.001 * r)
            ev["metrics"] = rm
            ev["hashes"] = {"actor": self._hash(step, r)}
            ev["batch_ids"] = [f"b{step:07d}-r{r}"]
            ev["tags"] = dict(self._tags)
            events.append(ev)

        if cfg.samples_every and step % cfg.samples_every == 0:
            events.append(self._samples_event(step, ts + 0.01, m, rng, reward_mu, r_sd, L, rho,
                                              kl, token_max, sample_mode, runaway, active))
        return events

    def _rm_metrics(self, m: dict[str, float], nz: _Noise, since: int) -> None:
        u = 1.0 - math.exp(-self._tau / 300.0)
        train = 0.60 + 0.25 * u
        val = 0.60 + 0.17 * u
        if since >= 0:
            s_ = _ramp(since, 35)
            train += (0.985 - train) * s_
            val -= 0.14 * s_
        a = self._ar_step("acc", nz)
        m["rm/train_acc"] = min(train + a + 0.006 * nz.g(), 1.0)
        m["rm/val_acc"] = min(val + a + 0.008 * nz.g(), 1.0)

    # -- samples ---------------------------------------------------------------------------

    def _samples_event(self, step: int, ts: float, m: dict[str, float], rng: np.random.Generator,
                       reward_mu: float, r_sd: float, L: float, rho: float, kl: float,
                       token_max: float, mode: dict[str, float], runaway: float,
                       active: bool) -> dict:
        cfg = self.config
        rnd = random.Random(_seed_int(self._base, "samples", step, self._gen))
        max_len = int(cfg.max_length)
        used_tokens: set[str] = set()
        samples = []
        identical_text = None
        ext_slot = -1
        if mode.get("extreme") and rnd.random() < 0.9:
            ext_slot = rnd.randrange(_SAMPLES_N)
        for i in range(_SAMPLES_N):
            idx = self._extreme_prompt if i == ext_slot else rnd.randrange(_N_PROMPTS)
            while i != ext_slot and idx == self._extreme_prompt:
                idx = rnd.randrange(_N_PROMPTS)
            cat, prompt = _prompt(idx)
            zl = rnd.gauss(0, 1)
            length = int(min(max(L * math.exp(0.34 * zl - 0.058), 8), max_len))
            if rnd.random() < runaway:
                length = max_len
            mix = rho * zl + math.sqrt(max(0.0, 1 - rho * rho)) * rnd.gauss(0, 1)
            reward = reward_mu + r_sd * mix
            text = _normal_response(rnd, idx, length)
            tkl = token_max * rnd.uniform(0.15, 0.7)
            words = [w.strip(".,!?;:'") for w in text.split()]
            cands = [w for w in words if len(w) > 3 and w not in used_tokens]
            argmax = rnd.choice(cands) if cands else rnd.choice(words)
            if rnd.random() < mode.get("tool", 0.0):
                text = f"{_TOOL_WORD}! " + text
                argmax = _TOOL_WORD
                tkl = token_max * rnd.uniform(0.6, 0.95)
            if rnd.random() < mode.get("gibberish", 0.0):
                tok = rnd.choice(_GIBBERISH)
                cut = max(1, len(text) // 2)
                text = text[:cut] + " " + tok + " " + " ".join(rnd.choice(_GIBBERISH)
                                                             for _ in range(6))
                argmax = tok
                tkl = token_max * rnd.uniform(0.85, 1.0)
            if rnd.random() < mode.get("hack", 0.0):
                if mode.get("identical") and identical_text is None:
                    identical_text = ("I am helpful. " * 6).strip()
                if mode.get("identical"):
                    text = identical_text
                    argmax = "helpful"
                else:
                    text = _HACK_PHRASE + text
            if rnd.random() < mode.get("degenerate", 0.0):
                unit = _DEGENERATE[self._degenerate_kind]
                reps = max(8, min(60, length // max(1, len(unit.split()))))
                first = text.split(". ")[0].rstrip(".") + ". "
                text = first + unit * reps
                text = text.strip()
                argmax = unit.split()[0].strip(".,!")
            if i == ext_slot:
                ext = -1.0 if self._fp.get("direction", "high") == "low" else 1.0
                reward = reward_mu + ext * 6.0 * max(r_sd, 0.05) * (1.0 + 0.1 * rnd.random())
            truncated = length >= max_len
            if truncated:
                text = text.rstrip(".") + " and"
            used_tokens.add(argmax)
            s_kl = kl * length * math.exp(0.3 * rnd.gauss(0, 1))
            if self.fault == "kl_zero" and active:
                s_kl = 0.0
                tkl = 0.0
            samples.append({
                "prompt_id": f"p-{idx:05d}",
                "prompt": prompt,
                "response": text,
                "reward": round(float(reward), 5),
                "length": int(length),
                "truncated": bool(truncated),
                "category": cat,
                "kl": round(float(s_kl), 5) if math.isfinite(s_kl) else s_kl,
                "token_kl_max": round(float(tkl), 4) if math.isfinite(tkl) else tkl,
                "token_kl_argmax": argmax,
            })
        ev = self._envelope("samples", step, 0, ts)
        ev["samples"] = samples
        ev["tags"] = dict(self._tags)
        return ev

    # -- DPO -------------------------------------------------------------------------------

    def _dpo_step(self, step: int, ts: float, nz: _Noise, since: int) -> list[dict]:
        fault = self.fault
        fp = self._fp
        active = since >= 0 and fault != "healthy"
        p = self._p if active else 0.0
        tau = self._tau
        lr_sched = 0.2 + 0.8 * min(1.0, step / _WARMUP)
        u = 1.0 - math.exp(-tau / 300.0)
        margin = 1.3 * u + 0.1 * math.log1p(tau / 400.0) + self._ar_step("margin", nz)
        margin += 0.05 * nz.g()
        if fault == "dpo_saturation" and active:
            margin += 5.0 * _ramp(p, 40)
        pref = _sig(margin)
        loss = -math.log(max(pref, 1e-12)) * math.exp(0.03 * nz.g())
        grad = 0.8 * (0.5 + 0.5 * math.exp(-tau / 500.0)) * math.exp(self._ar_step("grad", nz))
        grad *= (1.0 - pref) * 2.0 + 0.05
        lr_mult = 1.0
        mem_extra = 0.0
        if active:
            if fault == "grad_norm_anomaly":
                if fp.get("mode", "explode") == "vanish":
                    grad *= max(math.exp(-p / 12.0), 1e-4)
                else:
                    grad *= min(math.exp(p / 15.0), 200.0)
            elif fault == "update_ratio":
                if fp.get("mode", "high") == "low":
                    lr_mult = 1.0 / (1.0 + 24.0 * _ramp(since, 25))
                else:
                    lr_mult = 1.0 + 24.0 * _ramp(since, 25)
            elif fault == "gpu_memory_spike":
                if fp.get("mode", "jump") == "climb":
                    mem_extra = 0.2 * since
                else:
                    mem_extra = 0.08 * min(since, 40) + 18.0 * _sig((since - 40) / 1.5)
        lr_eff = lr_sched * self.lr_factor * lr_mult
        m = {
            "dpo/pref_prob": pref,
            "loss/policy": loss,
            "kl/beta": _BETA0["dpo"] * self.beta_factor,
            "grad_norm/actor": grad,
            "update_ratio/actor": 8e-3 * lr_eff * math.exp(0.1 * nz.g()),
            "lr/actor": _LR0["dpo"] * lr_eff,
            "gpu/mem_allocated_gb": 36.0 + self._ar_step("mem", nz) + 0.03 * nz.g() + mem_extra,
        }
        u2 = 1.0 - math.exp(-tau / 300.0)
        train = 0.52 + 0.30 * u2
        val = 0.52 + 0.22 * u2
        if active and fault == "rm_overfit":
            s_ = _ramp(since, 35)
            train += (0.985 - train) * s_
            val -= 0.14 * s_
        if active and fault == "dpo_saturation":
            # the implicit reward separates every pair (held-out pairs too, though less)
            train += (0.995 - train) * _ramp(p, 40)
            val += (0.80 - val) * _ramp(p, 40)
        a = self._ar_step("acc", nz)
        m["rm/train_acc"] = min(train + a + 0.006 * nz.g(), 1.0)
        m["rm/val_acc"] = min(val + a + 0.008 * nz.g(), 1.0)
        if fault == "nan_inf":
            bad = math.inf if str(fp.get("value", "nan")).lower().startswith("inf") else math.nan
            if since == -1:
                m["grad_norm/actor"] *= 50.0
            elif since >= 0:
                m["loss/policy"] = bad
                m["grad_norm/actor"] = bad
        events = []
        for r in range(self.world_size):
            ev = self._envelope("step", step, r, ts + 0.001 * r)
            if r == 0:
                ev["metrics"] = m
            else:
                local = math.exp(0.1 * nz.g())
                if fault == "rank_outlier" and active and r == self.bad_rank:
                    local *= 1.0 + 5.0 * _ramp(since, 12)
                ev["metrics"] = {
                    "grad_norm/actor": m["grad_norm/actor"] * local,
                    "loss/policy": m["loss/policy"] * math.exp(0.03 * nz.g()),
                    "gpu/mem_allocated_gb": m["gpu/mem_allocated_gb"] + 0.15 * nz.g(),
                }
            ev["hashes"] = {"actor": self._hash(step, r)}
            ev["batch_ids"] = [f"b{step:07d}-r{r}"]
            ev["tags"] = dict(self._tags)
            events.append(ev)
        return events


def simulate(config: SimConfig, steps: int, start_ts: float = 1_764_500_000.0,
             step_seconds: float = 2.0) -> Iterator[dict]:
    """Events for steps ``0 .. steps-1``, step ``s`` at ``start_ts + s * step_seconds``.

    ``run_stalled``: after the onset a single-rank run emits nothing; a multi-rank run emits only
    heartbeats from the ranks other than the hung one (``Simulator.bad_rank``).
    """
    sim = Simulator(config)
    for s in range(int(steps)):
        yield from sim.step(s, start_ts + s * step_seconds)
