"""The dashboard's HTTP server (aiohttp): pages, JSON API, live updates (SSE), controls, /metrics.

Routes
------
``GET /``                         fleet page (every run; sort, filter, group by tag; live)
``GET /run?run=ID``               a run's cockpit (three rows of charts, samples, controls, audit)
``GET /api/config``               controls enabled?, chart layout, KL lines, EMA span
``GET /api/fleet``                fleet rows and counts (``sort``, ``q``, ``state`` query parameters)
``GET /api/run?run=ID``           everything a cockpit draws (``points`` bounds each series)
``GET /api/run/series?run=ID``    the downsampled series only
``GET /api/run/dists?run=ID``     latest histograms and histograms over steps (heatmaps)
``GET /api/run/samples?run=ID``   latest samples (``category``, ``step``, ``limit``)
``GET /api/run/audit?run=ID``     control state, what the ranks answered to it, command/ack history
                                  (operator token required)
``GET /api/run/incidents?run=ID`` the run's incident snapshots kept in Redis (ids and summaries)
``POST /api/run/command?run=ID``  pause / resume / stop / adjust / rollback / snapshot with a reason (operator
                                  token required): an adjust's ``params``, a rollback's ``to_step``
                                  and ``checkpoint`` (either, or neither: see alerts.operator);
                                  with ``dry_run`` what it would send, and why, sending nothing
``GET /api/stream[?run=ID]``      server-sent events: fleet rows, or a run's new steps and alerts
``GET /metrics``                  Prometheus text format (see :mod:`web.metrics`)
``GET /healthz``                  liveness

Run ids travel as a query parameter (``run=``), so ids with slashes work everywhere.

The operator token comes from ``RLWATCH_OPERATOR_TOKEN`` (or ``RLWATCH_OPERATOR_TOKEN_FILE``);
it is sent as the ``X-RLWatch-Token`` header, ``Authorization: Bearer``, or a ``token`` form or
JSON field. Without it configured, the controls answer 403 and the page says why. Commands go
through the same control channel as every other command
(``control.apply(Command(..., issuer="web:operator").signed(secret))``).

The rows of the fleet page come from the fleet store (:mod:`streams.fleet_store`), which every
worker writes: with Redis, any dashboard shows every run of the application, whichever worker
processes it; charts are drawn in full by the dashboard of the worker that processes the run,
and as a sparkline elsewhere.

:class:`WebServer` runs the app in a background thread with its own event loop, which is how
``rlwatch demo --web``, ``rlwatch worker --web`` and ``rlwatch web`` serve it.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from alerts.operator import OperatorError, adjust_params, rollback_params
from contract.commands import Command
from web.fleet import CHARTS, Fleet, kl_lines_from_pack
from web.metrics import CONTENT_TYPE, registry_for, render

__all__ = ["WebServer", "build_web_app", "parse_address", "start_web"]

log = logging.getLogger("rlwatch.web")

STATIC = Path(__file__).parent / "static"
TOKEN_HEADER = "X-RLWatch-Token"
WEB_ACTIONS = ("pause", "resume", "stop", "adjust", "rollback", "snapshot")

K_FLEET = web.AppKey("fleet", Fleet)
K_CFG = web.AppKey("cfg", dict)
K_STATE = web.AppKey("state", dict)


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats -> null, tuples and sets -> lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [_clean(v) for v in x]
    return x


def _dumps(x: Any) -> str:
    return json.dumps(_clean(x), separators=(",", ":"), allow_nan=False)


def _json(request: web.Request, data: Any, status: int = 200, compress: bool = False) -> web.Response:
    resp = web.Response(text=_dumps(data), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})
    if compress and "gzip" in request.headers.get("Accept-Encoding", ""):
        resp.enable_compression()
    return resp


def _env_secret(name: str) -> str | None:
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise SystemExit(f"rlwatch: cannot read {name}_FILE={path}: {exc}") from None
    return os.environ.get(name) or None


def _run_param(request: web.Request) -> str:
    run = request.query.get("run", "")
    if not run:
        raise web.HTTPBadRequest(text=_dumps({"error": "missing ?run=RUN_ID"}), content_type="application/json")
    return run


def _int(request: web.Request, name: str, default: int | None, lo: int = 0, hi: int = 10_000) -> int | None:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    try:
        return max(lo, min(hi, int(raw)))
    except ValueError:
        raise web.HTTPBadRequest(text=_dumps({"error": f"{name} must be an integer"}),
                                 content_type="application/json") from None


# -- pages ---------------------------------------------------------------------------------------
def _page(name: str):
    async def handler(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / name, headers={"Cache-Control": "no-cache"})
    return handler


# -- API -----------------------------------------------------------------------------------------
async def api_config(request: web.Request) -> web.Response:
    cfg = request.app[K_CFG]
    fleet = request.app[K_FLEET]
    return _json(request, {
        "controls": {"enabled": bool(cfg["token"]),
                     "reason": None if cfg["token"] else
                     "Controls are disabled: the server was started without RLWATCH_OPERATOR_TOKEN."},
        "charts": CHARTS, "kl_lines": fleet.kl_lines,
        "smoothing": "the smoothed values the rules read",
        "finished_after": fleet.finished_after, "silent_after": fleet.silent_after,
        "mode": cfg["mode"], "control_error": request.app[K_STATE].get("control_error"),
        "store_error": request.app[K_STATE].get("store_error"),
    })


async def api_fleet(request: web.Request) -> web.Response:
    fleet = request.app[K_FLEET]
    rows = fleet.rows(sort=request.query.get("sort"), q=request.query.get("q"),
                      state=request.query.get("state"))
    return _json(request, {"now": fleet.clock(), "rows": rows, "counts": counts(rows)},
                 compress=True)


def counts(rows: list[dict]) -> dict:
    """Runs by control state, by status (live, silent, finished) and by worst open tier."""
    out = {"runs": len(rows), "state": {}, "status": {}, "worst": {}}
    for r in rows:
        out["state"][r["state"]] = out["state"].get(r["state"], 0) + 1
        out["status"][r["status"]] = out["status"].get(r["status"], 0) + 1
        w = r["worst"]["severity"] if r["worst"] else "none"
        out["worst"][w] = out["worst"].get(w, 0) + 1
    return out


def _known(request: web.Request, run: str) -> None:
    if run not in request.app[K_FLEET]:
        raise web.HTTPNotFound(text=_dumps({"error": f"unknown run {run!r}"}), content_type="application/json")


async def api_run(request: web.Request) -> web.Response:
    run = _run_param(request)
    fleet = request.app[K_FLEET]
    snap = fleet.snapshot(run, points=_int(request, "points", 400, 16, 4096))
    if snap is None:
        raise web.HTTPNotFound(text=_dumps({"error": f"unknown run {run!r}"}), content_type="application/json")
    snap["now"] = fleet.clock()
    return _json(request, snap, compress=True)


async def api_series(request: web.Request) -> web.Response:
    run = _run_param(request)
    names = request.query.get("metrics")
    out = request.app[K_FLEET].series(run, _int(request, "points", 400, 16, 4096),
                                      names.split(",") if names else None)
    if out is None:
        _known(request, run)
    return _json(request, out, compress=True)


async def api_dists(request: web.Request) -> web.Response:
    run = _run_param(request)
    out = request.app[K_FLEET].dists(run, bins=_int(request, "bins", 30, 4, 200))
    if out is None:
        _known(request, run)
    return _json(request, out, compress=True)


async def api_samples(request: web.Request) -> web.Response:
    run = _run_param(request)
    out = request.app[K_FLEET].samples(run, category=request.query.get("category") or None,
                                       step=_int(request, "step", None, 0, 2**62),
                                       limit=_int(request, "limit", 50, 1, 200))
    if out is None:
        _known(request, run)
    return _json(request, out, compress=True)


async def api_audit(request: web.Request) -> web.Response:
    run = _run_param(request)
    denied = _operator_only(request, {})     # the history holds signed commands: operators only
    if denied is not None:
        return denied
    control = request.app[K_STATE].get("control")
    if control is None:
        return _json(request, {"run_id": run, "state": None, "history": [],
                               "error": "no control channel"}, status=503)
    try:
        st = await control.status(run)
        hist = await control.history(run, _int(request, "count", 50, 1, 500))
        # every rank's answer to the command that set the state, however many ranks answered
        answers = await control.since(run, st.command.ts) if st.command is not None else []
    except Exception as exc:  # noqa: BLE001 - Redis down: say so, keep the page alive
        return _json(request, {"run_id": run, "state": None, "history": [],
                               "error": f"control channel unreachable: {exc}"}, status=503)
    return _json(request, {"run_id": run, "state": st.state,
                           "command": st.command.model_dump(exclude_none=True) if st.command else None,
                           "answered": _answered(st.command, answers, getattr(control, "secret", None)),
                           "history": hist})


def _answered(cmd, history: list[dict], secret: str | None) -> dict | None:
    """What the run's ranks answered to the command that set its state, from the audit entries
    read (signed answers only, with a control secret): ``{"held": every rank of the run
    applied it, "said": "applied (ranks 0-6); no answer yet (rank 7)", "ranks": 7, "world": 8
    (None when the answers do not say)}``; None when no rank has answered yet (a
    state of "paused" is then the monitor's, not yet the run's)."""
    from alerts.notices import say_heard, world_of
    from alerts.operator import answers_of

    if cmd is None:
        return None
    answers = answers_of(history, cmd.id, secret)
    if not answers:
        return None
    applied, silent, said = say_heard(answers)
    return {"held": applied and not silent, "said": said, "ranks": len(answers), "world": world_of(answers)}


async def api_incidents(request: web.Request) -> web.Response:
    """The run's incidents (what `rlwatch incidents list --run` shows); the snapshots themselves
    stay behind `rlwatch incidents show ID`."""
    run = _run_param(request)
    store = request.app[K_STATE].get("store")
    redis = getattr(store, "redis", None)
    if redis is None:
        return _json(request, {"run_id": run, "incidents": [],
                               "note": "no incident store here (the embedded demo keeps none)"})
    from alerts.incidents import RedisIncidents

    try:
        items = await RedisIncidents(redis, f"rlwatch:{getattr(store, 'app_id', 'rlwatch')}").list(
            run, _int(request, "limit", 20, 1, 200))
    except Exception as exc:  # noqa: BLE001 - Redis down: say so, keep the page alive
        return _json(request, {"run_id": run, "incidents": [], "error": f"Redis unreachable: {exc}"},
                     status=503)
    return _json(request, {"run_id": run, "incidents": items})


def _given_token(request: web.Request, body: dict) -> str | None:
    t = request.headers.get(TOKEN_HEADER)
    if t:
        return t
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    v = body.get("token")
    return str(v) if v else None


def _operator_only(request: web.Request, body: dict) -> web.Response | None:
    """None when the request carries the operator token, else the answer refusing it."""
    cfg = request.app[K_CFG]
    if not cfg["token"]:
        return _json(request, {"error": "controls are disabled: the server has no RLWATCH_OPERATOR_TOKEN"},
                     status=403)
    given = _given_token(request, body)
    if not given or not hmac.compare_digest(given.encode(), cfg["token"].encode()):
        return _json(request, {"error": "a valid operator token is required"}, status=401)
    return None


async def api_command(request: web.Request) -> web.Response:
    cfg = request.app[K_CFG]
    fleet = request.app[K_FLEET]
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _json(request, {"error": "body is not JSON"}, status=400)
        if not isinstance(body, dict):
            return _json(request, {"error": "body must be a JSON object"}, status=400)
    else:
        body = dict(await request.post())
    run = request.query.get("run") or str(body.get("run") or "")
    if not cfg["token"]:
        return _json(request, {"error": "controls are disabled: the server has no RLWATCH_OPERATOR_TOKEN"},
                     status=403)
    given = _given_token(request, body)
    if not given or not hmac.compare_digest(given.encode(), cfg["token"].encode()):
        return _json(request, {"error": "a valid operator token is required"}, status=401)
    action = str(body.get("action") or "")
    if action not in WEB_ACTIONS:
        return _json(request, {"error": f"action must be one of {', '.join(WEB_ACTIONS)}"}, status=400)
    reason = str(body.get("reason") or "").strip()
    if not reason:
        return _json(request, {"error": "a reason is required"}, status=400)
    if not run:
        return _json(request, {"error": "missing run"}, status=400)
    if run not in fleet:
        return _json(request, {"error": f"unknown run {run!r}"}, status=404)
    try:
        params, why = _operator_params(action, body, run, fleet)
    except OperatorError as exc:
        return _json(request, {"error": str(exc)}, status=400)
    if body.get("dry_run") in (True, "1", "true"):      # what it would send, and why: nothing sent
        return _json(request, {"run_id": run, "would": {"action": action, "params": params}, "why": why})
    control = request.app[K_STATE].get("control")
    if control is None:
        return _json(request, {"error": "no control channel"}, status=503)
    cmd = Command(run_id=run, action=action, params=params, ts=time.time(), reason=reason[:500],
                  issuer="web:operator").signed(cfg["secret"])
    try:
        new = await control.apply(cmd)
    except Exception as exc:  # noqa: BLE001
        log.error("rlwatch web: %s %s failed: %s", action, run, exc)
        return _json(request, {"error": f"control channel unreachable: {exc}"}, status=503)
    fleet.observe_command(cmd, new.state)
    log.warning("rlwatch web: operator %s %s (%s): now %s", action, run, reason, new.state)
    out = {"run_id": run, "state": new.state, "command": cmd.model_dump(exclude_none=True)}
    if why:
        out["why"] = why
    announcer = request.app[K_STATE].get("announcer")
    if announcer is not None and announcer.receivers:
        # the run's receivers are told (the command stands whatever they answer)
        step = (fleet.summary(run) or {}).get("last_step")
        got = await announcer.announce(cmd, new.state, step=step, why=why)
        out["announced"] = {"sent": got.sent, "failed": got.failed, "silenced": got.silenced,
                            "retrying": got.retrying, "unqueued": got.unqueued}
    return _json(request, out)


def _operator_params(action: str, body: dict, run: str, fleet: Fleet) -> tuple[dict, str | None]:
    """An adjust's factors (``params``: a JSON object, or ``"beta=1.5 lr=0.5"`` in a form) and a
    rollback's checkpoint (``to_step`` and ``checkpoint``, either, or neither: see
    :mod:`alerts.operator`); nothing for the other actions."""
    if action == "adjust":
        given = body.get("params")
        if isinstance(given, str):
            given = given.split()
        if not isinstance(given, (dict, list)):
            raise OperatorError("params must name at least one parameter and its factor, e.g. "
                                "{\"beta\": 1.5} (or beta=1.5 in a form)")
        return adjust_params(given), None
    if action == "rollback":
        raw = body.get("to_step")
        to_step = None
        if raw not in (None, ""):
            try:
                to_step = int(str(raw))
            except ValueError:
                raise OperatorError(f"to_step must be a step number, not {raw!r}") from None
        checkpoint = body.get("checkpoint")
        checkpoint = None if checkpoint in (None, "") else checkpoint     # (not a string: refused)
        return rollback_params(run, fleet.summary(run), to_step, checkpoint)
    return {}, None


async def api_metrics(request: web.Request) -> web.Response:
    body = await asyncio.get_running_loop().run_in_executor(None, render, request.app[K_STATE]["registry"])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def healthz(request: web.Request) -> web.Response:
    return _json(request, {"ok": True, "runs": len(request.app[K_FLEET].run_ids())})


# -- server-sent events --------------------------------------------------------------------------
def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {_dumps(data)}\n\n".encode()


def _row_key(row: dict) -> str:
    r = dict(row)
    r.pop("age_s", None)
    return _dumps(r)


async def api_stream(request: web.Request) -> web.StreamResponse:
    state = request.app[K_STATE]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    state["streams"] += 1
    try:
        await resp.write(b"retry: 2000\n\n")
        run = request.query.get("run")
        if run:
            await _run_stream(request, resp, run)
        else:
            await _fleet_stream(request, resp)
    except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        state["streams"] -= 1
    return resp


async def _fleet_stream(request: web.Request, resp: web.StreamResponse) -> None:
    fleet = request.app[K_FLEET]
    state = request.app[K_STATE]
    interval = request.app[K_CFG]["sse_interval"]
    sent: dict[str, str] = {}
    last_write = 0.0
    last_err = None
    first = True
    while not state["stopping"]:
        now = fleet.clock()
        rows = fleet.rows(now=now)
        changed, seen = [], set()
        for row in rows:
            key = _row_key(row)
            seen.add(row["run_id"])
            if sent.get(row["run_id"]) != key:
                sent[row["run_id"]] = key
                changed.append(row)
        removed = [r for r in sent if r not in seen]
        for r in removed:
            del sent[r]
        err = state.get("store_error")
        if first or changed or removed or err != last_err or time.monotonic() - last_write > 5.0:
            last_err = err
            await resp.write(_sse("fleet", {"now": now, "full": first, "rows": changed, "removed": removed,
                                            "store_error": err}))
            last_write = time.monotonic()
            first = False
        await _sleep(state, interval)


async def _run_stream(request: web.Request, resp: web.StreamResponse, run: str) -> None:
    fleet = request.app[K_FLEET]
    state = request.app[K_STATE]
    interval = request.app[K_CFG]["sse_interval"]
    since = _int(request, "since", None, 0, 2**62)
    asince = _int(request, "asince", None, 0, 2**62)
    last_row = ""
    last_versions: dict | None = None
    last_write = time.monotonic()
    while not state["stopping"]:
        versions = fleet.versions(run)
        if versions is not None:
            if since is None:
                since = versions["seq"]
            if asince is None:
                asince = versions["alert_seq"]
            rows, seq, complete = fleet.tail(run, since)
            if not complete:
                await resp.write(_sse("resync", {"seq": seq}))
                since = seq
            elif rows:
                await resp.write(_sse("steps", {"rows": rows, "seq": seq}))
                since = seq
            if versions["alert_seq"] > asince:
                markers = fleet.markers(run, asince)
                asince = versions["alert_seq"]
                await resp.write(_sse("alerts", {"markers": markers, "active": fleet.active_alerts(run),
                                                 "kl_lines": fleet.kl_lines_for(run)}))
            row = fleet.row(run)
            key = _row_key(row) if row else ""
            if key != last_row:
                last_row = key
                await resp.write(_sse("row", row))
            picked = {k: versions[k] for k in ("dists", "samples", "commands")}
            if picked != last_versions:
                await resp.write(_sse("changed", picked))
                last_versions = picked
            last_write = time.monotonic()
        elif time.monotonic() - last_write > 5.0:
            await resp.write(b": waiting for the run\n\n")
            last_write = time.monotonic()
        await _sleep(state, interval)


async def _sleep(state: dict, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not state["stopping"] and time.monotonic() < end:
        await asyncio.sleep(min(0.1, seconds))


# -- polling: the fleet store and the control states ------------------------------------------------
async def _control_states(control, runs: list[str]) -> dict:
    """The control state of each run (one round trip with Redis)."""
    from contract.commands import RunControl, state_key

    redis = getattr(control, "redis", None)
    if redis is None:
        return {r: await control.status(r) for r in runs}
    out = {}
    for i in range(0, len(runs), 500):
        chunk = runs[i:i + 500]
        for run, raw in zip(chunk, await redis.mget([state_key(r) for r in chunk])):
            out[run] = RunControl.model_validate_json(raw) if raw else RunControl(run_id=run)
    return out


async def _poll_states(app: web.Application) -> None:
    """Mirror the control channel's authoritative state of every run into the fleet."""
    fleet, state, cfg = app[K_FLEET], app[K_STATE], app[K_CFG]
    warned = False
    while not state["stopping"]:
        control = state.get("control")
        if control is not None:
            try:
                for run, st in (await _control_states(control, fleet.run_ids())).items():
                    cmd = st.command
                    fleet.set_control_state(run, st.state, cmd.reason if cmd else "",
                                            cmd.issuer if cmd else "", st.updated)
                if warned:
                    log.warning("rlwatch web: control channel reachable again")
                warned = False
                state["control_error"] = None
            except Exception as exc:  # noqa: BLE001
                state["control_error"] = f"control channel unreachable: {exc}"
                if not warned:
                    log.error("rlwatch web: %s", state["control_error"])
                    warned = True
        await _sleep(state, cfg["state_poll"])


