"""The ``rlwatch`` command line (contract section 5)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import sys
import time

__all__ = ["main"]


def _pack(rules: str | None, preset_name: str | None = None):
    from contract.presets import get_preset
    from rules.loader import RuleFileError, load_pack, merge_packs, with_preset

    try:
        names = (rules or "rlhf").split(",")
        packs = [load_pack(n.strip()) for n in names]
        pack = packs[0] if len(packs) == 1 else merge_packs(*packs)
    except RuleFileError as exc:
        raise SystemExit(f"rlwatch: {exc}") from None
    try:
        preset = get_preset(preset_name)
    except ValueError as exc:
        raise SystemExit(f"rlwatch: {exc}") from None
    return with_preset(pack, preset), preset


def cmd_demo(args) -> int:
    from rlwatch.demo import run_demo

    hooks, server = {}, None
    if args.web:  # the dashboard on the embedded run: a Fleet fed by the demo, buttons on its control
        from alerts.control import MemoryControl
        from web.server import start_web

        control = MemoryControl()
        server = start_web(args.web, control=control, mode="demo")
        hooks = {"observer": server.fleet, "control": control, "auto_resume": False}
    result = run_demo(steps=args.steps, onset=args.onset, as_json=args.json, **hooks)
    if server is not None:
        print(f"rlwatch demo: runs finished; the dashboard stays at {server.url} until Ctrl-C",
              file=sys.stderr, flush=True)
        server.wait()
    ok = bool(result.paused_runs) and not any(a.run_id == "ppo-healthy" and a.severity in ("orange", "red", "black")
                                              for a in result.alerts)
    return 0 if ok else 1


def cmd_worker(args) -> int:
    from contract.settings import Settings
    from streams.app import build_app, ensure_topics

    settings = Settings.from_env(kafka=args.kafka, redis=args.redis, rules=args.rules, routes=args.routes)
    logging.basicConfig(level=getattr(logging, args.loglevel.upper(), logging.INFO))
    if settings.routes:  # a bad routes file stops the worker at once, with the line at fault
        from alerts.factory import build_notifiers, build_routing
        from alerts.routing import RoutesFileError

        try:
            build_routing(settings, build_notifiers(settings))
        except RoutesFileError as exc:
            raise SystemExit(f"rlwatch worker: {exc}") from None
    logging.getLogger("rlwatch").info("rlwatch worker: %s", settings.describe())
    try:
        ensure_topics(settings)
    except Exception as exc:  # noqa: BLE001 - say what is wrong with the broker, then stop
        raise SystemExit(f"rlwatch worker: cannot reach Kafka at {settings.kafka}: {exc}") from None
    server = None
    if args.web:  # the dashboard in a background thread, fed by the agents, commands over Redis
        from alerts.control import RedisControl
        from web.server import start_web

        server = start_web(args.web, control_factory=lambda: RedisControl(settings.redis),
                           pack=settings.rules, mode="worker", secret=settings.control_secret)
    app = build_app(settings, **({"observer": server.fleet} if server else {}))
    sys.argv = ["rlwatch-worker", "worker", "-l", args.loglevel.lower(), "--without-web"]
    app.main()
    return 0


def cmd_replay(args) -> int:
    from alerts.render import text
    from rlwatch.replay import replay

    pack, preset = _pack(args.rules, args.preset)

    def show(alert):
        print(alert.to_json() if args.json else text(alert), flush=True)

    missing = [p for p in args.files if not __import__("os").path.exists(p)]
    if missing:
        raise SystemExit(f"rlwatch: no such file: {', '.join(missing)}")
    result = replay(args.files, pack, preset, on_alert=show)
    for r in result.rejected[:20]:
        print(f"rlwatch: skipped {r}", file=sys.stderr)
    if len(result.rejected) > 20:
        print(f"rlwatch: ... and {len(result.rejected) - 20} more skipped lines", file=sys.stderr)
    firing = [a for a in result.alerts if a.state == "firing"]
    print(f"rlwatch: replayed {result.events} events from {len(args.files)} file(s): "
          f"{len(firing)} alerts fired, {len(result.rejected)} lines skipped", file=sys.stderr)
    return 0


def cmd_rules(args) -> int:
    from rules.loader import RuleFileError, load_pack

    if args.rules_cmd == "list":
        try:
            pack = load_pack(args.rules or "rlhf")
        except RuleFileError as exc:
            print(exc, file=sys.stderr)
            return 1
        for r in pack.rules:
            tiers = "/".join(t.severity for t in r.tiers)
            print(f"{r.id:28s} {tiers:22s} {r.title}")
        print(f"{len(pack.rules)} rules in pack '{pack.pack}'", file=sys.stderr)
        return 0
    if args.rules_cmd == "check":
        from rules.engine import RuleEngine

        status = 0
        for f in args.files:
            try:
                pack = load_pack(f)
            except RuleFileError as exc:
                print(exc, file=sys.stderr)
                status = 1
                continue
            missing = RuleEngine(pack).undefined_targets()
            note = f"; targets without a default (set them per run): {', '.join(missing)}" if missing else ""
            print(f"{f}: OK, {len(pack.rules)} rules{note}")
        return status
    if args.rules_cmd == "test":
        from rlwatch.rule_tests import run_rule_tests

        failed = 0
        for f in args.files:
            try:
                outcomes = run_rule_tests(f)
            except RuleFileError as exc:
                print(exc, file=sys.stderr)
                return 1
            for o in outcomes:
                print(f"{'PASS' if o.passed else 'FAIL'} {f}: {o.name}")
                for p in o.problems:
                    print(f"     {p}")
                failed += not o.passed
            print(f"{sum(o.passed for o in outcomes)} passed, {sum(not o.passed for o in outcomes)} failed")
        return 1 if failed else 0
    return 2


def _run_on_redis(coro):
    """Run an operator command's coroutine; a Redis failure is one clear line, not a traceback."""
    try:
        return asyncio.run(coro)
    except BrokenPipeError:
        raise   # the reader went away (| head): not a Redis problem
    except Exception as exc:
        if type(exc).__module__.startswith("redis") or isinstance(exc, OSError):
            raise SystemExit(f"rlwatch: cannot reach Redis: {exc}") from None
        raise


