"""The dashboard's HTTP routes on a real aiohttp server: pages, API, controls, SSE, /metrics."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from alerts.control import MemoryControl
from contract.alert import Alert
from contract.commands import Command
from contract.events import parse_event
from tests.web.conftest import Feed, sim_events
from web.fleet import Fleet
from web.server import WebServer, build_web_app, parse_address

TOKEN = "s3cret-operator"
SECRET = "hmac-key"


def _fleet(runs=("ppo-a", "ppo-b"), steps=40) -> Fleet:
    """Two simulated runs through the core; ppo-b then holds an open red KL alert."""
    f = Fleet(kl_lines={"target": 0.05, "red": 0.125})
    feed = Feed(f)
    for i, r in enumerate(runs):
        feed.events(sim_events(r, steps, seed=i, t0=time.time() - steps))
    if "ppo-b" in runs:
        with_alert(f, feed, "ppo-b")
    return f


def with_alert(f: Fleet, feed: Feed, run: str) -> None:
    """The core's summary of ``run`` with an open red kl_above_target (as if it had fired)."""
    alert = Alert(rule="kl_above_target", severity="red", state="firing", run_id=run, step=30,
                  onset_step=28, summary="KL high", threshold=0.125, value=0.2)
    f.observe_alert(alert)
    summary = feed.summary(run)
    summary["open_alerts"] = [{"rule": "kl_above_target", "severity": "red", "onset_step": 28, "step": 30,
                               "value": 0.2, "threshold": 0.125, "metric": "kl/mean", "summary": "KL high"}]
    summary["worst"] = "red"
    hb = parse_event({"schema": 1, "kind": "heartbeat", "run_id": run, "step": summary["last_step"],
                      "ts": summary["last_event_ts"]}, summary["last_event_ts"])
    f.observe_event(hb, summary)


def run(coro_fn, fleet=None, control=None, **kw):
    """Start the app on a real loopback port, run ``coro_fn(session, base, fleet, control)``."""
    fleet = fleet or _fleet()
    control = control if control is not None else MemoryControl()

    async def main():
        app = build_web_app(fleet, control, sse_interval=0.05, state_poll=0.05, **kw)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                return await coro_fn(s, str(server.make_url("")).rstrip("/"), fleet, control)
        finally:
            await server.close()

    return asyncio.run(main())


def test_pages_and_the_built_charting_library_are_served():
    async def go(s, base, fleet, control):
        for path, needle in (("/", "fleet.js"), ("/run?run=ppo-a", "uPlot.iife.min.js"),
                             ("/static/cockpit.js", "uPlot"), ("/static/vendor/uPlot.min.css", ".uplot")):
            async with s.get(base + path) as r:
                assert r.status == 200, path
                assert needle in await r.text(), path
        async with s.get(base + "/static/vendor/uPlot.iife.min.js") as r:
            body = await r.text()
            assert r.status == 200 and "uPlot" in body and len(body) > 20_000
        async with s.get(base + "/healthz") as r:
            assert (await r.json()) == {"ok": True, "runs": 2}
    run(go)


