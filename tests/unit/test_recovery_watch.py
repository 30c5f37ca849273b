"""Which changelog partitions a table recovery reads again (streams.recovery.quiet_partitions).
The drill through a real broker, a recovery that lost a fetch, is in
tests/integration/test_loop.py."""
from __future__ import annotations

from streams.recovery import QUIET_SECONDS, quiet_partitions


def test_a_partition_with_records_left_that_sent_none_is_read_again_from_its_last_record():
    # partition 0 sent nothing since the start, 1 sent its last record 11 s ago, 2 one second ago
    got = quiet_partitions(now=111.0, remaining={0: 5, 1: 3, 2: 4}, offsets={0: -1, 1: 40, 2: 7},
                           received_at={1: 100.0, 2: 110.0}, started_at=100.0, sought_at={})
    assert got == {0: 0, 1: 40}


def test_a_partition_read_to_its_end_or_moving_is_left_alone():
    assert quiet_partitions(now=200.0, remaining={0: 0, 1: 2}, offsets={0: 9, 1: 3},
                            received_at={1: 195.0}, started_at=100.0, sought_at={}) == {}


def test_a_partition_just_sought_back_gets_its_time_again():
    args = dict(remaining={0: 5}, offsets={0: 12}, received_at={}, started_at=100.0)
    assert quiet_partitions(now=100.0 + QUIET_SECONDS, sought_at={}, **args) == {0: 12}
    sought = {0: 100.0 + QUIET_SECONDS}
    assert quiet_partitions(now=105.0 + QUIET_SECONDS, sought_at=sought, **args) == {}
    assert quiet_partitions(now=100.0 + 2 * QUIET_SECONDS, sought_at=sought, **args) == {0: 12}


def test_nothing_is_read_again_before_a_recovery_started():
    assert quiet_partitions(now=1e9, remaining={0: 5}, offsets={0: 1}, received_at={},
                            started_at=None, sought_at={}) == {}
