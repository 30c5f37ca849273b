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

#: Python packages that come with an extra of rlwatch, and that extra.
EXTRAS = {"faust": "worker", "aiokafka": "worker", "mode": "worker", "slack_sdk": "worker",
          "redis": "worker", "kafka": "worker", "aiohttp": "web", "prometheus_client": "web",
          "scipy": "stats"}


def _fail(what: str, message: str) -> SystemExit:
    """One clear line on stderr and exit status 1."""
    return SystemExit(f"rlwatch {what}: {message}")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("rlwatch")
    except PackageNotFoundError:
        return "unknown (not installed: run scripts/install.sh)"
    from streams.signals import CORE

    return f"{ver} ({CORE} core)"


#: the MB a worker's fetch may take of each partition (RLWATCH_FETCH_MB): from Kafka's 1 MB
#: default to a little above what one fetch takes in all (aiokafka's 50 MB)
FETCH_MB_RANGE = (1.0, 64.0)


def _settings(args, what: str, **overrides):
    """Settings from flags and RLWATCH_* variables, with the Redis URL checked."""
    from contract.settings import Settings, redis_url_problem

    settings = Settings.from_env(redis=getattr(args, "redis", None), **overrides)
    problem = redis_url_problem(settings.redis, "--redis" if getattr(args, "redis", None) else "RLWATCH_REDIS")
    if problem:
        raise _fail(what, problem)
    return settings


def _pack(rules: str | None, preset_name: str | None = None):
    from contract.presets import get_preset
    from rules.loader import RuleFileError, load_pack, merge_packs, with_preset

    try:
        names = [n.strip() for n in (rules or "rlhf").split(",") if n.strip()] or ["rlhf"]
        packs = [load_pack(n) for n in names]
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
        from streams.fleet_store import MemoryFleetStore
        from web.server import start_web

        control, store = MemoryControl(), MemoryFleetStore()
        server = start_web(args.web, control=control, store=store, mode="demo")
        hooks = {"observer": server.fleet, "control": control, "auto_resume": False, "store": store}
    result = run_demo(steps=args.steps, onset=args.onset, as_json=args.json, **hooks)
    if server is not None:
        print(f"rlwatch demo: runs finished; the dashboard stays at {server.url} until Ctrl-C",
              file=sys.stderr, flush=True)
        server.wait()
    ok = bool(result.paused_runs) and not any(a.run_id == "ppo-healthy" and a.severity in ("orange", "red", "black")
                                              for a in result.alerts)
    return 0 if ok else 1


def _check_redis(url: str, what: str) -> None:
    """Fail at start, in one line, when Redis does not answer."""
    import redis

    from contract.settings import mask_url

    client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure here is "cannot reach"
        raise _fail(what, f"cannot reach Redis at {mask_url(url)}: {exc} "
                          "(start it: scripts/services.sh start)") from None
    finally:
        client.close()


def _check_kafka(bootstrap: str, what: str, timeout: float = 3.0) -> None:
    """Fail fast, in one line, when no bootstrap server accepts a connection."""
    import socket

    problems = []
    for server in [b.strip() for b in bootstrap.split(",") if b.strip()]:
        hostport = server.split("://", 1)[-1]
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise _fail(what, f"RLWATCH_KAFKA / --kafka must be HOST:PORT[,HOST:PORT...], got {server!r}")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except OSError as exc:
            problems.append(f"{hostport}: {exc.strerror or exc}")
    raise _fail(what, f"cannot reach Kafka at {bootstrap} ({'; '.join(problems)}); "
                      "start it (scripts/services.sh start) or set --kafka / RLWATCH_KAFKA")


