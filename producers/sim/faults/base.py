"""What a fault is: a row of the table (:class:`Fault`) and an injector (:class:`Injector`).

An injector is a small class with only the hooks its fault needs; the simulator calls them, in
this order, on every step from ``lead`` steps before the onset on (all of them see ``c.since``,
the steps since the onset, and ``c.p``, the progress in the fault's clock):

* ``learn(c)``: a multiplier on how fast the run learns (stagnation: 0);
* ``latent(f, c)``: change the latent state of the step (every step, logged or not: keep any
  state of the injector here);
* ``batch(f, c)``: change the drawn responses (``f.rewards``, ``f.lengths``);
* ``metrics(f, c)``: change the step's metrics ``f.m`` and ``f.groups``;
* ``rank(rm, r, f, c)``: change the metrics of rank ``r`` > 0;
* ``hash_differs(rank, c)``: whether rank's parameter hash differs from rank 0's;
* ``events(events, c)``: the last word on the step's events (a stalled run emits none).

``c.size`` is the fault's size in its magnitude range's unit, ``c.q`` the position in the range
(0 mildest .. 1 strongest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from producers.sim.frame import Frame
from producers.sim.noise import Noise

__all__ = ["ALWAYS", "Ctx", "Fault", "Injector", "Range", "ONSET_RANGE"]

#: ``Injector.lead`` of an injector whose hooks run from the first step (they check c.since).
ALWAYS = 1 << 40

#: Where a fault's onset is drawn when ``SimConfig.onset`` is None (most faults).
ONSET_RANGE = (200, 400)


@dataclass(frozen=True)
class Range:
    """The magnitude range of a fault: ``what`` goes from ``mild`` (position 0) to ``strong``
    (position 1), linearly or, with ``log``, geometrically. ``mild`` may be the larger number (a
    slower decay is milder)."""

    what: str
    mild: float
    strong: float
    log: bool = False

    def at(self, q: float) -> float:
        q = min(max(float(q), 0.0), 1.0)
        if self.log:
            return self.mild * (self.strong / self.mild) ** q
        return self.mild + (self.strong - self.mild) * q


@dataclass
class Ctx:
    """What an injector knows about the run at one step."""

    step: int
    since: int                   # steps since the onset (< 0 before it)
    p: float                     # progress since the onset, in the fault's clock
    q: float                     # magnitude position, 0 .. 1 (0 when the fault has no range)
    size: float                  # magnitude in the range's unit (0 when the fault has none)
    T: float                     # KL target
    algo: str
    fp: dict[str, Any]           # SimConfig.fault_params
    nz: Noise
    lr_factor: float
    onset: int
    world_size: int
    bad_rank: int
    envelope: Callable[..., dict[str, Any]]   # (kind, step, rank, dt): an event at the step's
    #                                           time + dt, with the run's tags
    key: int = 0                 # the run's noise key (for seeded per-step draws)

    @property
    def grpo(self) -> bool:
        return self.algo == "grpo"

    def non_finite(self) -> float:
        """The non-finite value this run emits: NaN, or +Inf with ``{"value": "inf"}``."""
        return math.inf if str(self.fp.get("value", "nan")).lower().startswith("inf") else math.nan


class Injector:
    """A fault's effects (default: none). One instance per run; a rollback makes a new one."""

    lead = 0   # steps before the onset in which the hooks already run

    def learn(self, c: Ctx) -> float:
        return 1.0

    def latent(self, f: Frame, c: Ctx) -> None:
        pass

    def batch(self, f: Frame, c: Ctx) -> None:
        pass

    def metrics(self, f: Frame, c: Ctx) -> None:
        pass

    def rank(self, rm: dict[str, float], r: int, f: Frame, c: Ctx) -> None:
        pass

    def hash_differs(self, rank: int, c: Ctx) -> bool:
        return False

    def events(self, events: list[dict], c: Ctx) -> list[dict]:
        return events


@dataclass(frozen=True)
class Fault:
    """A row of the fault table.

    ``clock``: what drives the fault's progress ``c.p`` after the onset: ``steps`` (wall
    steps: data and infrastructure faults), ``lr`` (the actor's learning rate: optimizer-driven
    faults, slowed by ``adjust lr``), ``critic`` (the critic's), ``kl`` (``lr / beta**1.5``
    minus a pull back when beta was raised: ``adjust beta x1.5`` slows a KL blow-up and a
    larger factor reverses it).
    """

    id: str
    injector: type[Injector]
    algos: tuple[str, ...]
    clock: str
    magnitude: Range | None
    onset: tuple[int, int] = ONSET_RANGE

    @property
    def description(self) -> str:
        doc = (self.injector.__doc__ or "").strip()
        return " ".join(doc.split("\n\n")[0].split())

    def rate(self, lr_factor: float, lr_critic_factor: float, beta_factor: float) -> float:
        """Progress per step after the onset."""
        if self.clock == "kl":
            return lr_factor / beta_factor ** 1.5 - 0.4 * max(0.0, beta_factor - 1.0)
        if self.clock == "lr":
            return lr_factor
        if self.clock == "critic":
            return lr_critic_factor
        return 1.0
