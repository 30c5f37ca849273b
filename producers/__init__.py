"""The training-side SDK: publish events without slowing a step, obey control commands."""

from producers.control import TrainingStopped
from producers.monitor import Monitor

__all__ = ["Monitor", "TrainingStopped"]