def cmd_worker(args) -> int:
    settings = _settings(args, "worker", kafka=args.kafka, rules=args.rules, routes=args.routes)
    if not FETCH_MB_RANGE[0] <= settings.fetch_mb <= FETCH_MB_RANGE[1]:
        raise _fail("worker", f"RLWATCH_FETCH_MB must be between {FETCH_MB_RANGE[0]:g} and "
                              f"{FETCH_MB_RANGE[1]:g} (MB a fetch takes of each partition at "
                              f"most), got {settings.fetch_mb:g}")
    for name in ("brake_resend_seconds", "brake_resend_max_seconds"):
        if not getattr(settings, name) > 0:     # (NaN too)
            raise _fail("worker", f"RLWATCH_{name.upper()} must be a positive number of seconds "
                                  f"(the waits between re-sends of an unacknowledged brake), "
                                  f"got {getattr(settings, name):g}")
    pack, _ = _pack(settings.rules)         # a bad or missing rule file stops the worker at once
    from streams.app import GIL_SWITCH_SECONDS, build_app, ensure_topics

    logging.basicConfig(level=getattr(logging, args.loglevel.upper(), logging.INFO))
    if settings.routes:  # a bad routes file stops the worker at once, with the line at fault
        from alerts.factory import build_notifiers, build_routing
        from alerts.routes_file import RoutesFileError

        try:
            build_routing(settings, build_notifiers(settings))
        except RoutesFileError as exc:
            raise _fail("worker", str(exc)) from None
    _check_redis(settings.redis, "worker")
    _check_kafka(settings.kafka, "worker")
    logging.getLogger("rlwatch").info("rlwatch worker: %s", settings.describe())
    from streams.signals import core_note

    note = core_note()
    if note:   # the pure Python core works, but a fleet needs the native one: say it loudly
        logging.getLogger("rlwatch").warning("rlwatch worker: %s", note)
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)      # the client's retries say nothing new; we say it once
    try:
        ensure_topics(settings, timeout=10.0)
    except Exception as exc:  # noqa: BLE001 - say what is wrong with the broker, then stop
        raise _fail("worker", f"cannot reach Kafka at {settings.kafka}: {exc}") from None
    finally:
        kafka_log.setLevel(level)
    server = None
    if args.web:  # the dashboard in a background thread, fed by the agents, commands over Redis
        server = _start_fleet_web(args.web, settings, mode="worker", metrics_scope="local")
    app = build_app(settings, pack=pack, **({"observer": server.fleet} if server else {}))
    sys.argv = ["rlwatch-worker", "worker", "-l", args.loglevel.lower(), "--without-web"]
    # start-up objects frozen, and what survives each collector pass frozen too: a fleet's
    # compiled rules are millions of objects, a pass over them a stop of seconds (streams.heap)
    app.rlwatch_heap.install()
    # the fetching and the brake threads get the GIL soon after they wake (GIL_SWITCH_SECONDS)
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    app.main()
    return 0


def _start_fleet_web(address: str, settings, mode: str, metrics_scope: str = "all"):
    """The dashboard on Redis: rows from the fleet store, commands over the control channel."""
    from alerts.announce import Announcer
    from alerts.control import RedisControl
    from streams.fleet_store import FleetStore
    from web.server import start_web

    return start_web(address, control_factory=lambda: RedisControl(settings.redis),
                     announcer_factory=lambda control: Announcer.from_settings(settings, control.redis),
                     store_factory=lambda: FleetStore.from_url(settings.redis, settings.app_id,
                                                               settings.run_ttl_hours * 3600),
                     pack=settings.rules, mode=mode, secret=settings.control_secret,
                     metrics_scope=metrics_scope, finished_after=settings.finished_after)


def cmd_web(args) -> int:
    settings = _settings(args, "web", rules=args.rules)
    _pack(settings.rules)
    import web.server  # noqa: F401 - a missing 'web' extra is named before Redis is tried
    _check_redis(settings.redis, "web")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = _start_fleet_web(args.address, settings, mode="web")
    print(f"rlwatch web: the fleet of app {settings.app_id!r} from {settings.describe()['redis']}; "
          "Ctrl-C stops", file=sys.stderr, flush=True)
    server.wait()
    return 0


def cmd_replay(args) -> int:
    from alerts.render import text
    from rlwatch.replay import coverage_lines, replay

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
    for line in coverage_lines(result):      # which rules had their inputs; loud when none
        print(line, file=sys.stderr)
    firing = [a for a in result.alerts if a.state == "firing"]
    print(f"rlwatch: replayed {result.events} events from {len(args.files)} file(s): "
          f"{len(firing)} alerts fired, {len(result.rejected)} lines skipped", file=sys.stderr)
    if result.events == 0:
        why = "every line was skipped (see above)" if result.rejected else "the file(s) hold no events"
        print(f"rlwatch replay: nothing was replayed: {why}", file=sys.stderr)
        return 1
    return 0