async def _poll_store(app: web.Application) -> None:
    """Read the records the workers write (only what changed; everything every 30 s)."""
    fleet, state, cfg = app[K_FLEET], app[K_STATE], app[K_CFG]
    since, full_at, warned = float("-inf"), 0.0, False
    while not state["stopping"]:
        store = state.get("store")
        if store is not None:
            try:
                if time.monotonic() - full_at > 30.0:
                    records, full_at = await store.all(), time.monotonic()
                else:
                    records = await store.changed_since(since)
                if records:
                    # the writers' clocks: look again a little before the newest record seen
                    since = max(since, max(r.get("updated", 0) for r in records) - 2.0)
                fleet.set_records(records)
                if warned:
                    log.warning("rlwatch web: fleet store reachable again")
                warned = False
                state["store_error"] = None
            except Exception as exc:  # noqa: BLE001
                state["store_error"] = f"fleet store unreachable: {exc}"
                if not warned:
                    log.error("rlwatch web: %s", state["store_error"])
                    warned = True
        await _sleep(state, cfg["store_poll"])


def build_web_app(fleet: Fleet, control=None, *, control_factory: Callable[[], Any] | None = None,
                  store=None, store_factory: Callable[[], Any] | None = None,
                  token: str | None = None, secret: str | None = None, mode: str = "demo",
                  sse_interval: float = 0.5, state_poll: float = 1.0, store_poll: float = 1.0,
                  metrics_scope: str = "all",
                  announcer_factory: Callable[[Any], Any] | None = None) -> web.Application:
    """The aiohttp application. ``control`` (or ``control_factory``, called on startup inside
    the server's loop, e.g. for a Redis client) is the channel commands go through; ``store``
    (or ``store_factory``) the fleet store the rows come from; ``announcer_factory`` (called
    on startup with the control channel) the :class:`alerts.announce.Announcer` that tells a
    run's receivers of an operator's command (none: nobody is told)."""
    app = web.Application(client_max_size=64 * 1024)
    app[K_FLEET] = fleet
    app[K_CFG] = {"token": token, "secret": secret, "mode": mode, "sse_interval": sse_interval,
                  "state_poll": state_poll, "store_poll": store_poll}
    app[K_STATE] = {"control": control, "store": store, "stopping": False, "streams": 0,
                    "control_error": None, "store_error": None, "announcer": None,
                    "registry": registry_for(fleet, metrics_scope), "tasks": []}

    async def on_startup(app_: web.Application) -> None:
        st = app_[K_STATE]
        if st["control"] is None and control_factory is not None:
            st["control"] = control_factory()
            st["own_control"] = True
        if st["store"] is None and store_factory is not None:
            st["store"] = store_factory()
            st["own_store"] = True
        if announcer_factory is not None:
            try:
                st["announcer"] = announcer_factory(st["control"])
            except (SystemExit, Exception) as exc:  # noqa: BLE001 - the dashboard works without it
                log.error("rlwatch web: operators' commands will not be announced: the receivers "
                          "are not configured right: %s", exc)
        loop = asyncio.get_running_loop()
        st["tasks"].append(loop.create_task(_poll_states(app_)))
        st["tasks"].append(loop.create_task(_poll_store(app_)))

    async def on_shutdown(app_: web.Application) -> None:
        app_[K_STATE]["stopping"] = True

    async def on_cleanup(app_: web.Application) -> None:
        st = app_[K_STATE]
        st["stopping"] = True
        for t in st["tasks"]:
            t.cancel()
        for t in st["tasks"]:
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001
                log.warning("rlwatch web: background task ended with %s", exc)
        if st["announcer"] is not None:
            await st["announcer"].close()
        for name in ("control", "store"):
            if st.get(f"own_{name}") and st[name] is not None:
                try:
                    await st[name].close()
                except Exception as exc:  # noqa: BLE001
                    log.warning("rlwatch web: closing the %s: %s", name, exc)

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    r = app.router
    r.add_get("/", _page("index.html"))
    r.add_get("/run", _page("run.html"))
    r.add_get("/api/config", api_config)
    r.add_get("/api/fleet", api_fleet)
    r.add_get("/api/run", api_run)
    r.add_get("/api/run/series", api_series)
    r.add_get("/api/run/dists", api_dists)
    r.add_get("/api/run/samples", api_samples)
    r.add_get("/api/run/audit", api_audit)
    r.add_get("/api/run/incidents", api_incidents)
    r.add_post("/api/run/command", api_command)
    r.add_get("/api/stream", api_stream)
    r.add_get("/metrics", api_metrics)
    r.add_get("/healthz", healthz)
    r.add_static("/static/", STATIC, append_version=False)
    return app