def test_fleet_and_run_api():
    async def go(s, base, fleet, control):
        async with s.get(base + "/api/fleet?sort=-severity") as r:
            data = await r.json()
        assert [x["run_id"] for x in data["rows"]] == ["ppo-b", "ppo-a"]
        assert data["rows"][0]["worst"]["rule"] == "kl_above_target"
        async with s.get(base + "/api/fleet?q=ppo-a") as r:
            assert [x["run_id"] for x in (await r.json())["rows"]] == ["ppo-a"]
        async with s.get(base + "/api/run?run=ppo-b&points=16") as r:
            snap = await r.json()
        assert snap["row"]["run_id"] == "ppo-b" and snap["kl_lines"]["red"] == 0.125
        assert len(snap["series"]["step"]) <= 32 and snap["markers"][0]["onset_step"] == 28
        assert snap["active"][0]["severity"] == "red"
        async with s.get(base + "/api/run/series?run=ppo-a&metrics=kl/mean") as r:
            ser = await r.json()
        assert list(ser["raw"]) == ["kl/mean"] and len(ser["step"]) == 40
        async with s.get(base + "/api/run/dists?run=ppo-a") as r:
            assert "reward" in (await r.json())["dists"]
        async with s.get(base + "/api/run/samples?run=ppo-a&category=safety") as r:
            smp = await r.json()
        assert smp["samples"] and {x["category"] for x in smp["samples"]} == {"safety"}
        for path, status in (("/api/run?run=nope", 404), ("/api/run", 400), ("/api/run/dists?run=nope", 404),
                             ("/api/run/samples?run=nope", 404), ("/api/run/series?run=ppo-a&points=x", 400)):
            async with s.get(base + path) as r:
                assert r.status == status, path
        async with s.get(base + "/api/config") as r:
            cfg = await r.json()
        assert cfg["controls"]["enabled"] is False and "RLWATCH_OPERATOR_TOKEN" in cfg["controls"]["reason"]
        assert "kl" in cfg["charts"]
    run(go)


def test_json_never_carries_nan():
    f = Fleet()
    feed = Feed(f)
    feed.events(sim_events("ppo-a", 5, t0=time.time() - 5))
    feed.events([parse_event({"schema": 1, "kind": "step", "run_id": "ppo-a", "step": 99, "ts": time.time(),
                              "metrics": {"loss/value": "NaN", "kl/mean": "Infinity"}}, time.time())])

    async def go(s, base, fleet, control):
        async with s.get(base + "/api/run?run=ppo-a") as r:
            text = await r.text()
        assert "NaN" not in text and "Infinity" not in text
        json.loads(text)
    run(go, fleet=f)


def test_controls_are_disabled_without_a_token():
    async def go(s, base, fleet, control):
        async with s.post(base + "/api/run/command?run=ppo-a", json={"action": "pause", "reason": "x",
                                                                      "token": "anything"}) as r:
            assert r.status == 403 and "RLWATCH_OPERATOR_TOKEN" in (await r.json())["error"]
        assert not control.audit
    run(go, token=None)