def cmd_rules(args) -> int:
    from rules.loader import RuleFileError, load_pack

    if args.rules_cmd == "tune":
        from rlwatch.backtest_cli import cli_tune

        return cli_tune(args)
    if args.rules_cmd == "list":
        pack, _ = _pack(args.rules)
        for r in pack.rules:
            tiers = "/".join(t.severity for t in r.tiers)
            print(f"{r.id:28s} {tiers:22s} {r.title}")
            if getattr(args, "params", False):   # every threshold a run can override
                for name, value in r.params.items():
                    print(f"    {name} = {value:g}")
        print(f"{len(pack.rules)} rules in pack '{pack.pack}'", file=sys.stderr)
        return 0
    if args.rules_cmd == "check":
        from rules.engine import RuleEngine

        from rules.loader import pack_warnings

        status = 0
        for f in args.files:
            try:
                pack = load_pack(f)
            except RuleFileError as exc:
                print(exc, file=sys.stderr)
                status = 1
                continue
            for w in pack_warnings(pack):
                print(w, file=sys.stderr)
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


def _control(args, what: str = "status"):
    from alerts.control import RedisControl

    settings = _settings(args, what)
    return RedisControl(settings.redis), settings


def _fleet_store(control, settings):
    from streams.fleet_store import FleetStore

    return FleetStore(control.redis, settings.app_id, settings.run_ttl_hours * 3600)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 2:
        return "just now"
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


async def _unacknowledged(control, settings, now: float) -> dict[str, list[dict]]:
    """The brakes (pause, stop) of this application that no run acknowledged, by run."""
    from alerts.escalation import RedisAcks
    from alerts.factory import namespace

    acks = RedisAcks(control.redis, namespace(settings), settings.control_secret)
    out: dict[str, list[dict]] = {}
    for cmd, escalated in sorted(await acks.unsettled(), key=lambda w: w[0].ts):
        out.setdefault(cmd.run_id, []).append({
            "command_id": cmd.id, "action": cmd.action, "ts": cmd.ts,
            "waited_seconds": round(max(0.0, now - cmd.ts), 1), "escalated": escalated})
    return out


def _fleet_line(rec: dict | None, now: float, finished_after: float) -> str:
    """What the fleet view says about a run, in a few words."""
    from streams.fleet_store import run_status, steps_per_second

    if not rec:
        return "no events seen by a worker of this app"
    s = rec.get("summary") or {}
    status = run_status(rec, now, finished_after=finished_after)
    parts = [f"step {s.get('last_step')}"]
    if status == "live":
        parts.append(f"live, {steps_per_second(rec, now):.2f} steps/s")
    elif status == "finished" and rec.get("closed"):
        parts.append("finished (closed its monitor)")
    else:
        parts.append(status)
    if s.get("incarnation"):
        parts.append(f"incarnation {s['incarnation']}")
    alerts = s.get("open_alerts") or []
    if alerts:
        order = ("info", "yellow", "orange", "red", "black")
        worst = max(alerts, key=lambda a: order.index(a.get("severity", "info")))
        more = f" (+{len(alerts) - 1} more)" if len(alerts) > 1 else ""
        parts.append(f"{worst['severity']} {worst['rule']}{more}")
    ts = s.get("last_event_ts")
    parts.append(f"last event {_ago(now - ts if ts is not None else None)}")
    return ", ".join(parts)


async def _known_runs(control, settings) -> tuple[dict[str, dict], list[str]]:
    """The fleet store's records and the control channel's runs."""
    store = _fleet_store(control, settings)
    return {r["run_id"]: r for r in await store.all()}, await control.runs()


#: the newest checkpoints `rlwatch status RUN` prints (--json gives all the summary holds)
SHOWN_CHECKPOINTS = 4

RESUME_NOTE = ("note: the brake does not re-arm by itself. Alerts firing now will not pause {run} "
               "again; only an alert that fires anew (after it resolves, or a higher tier) does. "
               "Until then you own this run: `rlwatch pause {run}` stops it again.")