def _control(args):
    from alerts.control import RedisControl
    from contract.settings import Settings

    settings = Settings.from_env(redis=args.redis)
    return RedisControl(settings.redis), settings


def cmd_command(args) -> int:
    from contract.commands import Command

    async def go():
        control, settings = _control(args)
        try:
            cmd = Command(run_id=args.run, action=args.command, ts=time.time(),
                          reason=args.reason or f"{args.command} from the command line",
                          issuer=f"cli:{getpass.getuser()}").signed(settings.control_secret)
            state = await control.apply(cmd)
            print(f"{args.run}: {state.state} ({args.command} sent, command {cmd.id})")
        finally:
            await control.close()

    _run_on_redis(go())
    return 0


def cmd_status(args) -> int:
    async def go():
        control, _ = _control(args)
        try:
            runs = [args.run] if args.run else await control.runs()
            if not runs:
                print("no runs known to the control channel yet")
            for run in runs:
                st = await control.status(run)
                cmd = st.command
                how = f" by {cmd.issuer}: {cmd.reason}" if cmd else ""
                if args.json:
                    print(json.dumps({"run_id": run, "state": st.state,
                                      "history": await control.history(run, 50) if args.run else []}))
                    continue
                print(f"{run}: {st.state}{how}")
                if args.run:
                    for e in await control.history(run, 50):
                        when = time.strftime("%H:%M:%S", time.localtime(e.get("ts", 0)))
                        if e.get("type") == "ack":
                            print(f"  {when} ack   {e['action']:8s} {e['status']} (rank {e.get('rank')}) {e.get('detail', '')}")
                        else:
                            print(f"  {when} {e['action']:14s} {e.get('issuer', '')}: {e.get('reason', '')}")
        finally:
            await control.close()

    _run_on_redis(go())
    return 0


def _redis_run(args, fn):
    """Run ``fn(redis)`` on the configured Redis; a Redis failure is one clear line."""
    from contract.settings import Settings

    async def go():
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(Settings.from_env(redis=args.redis).redis, socket_timeout=5,
                                    socket_connect_timeout=3)
        try:
            return await fn(r)
        finally:
            await r.aclose()

    return _run_on_redis(go())


