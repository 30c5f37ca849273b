"""The loop: :class:`Simulator` (one run, step by step, obeying adjust and rollback) and
:func:`simulate` (the events of a whole run).

Per step: integrate the slow state (learning clock, the fault's progress); draw the latent
state of the healthy model; let the fault's injector act on it; add healthy one-step spikes;
then, on a logged step only, draw the batch, compute the metrics, let the injector act on those,
and emit one step event per rank, a samples event and a checkpoint when due.

Everything is deterministic: the noise of a step comes from a generator seeded by
``(seed, run_id, step, rollback generation)``; there are no clock reads (``ts`` is an argument).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from typing import Any, Iterator

import numpy as np

import producers.sim.dpo as dpo
import producers.sim.dynamics as dynamics
from producers.sim.config import SimConfig
from producers.sim.control import Control
from producers.sim.faults import FAULTS, Ctx, effective_algo
from producers.sim.frame import Frame, State
from producers.sim.healthy import resolve_background
from producers.sim.noise import Noise, seed_int, unit
from producers.sim.samples import DEGENERATE, N_PROMPTS, samples

__all__ = ["Simulator", "simulate"]


class Simulator(Control):
    """One simulated run. Call :meth:`step` once per training step, in ascending order.

    After construction: ``algo`` (the algorithm simulated, ``effective_algo``), ``world_size``
    (``param_hash_mismatch`` needs 2+ ranks and ``rank_outlier`` 3+: they use 4 when fewer are
    configured), ``bad_rank`` (the faulty rank of rank-local faults: the last one, or
    ``fault_params={"bad_rank": k}``), ``onset``, ``magnitude`` (position 0..1 in the fault's
    range; None for a fault without one), ``size`` (the magnitude in the range's unit),
    ``healthy_features``; ``truth()`` has all of them in one dict, for a backtest's labels.
    """

    def __init__(self, config: SimConfig):
        if config.fault not in FAULTS:
            raise ValueError(f"unknown fault {config.fault!r}; expected one of {', '.join(FAULTS)}")
        config.check()
        self.config = config
        self.fault = config.fault
        self.spec = FAULTS[config.fault]
        self.algo = effective_algo(config.algo, config.fault)
        ws = config.world_size
        if self.fault == "param_hash_mismatch" and ws < 2:
            ws = 4
        if self.fault == "rank_outlier" and ws < 3:  # "3 x the median of all ranks" needs 3+
            ws = 4
        self.world_size = ws
        self._fp = dict(config.fault_params or {})
        self.bad_rank = int(self._fp.get("bad_rank", ws - 1)) if ws > 1 else 0
        self.bad_rank = min(max(self.bad_rank, 1 if ws > 1 else 0), ws - 1)
        self._base = seed_int("rlwatch-sim", config.seed, config.run_id)
        # the run reports its KL target as the SDK's targets= does (rules scale with it)
        self._tags = {"algo": self.algo, "model": "sim-llama-8b",
                      "target.kl": str(float(config.kl_target))}
        # the draws of this seed: onset, magnitude, healthy background
        lo, hi = self.spec.onset
        self.onset = (int(config.onset) if config.onset is not None
                      else lo + int(unit("onset", config.seed, self.fault) * (hi - lo + 1)))
        rng = self.spec.magnitude
        if rng is None:        # an all-or-nothing fault
            self.magnitude: float | None = None
            self.size: float | None = None
        else:
            self.magnitude = (float(config.magnitude) if config.magnitude is not None
                              else unit("magnitude", config.seed, self.fault))
            self.size = rng.at(self.magnitude)
        self._bg = resolve_background(config.healthy_variant, config.seed, self._base)
        self.healthy_features = tuple(sorted(self._bg.features))
        # adjustable hyper-parameters (multipliers)
        self.lr_factor = 1.0
        self.lr_critic_factor = 1.0
        self.beta_factor = 1.0
        self._gen = 0                      # rollback generation (part of the noise seed)
        rr = random.Random(self._base ^ 0x5EED)
        self._extreme_prompt = rr.randrange(N_PROMPTS)
        self._degenerate_kind = rr.randrange(len(DEGENERATE))
        self._st = State()
        self._last_step = -1
        self._injector = self.spec.injector()
        self._snapshots: dict[int, State] = {}
        self._recent: deque[int] = deque()

    def truth(self) -> dict[str, Any]:
        """What this run really is: fault, algorithm, onset (None when healthy), magnitude, size
        and its unit, healthy features, logging interval, ranks."""
        rng = self.spec.magnitude
        onset = None if self.fault == "healthy" else self.onset
        return {"fault": self.fault, "algo": self.algo, "onset": onset,
                "magnitude": self.magnitude, "size": self.size,
                "size_unit": rng.what if rng is not None else None,
                "healthy_features": list(self.healthy_features),
                "log_every": self.config.log_every, "world_size": self.world_size}

    # -- helpers ---------------------------------------------------------------------------

    def _envelope(self, kind: str, step: int, rank: int, ts: float) -> dict[str, Any]:
        return {"schema": 1, "kind": kind, "run_id": self.config.run_id, "rank": rank,
                "world_size": self.world_size, "step": step, "ts": ts}

    def _hash(self, step: int, rank: int, c: Ctx, active: bool) -> str:
        diverged = active and self._injector.hash_differs(rank, c)
        key = (self._base, self._gen, step, "diverged" if diverged else "ok")
        return "sha256:" + hashlib.sha256(repr(key).encode()).hexdigest()

    def _ctx(self, step: int, nz: Noise, ts: float) -> Ctx:
        def envelope(kind: str, s: int, rank: int, dt: float = 0.0) -> dict[str, Any]:
            return {**self._envelope(kind, s, rank, ts + dt), "tags": dict(self._tags)}
        return Ctx(step=step, since=step - self.onset, p=self._st.p, q=self.magnitude or 0.0,
                   size=self.size or 0.0, T=float(self.config.kl_target), algo=self.algo,
                   fp=self._fp, nz=nz, lr_factor=self.lr_factor, onset=self.onset,
                   world_size=self.world_size, bad_rank=self.bad_rank, envelope=envelope,
                   key=self._base)

    def _integrate(self, step: int, nz: Noise, ts: float) -> bool:
        """Advance the slow state to ``step``; False when the step was already reached."""
        n = step - self._last_step if step > self._last_step else 0
        st, inj = self._st, self._injector
        for k in range(n):
            s = self._last_step + 1 + k
            lr_sched = self._bg.lr_schedule(s)
            learn = lr_sched * self.lr_factor * self.beta_factor ** -0.3
            if s >= self.onset:
                learn *= inj.learn(self._ctx(s, nz, ts))
            st.tau += learn
            st.tau_c += lr_sched * self.lr_critic_factor
            st.kl_scale += (self.beta_factor ** -0.6 - st.kl_scale) / 30.0
            if s >= self.onset and self.fault != "healthy":
                rate = self.spec.rate(self.lr_factor, self.lr_critic_factor, self.beta_factor)
                st.p = max(0.0, st.p + rate)
        if n:
            self._last_step = step
        return n > 0

    # -- the step --------------------------------------------------------------------------

    def step(self, step: int, ts: float) -> list[dict]:
        """All events of ``step``: one step event per rank and a samples event when the step is
        logged and due, a checkpoint when due."""
        step, ts = int(step), float(ts)
        cfg = self.config
        rng = np.random.default_rng([self._base & 0xFFFFFFFF, self._base >> 32,
                                     step & 0xFFFFFFFF, self._gen])
        nz = Noise(rng)
        advanced = self._integrate(step, nz, ts)
        st, inj, bg = self._st, self._injector, self._bg
        c = self._ctx(step, nz, ts)
        active = self.fault != "healthy" and c.since >= -inj.lead
        f = Frame(step=step, since=c.since, algo=self.algo, T=c.T, max_len=int(cfg.max_length),
                  tau=st.tau, tau_c=st.tau_c, lr_sched=bg.lr_schedule(step),
                  lr_factor=self.lr_factor, lr_critic_factor=self.lr_critic_factor,
                  beta_factor=self.beta_factor, kl_scale=st.kl_scale)
        model = dpo if self.algo == "dpo" else dynamics
        model.latent(f, st, bg, nz)
        if active:
            inj.latent(f, c)
        model.spikes(f, bg, nz)

        events: list[dict] = []
        if step % cfg.log_every == 0:
            if self.algo != "dpo":
                dynamics.batch(f, rng)
                if active:
                    inj.batch(f, c)
            model.metrics(f, bg, nz)
            if active:
                inj.metrics(f, c)
            events = self._step_events(f, c, nz, ts, active)
            if self.algo != "dpo" and cfg.samples_every and step % cfg.samples_every == 0:
                rnd = random.Random(seed_int(self._base, "samples", step, self._gen))
                ev = self._envelope("samples", step, 0, ts + 0.01)
                ev["samples"] = samples(f, rnd, self._extreme_prompt, self._degenerate_kind)
                ev["tags"] = dict(self._tags)
                events.append(ev)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            events.append({**self._envelope("checkpoint", step, 0, ts + 0.02),
                           "path": f"/ckpt/{cfg.run_id}/step-{step}", "tags": dict(self._tags)})
        if active and c.since >= 0:
            events = inj.events(events, c)
        if advanced:
            self._remember(step)
        return events

    def _step_events(self, f: Frame, c: Ctx, nz: Noise, ts: float, active: bool) -> list[dict]:
        cfg, m = self.config, f.m
        ev0 = self._envelope("step", f.step, 0, ts)
        ev0["metrics"] = m
        if self.algo != "dpo":
            if cfg.dists_every and f.step % cfg.dists_every == 0:
                ev0["dists"] = {
                    "reward": [round(float(x), 5) for x in f.rewards[:dynamics.DIST_N]],
                    "response_length": [int(x) for x in f.lengths[:dynamics.DIST_N]],
                }
            ev0["groups"] = f.groups
        events = [ev0]
        for r in range(1, self.world_size):
            rm = {"grad_norm/actor": m["grad_norm/actor"] * math.exp(0.1 * nz.g())}
            if self.algo == "dpo":
                rm["loss/policy"] = m["loss/policy"] * math.exp(0.03 * nz.g())
            else:
                rm["loss/policy"] = m["loss/policy"] + 0.004 * nz.g()
                if "loss/value" in m:
                    rm["grad_norm/critic"] = m["grad_norm/critic"] * math.exp(0.1 * nz.g())
                    rm["loss/value"] = m["loss/value"] * math.exp(0.05 * nz.g())
            rm["gpu/mem_allocated_gb"] = m["gpu/mem_allocated_gb"] + 0.15 * nz.g()
            if active and c.since >= 0:
                self._injector.rank(rm, r, f, c)
            ev = self._envelope("step", f.step, r, ts + 0.001 * r)
            ev["metrics"] = rm
            events.append(ev)
        for ev in events:
            ev["hashes"] = {"actor": self._hash(f.step, ev["rank"], c, active and c.since >= 0)}
            ev["batch_ids"] = [f"b{f.step:07d}-r{ev['rank']}"]
            ev["tags"] = dict(self._tags)
        return events


def simulate(config: SimConfig, steps: int, start_ts: float = 1_764_500_000.0,
             step_seconds: float = 2.0) -> Iterator[dict]:
    """Events for steps ``0 .. steps-1``, step ``s`` at ``start_ts + s * step_seconds``
    (only the logged ones when ``config.log_every`` > 1)."""
    sim = Simulator(config)
    for s in range(int(steps)):
        yield from sim.step(s, start_ts + s * step_seconds)