#: after a rank's first answer, how long a run of unknown size gives its other ranks to answer
ANSWER_GRACE = 1.0
#: exit statuses of a command that was sent: a rank refused it (ignored, failed), or not every
#: rank answered within --wait (1 stays "not sent": a bad input, an unknown run, Redis down)
REFUSED, UNANSWERED = 3, 4


async def _answers(control, cmd, secret: str | None, seconds: float, world: int | None) -> dict:
    """The answers of the run's ranks to a command (by rank), waited for up to ``seconds``:
    until each of its ``world`` ranks answered, or (its size unknown) :data:`ANSWER_GRACE`
    after the first answer. Without ``world``, the size the answers give (each training
    process puts its run's ``world_size`` in its acknowledgements) is waited for."""
    from alerts.notices import world_of
    from alerts.operator import answers_of

    deadline = time.monotonic() + seconds
    first = None
    while True:
        got = answers_of(await control.since(cmd.run_id, cmd.ts), cmd.id, secret)
        now = time.monotonic()
        if got and first is None:
            first = now
        size = world or world_of(got)
        if (now >= deadline or (size and all(r in got for r in range(size)))
                or (not size and first is not None and now - first >= ANSWER_GRACE)):
            return got
        await asyncio.sleep(0.1)


def _say_answers(what: str, run: str, waited: float, answers: dict, world: int | None) -> None:
    """Print the ranks' answers. A rank that did not apply the command exits with
    :data:`REFUSED` (its answer on stderr); a rank that did not answer with :data:`UNANSWERED`."""
    from alerts.notices import say_heard

    if not answers:
        print(f"{run}: no answer within {waited:g}s (a run answers at its next step boundary, or at "
              f"once while paused; `rlwatch status {run}` shows it when it comes)")
        raise SystemExit(UNANSWERED)
    ok, missing, said = say_heard(answers, world)
    if not ok:
        print(f"rlwatch {what}: run {run} answered {said}", file=sys.stderr)
        raise SystemExit(REFUSED)
    print(f"{run} answered: {said}")
    if missing:
        raise SystemExit(UNANSWERED)


async def _announce(settings, redis, cmd, state: str, step, why) -> None:
    """Tell the run's receivers (Slack, webhooks: as a worker routes) that ``cmd`` was sent;
    say which took it, and on stderr which could not (the command stands either way)."""
    from alerts.announce import Announcer

    try:
        announcer = Announcer.from_settings(settings, redis)
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - a bad receiver setting: the brake is sent
        print(f"rlwatch {cmd.action}: the command was sent, but its receivers are not configured "
              f"right, so nobody was told: {exc}", file=sys.stderr)
        return
    try:
        if not announcer.receivers:
            return      # none configured (RLWATCH_SLACK_WEBHOOK, ... or a routes file)
        got = await announcer.announce(cmd, state, step=step, why=why)
    finally:
        await announcer.close()
    if got.sent:
        print(f"{cmd.run_id}: told {', '.join(got.sent)}")
    if got.silenced:
        print(f"{cmd.run_id}: not told (silenced): "
              + ", ".join(f"{name} ({by})" for name, by in got.silenced.items()))
    for name, error in got.failed.items():
        later = "; a worker retries it" if name in got.retrying else \
            f"; {got.unqueued[name]}" if name in got.unqueued else ""
        print(f"rlwatch {cmd.action}: the command was sent, but telling {name} failed: {error}{later}",
              file=sys.stderr)


ONE_SHOT_NOTE = ("note: the run's script applies it at its next step boundary, or at once while paused "
                 "(its on_{action} callback; without one it answers \"ignored\"), and a paused run stays "
                 "paused; `rlwatch status {run}` shows its answer.")


