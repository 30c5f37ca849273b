"""Drop-in integrations of the SDK with the RLHF frameworks people train with.

* :class:`RlwatchCallback` (``producers.integrations.trl``): a ``transformers.TrainerCallback``
  for TRL's PPO and GRPO trainers (and any ``transformers.Trainer``). Needs ``transformers``,
  which is imported only when the callback is.
* :class:`DictLogger` and the thin helpers of ``producers.integrations.adapters`` for loops that
  log plain dicts: veRL (``Tracking.log(data, step)``), OpenRLHF (``train/`` prefix), NeMo-RL.
"""

from __future__ import annotations

from producers.integrations.adapters import DictLogger, NemoRLLogger, OpenRLHFLogger, VerlTracking

__all__ = ["DictLogger", "NemoRLLogger", "OpenRLHFLogger", "RlwatchCallback", "VerlTracking"]


def __getattr__(name: str):
    if name == "RlwatchCallback":  # lazily: importing transformers takes seconds
        from producers.integrations.trl import RlwatchCallback

        return RlwatchCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