# -- running it next to something else -----------------------------------------------------------
def parse_address(addr: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``PORT`` (loopback)."""
    addr = addr.strip()
    if addr.isdigit():
        return "127.0.0.1", int(addr)
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    host = host.strip("[]") or "127.0.0.1"
    p = int(port)
    if not 0 <= p <= 65535:
        raise ValueError(f"port out of range in {addr!r}")
    return host, p


class WebServer:
    """The dashboard in a daemon thread with its own event loop."""

    def __init__(self, fleet: Fleet, host: str, port: int, **app_kwargs):
        self.fleet, self.host, self.port = fleet, host, port
        self.app_kwargs = app_kwargs
        self.app: web.Application | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    @property
    def control(self):
        return None if self.app is None else self.app[K_STATE].get("control")

    def start(self, timeout: float = 15.0) -> WebServer:
        self._thread = threading.Thread(target=self._main, name="rlwatch-web", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("rlwatch web: the server did not start in time")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.app = build_web_app(self.fleet, **self.app_kwargs)
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
            addrs = runner.addresses
            if addrs:
                self.port = addrs[0][1]
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self) -> None:
        """Serve until Ctrl-C (then stop cleanly)."""
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()


def start_web(address: str, *, control=None, control_factory: Callable[[], Any] | None = None,
              store=None, store_factory: Callable[[], Any] | None = None,
              pack: Any = "rlhf", fleet: Fleet | None = None, mode: str = "demo",
              token: str | None = None, secret: str | None = None, out=None,
              metrics_scope: str = "all", finished_after: float | None = None,
              announcer_factory: Callable[[Any], Any] | None = None) -> WebServer:
    """Start the dashboard on ``address`` (``HOST:PORT``) in a background thread.

    ``token`` defaults to ``RLWATCH_OPERATOR_TOKEN`` and ``secret`` (command signing) to
    ``RLWATCH_CONTROL_SECRET``. ``pack`` (a pack or a pack name/file) gives the KL lines."""
    out = out or sys.stderr
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise SystemExit(f"rlwatch: --web: {exc}") from None
    if fleet is None:
        lines: dict[str, float] = {}
        try:
            if isinstance(pack, str):
                from rules.loader import load_pack, merge_packs

                names = [n.strip() for n in pack.split(",") if n.strip()]
                packs = [load_pack(n) for n in names]
                pack = packs[0] if len(packs) == 1 else merge_packs(*packs)
            lines = kl_lines_from_pack(pack) if pack is not None else {}
        except Exception as exc:  # noqa: BLE001 - lines are a nicety; the rules loader reports errors
            log.warning("rlwatch web: no KL lines from the rule pack: %s", exc)
        fleet = Fleet(kl_lines=lines, **({"finished_after": finished_after} if finished_after else {}))
    token = token if token is not None else _env_secret("RLWATCH_OPERATOR_TOKEN")
    secret = secret if secret is not None else _env_secret("RLWATCH_CONTROL_SECRET")
    server = WebServer(fleet, host, port, control=control, control_factory=control_factory,
                       store=store, store_factory=store_factory, token=token, secret=secret,
                       mode=mode, metrics_scope=metrics_scope, announcer_factory=announcer_factory)
    try:
        server.start()
    except OSError as exc:
        raise SystemExit(f"rlwatch: --web {address}: cannot listen: {exc}") from None
    note = "operator controls enabled" if token else \
        "operator controls disabled (set RLWATCH_OPERATOR_TOKEN to enable them)"
    print(f"rlwatch web: dashboard at {server.url} (Prometheus at {server.url}metrics); {note}",
          file=out, flush=True)
    return server