def cmd_command(args) -> int:
    """pause, resume, stop, adjust, rollback and snapshot of one run, over Redis."""
    from alerts.operator import OperatorError, adjust_params, rollback_params, say_sent
    from contract.commands import Command, runs_key

    what = args.command
    params: dict = {}
    why = None
    if what == "adjust":        # (what was typed is checked before anything is sent)
        try:
            params = adjust_params(args.params)
        except OperatorError as exc:
            raise _fail(what, str(exc)) from None

    async def go():
        nonlocal params, why
        control, settings = _control(args, what)
        try:
            rec = None
            if not args.force or what == "rollback":
                # this run's record alone (a fleet of a thousand runs holds megabytes of them)
                rec = await _fleet_store(control, settings).get(args.run)
                if not args.force and rec is None and not await control.redis.sismember(runs_key(), args.run):
                    raise _fail(what, f"no run {args.run!r} is known to app {settings.app_id!r} "
                                      f"(`rlwatch status` lists the runs; --force sends the "
                                      f"{what} anyway, e.g. before the run starts)")
            if what == "rollback":
                try:
                    params, why = rollback_params(args.run, (rec or {}).get("summary"),
                                                  args.to_step, args.checkpoint)
                except OperatorError as exc:
                    raise _fail(what, str(exc)) from None
            if getattr(args, "dry_run", False):
                print(f"{args.run}: would roll back to step {params['to_step']} ({params['checkpoint']}: "
                      f"{why}); nothing sent")
                return
            cmd = Command(run_id=args.run, action=what, params=params, ts=time.time(),
                          reason=args.reason or f"{what} from the command line",
                          issuer=f"cli:{getpass.getuser()}").signed(settings.control_secret)
            state = await control.apply(cmd)
            print(f"{args.run}: {state.state} ({say_sent(cmd, why)} sent, command {cmd.id})")
            if not args.no_announce:
                step = ((rec or {}).get("summary") or {}).get("last_step")
                await _announce(settings, control.redis, cmd, state.state, step, why)
            if args.wait > 0:
                world = ((rec or {}).get("summary") or {}).get("world_size")
                world = world if isinstance(world, int) and 0 < world <= 4096 else None
                _say_answers(what, args.run, args.wait, await _answers(
                    control, cmd, settings.control_secret, args.wait, world), world)
            elif what in ("adjust", "rollback", "snapshot"):
                print(ONE_SHOT_NOTE.format(action=what, run=args.run))
            if what == "resume":
                alerts = ((rec or await _fleet_store(control, settings).get(args.run) or {})
                          .get("summary") or {}).get("open_alerts") or []
                if alerts:
                    names = ", ".join(f"{a['severity']} {a['rule']}" for a in alerts[:5])
                    print(f"{args.run} has open alerts: {names}")
                print(RESUME_NOTE.format(run=args.run))
        finally:
            await control.close()

    _run_on_redis(go())
    return 0


