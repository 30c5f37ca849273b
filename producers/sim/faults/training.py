"""Faults of the optimizer, the critic and the machines: gradients, learning rate, value head,
non-finite numbers, ranks, memory, a hung run. Magnitudes: see the table in
``producers/sim/faults/__init__.py``."""

from __future__ import annotations

import math

from producers.sim.faults.base import Ctx, Injector
from producers.sim.frame import Frame
from producers.sim.noise import ramp, sig, unit

_LOSSES_AND_GRADS = ("loss/policy", "loss/value", "grad_norm/actor", "grad_norm/critic")
_GRADS = ("grad_norm/actor", "grad_norm/critic")
_DOWNSTREAM = ("kl/mean", "kl/token_max", "kl/token_p99", "kl/ppo", "entropy/mean", "value/mean",
               "value/std", "advantages/mean", "advantages/std", "update_ratio/actor",
               "update_ratio/critic", "ppo/clip_frac", "value/clip_frac")


class ValueLossDivergence(Injector):
    """Critic loss grows by orders of magnitude.

    ``size``: the e-folding time (in progress steps) of the growth. ``fault_params=
    {"returns_abnormal": True}``: a data problem instead (1-5 % of samples get absurd rewards,
    more for a larger magnitude), the returns show it.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        if c.fp.get("returns_abnormal", False):
            f.returns_extreme = (0.01 + 0.04 * c.q) * ramp(c.p, 15)
        else:
            f.vloss_mult = min(math.exp(c.p / c.size), 1e5)
            f.vloss_mult *= math.exp(0.5 * ramp(c.p, 20) * c.nz.g())
            f.value_std_mult = 1.0 + 2.0 * ramp(c.p, 40)


class ValueShift(Injector):
    """value/mean changes sign and value/std explodes.

    ``size``: the factor value/std grows by.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        f.value_shift = -(abs(f.r_trend) + 0.6) * ramp(c.p, 30)
        f.value_std_mult = 1.0 + (c.size - 1.0) * ramp(c.p, 35)


class GradNormAnomaly(Injector):
    """Gradient norm explodes (or vanishes) on all ranks.

    ``size``: the e-folding time in steps of the growth (capped at 200 x) or, with
    ``fault_params={"mode": "vanish"}``, of the decay.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        if c.fp.get("mode", "explode") == "vanish":
            f.grad_mult *= max(math.exp(-c.p / c.size), 1e-4)
        else:
            f.grad_mult *= min(math.exp(c.p / c.size), 200.0)
            if c.nz.u() < 0.1 * ramp(c.p, 20):
                f.grad_mult *= 3.0 + 7.0 * c.nz.u()

    def metrics(self, f: Frame, c: Ctx) -> None:
        if c.fp.get("mode", "explode") == "vanish":
            f.m["update_ratio/actor"] *= max(math.exp(-c.p / c.size), 0.05)
        else:
            f.m["update_ratio/actor"] *= 1.0 + 0.5 * ramp(c.p, 20)


class UpdateRatio(Injector):
    """Update/param norm ratio leaves 1e-3..1e-1 (lr misconfigured).

    ``size``: the factor the learning rate is off by (``fault_params={"mode": "low"}``: too
    small by it, instead of too large).
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        r = ramp(c.since, 25)
        if c.fp.get("mode", "high") == "low":
            f.lr_mult = 1.0 / (1.0 + (c.size - 1.0) * r)
        else:
            f.lr_mult = 1.0 + (c.size - 1.0) * r
            f.clip_noise *= 1.0 + 0.5 * r
            f.kl_ppo_inc *= 1.0 + 2.0 * r


class NanInf(Injector):
    """Loss and gradient norms become NaN (after a short gradient blow-up).

    ``fault_params={"value": "inf"}``: +Inf instead of NaN. ``{"where": "grad_norm"}``: only the
    gradient norm is non-finite, at the onset and then at isolated steps (never two in a row),
    with a finite loss: mixed-precision steps the optimizer skipped, a healthy-ish run; ``size``
    is then the share of such steps. The default (``"loss"``) ignores ``size``.
    """

    lead = 2

    def _skipped(self, step: int, c: Ctx) -> bool:
        def hit(s: int) -> bool:
            return unit(c.key, "skipped-step", s) < c.size
        if step == c.onset:
            return True
        if step == c.onset + 1:
            return False
        return step > c.onset and hit(step) and not hit(step - 1)

    def metrics(self, f: Frame, c: Ctx) -> None:
        m, bad = f.m, c.non_finite()
        if c.fp.get("where", "loss") == "grad_norm":
            if self._skipped(c.step, c):
                for k in _GRADS:
                    if k in m:
                        m[k] = bad
            return
        if c.since == -2:
            m["grad_norm/actor"] *= 8.0
        elif c.since == -1:
            m["grad_norm/actor"] *= 60.0
            if "loss/value" in m:
                m["loss/value"] *= 20.0
        else:
            for k in _LOSSES_AND_GRADS:
                if k in m:
                    m[k] = bad
            if c.since >= 1:
                for k in _DOWNSTREAM:
                    if k in m:
                        m[k] = math.nan

    def rank(self, rm: dict[str, float], r: int, f: Frame, c: Ctx) -> None:
        if c.since < 0:
            return
        keys = _GRADS if c.fp.get("where", "loss") == "grad_norm" else _LOSSES_AND_GRADS
        for k in keys:
            if k in rm and not math.isfinite(f.m.get(k, 0.0)):
                rm[k] = f.m[k]


class RankOutlier(Injector):
    """One rank's gradient norm is many times the others' (bad shard).

    ``size``: the factor on that rank (``Simulator.bad_rank``).
    """

    def rank(self, rm: dict[str, float], r: int, f: Frame, c: Ctx) -> None:
        if r == c.bad_rank:
            r12 = ramp(c.since, 12)
            rm["grad_norm/actor"] *= 1.0 + (c.size - 1.0) * r12
            rm["loss/policy"] *= 1.0 + 0.6 * (c.size - 1.0) * r12


class ParamHashMismatch(Injector):
    """One rank's parameter hash differs from rank 0.

    No magnitude.
    """

    def hash_differs(self, rank: int, c: Ctx) -> bool:
        return rank == c.bad_rank


class GpuMemorySpike(Injector):
    """Allocated GPU memory climbs and jumps (lengths unchanged).

    ``size``: the jump in GB after a short climb; ``fault_params={"mode": "climb"}``: a steady
    leak of size / 90 GB per step instead.
    """

    def latent(self, f: Frame, c: Ctx) -> None:
        s = c.since
        if c.fp.get("mode", "jump") == "climb":
            f.mem_extra = c.size / 90.0 * s
        else:
            f.mem_extra = 0.08 * min(s, 40) + c.size * sig((s - 40) / 1.5)


class RunStalled(Injector):
    """The run (one rank) stops emitting step events.

    No magnitude. A single-rank run emits nothing after the onset; a multi-rank run emits only
    heartbeats, from the ranks other than the hung one (``Simulator.bad_rank``).
    """

    def events(self, events: list[dict], c: Ctx) -> list[dict]:
        if c.world_size == 1:
            return []
        out = []
        for r in range(c.world_size):
            if r != c.bad_rank:
                out.append(c.envelope("heartbeat", c.onset, r, 0.001 * r))
        return out
