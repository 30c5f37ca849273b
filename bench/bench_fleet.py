"""A fleet on two workers: 1,000 runs x 8 ranks at one step per second per rank
(``python bench/bench_fleet.py``).

A load generator (a process of its own, kafka-python, healthy step events of about ten metrics)
writes ``--runs`` x ``--ranks`` step events per ``--step-seconds`` to a fresh events topic of the
local Kafka (scripts/services.sh); two `rlwatch worker` processes of one application share its
four partitions. Every ``--every`` seconds it samples: events written and committed by the
workers' group (so the lag), and each worker's CPU seconds and resident memory (from /proc).

Prints the rate asked for and reached, the processing rate, the lag over time (bounded or
growing), the workers' memory per run (resident memory above the idle worker's, over the runs it
owns) and CPU seconds per million events processed. The machine is what it is: when the load
generator, the broker and the two workers cannot all get a core, the reached rates say so.

    python bench/bench_fleet.py [--runs 1000] [--ranks 8] [--seconds 120]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _stack import Load, Worker, bench_env, group_offsets, services_up  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--step-seconds", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    services_up()
    sid = uuid.uuid4().hex[:8]
    env = bench_env(sid, RLWATCH_ACK_TIMEOUT=600)
    group, topic = env["RLWATCH_APP_ID"], env["RLWATCH_EVENTS_TOPIC"]
    workers = [Worker(env).start() for _ in range(args.workers)]
    time.sleep(8)                                 # both in the group, partitions settled
    idle = [w.usage() for w in workers]
    rate = args.runs * args.ranks / args.step_seconds
    load = Load(topic, args.runs, args.ranks, rate).start()
    t0 = time.time()
    rows = []
    try:
        while time.time() - t0 < args.seconds:
            time.sleep(args.every)
            got = group_offsets(group, topic)
            use = [w.usage() for w in workers]
            rows.append((time.time() - t0, load.sent.value, got, use))
            written, done = got if got else (float("nan"), float("nan"))
            print(f"  t={rows[-1][0]:5.0f}s sent {load.sent.value:>9,d} written {written:>9,} committed {done:>9,} "
                  f"lag {written - done:>8,} | " + " | ".join(f"cpu {c - i[0]:6.1f}s rss {r:6.0f} MB"
                                                            for (c, r), i in zip(use, idle)), flush=True)
    finally:
        sent = load.stop()
        elapsed = time.time() - t0
        time.sleep(3)
        final = group_offsets(group, topic)
        use = [w.usage() for w in workers]
        for w in workers:
            w.stop()
    written, done = final if final else (0, 0)
    cpu = sum(c - i[0] for (c, _), i in zip(use, idle))
    lags = [g[0] - g[1] for _, _, g, _ in rows if g]
    half = len(lags) // 2
    trend = "bounded" if not lags or max(lags[half:] or [0]) <= 1.2 * max(lags[:max(1, half)]) + rate * 2 else "growing"
    # processed events from the committed offsets (the last commit may trail by a few seconds)
    first = next((r for r in rows if r[2]), None)
    proc_rate = (rows[-1][2][1] - first[2][1]) / (rows[-1][0] - first[0]) if first and len(rows) > 1 and rows[-1][2] else float("nan")
    per_run = [(r - i[1]) / (args.runs / len(workers)) * 1024 for (_, r), i in zip(use, idle)]
    print(f"\nfleet: {args.runs} runs x {args.ranks} ranks, one step per {args.step_seconds:g}s per rank, "
          f"{len(workers)} workers, {elapsed:.0f}s")
    print(f"  asked          {rate:10,.0f} events/s")
    print(f"  sent           {sent / elapsed:10,.0f} events/s ({sent:,} events)")
    print(f"  processed      {proc_rate:10,.0f} events/s (committed offsets, steady part)")
    print(f"  lag            {', '.join(f'{x:,}' for x in lags)} (at each sample; {trend}); "
          f"{written - done:,} at the end")
    print(f"  memory per run {', '.join(f'{x:.0f}' for x in per_run)} KB (resident above idle, per worker)")
    print(f"  CPU            {cpu:.0f} s for {done:,} events: {cpu / max(1, done) * 1e6:,.0f} s per million events "
          f"(both workers; {os.cpu_count()} CPUs on this machine)")


if __name__ == "__main__":
    main()
