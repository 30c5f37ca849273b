"""What a training worker's commands do to a simulated run: ``adjust`` and ``rollback``."""

from __future__ import annotations

import math
from collections import deque

from typing import Any

from producers.sim.config import SimConfig
from producers.sim.faults.base import Fault, Injector
from producers.sim.frame import State

__all__ = ["Control"]

_ADJUST_ALIASES = {
    "beta": "beta", "kl_coef": "beta", "kl_beta": "beta", "init_kl_coef": "beta", "kl/beta": "beta",
    "lr": "lr", "learning_rate": "lr",
    "lr_actor": "lr_actor", "actor_lr": "lr_actor", "lr/actor": "lr_actor",
    "lr_critic": "lr_critic", "critic_lr": "lr_critic", "lr/critic": "lr_critic",
}


class Control:
    """The control half of :class:`producers.sim.run.Simulator`, which sets these attributes."""

    config: SimConfig
    fault: str
    spec: Fault
    onset: int
    lr_factor: float
    lr_critic_factor: float
    beta_factor: float
    _fp: dict[str, Any]
    _gen: int
    _injector: Injector
    _last_step: int
    _st: State
    _snapshots: dict[int, State]
    _recent: deque[int]

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
        self._st = self._snapshots[max(candidates)].copy() if candidates else State()
        for s in [s for s in self._snapshots if s > to_step]:
            del self._snapshots[s]
        self._recent = deque(s for s in self._recent if s <= to_step)
        self._last_step = to_step
        self._st.p = 0.0
        self._injector = self.spec.injector()
        if started and self.fault != "healthy":
            delay = self._fp.get("redevelop_after", 200)
            self.onset = (1 << 62) if delay is None else max(self.onset, to_step + 1) + int(delay)
        self._gen += 1

    def _remember(self, step: int) -> None:
        self._snapshots[step] = self._st.copy()
        self._recent.append(step)
        cp = self.config.checkpoint_every
        while len(self._recent) > 1000:
            old = self._recent.popleft()
            if not (cp and old % cp == 0):
                self._snapshots.pop(old, None)

