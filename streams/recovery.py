"""Faust's table recovery, watched: a changelog partition that stops sending records while the
recovery still needs them is read again.

While a worker recovers its run table (at start, after each rebalance) its event partitions are
paused: none of its runs is judged and no brake can fire there until the recovery has read every
changelog partition it is assigned up to the end. A clean-clone CI run saw a recovery after a
rebalance get no record at all from two changelog partitions, for minutes (Faust only logs "No
event received for active tp ..."). A stress run of rebalances (a second worker joining and
leaving a first every 27 s, a CPU hog beside) met it twice in 71 cycles, and this watch ended
the second 10 s after it began. A likely cause, now mended: a fetch in flight across the
rebalance that completes with the recovery's records and is dropped by the fetch loop (see
``BatchConsumer._read_changelogs_again``).

This watch stays as the second line: :class:`WatchedRecovery` checks every ``WATCH_SECONDS``;
an active changelog partition with records left that sent none for ``QUIET_SECONDS`` (since the
recovery started, or since its last record) is sought back to the last record the recovery
applied and resumed (the recovery skips what it has applied already), and the worker says so
in a warning. A recovery that is slow but moving is left alone.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

from faust.tables.recovery import Recovery
from mode import Service

__all__ = ["QUIET_SECONDS", "WATCH_SECONDS", "WatchedRecovery", "quiet_partitions"]

log = logging.getLogger("rlwatch")

#: how long a changelog partition with records left may send none before it is read again
QUIET_SECONDS = 10.0
#: how often the recovery is looked at
WATCH_SECONDS = 1.0


def quiet_partitions(now: float, remaining: dict[Any, int], offsets: dict[Any, int | None],
                     received_at: dict[Any, float], started_at: float | None,
                     sought_at: dict[Any, float], quiet: float = QUIET_SECONDS) -> dict[Any, int]:
    """The partitions to read again, each with the offset to seek it to (the last record the
    recovery applied, or 0): those with records left (``remaining``) that sent none for
    ``quiet`` seconds since the recovery started, their last record, or their last seek."""
    if started_at is None:
        return {}
    out = {}
    for tp, left in remaining.items():
        if left <= 0:
            continue
        last = max(received_at.get(tp, started_at), sought_at.get(tp, started_at), started_at)
        if now - last >= quiet:
            offset = offsets.get(tp)
            out[tp] = offset if offset is not None and offset > 0 else 0
    return out


class WatchedRecovery(Recovery):
    """Faust's recovery, whose changelog partitions that went quiet are read again (see the
    module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sought_at: dict[Any, float] = {}      # partition -> when it was last sought back

    @Service.task
    async def _watch_quiet_partitions(self) -> None:
        async for _ in self.itertimer(WATCH_SECONDS, name="WatchedRecovery.watch"):
            if not self.in_recovery:
                self._sought_at.clear()
                continue
            if not self.app.consumer.flow_active:
                continue        # a rebalance began: the next recovery seeks its partitions
            await self.read_quiet_again(monotonic())

    async def read_quiet_again(self, now: float) -> None:
        """Seek back and resume the quiet partitions (see :func:`quiet_partitions`)."""
        remaining = {tp: left for tp, left in self.active_remaining().items()
                     if tp in self.active_tps}
        quiet = quiet_partitions(now, remaining, self.active_offsets,
                                 self._active_events_received_at, self._recovery_started_at,
                                 self._sought_at)
        if not quiet:
            return
        log.warning("rlwatch: the table's recovery got no record for %.0f s from changelog "
                    "partitions %s, with %d records left: reading them again from offsets %s",
                    QUIET_SECONDS, sorted(tp.partition for tp in quiet),
                    sum(remaining[tp] for tp in quiet),
                    {tp.partition: offset for tp, offset in sorted(quiet.items())})
        consumer = self.app.consumer
        try:
            consumer.resume_partitions(quiet)
            await consumer.seek_wait(quiet)
        except Exception as exc:  # noqa: BLE001 - a rebalance took them meanwhile: it seeks anew
            log.warning("rlwatch: could not read changelog partitions %s again: %r",
                        sorted(tp.partition for tp in quiet), exc)
            return
        for tp in quiet:
            self._sought_at[tp] = now