def cmd_status(args) -> int:
    result = {"code": 0}

    async def go():
        control, settings = _control(args)
        now = time.time()
        try:
            records, channel_runs = await _known_runs(control, settings)
            # the control channel is shared by every application on this Redis: by default list
            # this application's runs (its fleet view), and say how many others there are
            others = sorted(set(channel_runs) - set(records))
            runs = sorted(set(records) | set(others)) if (args.all or args.run) else sorted(records)
            if args.run:
                if args.run not in runs:
                    msg = f"no run {args.run!r} is known to app {settings.app_id!r}"
                    if args.json:
                        print(json.dumps({"run_id": args.run, "error": msg}))
                    else:
                        print(f"rlwatch status: {msg} (`rlwatch status` lists the runs)", file=sys.stderr)
                    result["code"] = 1
                    return
                runs = [args.run]
            out = []
            waiting = await _unacknowledged(control, settings, now)
            for run in runs:
                st = await control.status(run)
                rec = records.get(run)
                from streams.fleet_store import run_status

                item = {"run_id": run, "state": st.state,
                        "command": st.command.model_dump(exclude_none=True) if st.command else None,
                        "status": run_status(rec, now, finished_after=settings.finished_after)
                        if rec else None,
                        "summary": (rec or {}).get("summary"), "closed": (rec or {}).get("closed"),
                        "unacknowledged": waiting.get(run, [])}
                if args.run:
                    item["history"] = await control.history(run, 50)
                out.append(item)
            if args.json:
                print(json.dumps(out[0] if args.run else out))
                return
            if not out:
                print(f"no runs known to app {settings.app_id!r} yet (no worker of it has seen an event)")
            for item in out:
                cmd = item["command"]
                how = f" by {cmd['issuer']}: {cmd['reason']}" if cmd else ""
                # a finished run is no longer "running"; paused or stopped stay what they are
                shown = "finished" if item["status"] == "finished" and item["state"] == "running" else item["state"]
                print(f"{item['run_id']}: {shown}{how}  "
                      f"[{_fleet_line(records.get(item['run_id']), now, settings.finished_after)}]")
                for w in item["unacknowledged"]:
                    print(f"  {w['action']} {w['command_id']} not acknowledged by the run, sent "
                          f"{_ago(w['waited_seconds'])}" + (" (escalated)" if w["escalated"] else ""))
                if not args.run:
                    continue
                s = item["summary"] or {}
                if s.get("targets") or s.get("kl_lines"):
                    print("  targets: " + (", ".join(f"{k}={v}" for k, v in (s.get("targets") or {}).items()) or "-")
                          + ("; KL thresholds: " + ", ".join(f"{k} {v:.6g}" for k, v in s["kl_lines"].items())
                             if s.get("kl_lines") else ""))
                for a in s.get("open_alerts") or []:
                    print(f"  open: {a['severity'].upper()} {a['rule']} since step {a.get('onset_step')}"
                          + (f": {a['summary']}" if a.get("summary") else ""))
                if s.get("checkpoints"):
                    shown, older = s["checkpoints"][-SHOWN_CHECKPOINTS:], len(s["checkpoints"]) - SHOWN_CHECKPOINTS
                    print("  checkpoints: " + ", ".join(f"step {st} {path}" for st, path in shown)
                          + (f" (and {older} older: --json lists them)" if older > 0 else ""))
                for e in item["history"]:
                    when = time.strftime("%H:%M:%S", time.localtime(e.get("ts", 0)))
                    if e.get("type") == "ack":
                        print(f"  {when} ack   {e['action']:8s} {e['status']} (rank {e.get('rank')}) {e.get('detail', '')}")
                    else:
                        given = " ".join(f"{k}={v}" for k, v in (e.get("params") or {}).items())
                        print(f"  {when} {e['action']:14s} {e.get('issuer', '')}: {e.get('reason', '')}"
                              + (f" [{given}]" if given else ""))
            if not args.run and not args.all and others:
                print(f"(and {len(others)} run(s) known only to the control channel: other applications, "
                      "or runs no worker has seen; --all lists them)")
        finally:
            await control.close()

    _run_on_redis(go())
    return result["code"]


