"""The variety of healthy training: what a rule must not take for a fault.

Each feature is off in a ``"plain"`` run (the default) and switched on by
``SimConfig.healthy_variant``; its parameters are drawn by the seed from the ranges below.

* ``lr_warmup``: the learning rate rises linearly from 0 over 50-200 steps (plain: from 20 %
  over 20 steps); learning, KL growth and clip fraction follow it, and ``update_ratio`` starts
  below 1e-3.
* ``value_fit`` (PPO): the value head starts untrained: ``value/mean`` starts at -1.0 .. 0.2 x
  the returns' mean (usually the wrong sign), ``value/std`` at 0.05-0.25 x or 2.5-4 x the
  returns' std, and both settle on the returns over 50-180 steps; the value loss starts high.
* ``spikes``: in every block of 250 steps, one step where ``kl/mean`` is 5-60 x its level, one
  where ``reward/mean`` jumps 4-10 step-to-step deviations up or down, and one where
  ``grad_norm/actor`` is 5-30 x its level; the next step is back to normal.
* ``low_entropy_drift`` (PPO, GRPO): entropy starts low (0.15-0.5 nats), wanders by ~6 % step to
  step and drifts down slowly (-40 % over a few thousand steps, never half within 200 steps).
* ``kl_from_zero`` (PPO, GRPO): KL starts at ~0 and grows over the first ~250-600 steps of
  training to 0.6-0.95 x the target, where it stays (noise takes it above the target at times).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from producers.sim.config import HEALTHY_FEATURES
from producers.sim.noise import seed_int, unit

__all__ = ["Background", "resolve_background", "resolve_features"]

_SPIKE_BLOCK = 250
_PLAIN_WARMUP = 20


def resolve_features(variant: str | tuple[str, ...] | list[str] | None,
                     seed: int) -> frozenset[str]:
    """The features a ``healthy_variant`` asks for (``ValueError`` on an unknown name)."""
    if variant is None:
        return frozenset()
    if isinstance(variant, str):
        names = [v.strip() for v in variant.split(",") if v.strip()]
    else:
        names = [str(v).strip() for v in variant]
    out: set[str] = set()
    for name in names:
        if name == "plain":
            continue
        if name == "all":
            out.update(HEALTHY_FEATURES)
        elif name == "random":
            out.update(f for f in HEALTHY_FEATURES if unit("healthy", seed, f) < 0.5)
        elif name in HEALTHY_FEATURES:
            out.add(name)
        else:
            raise ValueError(f"unknown healthy_variant {name!r}; expected plain, all, random or "
                             f"one of {', '.join(HEALTHY_FEATURES)}")
    return frozenset(out)


def _draw(seed: int, feature: str, what: str, lo: float, hi: float, log: bool = False) -> float:
    u = unit("healthy", seed, feature, what)
    if log:
        return lo * (hi / lo) ** u
    return lo + (hi - lo) * u


@dataclass(frozen=True)
class Background:
    """The drawn healthy features of one run and their parameters."""

    features: frozenset[str]
    warmup_steps: int
    value_fit_steps: float
    value_start: float       # value/mean at step 0, as a multiple of the returns' mean
    value_std_start: float   # value/std at step 0, as a multiple of the returns' std
    entropy_level: float | None
    kl_plateau: float | None  # x kl_target
    kl_time: float
    spike_key: int

    def lr_schedule(self, step: int) -> float:
        """The learning rate at ``step`` as a fraction of its peak."""
        if "lr_warmup" in self.features:
            return min(1.0, (step + 1) / self.warmup_steps)
        return 0.2 + 0.8 * min(1.0, step / _PLAIN_WARMUP)

    def warmup_fraction(self, step: int) -> float:
        """How far the warm-up has got (1 after it), for quantities that ramp with it."""
        return min(1.0, step / self.warmup_steps)

    def value_fit(self, step: int) -> tuple[float, float]:
        """(mean error, std factor) of an untrained value head at ``step``: (0, 1) once fitted."""
        if "value_fit" not in self.features:
            return 0.0, 1.0
        w = math.exp(-3.0 * step / self.value_fit_steps)
        return (self.value_start - 1.0) * w, self.value_std_start ** w

    def spike(self, kind: str, step: int) -> float:
        """The spike of ``kind`` (``kl``, ``reward``, ``grad``) at ``step``, 0 when none.

        ``kl`` and ``grad``: a factor > 1; ``reward``: a signed number of step deviations.
        """
        if "spikes" not in self.features:
            return 0.0
        block = step // _SPIKE_BLOCK
        h = seed_int(self.spike_key, kind, block)
        if step % _SPIKE_BLOCK != 10 + h % (_SPIKE_BLOCK - 20) or step < 10:
            return 0.0
        u = ((h >> 16) % 10_000) / 10_000
        if kind == "kl":
            return 5.0 * 12.0 ** u
        if kind == "grad":
            return 5.0 * 6.0 ** u
        return (4.0 + 6.0 * u) * (1.0 if (h >> 40) % 2 else -1.0)


def resolve_background(variant, seed: int, spike_key: int) -> Background:
    """Draw the healthy background of a run from its seed."""
    features = resolve_features(variant, seed)
    warm = "lr_warmup" in features
    low_ent = "low_entropy_drift" in features
    kl0 = "kl_from_zero" in features
    narrow = unit("healthy", seed, "value_fit", "std_side") < 0.5
    return Background(
        features=features,
        warmup_steps=int(round(_draw(seed, "lr_warmup", "steps", 50, 200))) if warm
        else _PLAIN_WARMUP,
        value_fit_steps=_draw(seed, "value_fit", "steps", 50, 180),
        value_start=_draw(seed, "value_fit", "mean", -1.0, 0.2),
        value_std_start=(_draw(seed, "value_fit", "std", 0.05, 0.25, log=True) if narrow
                         else _draw(seed, "value_fit", "std", 2.5, 4.0)),
        entropy_level=_draw(seed, "low_entropy_drift", "level", 0.15, 0.5) if low_ent else None,
        kl_plateau=_draw(seed, "kl_from_zero", "plateau", 0.6, 0.95) if kl0 else None,
        kl_time=_draw(seed, "kl_from_zero", "time", 250, 600),
        spike_key=spike_key,
    )
