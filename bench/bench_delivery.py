"""What the worker's alert lanes cost per alert, on a real redis-server: Redis round trips and
CPU, for one tree or several side by side (``--tree`` an older copy of the code, e.g. a
``git worktree``, with its native core built or copied in).

The alerts are those a simulated fleet raises through the whole core with the built-in pack
(``bench_fleet_replay.fleet_lines``: interleaved PPO/GRPO runs, most with a fault), each with its
incident snapshot, as the worker publishes them. Three passes, on one application id:

* **notify**: the alerts read as the worker's alerts lane reads them (their snapshots kept as
  the JSON text they came in) and notified as it notifies them: ``Dispatcher.notify_all`` of the
  alerts waiting, ``--batch`` at a time (incidents, outbox, the background send to the default
  console receiver), then the outbox drained; a tree from before ``notify_all`` notifies each
  alert alone (``Dispatcher.notify``), as its worker did;
* **brake**: every firing alert through a ``BrakeThread`` (its own thread, loop and Redis
  client), as the worker's fast path pulls it, until each one's commands landed;
* **tick**: the delivery timer's pass (repeats, unacknowledged brakes, re-sends, the outbox) with
  the fleet's alerts active and its brakes unacknowledged (nobody trains here), per tick, the
  ticks 2 s apart (a deployment's workers take the fleet's part in turns: this is the tick of
  the worker whose turn it is).

Round trips are counted in the client (each command, pipeline or script sent is one; the
set-up of a new connection, HELLO, CLIENT and PING, is counted apart: the brake pass opens a
connection per run braking at once, which read as 0.32 round trips more per brake); CPU is
the process's (both threads), with the garbage collector tuned as the worker tunes it
(``streams.processor.tune_gc``: the fleet's alerts and the core's state frozen). On a shared
host CPU figures drift by tens of per cent between runs; round trips do not.

``--fleet-active N`` puts N other runs' firing alerts in the outbox first, as a large fleet has
(the notify pass's first notification then indexes them by run, once per process, as a
worker's first one after its start does: a round trip per 500 runs; per run before).

    python bench/bench_delivery.py [--runs 24] [--steps 400] [--fleet-active 0] [--batch 64]
                                   [--tree OLD_TREE ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, contextlib, io, json, sys, time, uuid
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(1, tree + "/bench")
from bench_fleet_replay import fleet_lines
from contract.alert import Alert
from contract.events import parse_event
from contract.settings import Settings
from rules.loader import load_pack
from streams.processor import Pipeline
from streams.snapshot import SnapshotRecorder, attach_snapshot
from alerts.factory import build_brake_thread, build_dispatcher
from redis.asyncio.connection import AbstractConnection

trips, setup = [0], [0]
HANDSHAKE = (b"HELLO", b"CLIENT", b"PING", b"AUTH", b"SELECT")
send = AbstractConnection.send_packed_command
async def counted(self, command, check_health=True):
    first = command if isinstance(command, (bytes, bytearray, memoryview)) else command[0]
    if bytes(first[:64]).split(b"\r\n")[2].upper() in HANDSHAKE:
        setup[0] += 1       # a new connection's set-up (the pool grows in a burst): not counted
    else:
        trips[0] += 1
    return await send(self, command, check_health)
AbstractConnection.send_packed_command = counted

pipe, rec, raw_alerts = Pipeline(load_pack("rlhf")), SnapshotRecorder(), []
for line in fleet_lines(int(sys.argv[2]), int(sys.argv[3])):
    ev = parse_event(line, 0.0)
    rec.observe(ev)
    for a in pipe.feed(ev, ev.ts):
        raw_alerts.append(attach_snapshot(a, rec, pipe.runs[a.run_id]).to_json())

SETTINGS = Settings(redis=sys.argv[4], app_id="bench-delivery-" + uuid.uuid4().hex[:8])   # one for all passes

async def notify(raws):
    d = build_dispatcher(SETTINGS)
    await d.outbox.pending()          # connected before counting
    now = time.time()
    for i in range(int(sys.argv[5])):     # the rest of the fleet's firing alerts
        other = Alert(rule="kl_above_target", severity="yellow", state="firing", run_id=f"other-{i}",
                      step=100, summary="x" * 400)
        if hasattr(d.outbox, "track"):
            await d.outbox.track(other, now)
        else:                                      # a tree from before outbox.track
            await d.outbox.activate(other, now)
    read = getattr(Alert, "from_json_keeping_snapshot", Alert.from_json)
    batch = int(sys.argv[6])
    t, c = trips[0], time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):      # the console receiver's lines
        alerts = [read(x) for x in raws]                 # as the worker's alerts lane reads them
        if hasattr(d, "notify_all"):
            for k in range(0, len(alerts), batch):
                await d.notify_all(alerts[k:k + batch])
        else:
            for a in alerts:
                await d.notify(a)
        await d.idle(timeout=60)
        await d.drainer.drain()
    out = trips[0] - t, time.process_time() - c
    await d.drainer.close()
    return out

async def brake(alerts):
    loop = asyncio.get_running_loop()
    d = build_dispatcher(SETTINGS)
    bt = build_brake_thread(SETTINGS, d, loop)
    firing = [a for a in alerts if a.state == "firing"]
    left, all_done = [len(firing)], asyncio.Event()
    if not firing:
        all_done.set()
    def done():
        def one():
            left[0] -= 1
            if not left[0]:
                all_done.set()
        loop.call_soon_threadsafe(one)
    t, c = trips[0], time.process_time()
    for a in firing:
        bt.submit(a, done)
    await asyncio.wait_for(all_done.wait(), 120)
    out = (trips[0] - t, time.process_time() - c, len(firing), sum(len(d.plan(a)) for a in firing),
           sum(1 for a in firing if d.plan(a)))
    bt.stop()
    return out

async def tick():
    d = build_dispatcher(SETTINGS)
    await d.outbox.pending()
    now = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        await d.tick(now, wait=True)           # the first tick may escalate: not counted
        t, c = trips[0], time.process_time()
        for k in range(1, 6):     # a worker's ticks, 2 s apart: each its turn at the fleet's work
            await d.tick(now + 2 * k, wait=True)
    out = (trips[0] - t) / 5, (time.process_time() - c) / 5
    await d.drainer.close()
    return out

alerts = [Alert.from_json(x) for x in raw_alerts]
import streams.processor
if hasattr(streams.processor, "tune_gc"):    # as the worker runs: the start-up heap frozen
    streams.processor.tune_gc()
n_trips, n_cpu = asyncio.run(notify(raw_alerts))
b_trips, b_cpu, firing, commands, braking = asyncio.run(brake(alerts))
t_trips, t_cpu = asyncio.run(tick())
print(json.dumps({"alerts": len(alerts), "firing": firing, "commands": commands, "braking": braking,
                  "setup_trips": setup[0],
                  "notify_trips": n_trips, "notify_cpu": n_cpu, "brake_trips": b_trips, "brake_cpu": b_cpu,
                  "tick_trips": t_trips, "tick_cpu": t_cpu}))
"""