def cmd_silence(args) -> int:
    from alerts.matchers import parse_matcher_args
    from alerts.silences import RedisSilences, Silence, parse_duration

    now = time.time()
    if args.silence_cmd == "add":
        try:
            matchers = parse_matcher_args(args.matchers)
            silence = Silence(matchers=matchers, starts_at=now, ends_at=now + parse_duration(args.duration),
                              created_by=args.author or getpass.getuser(), comment=args.comment or "")
        except ValueError as exc:
            raise SystemExit(f"rlwatch silence: {exc}") from None
        _redis_run(args, lambda r: RedisSilences(r).add(silence))
        print(f"silence {silence.id} until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(silence.ends_at))}")
        return 0
    if args.silence_cmd == "expire":
        got = _redis_run(args, lambda r: RedisSilences(r).expire(args.id, now))
        if got is None:
            raise SystemExit(f"rlwatch silence: no single silence with id {args.id!r}")
        print(f"silence {got.id} expired")
        return 0
    silences = _redis_run(args, lambda r: RedisSilences(r).all())
    shown = [s for s in silences if args.all or s.state(now) != "expired"]
    if args.json:
        for s in shown:
            print(json.dumps({**s.model_dump(), "state": s.state(now)}))
        return 0
    if not shown:
        print("no active silences" + ("" if args.all else " (--all shows expired ones)"))
    for s in shown:
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.ends_at))
        what = " ".join(f"{k}={'|'.join(v) if isinstance(v, list) else v}" for k, v in s.matchers.items())
        print(f"{s.id}  {s.state(now):8s} until {until}  {what}  by {s.created_by}: {s.comment}")
    return 0


