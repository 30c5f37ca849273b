"""How far a worker has read each partition of the events topic, as a time: what the liveness
rules may judge a run's silence by.

A run is silent since its last event's ``ts``. At wall time ``now`` the silence is ``now - ts``
only if the worker has read everything its producers sent until ``now``. A worker behind on a
partition has not: the run's later events may wait in the partition's backlog. That happens
after every rebalance and restart (the new owner starts from the last committed offset, often
seconds behind) and whenever a worker falls behind. Judged by the wall clock, every run of such
a partition looked silent for as long as the worker was behind, and a ``run_stalled`` fired and
resolved a moment later, once the backlog was read (one CI run saw twelve such after a rebalance
that took longer than the rule's timeout).

So each partition's runs are judged as of the time the worker has read it up to:

* caught up (it processed, or committed, every offset below the partition's high-water mark):
  ``now``;
* behind: the producer's timestamp of the last record it processed there (every record sent
  before that is read; the run's silence is known up to then, and the alert comes once the
  worker got there);
* behind with nothing processed since the partition was assigned, or with no high-water mark
  known yet: not judged (``None``); the next pass will know more.

Pure: the offsets, the high-water marks, the committed offsets and the time are arguments.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["ReadMarks"]


class ReadMarks:
    """The last record processed on each partition since it was assigned: its offset and its
    producer's timestamp (seconds). The events lane notes each record (:meth:`read`); a
    rebalance forgets them (:meth:`forget`)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, Optional[float]]] = {}

    def read(self, partition: int, offset: int, timestamp: Optional[float]) -> None:
        """A record of ``partition`` at ``offset`` was processed; ``timestamp`` in seconds (None
        or negative when the record has none)."""
        self.last[partition] = (offset, timestamp)

    def read_records(self, records, n: int, partitions: int) -> None:
        """The first ``n`` of ``records`` were processed, in order: records of ``partitions``
        partitions with ``partition``, ``offset`` and ``timestamp`` (milliseconds), as aiokafka's.
        Walks back from the last one processed until it saw every partition."""
        last, seen = self.last, set()
        for i in range(n - 1, -1, -1):
            record = records[i]
            if record.partition not in seen:
                seen.add(record.partition)
                last[record.partition] = (record.offset, record.timestamp / 1000)
                if len(seen) == partitions:
                    break

    def forget(self) -> None:
        self.last.clear()

    def as_of(self, partition: int, highwater: Optional[int], committed: Optional[int],
              now: float) -> Optional[float]:
        """The time up to which the worker has read ``partition``: ``now`` when caught up, the
        last processed record's timestamp when behind, None when that is not known.

        ``highwater``: the partition's next offset to be written, as of the consumer's last fetch
        (None before the first); ``committed``: the group's committed offset (the next to read;
        None when there is none)."""
        if highwater is None:
            return None
        if highwater <= 0:
            return now          # nothing was ever written there
        last = self.last.get(partition)
        read_to = -1 if last is None else last[0] + 1           # the next offset to process
        if committed is not None and committed > read_to:
            read_to = committed
        if read_to >= highwater:
            return now
        if last is None or last[1] is None or last[1] < 0:
            return None
        return min(last[1], now)
