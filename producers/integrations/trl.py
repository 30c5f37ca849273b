"""rlwatch for TRL's PPO and GRPO trainers (and any ``transformers.Trainer``): one callback.

    from producers import Monitor
    from producers.integrations.trl import RlwatchCallback

    trainer = GRPOTrainer(..., callbacks=[RlwatchCallback(Monitor(run_id="grpo-7b"))])
    trainer.train()

* ``on_log``: the trainer's logs, renamed through the ``trl-ppo`` / ``trl-grpo`` preset (given,
  or detected from the config class and the logged names), go to ``Monitor.log`` at
  ``state.global_step``.
* ``on_step_begin``: the monitor's step boundary. A pause blocks there until resume; a stop sets
  ``control.should_training_stop`` and ``control.should_save`` (the trainer saves a checkpoint
  and ends cleanly); an ``adjust`` is applied (see :meth:`RlwatchCallback.apply_adjust`). Trainer
  loops that never call ``on_step_begin`` (TRL's PPOTrainer) get the boundary at ``on_step_end``.
* ``on_save``: the checkpoint directory (``<output_dir>/checkpoint-<step>``) is reported, so a
  rollback knows where to go.

Nothing raises into the trainer: a monitoring failure is logged as a warning and training goes
on. Only the main process (``state.is_world_process_zero``) publishes logs and checkpoints
(TRL's logs are already reduced across ranks) unless ``log_all_ranks=True``; every rank obeys
the control commands.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from producers.control import TrainingStopped
from producers.integrations.adapters import META_KEYS, to_metrics
from producers.monitor import Monitor
from contract.commands import Command
from contract.presets import Preset, get_preset
from contract.presets import detect_preset as find_preset

__all__ = ["RlwatchCallback", "detect_preset"]

log = logging.getLogger("rlwatch.producers")

#: The end-of-training summary Trainer logs once; not a step's metrics.
_SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second"})
_CALLBACK_META = META_KEYS | {"train_loss"}

_LR_KEYS = ("lr", "learning_rate", "lr/actor")
_BETA_KEYS = ("beta", "kl_coef", "kl/beta", "init_kl_coef")


def detect_preset(keys, config: Any = None) -> str | None:
    """The preset of a TRL run: from the trainer's config class when it names one (GRPO, PPO,
    DPO), else from the logged names by the one detection rlwatch has everywhere
    (:func:`contract.presets.detect_preset`); None when undecided."""
    name = type(config).__name__.lower() if config is not None else ""
    for prefix, preset in (("grpo", "trl-grpo"), ("ppo", "trl-ppo"), ("dpo", "trl-dpo")):
        if name.startswith(prefix):
            return preset
    found = find_preset(keys, among=("trl-ppo", "trl-grpo", "trl-dpo"))
    return found.name if found is not None else None


def _default_run_id(args) -> str:
    raw = (os.environ.get("RLWATCH_RUN_ID") or getattr(args, "run_name", None)
           or os.path.basename(os.path.normpath(getattr(args, "output_dir", None) or "trl-run")))
    return re.sub(r"\s+", "-", str(raw).strip()) or "trl-run"


class RlwatchCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that publishes to rlwatch and obeys its commands.

    ``monitor``: a :class:`~producers.Monitor`; when None, one is made at ``on_train_begin``
    with ``run_id`` (else ``RLWATCH_RUN_ID``, ``args.run_name`` or the output dir's name) and
    ``monitor_kwargs``, and closed (flushed) at ``on_train_end``.

    ``preset``: ``"auto"`` (the config class, else the first logged names that tell PPO from
    GRPO), ``"trl-ppo"``, ``"trl-grpo"``, a :class:`~contract.presets.Preset`, or None (names as
    logged).

    ``on_adjust(params, command)``: applies ``adjust`` commands yourself; without it the
    callback applies them to the trainer (:meth:`apply_adjust`). ``trainer``: optional, lets
    the built-in adjust reach ``trainer.beta`` (GRPO reads its KL coefficient from there).
    """

    def __init__(self, monitor: Monitor | None = None, *, run_id: str | None = None,
                 preset: str | Preset | None = "auto",
                 on_adjust: Callable[[dict, Command], None] | None = None, trainer: Any = None,
                 log_all_ranks: bool = False, save_on_stop: bool = True,
                 close_timeout: float = 10.0, **monitor_kwargs):
        self.monitor = monitor
        self._owns_monitor = monitor is None
        self.run_id = run_id
        self.monitor_kwargs = monitor_kwargs
        if preset == "auto":
            self.preset: Preset | None = None
            self.auto = True
        else:
            self.preset = get_preset(preset) if isinstance(preset, str) else preset
            self.auto = False
        self.user_adjust = on_adjust
        self.trainer = trainer
        self.log_all_ranks = log_all_ranks
        self.save_on_stop = save_on_stop
        self.close_timeout = close_timeout
        self.stopped: TrainingStopped | None = None
        self.adjustments: list[dict] = []
        self.errors = 0
        self._args = None
        self._optimizer = None
        self._lr_scheduler = None
        self._began = False
        if monitor is not None:
            self._install_adjust(monitor)

    # -- helpers ----------------------------------------------------------------------------------
    def _install_adjust(self, monitor: Monitor) -> None:
        if self.user_adjust is not None:
            monitor.on_adjust = self.user_adjust
        elif monitor.on_adjust is None:
            monitor.on_adjust = self._builtin_adjust

    def _ensure_monitor(self, args) -> Monitor | None:
        if self.monitor is None:
            self.monitor = Monitor(self.run_id or _default_run_id(args), **self.monitor_kwargs)
            self._install_adjust(self.monitor)
        return self.monitor

    def _remember(self, args, kwargs: dict) -> None:
        self._args = args
        if kwargs.get("optimizer") is not None:
            self._optimizer = kwargs["optimizer"]
        if kwargs.get("lr_scheduler") is not None:
            self._lr_scheduler = kwargs["lr_scheduler"]

    def _publishes(self, state) -> bool:
        return self.log_all_ranks or bool(getattr(state, "is_world_process_zero", True))

    def _warn(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        log.warning("rlwatch: %s failed (%s: %s); training continues", what, type(exc).__name__, exc)

    def _boundary(self, control) -> None:
        mon = self.monitor
        if mon is None:
            return
        try:
            mon.step_boundary()          # blocks while paused
        except TrainingStopped as exc:
            self.stopped = exc
            control.should_training_stop = True
            if self.save_on_stop:
                control.should_save = True
            log.warning("rlwatch: %s; the trainer will save and stop", exc)
        except Exception as exc:  # noqa: BLE001 - never raise into the trainer
            self._warn("step boundary", exc)

    # -- adjust -------------------------------------------------------------------------------------
    def apply_adjust(self, params: dict) -> dict[str, float]:
        """Apply ``adjust`` factors to the trainer; returns what was applied.

        ``lr`` / ``learning_rate``: multiplies every optimizer param group's ``lr`` and the
        scheduler's ``base_lrs`` (so the schedule keeps the new scale). ``beta`` / ``kl_coef``:
        multiplies ``trainer.beta`` (GRPO) and ``args.beta`` / ``args.kl_coef`` (PPO reads
        ``args.kl_coef`` at every step). Values are factors, as rule actions write them
        (``{adjust: {beta: 1.5}}``). Raises ValueError when nothing could be applied.
        """
        applied: dict[str, float] = {}
        unknown = []
        for key, raw in params.items():
            factor = float(raw)
            if key in _LR_KEYS:
                if self._optimizer is not None:
                    for group in self._optimizer.param_groups:
                        group["lr"] = group["lr"] * factor
                    base = getattr(self._lr_scheduler, "base_lrs", None)
                    if isinstance(base, list):
                        self._lr_scheduler.base_lrs = [b * factor for b in base]
                    applied[key] = factor
                else:
                    unknown.append(f"{key} (no optimizer seen yet)")
            elif key in _BETA_KEYS:
                done = False
                for obj, attr in ((self.trainer, "beta"), (self._args, "beta"), (self._args, "kl_coef")):
                    value = getattr(obj, attr, None) if obj is not None else None
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        setattr(obj, attr, value * factor)
                        done = True
                if done:
                    applied[key] = factor
                else:
                    unknown.append(f"{key} (no beta / kl_coef on the trainer or its args)")
            else:
                unknown.append(key)
        if unknown:
            log.warning("rlwatch: adjust: could not apply %s", ", ".join(unknown))
        if not applied:
            raise ValueError(f"nothing to adjust: {', '.join(unknown) or 'no parameters'}")
        self.adjustments.append(applied)
        return applied

    def _builtin_adjust(self, params: dict, cmd: Command) -> None:
        applied = self.apply_adjust(params)
        log.warning("rlwatch: adjusted %s (%s)", applied, cmd.reason or cmd.issuer)

    # -- TrainerCallback events -----------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        try:
            self._remember(args, kwargs)
            self._ensure_monitor(args)
            if self.auto and self.preset is None:
                name = detect_preset((), args)
                if name:
                    self.preset = get_preset(name)
        except Exception as exc:  # noqa: BLE001
            self._warn("setup", exc)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._remember(args, kwargs)
        self._began = True
        self._boundary(control)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if not self._began:          # a loop without on_step_begin (TRL's PPOTrainer)
            self._remember(args, kwargs)
            self._boundary(control)
        self._began = False
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or self.monitor is None or not self._publishes(state):
            return control
        try:
            if _SUMMARY_KEYS & set(logs):
                return control
            metrics, _ = to_metrics(logs, _CALLBACK_META)
            if not metrics:
                return control
            if self.auto and self.preset is None:
                name = detect_preset(metrics, args)
                if name:
                    self.preset = get_preset(name)
            if self.preset is not None:
                metrics = self.preset.map_metrics(metrics)
            self.monitor.log(int(state.global_step), metrics)
        except Exception as exc:  # noqa: BLE001
            self._warn("log", exc)
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.monitor is None or not self._publishes(state):
            return control
        try:
            step = int(state.global_step)
            path = os.path.join(args.output_dir or ".", f"checkpoint-{step}")
            self.monitor.log_checkpoint(step, path)
        except Exception as exc:  # noqa: BLE001
            self._warn("checkpoint report", exc)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        """A monitor the callback made is flushed (within ``close_timeout``) and closed; one you
        passed in stays open (close it yourself, e.g. with ``with Monitor(...)``)."""
        if self.monitor is not None and self._owns_monitor:
            try:
                self.monitor.close(self.close_timeout)
            except Exception as exc:  # noqa: BLE001
                self._warn("close", exc)
        return control
