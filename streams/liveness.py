"""The liveness pass: the liveness rules (``run_stalled``) of every run a worker owns.

A worker walks its runs every ``tick_seconds``. Most of them may not be decoded: right after a
restart none is, and a worker owning more runs than it keeps decoded has the rest only in its
table. Each of those is restored for the pass (about 1 ms), so a pass over a fleet is a second
or more of work. Done in one go, it held up the event loop that long: a brake raised by the
events lane meanwhile waited for the whole pass. So the pass:

* gives the event loop a turn every ``slice_`` runs (``LIVENESS_SLICE``);
* stops when a rebalance started since it began (``active()`` false): the runs may belong to
  another worker now, and the next pass starts over with the runs this one owns then;
* is given only the runs of the partitions the worker is assigned (the worker's table keeps
  states it wrote for partitions a rebalance took away: those runs go on at another worker);
* judges each run as of the time the worker has read its partition up to (``as_of``,
  :mod:`streams.read_marks`), not the wall clock: a worker behind on a partition (after a
  rebalance or a restart, or slow) has the runs' later events still to read, and would find
  them silent; a run whose partition's reading is not known yet waits for the next pass;
* takes the runs that are not decoded with ``states.peek`` and lets them go after
  (``states.put_back``): a pass restoring every run would otherwise push the runs the events
  lane is working on out of the cache (each pass decoding and evicting the whole fleet again).

Pure apart from the awaits: the states, the processor, the time and what to do with alerts and
expired runs are arguments (the worker's are Faust- and Redis-backed; the tests' are not).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Optional

__all__ = ["LIVENESS_SLICE", "LivenessPass", "liveness_pass"]

LIVENESS_SLICE = 32    # runs between two turns of the event loop (a restored run: about 1 ms)


@dataclass
class LivenessPass:
    """What one pass did."""

    runs: int = 0          # runs whose liveness rules were evaluated
    restored: int = 0      # of them, restored from the table for the pass (not kept decoded)
    expired: int = 0       # runs dropped: silent past the TTL
    alerts: int = 0
    waiting: int = 0       # runs not judged: how far their partition is read is not known yet
    stopped: bool = False  # a rebalance stopped the pass before the end


async def liveness_pass(states, processor, run_ids: Iterable[str], now: float, *,
                        ttl_seconds: float, active: Callable[[], bool],
                        alerted: Callable[..., Awaitable[None]],
                        expired: Callable[[str], None],
                        as_of: Optional[Callable[[str], Optional[float]]] = None,
                        slice_: int = LIVENESS_SLICE) -> LivenessPass:
    """Evaluate the liveness rules of ``run_ids`` at wall time ``now``, or, given ``as_of``,
    each run as of ``as_of(run_id)``: the time its events are read up to (None: not known, the
    run is left for the next pass).

    ``states``: the worker's run states (``peek``, ``lend``, ``put_back``, ``drop``); ``active()``: False
    once a rebalance started; ``await alerted(state, alerts)`` publishes the alerts of a run
    (its state is written after them, by ``put_back``); ``expired(run_id)`` is told of each run dropped."""
    done = LivenessPass()
    for i, run_id in enumerate(run_ids):
        if i and i % slice_ == 0:
            await asyncio.sleep(0)
        if not active():
            done.stopped = True
            break
        at = now if as_of is None else as_of(run_id)
        if at is None:
            done.waiting += 1
            continue
        st, decoded = states.peek(run_id)
        if st is None:
            continue       # dropped meanwhile
        if at - st.last_event_ts > ttl_seconds:
            states.drop(run_id)
            if not decoded:
                st.release()
            expired(run_id)
            done.expired += 1
            continue
        done.runs += 1
        done.restored += not decoded
        alerts = processor.tick(st, at)
        if alerts:       # in Kafka before the state that raised them is written (put_back)
            done.alerts += len(alerts)
            if not decoded:
                states.lend(run_id, st)
            await alerted(st, alerts)
            if not active():    # a rebalance meanwhile: the run may be another worker's now
                states.put_back(run_id, st, changed=False)
                continue
        states.put_back(run_id, st, changed=bool(alerts))
    return done