def test_operator_commands_go_through_the_control_channel_signed():
    delivered: list[Command] = []

    async def go(s, base, fleet, control):
        control.subscribe("ppo-a", delivered.append)
        url = base + "/api/run/command?run=ppo-a"
        cases = [
            ({}, {"action": "pause", "reason": "r"}, 401),                                # no token
            ({"X-RLWatch-Token": "wrong"}, {"action": "pause", "reason": "r"}, 401),
            ({"X-RLWatch-Token": TOKEN}, {"action": "pause"}, 400),                       # no reason
            ({"X-RLWatch-Token": TOKEN}, {"action": "reboot", "reason": "r"}, 400),       # no such action
            ({"X-RLWatch-Token": TOKEN}, {"action": "rollback", "reason": "r", "to_step": 10_000}, 400),  # ahead
            ({"X-RLWatch-Token": TOKEN}, {"action": "adjust", "reason": "r"}, 400),       # no factors
        ]
        for headers, body, status in cases:
            async with s.post(url, json=body, headers=headers) as r:
                assert r.status == status, (headers, body, await r.text())
        assert not delivered
        async with s.post(base + "/api/run/command?run=nope", json={"action": "pause", "reason": "r"},
                          headers={"X-RLWatch-Token": TOKEN}) as r:
            assert r.status == 404
        async with s.post(url, json={"action": "pause", "reason": "grad spikes"},
                          headers={"X-RLWatch-Token": TOKEN}) as r:
            out = await r.json()
            assert r.status == 200 and out["state"] == "paused"
        cmd = delivered[-1]
        assert cmd.action == "pause" and cmd.issuer == "web:operator" and cmd.reason == "grad spikes"
        assert cmd.signature and cmd.verify(SECRET) and not cmd.verify("other")
        assert (await control.status("ppo-a")).state == "paused"
        assert fleet.row("ppo-a")["state"] == "paused"
        # the token as a form field, and as a bearer token
        async with s.post(url, data={"action": "resume", "reason": "looked fine", "token": TOKEN}) as r:
            assert r.status == 200 and (await r.json())["state"] == "running"
        async with s.post(url, json={"action": "stop", "reason": "done"},
                          headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert (await r.json())["state"] == "stopped"
        async with s.get(base + "/api/run/audit?run=ppo-a") as r:
            assert r.status == 401                   # signed commands: operators only
        async with s.get(base + "/api/run/audit?run=ppo-a", headers={"X-RLWatch-Token": TOKEN}) as r:
            audit = await r.json()
        assert audit["state"] == "stopped"
        assert [e["action"] for e in audit["history"]] == ["pause", "resume", "stop"]
        assert {e["issuer"] for e in audit["history"]} == {"web:operator"}
        assert audit["answered"] is None             # the stop is the monitor's word, not yet the run's
        stop = delivered[-1]
        for rank in (0, 1):
            control.record_ack({"type": "ack", "command_id": stop.id, "run_id": "ppo-a", "action": "stop",
                                "status": "applied", "detail": "", "rank": rank, "ts": stop.ts + 1})
        async with s.get(base + "/api/run/audit?run=ppo-a", headers={"X-RLWatch-Token": TOKEN}) as r:
            audit = await r.json()
        assert audit["answered"] == {"held": True, "said": "applied (ranks 0-1)", "ranks": 2, "world": None}
        # a run of 64 ranks: every answer counts, not only those among the history shown (50)
        for rank in range(64):
            control.record_ack({"type": "ack", "command_id": stop.id, "run_id": "ppo-a", "action": "stop",
                                "status": "applied", "detail": "", "rank": rank, "world_size": 64,
                                "ts": stop.ts + 2})
        async with s.get(base + "/api/run/audit?run=ppo-a", headers={"X-RLWatch-Token": TOKEN}) as r:
            audit = await r.json()
        assert len(audit["history"]) == 50
        assert audit["answered"] == {"held": True, "said": "applied (ranks 0-63)", "ranks": 64, "world": 64}
        async with s.get(base + "/api/config") as r:
            assert (await r.json())["controls"]["enabled"] is True
    run(go, token=TOKEN, secret=SECRET)


def test_an_operator_adjusts_and_rolls_back_a_run_from_the_web():
    """adjust with factors (JSON, or name=number in a form), rollback to the checkpoint before the
    worst open alert's onset when none is named; bad factors and unknown checkpoints are refused
    with the reason, and nothing is sent for them."""
    f = _fleet()
    summary = dict(f.summary("ppo-b"))
    summary["checkpoints"] = [[20, "/ck/20"], [29, "/ck/29"]]
    summary["open_alerts"] = [dict(summary["open_alerts"][0], rollback_to={"step": 20, "checkpoint": "/ck/20"})]
    f.observe_event(parse_event({"schema": 1, "kind": "heartbeat", "run_id": "ppo-b", "step": summary["last_step"],
                                 "ts": summary["last_event_ts"] + 1}, summary["last_event_ts"] + 1),
                    dict(summary, last_event_ts=summary["last_event_ts"] + 1))
    delivered: list[Command] = []
    auth = {"X-RLWatch-Token": TOKEN}

    async def go(s, base, fleet, control):
        control.subscribe("ppo-b", delivered.append)
        url = base + "/api/run/command?run=ppo-b"
        for body, says in [({"action": "adjust", "reason": "r", "params": {"beta": "lots"}}, "beta=lots"),
                           ({"action": "adjust", "reason": "r", "params": [1]}, "1 is not name=number"),
                           ({"action": "rollback", "reason": "r", "checkpoint": 5}, "--checkpoint must be"),
                           ({"action": "adjust", "reason": "r", "params": "beta"}, "not name=number"),
                           ({"action": "rollback", "reason": "r", "to_step": 25}, "no checkpoint at step 25"),
                           ({"action": "rollback", "reason": "r", "to_step": "x"}, "to_step must be a step")]:
            async with s.post(url, json=body, headers=auth) as r:
                assert r.status == 400 and says in (await r.json())["error"], await r.text()
        assert not delivered
        async with s.post(url, json={"action": "adjust", "reason": "KL high", "params": {"beta": 1.5}},
                          headers=auth) as r:
            assert r.status == 200, await r.text()
        async with s.post(url, data={"action": "adjust", "reason": "and lr", "params": "lr=0.5 beta=2",
                                     "token": TOKEN}) as r:
            assert r.status == 200, await r.text()
        sent_before = len(delivered)
        async with s.post(url, json={"action": "rollback", "reason": "look first", "dry_run": True},
                          headers=auth) as r:
            out = await r.json()
            assert r.status == 200 and out["would"] == {"action": "rollback",
                                                        "params": {"to_step": 20, "checkpoint": "/ck/20"}}
        assert len(delivered) == sent_before     # a dry run sends nothing
        async with s.post(url, json={"action": "rollback", "reason": "back to before it"}, headers=auth) as r:
            out = await r.json()
            assert r.status == 200 and "before the onset of its red alert kl_above_target" in out["why"]
        async with s.post(url, data={"action": "rollback", "reason": "further", "to_step": "29",
                                     "token": TOKEN}) as r:
            assert r.status == 200, await r.text()
        async with s.post(url, json={"action": "snapshot", "reason": "keep the samples"}, headers=auth) as r:
            assert r.status == 200, await r.text()
        assert [(c.action, c.params) for c in delivered] == [
            ("adjust", {"beta": 1.5}), ("adjust", {"lr": 0.5, "beta": 2.0}),
            ("rollback", {"to_step": 20, "checkpoint": "/ck/20"}),
            ("rollback", {"to_step": 29, "checkpoint": "/ck/29"}), ("snapshot", {})]
        assert all(c.verify(SECRET) and c.issuer == "web:operator" for c in delivered)
        assert (await control.status("ppo-b")).state == "running"     # neither changes the state
    run(go, fleet=f, token=TOKEN, secret=SECRET)


def test_state_set_elsewhere_reaches_the_rows():
    async def go(s, base, fleet, control):
        await control.apply(Command(run_id="ppo-a", action="pause", ts=time.time(), reason="from the CLI",
                                    issuer="cli:someone"))
        for _ in range(100):
            if fleet.row("ppo-a")["state"] == "paused":
                break
            await asyncio.sleep(0.02)
        row = fleet.row("ppo-a")
        assert row["state"] == "paused" and row["state_issuer"] == "cli:someone"
    run(go)


async def _events(resp, want: set[str], timeout: float = 5.0) -> dict[str, list]:
    """Read server-sent events until one of each name in ``want`` arrived."""
    got: dict[str, list] = {}
    name = None
    end = time.monotonic() + timeout
    while not want <= set(got) and time.monotonic() < end:
        line = (await asyncio.wait_for(resp.content.readline(), timeout)).decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name:
            got.setdefault(name, []).append(json.loads(line[6:]))
    return got


def test_server_sent_events_for_the_fleet_and_a_run():
    async def go(s, base, fleet, control):
        async with s.get(base + "/api/stream") as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            got = await _events(r, {"fleet"})
            first = got["fleet"][0]
            assert first["full"] and {x["run_id"] for x in first["rows"]} == {"ppo-a", "ppo-b"}
            feed.events(sim_events("ppo-a", 3, start=40))
            got = await _events(r, {"fleet"})
            # only changed rows travel (ppo-b's may too: its steps/s decays with the clock)
            changed = {x["run_id"]: x["last_step"] for x in got["fleet"][0]["rows"]}
            assert changed["ppo-a"] == 42 and not got["fleet"][0]["full"]
        seq = fleet.versions("ppo-a")["seq"]
        aseq = fleet.versions("ppo-a")["alert_seq"]
        async with s.get(base + f"/api/stream?run=ppo-a&since={seq}&asince={aseq}") as r:
            got = await _events(r, {"row", "changed"})
            assert got["row"][0]["run_id"] == "ppo-a"
            feed.events(sim_events("ppo-a", 2, start=43))
            fleet.observe_alert(Alert(rule="entropy_collapse", severity="orange", state="firing",
                                      run_id="ppo-a", step=44, onset_step=40))
            got = await _events(r, {"steps", "alerts"})
            steps = [row["step"] for e in got["steps"] for row in e["rows"]]
            assert steps == [43, 44]
            assert got["steps"][0]["rows"][0]["v"]["kl/mean"] is not None
            assert got["alerts"][0]["markers"][0]["rule"] == "entropy_collapse"
        async with s.get(base + "/api/stream?run=ppo-a&since=1") as r:    # too far behind
            assert "resync" in await _events(r, {"resync"})
    f = Fleet()
    feed = Feed(f)
    for r in ("ppo-a", "ppo-b"):
        feed.events(sim_events(r, 40))
    f.tail_rows = 8
    for run_ in f.runs.values():
        from collections import deque
        run_.tail = deque(run_.tail, maxlen=8)
    run(go, fleet=f)


def test_web_server_thread_on_a_free_port():
    fleet = _fleet(steps=3)
    srv = WebServer(fleet, "127.0.0.1", 0, control=MemoryControl(), token=None).start()
    try:
        assert srv.port > 0 and srv.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(srv.url + "api/fleet", timeout=5) as r:
            assert len(json.load(r)["rows"]) == 2
        with urllib.request.urlopen(srv.url + "metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain") and b"rlwatch_metric_ema" in r.read()
    finally:
        srv.stop()
    assert not srv._thread.is_alive()


def test_parse_address():
    assert parse_address("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_address("8765") == ("127.0.0.1", 8765)
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_address("0.0.0.0:0") == ("0.0.0.0", 0)
    for bad in ("localhost", "host:port", "h:99999"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_rows_of_every_worker_come_from_the_fleet_store():
    """A run another worker processes: in the rows and the counts, its cockpit drawn from its
    record's sparkline, and commands to it accepted (the run is known)."""
    from streams.fleet_store import MemoryFleetStore, make_record

    store = MemoryFleetStore()
    now = time.time()
    rec = None
    for step in range(0, 100, 5):
        rec = make_record({"run_id": "elsewhere", "incarnation": "i1", "generation": 0, "last_step": step,
                           "last_event_ts": now - 100 + step, "events": step, "world_size": 8,
                           "tags": {"team": "b"}, "targets": {"kl": 0.03},
                           "kl_lines": {"yellow": 0.045, "red": 0.075}, "open_alerts": [], "worst": None,
                           "latest": {"kl/mean": 0.02}, "smoothed": {"kl/mean": 0.018}},
                          rec, now - 100 + step, writer="host-b:7")

    async def go(s, base, fleet, control):
        await store.put([rec])
        for _ in range(100):
            async with s.get(base + "/api/fleet") as r:
                data = await r.json()
            if any(x["run_id"] == "elsewhere" for x in data["rows"]):
                break
            await asyncio.sleep(0.02)
        row = next(x for x in data["rows"] if x["run_id"] == "elsewhere")
        assert row["local"] is False and row["writer"] == "host-b:7" and row["world_size"] == 8
        assert row["kl_lines"] == {"yellow": 0.045, "red": 0.075, "target": 0.03}
        assert row["signals"]["kl/mean"] == 0.018 and row["incarnation"] == "i1"
        assert data["counts"]["runs"] == 3 and data["counts"]["worst"]["red"] == 1
        async with s.get(base + "/api/run?run=elsewhere") as r:
            snap = await r.json()
        assert snap["local"] is False and snap["series"]["step"][-1] == 95
        async with s.post(base + "/api/run/command?run=elsewhere", json={"action": "pause", "reason": "r"},
                          headers={"X-RLWatch-Token": TOKEN}) as r:
            assert r.status == 200 and (await r.json())["state"] == "paused"
        async with s.get(base + "/api/run/dists?run=elsewhere") as r:
            assert r.status == 200 and (await r.json())["dists"] == {}
    run(go, store=store, store_poll=0.02, token=TOKEN)


def test_an_operator_command_from_the_dashboard_is_told_to_the_runs_receivers():
    """The team's channel hears of a brake pulled from the dashboard (who, why, the run's state
    now); a receiver that fails is in the answer, with why no worker retries it (the workers do
    not send to it), and the command stands."""
    from alerts.announce import Announcer
    from alerts.notifiers import DeliveryError
    from alerts.outbox import MemoryOutbox
    from tests.unit.alerts._helpers import Recording

    slack, hook = Recording("slack-webhook"), Recording("webhook")
    hook.fail = DeliveryError("webhook answered 500")
    closed = []
    outbox = MemoryOutbox()         # the workers': they send to Slack only
    asyncio.run(outbox.note_receivers(["console", "slack-webhook"], time.time()))

    class Closing(Announcer):
        async def close(self):
            closed.append(True)

    def factory(control):
        assert control is not None        # made once the control channel is there
        return Closing([slack, hook], outbox=outbox)

    async def go(s, base, fleet, control):
        async with s.post(base + "/api/run/command?run=ppo-a", json={"action": "pause", "reason": "grad spikes"},
                          headers={"X-RLWatch-Token": TOKEN}) as r:
            out = await r.json()
        assert r.status == 200 and out["state"] == "paused"
        assert out["announced"] == {"sent": ["slack-webhook"], "failed": {"webhook": "DeliveryError: webhook answered 500"},
                                    "silenced": {}, "retrying": [],
                                    "unqueued": {"webhook": "no monitor worker sends to webhook (it is "
                                                            "configured only here): not kept for a retry"}}
        assert await outbox.pending() == 0
        (alert, _), = slack.sent
        assert alert.rule == "operator_command" and alert.labels["issuer"] == "web:operator"
        assert alert.summary.startswith("run ppo-a: pause sent by web:operator: grad spikes; the run is paused")
        assert alert.step == fleet.summary("ppo-a")["last_step"] > 0
        assert (await control.status("ppo-a")).state == "paused"
        # a dry run sends nothing, and tells nobody
        async with s.post(base + "/api/run/command?run=ppo-b", json={"action": "rollback", "reason": "r",
                                                                     "dry_run": True},
                          headers={"X-RLWatch-Token": TOKEN}) as r:
            assert "announced" not in await r.json()
        assert len(slack.sent) == 1
    run(go, token=TOKEN, secret=SECRET, announcer_factory=factory)
    assert closed == [True]


def test_the_cockpit_counts_only_signed_answers_to_the_brake():
    """A forged "applied" (not signed with the control secret) must not tell the operator that
    the brake holds."""
    from contract.commands import ack_signature
    from web.server import _answered

    cmd = Command(run_id="ppo-a", action="pause", ts=100.0).signed(SECRET)
    ack = {"type": "ack", "command_id": cmd.id, "run_id": "ppo-a", "action": "pause", "status": "applied",
           "detail": "", "rank": 0, "ts": 101.0}
    assert _answered(cmd, [ack], SECRET) is None
    failed = {**ack, "rank": 1, "status": "failed", "detail": "stuck in a collective"}
    signed = [{**a, "signature": ack_signature(a, SECRET)} for a in (ack, failed)]
    assert _answered(cmd, signed, SECRET) == {"held": False, "ranks": 2, "world": None,
                                              "said": "failed (rank 1): stuck in a collective; applied (rank 0)"}
    assert _answered(None, signed, SECRET) is None
    # answers that give the run's size: a pause applied by two of four ranks does not hold yet
    two = [{**a, "world_size": 4} for a in (ack, {**ack, "rank": 1})]
    assert _answered(cmd, [{**a, "signature": ack_signature(a, SECRET)} for a in two], SECRET) == \
        {"held": False, "ranks": 2, "world": 4, "said": "applied (ranks 0-1); no answer yet (ranks 2-3)"}
