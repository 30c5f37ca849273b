"""One log line per change of the broker's health, not thousands.

While Kafka is down, aiokafka, kafka-python and Faust's transport log an error for every
reconnect attempt of every client, several a second. :class:`BrokerLogGate` sits on those loggers: the first warning
or error goes through, with one line of ours saying that the clients' further complaints are
counted, not printed; after ``quiet`` seconds without another one, :meth:`check` (the worker's
timer) logs one line saying the trouble is over and how many lines it held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["BROKER_LOGGERS", "BrokerLogGate"]

#: The loggers of the Kafka clients and of Faust's transport (not Faust's others: the worker's
#: redirected standard output, where the console sink prints alerts, comes through "mode.redirect").
BROKER_LOGGERS = ("aiokafka", "kafka", "faust.transport")


class BrokerLogGate(logging.Filter):
    def __init__(self, quiet: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 log: logging.Logger | None = None):
        super().__init__()
        self.quiet, self.clock = quiet, clock
        self.log = log or logging.getLogger("rlwatch.worker")
        self.trouble_since: float | None = None
        self.last_seen = 0.0
        self.held = 0
        self._installed: list[logging.Handler] = []

    def install(self) -> BrokerLogGate:
        """Sit on every handler of the root logger (records of the clients' many child loggers
        all pass there). Idempotent: call it again after logging was set up anew (Faust's
        worker does that when it starts)."""
        for h in logging.getLogger().handlers:
            if self not in h.filters:
                h.addFilter(self)
                self._installed.append(h)
        return self

    def uninstall(self) -> None:
        for h in self._installed:
            h.removeFilter(self)
        self._installed.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not any(
                record.name == n or record.name.startswith(n + ".") for n in BROKER_LOGGERS):
            return True
        now = self.clock()
        self.last_seen = now
        if self.trouble_since is None:
            self.trouble_since, self.held = now, 0
            self.log.error("rlwatch: the Kafka clients report trouble (first line below); their "
                           "further warnings are counted, not printed, until they stop")
            return True
        self.held += 1
        return False

    def check(self) -> bool:
        """Call now and then: True (and one line logged) when the trouble just ended."""
        self.install()
        if self.trouble_since is None or self.clock() - self.last_seen < self.quiet:
            return False
        self.log.warning("rlwatch: the Kafka clients have been quiet for %.0fs; %d line(s) held back "
                         "over %.0fs of trouble", self.quiet, self.held, self.last_seen - self.trouble_since)
        self.trouble_since, self.held = None, 0
        return True
