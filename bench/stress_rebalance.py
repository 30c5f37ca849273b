"""Rebalances, over and over: does a worker's table recovery ever get stuck?

A first `rlwatch worker` stays up while a second joins and, ``--hold`` seconds later, is stopped
(SIGTERM), ``--cycles`` times; healthy runs log meanwhile (``--runs`` x 8 ranks at ``--rate``
events/s, so the table has states and the changelog records to recover). With ``--hog N``,
N busy processes share the CPUs (a loaded host made the stall show more often).

After the run it prints, per worker process, the table recoveries that went quiet:
``no record`` (Faust's "No event received for active tp", every 5 s of a stalled recovery) and
``read again`` (the watched recovery seeking a quiet partition back, ``streams.recovery``),
and the rebalances the first worker went through. A stall that the watch ends still counts: it
is 10 s of runs unjudged. It stops at the first cycle that saw one with ``--stop-at-first``.

    python bench/stress_rebalance.py [--cycles 40] [--hold 12] [--runs 12] [--rate 200] [--hog 1]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stack import Load, Worker, bench_env, services_up  # noqa: E402

QUIET = ("No event received for active tp", "reading them again")


def quiet(worker: Worker) -> tuple[int, int]:
    """(Faust's "no record" warnings, partitions read again) in ``worker``'s output."""
    lines = [line for _, line in list(worker.lines)]
    return (sum(QUIET[0] in ln for ln in lines), sum(QUIET[1] in ln for ln in lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--hold", type=float, default=12.0, help="seconds with two workers, then with one")
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--rate", type=float, default=200.0, help="their step events per second")
    ap.add_argument("--hog", type=int, default=1, help="busy processes beside")
    ap.add_argument("--stop-at-first", action="store_true")
    args = ap.parse_args()
    services_up()
    env = bench_env(uuid.uuid4().hex[:8])
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    first = Worker(env).start()
    load = Load(env["RLWATCH_EVENTS_TOPIC"], args.runs, 8, args.rate).start()
    seconds: list[Worker] = []
    cycle = 0
    try:
        time.sleep(5)
        for cycle in range(1, args.cycles + 1):
            second = Worker(env).start()
            seconds.append(second)
            time.sleep(args.hold)
            second.stop()
            time.sleep(args.hold)
            stalls = [quiet(w) for w in (first, *seconds)]
            bad = sum(a + b for a, b in stalls)
            print(f"cycle {cycle}: quiet recoveries so far (no-record warnings, partitions read "
                  f"again): first {stalls[0]}, seconds {tuple(map(sum, zip(*stalls[1:])))}",
                  flush=True)
            if bad and args.stop_at_first:
                break
    finally:
        load.stop()
        first.stop()
        for hog in hogs:
            hog.kill()
    rebalances = sum("Revoking previously assigned" in line for _, line in first.lines)
    stalls = [quiet(w) for w in (first, *seconds)]
    hit = sum(1 for a, b in stalls if a or b)
    print(f"\n{cycle} cycles, {rebalances} rebalances of the first worker; workers whose table "
          f"recovery went quiet: {hit} of {len(stalls)} (no-record warnings "
          f"{sum(a for a, _ in stalls)}, partitions read again {sum(b for _, b in stalls)})")


if __name__ == "__main__":
    main()