def _redis_run(args, fn):
    """Run ``fn(redis)`` on the configured Redis; a Redis failure is one clear line."""
    url = _settings(args, args.cmd).redis

    async def go():
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=3)
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
        if args.duration.strip().replace(".", "", 1).isdigit():
            raise _fail("silence", f"--duration {args.duration} has no unit: say 30m, 2h or 1d "
                                   f"({args.duration}s would be {args.duration} seconds)")
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
    from alerts.factory import namespace
    from alerts.incidents import RedisIncidents

    ns = namespace(_settings(args, args.cmd))      # the application's incidents

    if args.incidents_cmd == "show":
        settings = _settings(args, args.cmd)

        async def show(r):
            from alerts.control import RedisControl
            from alerts.incidents import answered_commands

            inc = await RedisIncidents(r, ns).get(args.id)
            if inc is not None and inc.get("commands"):
                # what the run answered to the commands (the training side's snapshot, the pause)
                control = RedisControl(settings.redis, settings.control_secret, redis=r)
                entries = await control.since(inc["run_id"], inc["created"])
                inc["answered"] = answered_commands(inc, entries, settings.control_secret)
            return inc

        inc = _redis_run(args, show)
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
        for action, said in (inc.get("answered") or {}).items():
            print(f"  run answered {action}: {said}")
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
    items = _redis_run(args, lambda r: RedisIncidents(r, ns).list(args.run, args.limit))
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
    p.add_argument("--version", action="version", version=f"rlwatch {_version()}")
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

    wb = sub.add_parser("web", help="the fleet dashboard on its own: every run of the application, "
                                    "from Redis (no Kafka needed)")
    wb.add_argument("address", nargs="?", default="127.0.0.1:8765", metavar="HOST:PORT",
                    help="where to serve it (default 127.0.0.1:8765)")
    wb.add_argument("--redis", help="Redis URL (RLWATCH_REDIS, default redis://localhost:6379/0)")
    wb.add_argument("--rules", help="rule pack(s) for the default KL lines (default rlhf)")
    wb.set_defaults(fn=cmd_web)

    r = sub.add_parser("replay", help="backtest recorded runs through the rules")
    r.add_argument("files", nargs="+")
    r.add_argument("--rules", help="built-in pack name or rule file(s), comma-separated")
    r.add_argument("--preset", help="trl-ppo, trl-grpo, trl-dpo, tinker, verl, openrlhf, nemo-rl "
                                    "(default: found from each file's metric names)")
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
    li.add_argument("--params", action="store_true", help="show each rule's parameters and defaults")
    from rlwatch.backtest_cli import add_backtest_parser, add_tune_parser

    add_tune_parser(rsub)                   # rules tune DIR
    ru.set_defaults(fn=cmd_rules)
    add_backtest_parser(sub)                # backtest DIR

    helps = {"adjust": "send a run's script new factors for its hyperparameters, e.g. "
                       "`adjust RUN beta=1.5 lr=0.5` (over Redis; its on_adjust applies them)",
             "rollback": "roll a run back to a checkpoint it reported (over Redis): by default the "
                         "newest one before the onset of its worst open alert",
             "snapshot": "ask a run's script for a snapshot (over Redis; its on_snapshot callback "
                         "decides what: samples, weights...)"}
    for name in ("pause", "resume", "stop", "adjust", "rollback", "snapshot"):
        q = sub.add_parser(name, help=helps.get(name, f"{name} a run (over Redis)"))
        q.add_argument("run")
        if name == "adjust":
            q.add_argument("params", nargs="+", metavar="NAME=FACTOR",
                           help="factors, as rule actions write them: beta=1.5 raises the KL "
                                "coefficient by half, lr=0.5 halves the learning rate")
        if name == "rollback":
            q.add_argument("--to-step", type=int,
                           help="the step of the checkpoint (its path is found among those the run reported)")
            q.add_argument("--checkpoint", help="the checkpoint's path (its step is found likewise)")
            q.add_argument("--dry-run", action="store_true",
                           help="say which checkpoint it would go to, and why, without sending anything")
        q.add_argument("--reason")
        q.add_argument("--redis")
        q.add_argument("--force", action="store_true",
                       help="send it even if no worker has seen the run yet")
        q.add_argument("--no-announce", action="store_true",
                       help="do not tell the run's receivers (Slack, webhooks) that it was sent "
                            "(by default they are told, as a worker routes alerts: rule operator_command)")
        one_shot = name in ("adjust", "rollback", "snapshot")
        q.add_argument("--wait", type=float, default=10.0 if one_shot else 0.0, metavar="SECONDS",
                       help="wait this long for the answers of the run's ranks and print them; exit "
                            f"{REFUSED} when a rank ignored or failed the command, {UNANSWERED} when not "
                            f"every rank answered (default {'10' if one_shot else '0: do not wait'})")
        q.set_defaults(fn=cmd_command, command=name)

    s = sub.add_parser("status", help="every run (or one, with its command history): control state, "
                                      "step, live/finished, worst open alert")
    s.add_argument("run", nargs="?")
    s.add_argument("--redis")
    s.add_argument("--json", action="store_true", help="one JSON document (a list, or one run)")
    s.add_argument("--all", action="store_true",
                   help="also the runs known only to the control channel (other applications)")
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
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        extra = EXTRAS[top]
        print(f"rlwatch {args.cmd}: the Python package {top!r} is not installed; it comes with "
              f"rlwatch's {extra!r} extra: run scripts/install.sh in the repository, or "
              f"pip install 'rlwatch[{extra}]'", file=sys.stderr)
        return 1
    except ImportError as exc:
        from producers.recorded import MissingCRC32C

        if not isinstance(exc, MissingCRC32C):
            raise
        print(f"rlwatch {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