def cmd_incidents(args) -> int:
    from alerts.incidents import RedisIncidents

    if args.incidents_cmd == "show":
        inc = _redis_run(args, lambda r: RedisIncidents(r).get(args.id))
        if inc is None:
            raise SystemExit(f"rlwatch incidents: no single incident with id {args.id!r}")
        if args.json:
            print(json.dumps(inc, indent=2))
            return 0
        snap = inc.get("snapshot", {})
        print(f"{inc['id']}  {inc['severity'].upper()} {inc['rule']}  run {inc['run_id']}  step {inc['step']} "
              f"(onset {inc['onset_step']})")
        print(f"  {inc['summary']}")
        print(f"  monitor did: {', '.join(inc.get('actions_taken') or []) or 'nothing'}")
        if "note" in snap:
            print(f"  {snap['note']}")
            return 0
        print(f"  {snap.get('metric') or 'value'}: {snap.get('value')} vs {snap.get('threshold')}; "
              f"rollback to: {snap.get('rollback_to') or 'none'}")
        window = snap.get("window", {}).get("steps", [])
        metric = snap.get("metric")
        if window:
            series = [f"{w['step']}:{w['metrics'].get(metric, '-')}" for w in window] if metric else \
                [str(w["step"]) for w in window]
            print(f"  window (rank {snap['window'].get('rank')}, {len(window)} steps): {' '.join(series[-30:])}")
        for label, part in (("offending step", snap.get("offending", {})), ("last stable step", snap.get("last_stable", {}))):
            print(f"  {label} {part.get('step')}: {len(part.get('samples', []))} samples")
            for smp in part.get("samples", [])[:3]:
                resp = str(smp.get("response", ""))[:100].replace("\n", " ")
                print(f"    reward {smp.get('reward')} kl {smp.get('kl')}: {resp!r}")
        for rank, entry in sorted(snap.get("ranks", {}).items()):
            print(f"  rank {rank}: value {entry.get('value')} batches {', '.join(entry.get('batch_ids', [])[:8])}")
        print("  (--json for everything)")
        return 0
    items = _redis_run(args, lambda r: RedisIncidents(r).list(args.run, args.limit))
    if args.json:
        for i in items:
            print(json.dumps(i))
        return 0
    if not items:
        print("no incidents recorded")
    for i in items:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i["created"]))
        print(f"{i['id']}  {when}  {i['severity']:6s} {i['rule']:28s} {i['run_id']} step {i['step']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlwatch", description="Real-time monitoring for RLHF training.")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="the whole loop in one process (no Kafka/Redis needed)")
    d.add_argument("--steps", type=int, default=400)
    d.add_argument("--onset", type=int, default=120, help="step at which the KL fault starts")
    d.add_argument("--json", action="store_true", help="alerts as JSON lines")
    d.add_argument("--web", metavar="HOST:PORT",
                   help="serve the dashboard (fleet, cockpit, controls, /metrics) on HOST:PORT; "
                        "keeps serving after the runs end, until Ctrl-C; no automatic resume")
    d.set_defaults(fn=cmd_demo)

    w = sub.add_parser("worker", help="the stream processor on Kafka + Redis (Faust)")
    w.add_argument("--kafka", help="bootstrap servers (RLWATCH_KAFKA, default localhost:9092)")
    w.add_argument("--redis", help="Redis URL (RLWATCH_REDIS, default redis://localhost:6379/0)")
    w.add_argument("--rules", help="built-in pack name or rule file(s), comma-separated (default rlhf)")
    w.add_argument("--routes", help="alert routing file (YAML: receivers, routes, grouping, inhibition, "
                                    "enforcement; RLWATCH_ROUTES); default: every alert to every receiver")
    w.add_argument("--loglevel", default="info", choices=["crit", "error", "warn", "info", "debug"])
    w.add_argument("--web", metavar="HOST:PORT",
                   help="serve the dashboard (fleet, cockpit, controls, /metrics) on HOST:PORT")
    w.set_defaults(fn=cmd_worker)

    r = sub.add_parser("replay", help="backtest recorded runs through the rules")
    r.add_argument("files", nargs="+")
    r.add_argument("--rules", help="built-in pack name or rule file(s), comma-separated")
    r.add_argument("--preset", help="trl-ppo, trl-grpo, verl, openrlhf, nemo-rl")
    r.add_argument("--json", action="store_true", help="alerts as JSON lines (contract section 3)")
    r.set_defaults(fn=cmd_replay)

    ru = sub.add_parser("rules", help="check, test and list rules")
    rsub = ru.add_subparsers(dest="rules_cmd", required=True)
    c = rsub.add_parser("check")
    c.add_argument("files", nargs="+")
    t = rsub.add_parser("test")
    t.add_argument("files", nargs="+")
    li = rsub.add_parser("list")
    li.add_argument("--rules")
    ru.set_defaults(fn=cmd_rules)

    for name in ("pause", "resume", "stop"):
        q = sub.add_parser(name, help=f"{name} a run (over Redis)")
        q.add_argument("run")
        q.add_argument("--reason")
        q.add_argument("--redis")
        q.set_defaults(fn=cmd_command, command=name)

    s = sub.add_parser("status", help="control state of a run and its command history")
    s.add_argument("run", nargs="?")
    s.add_argument("--redis")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)

    si = sub.add_parser("silence", help="mute notifications of matching alerts for a while (commands still go)")
    ssub = si.add_subparsers(dest="silence_cmd", required=True)
    sa = ssub.add_parser("add", help="e.g. silence add run=exp-7 'rule=kl_*' --duration 2h --comment ...")
    sa.add_argument("matchers", nargs="+", help="name=glob or name!=glob (severity=>=red works too)")
    sa.add_argument("--duration", default="1h", help="30m, 2h, 1d (default 1h)")
    sa.add_argument("--comment")
    sa.add_argument("--author")
    sl = ssub.add_parser("list")
    sl.add_argument("--all", action="store_true", help="include expired silences")
    sl.add_argument("--json", action="store_true")
    se = ssub.add_parser("expire")
    se.add_argument("id", help="silence id (a unique prefix is enough)")
    for q in (sa, sl, se):
        q.add_argument("--redis")
    si.set_defaults(fn=cmd_silence)

    inc = sub.add_parser("incidents", help="incident snapshots kept for alerts with the snapshot action")
    isub = inc.add_subparsers(dest="incidents_cmd", required=True)
    il = isub.add_parser("list")
    il.add_argument("--run")
    il.add_argument("--limit", type=int, default=50)
    ish = isub.add_parser("show")
    ish.add_argument("id", help="incident id (a unique prefix is enough)")
    for q in (il, ish):
        q.add_argument("--redis")
        q.add_argument("--json", action="store_true")
    inc.set_defaults(fn=cmd_incidents)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
