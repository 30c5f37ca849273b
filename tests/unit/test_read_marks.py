"""How far a worker has read a partition, as a time (streams.read_marks): the clock the liveness
rules judge a run's silence by."""

from __future__ import annotations

from types import SimpleNamespace

from streams.read_marks import ReadMarks

NOW = 1_000_000.0


def test_a_partition_read_to_its_high_water_mark_is_read_up_to_now():
    marks = ReadMarks()
    marks.read(0, 41, NOW - 30)
    assert marks.as_of(0, highwater=42, committed=None, now=NOW) == NOW


def test_a_partition_behind_is_read_up_to_its_last_processed_record():
    marks = ReadMarks()
    marks.read(0, 10, NOW - 25)
    assert marks.as_of(0, highwater=42, committed=None, now=NOW) == NOW - 25
    marks.read(0, 30, NOW - 9)
    assert marks.as_of(0, highwater=42, committed=None, now=NOW) == NOW - 9


def test_the_committed_offset_counts_as_read():
    """Right after an assignment nothing is processed yet: a partition whose committed offset is
    its high-water mark has nothing new (a run there that is silent is silent now); one with a
    backlog is not judged until a record of it is processed."""
    marks = ReadMarks()
    assert marks.as_of(3, highwater=42, committed=42, now=NOW) == NOW
    assert marks.as_of(3, highwater=50, committed=42, now=NOW) is None
    assert marks.as_of(3, highwater=None, committed=42, now=NOW) is None    # no fetch yet
    assert marks.as_of(3, highwater=0, committed=None, now=NOW) == NOW      # never written


def test_records_without_timestamps_leave_a_partition_behind_unknown():
    marks = ReadMarks()
    marks.read(1, 5, -0.001)
    assert marks.as_of(1, highwater=42, committed=None, now=NOW) is None
    marks.read(1, 6, None)
    assert marks.as_of(1, highwater=42, committed=None, now=NOW) is None


def test_a_timestamp_ahead_of_the_clock_is_read_up_to_now_at_most():
    marks = ReadMarks()
    marks.read(0, 10, NOW + 50)
    assert marks.as_of(0, highwater=42, committed=None, now=NOW) == NOW


def test_a_rebalance_forgets_what_was_read():
    marks = ReadMarks()
    marks.read(0, 41, NOW - 1)
    marks.forget()
    assert marks.as_of(0, highwater=42, committed=None, now=NOW) is None


def test_a_batch_notes_the_last_processed_record_of_each_partition():
    def rec(p, o, ts):
        return SimpleNamespace(partition=p, offset=o, timestamp=ts * 1000)

    batch = [rec(0, 1, NOW - 9), rec(1, 7, NOW - 8), rec(0, 2, NOW - 7), rec(1, 8, NOW - 6),
             rec(2, 3, NOW - 5)]
    marks = ReadMarks()
    marks.read_records(batch, 4, partitions=3)          # the fifth was not processed
    assert marks.last == {0: (2, NOW - 7), 1: (8, NOW - 6)}
    marks.read_records(batch, 5, partitions=3)
    assert marks.last == {0: (2, NOW - 7), 1: (8, NOW - 6), 2: (3, NOW - 5)}
    marks.read_records(batch, 0, partitions=3)          # nothing processed: nothing changes
    assert marks.last[2] == (3, NOW - 5)
