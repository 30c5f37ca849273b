"""streams.heap: the worker freezes what survives a collection (a fleet's compiled rules,
millions of objects, are then not visited again) and thaws it when due, so that cycles that
became garbage meanwhile are freed all the same."""
from __future__ import annotations

import gc
import weakref

import pytest

from streams.heap import Heap


class Node:
    """A run-like cycle: state -> rules -> state."""

    def __init__(self):
        self.rules = [lambda: self]


@pytest.fixture
def heap():
    h = Heap(thaw_every=3600.0)
    threshold = gc.get_threshold()
    h.install()
    yield h
    h.uninstall()
    gc.unfreeze()
    gc.set_threshold(*threshold)
    gc.collect()


@pytest.mark.parametrize("generation", [0, 1, 2])
def test_what_survives_a_collection_is_frozen_and_not_visited_again(heap, generation):
    kept = [Node() for _ in range(2000)]
    assert any(o is kept[0] for o in gc.get_objects())
    before = gc.get_freeze_count()
    gc.collect(generation)
    assert heap.passes >= 1
    assert gc.get_freeze_count() >= before + 2000
    assert not any(o is kept[0] for o in gc.get_objects())   # out of the generations visited
    assert len(gc.get_objects(1)) == len(gc.get_objects(2)) == 0


def test_a_cycle_that_became_garbage_while_frozen_is_freed_at_the_thaw(heap):
    run = Node()
    gone = weakref.ref(run)
    gc.collect()                      # the cycle survives a pass: frozen
    del run
    gc.collect()
    assert gone() is not None         # frozen garbage: what the thaw is for
    t0 = 1000.0
    assert heap.tick(t0) is None                  # starts the clock
    assert heap.tick(t0 + 3599) is None
    thaw = heap.tick(t0 + 3600)
    assert thaw is not None and thaw.collected >= 1 and thaw.frozen > 0
    assert gone() is None
    assert heap.thaws == 1
    assert heap.tick(t0 + 3601) is None           # the clock starts again
    assert thaw.next_in == heap.thaw_every


def test_the_interval_between_thaws_adapts_to_the_garbage_they_find():
    h = Heap(thaw_every=3600.0, least=600.0, most=86_400.0)
    assert h.next_interval(collected=80, frozen=4_000_000) == 7200.0      # quiet: doubled
    assert h.next_interval(collected=2_000, frozen=1_000_000) == 3600.0   # between: kept
    assert h.next_interval(collected=50_000, frozen=1_000_000) == 1800.0  # busy: halved
    h.thaw_every = 80_000.0
    assert h.next_interval(0, 4_000_000) == 86_400.0                      # at most a day
    h.thaw_every = 700.0
    assert h.next_interval(50_000, 1_000_000) == 600.0                    # at least ten minutes


def test_without_install_it_leaves_the_collector_alone():
    h = Heap(thaw_every=0.0)
    frozen = gc.get_freeze_count()
    assert h.tick(0.0) is None and h.tick(10.0) is None
    gc.collect()
    assert gc.get_freeze_count() == frozen and h.passes == 0