def measure(tree: Path, runs: int, steps: int, redis_url: str, others: int, batch: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(runs), str(steps), redis_url, str(others),
                          str(batch)],
                         env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"the delivery pass failed for {tree}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--redis", default=os.environ.get("RLWATCH_TEST_REDIS", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--tree", action="append", default=[], type=Path,
                    help="another copy of the code to measure beside this one (repeatable)")
    ap.add_argument("--rounds", type=int, default=2, help="passes per tree, in turns (CPU: the lowest)")
    ap.add_argument("--fleet-active", type=int, default=0, metavar="N",
                    help="firing alerts of N other runs in the outbox before the notify pass (a large "
                    "fleet's): what each notification's inhibition reads")
    ap.add_argument("--batch", type=int, default=64,
                    help="alerts notified together, at most (the worker's alerts lane notifies those "
                    "waiting, up to 64; in the default fleet's worker about 50 at a time, measured)")
    args = ap.parse_args()
    if args.batch < 1:
        raise SystemExit("--batch must be at least 1")
    trees = [ROOT, *[t.resolve() for t in args.tree]]
    got: dict[Path, list[dict]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for t in trees:
            got[t].append(measure(t, args.runs, args.steps, args.redis, args.fleet_active, args.batch))
    first = got[ROOT][0]
    print(f"fleet: {args.runs} runs x {args.steps} steps: {first['alerts']} alerts, {first['firing']} "
          f"firing ({first['braking']} with commands), {first['commands']} brake commands, "
          f"{args.fleet_active} other runs' firing alerts; per alert (notify) and per firing alert "
          "with commands (brake); round trips without the set-up of new connections (HELLO, CLIENT, "
          "PING: the brake's pool grows to a connection per run braking at once)")
    print(f"  {'notify trips':>12} {'notify CPU ms':>13} {'brake trips':>11} {'brake CPU ms':>12} "
          f"{'tick trips':>10} {'tick CPU ms':>11}  tree")
    mine = min(x["notify_cpu"] for x in got[ROOT])
    for t in trees:
        rows = got[t]
        r = rows[0]
        n_cpu = min(x["notify_cpu"] for x in rows) / max(r["alerts"], 1) * 1e3
        braking = max(r.get("braking", r["firing"]), 1)
        b_cpu = min(x["brake_cpu"] for x in rows) / braking * 1e3
        t_cpu = min(x["tick_cpu"] for x in rows) * 1e3
        print(f"  {r['notify_trips'] / max(r['alerts'], 1):12.2f} {n_cpu:13.3f} {r['brake_trips'] / braking:11.2f} "
              f"{b_cpu:12.3f} {r['tick_trips']:10.1f} {t_cpu:11.3f}  {t}")
    print("  connection set-up round trips, all passes: " + ", ".join(
        f"{got[t][0].get('setup_trips', 0)} ({t.name})" for t in trees))
    for t in trees[1:]:
        theirs = min(x["notify_cpu"] for x in got[t])
        print(f"  notify CPU, {t} / this tree: {theirs / mine:.2f}" if mine > 0 else "")


if __name__ == "__main__":
    main()
