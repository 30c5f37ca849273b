"""Log the dicts a framework already produces: names mapped through a preset, then ``Monitor.log``.

    from producers import Monitor
    from producers.integrations import DictLogger

    mon = Monitor(run_id="grpo-7b")
    rl = DictLogger(mon, preset="verl")
    ...
    rl.log(step, metrics)           # {"actor/pg_loss": 0.1, "critic/vf_loss": 2.3, ...}

Thin named helpers fit the call shapes of the frameworks' own loggers:

* :class:`VerlTracking`: veRL's ``Tracking.log(data, step, backend=None)``; wraps an existing
  ``Tracking`` so both receive every dict.
* :class:`OpenRLHFLogger`: OpenRLHF's logs dict (keys with or without the ``train/`` prefix,
  ``train/global_step`` as the step when no step is given).
* :class:`NemoRLLogger`: NeMo-RL's ``Logger.log_metrics(metrics, step, prefix="train")``.

Values that are not numbers (strings, lists, None) are skipped and counted in ``skipped``;
NumPy scalars and one-element arrays/tensors are converted with ``.item()``. Bookkeeping keys
(``step``, ``epoch``, ``_runtime`` ...) are not metrics.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from contract.presets import Preset, get_preset

__all__ = ["META_KEYS", "DictLogger", "NemoRLLogger", "OpenRLHFLogger", "VerlTracking", "to_metrics"]

log = logging.getLogger("rlwatch.producers")

#: Keys that count steps or time, not training signals.
META_KEYS = frozenset({
    "step", "global_step", "_step", "train/global_step", "trainer/global_step", "epoch",
    "train/epoch", "total_flos", "_runtime", "_timestamp", "timestamp",
})

#: Keys where a logged dict may carry its own step, in order of preference.
STEP_KEYS = ("step", "global_step", "train/global_step", "trainer/global_step", "_step")


def _number(v: Any) -> float | None:
    """A metric value as a float, or None when ``v`` is not a number."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    item = getattr(v, "item", None)
    if callable(item):
        size = getattr(v, "size", None)
        size = size() if callable(size) else size          # torch: .size() is a shape
        try:
            if size is not None and not isinstance(size, int):
                size = math.prod(size)
            if size in (None, 1):
                x = item()
                return None if isinstance(x, bool) else float(x)
        except (TypeError, ValueError):
            return None
    return None


def to_metrics(data: Mapping[str, Any], drop=META_KEYS) -> tuple[dict[str, float], list[str]]:
    """(numeric entries of ``data`` minus ``drop``, names of the skipped non-numeric entries)."""
    out: dict[str, float] = {}
    skipped: list[str] = []
    for k, v in data.items():
        k = str(k)
        if k in drop:
            continue
        x = _number(v)
        if x is None:
            skipped.append(k)
        else:
            out[k] = x
    return out, skipped


def step_of(data: Mapping[str, Any]) -> int | None:
    for key in STEP_KEYS:
        x = _number(data.get(key))
        if x is not None and math.isfinite(x) and x >= 0:
            return int(x)
    return None


class DictLogger:
    """``log(step, dict)`` -> the dict's numbers, renamed by ``preset``, to ``monitor.log``.

    ``preset``: a preset name (``verl``, ``openrlhf``, ``nemo-rl``, ``trl-ppo``, ``trl-grpo``),
    a :class:`~contract.presets.Preset`, or None to keep the names as logged. Names the preset
    does not know are kept as they are.
    """

    def __init__(self, monitor, preset: str | Preset | None = None, *, drop=META_KEYS):
        self.monitor = monitor
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        self.drop = frozenset(drop)
        self.skipped = 0           # non-numeric values skipped over the logger's life
        self.logged = 0

    def metrics(self, data: Mapping[str, Any]) -> dict[str, float]:
        """The canonical metrics of one logged dict (no side effect but the skip count)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a dict of metric name -> number, got {type(data).__name__}")
        metrics, skipped = to_metrics(data, self.drop)
        self.skipped += len(skipped)
        return self.preset.map_metrics(metrics) if self.preset is not None else metrics

    def log(self, step: int | None, data: Mapping[str, Any], **extra) -> dict[str, float]:
        """Queue one step's metrics; ``step=None`` takes it from the dict (``step``,
        ``global_step``, ``train/global_step``, ``_step``). ``extra`` (``dists``, ``groups``,
        ``hashes``) goes to ``Monitor.log`` as it is. Returns the metrics sent."""
        metrics = self.metrics(data)
        if step is None:
            step = step_of(data)
            if step is None:
                raise ValueError("no step given and none in the dict (step, global_step, _step)")
        self.monitor.log(int(step), metrics, **extra)
        self.logged += 1
        return metrics


class VerlTracking(DictLogger):
    """veRL: ``logger.log(data=metrics, step=global_steps)`` as ``verl.utils.tracking.Tracking``.

    ``VerlTracking(monitor, Tracking(...))`` forwards every call to the wrapped tracker first
    (wandb, console ...) and then to rlwatch; other attributes are the wrapped tracker's.
    """

    def __init__(self, monitor, tracking=None, *, preset: str | Preset | None = "verl", **kw):
        super().__init__(monitor, preset, **kw)
        self.tracking = tracking

    def log(self, data: Mapping[str, Any], step: int | None = None, backend=None, **extra):
        if self.tracking is not None:
            if backend is None:
                self.tracking.log(data=data, step=step)
            else:
                self.tracking.log(data=data, step=step, backend=backend)
        return super().log(step, data, **extra)

    def __getattr__(self, name: str):
        tracking = self.__dict__.get("tracking")
        if tracking is None:
            raise AttributeError(name)
        return getattr(tracking, name)


class OpenRLHFLogger(DictLogger):
    """OpenRLHF: the ``logs_dict`` of its PPO trainer, with or without the ``train/`` prefix.

    ``log(global_step, logs_dict)``; ``log(None, logs)`` takes ``train/global_step`` from the
    dict, as OpenRLHF hands it to wandb.
    """

    def __init__(self, monitor, *, preset: str | Preset | None = "openrlhf", **kw):
        super().__init__(monitor, preset, **kw)


class NemoRLLogger(DictLogger):
    """NeMo-RL: ``log_metrics(metrics, step, prefix="train")`` joins names as ``prefix/name``,
    as NeMo-RL's own ``Logger`` does; the ``nemo-rl`` preset then maps ``train/loss`` & co."""

    def __init__(self, monitor, *, preset: str | Preset | None = "nemo-rl", **kw):
        super().__init__(monitor, preset, **kw)

    def log_metrics(self, metrics: Mapping[str, Any], step: int, prefix: str | None = "",
                    step_metric: str | None = None, step_finished: bool = False, **_ignored):
        del step_metric, step_finished  # NeMo-RL's signature; rlwatch has one step axis
        if prefix:
            metrics = {f"{prefix}/{k}": v for k, v in metrics.items()}
        return self.log(step, metrics)
