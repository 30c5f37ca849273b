"""Control-channel edges against real Redis: a relaunched run is not killed by an old stop;
an operator can clear a stop; the SDK never logs the Redis password."""

from __future__ import annotations

import json
import logging
import time
import uuid

import pytest

from producers import Monitor, TrainingStopped
from contract.commands import Command
from tests.support.control import apply_command

pytestmark = pytest.mark.integration


def test_a_relaunched_run_ignores_a_stop_from_before_it_started(services):
    run = f"relaunch-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], Command(run_id=run, action="stop", ts=time.time(), reason="old"))
    time.sleep(0.05)
    mon = Monitor(run, kafka=False, redis=services["redis"], heartbeat_seconds=0)
    try:
        assert mon.control.wait_ready(10) and mon.control.connected
        mon.step_boundary()          # not stopped by the previous incarnation's stop
        assert mon.state == "running"
        apply_command(services["redis"], Command(run_id=run, action="stop", ts=time.time(), reason="now"))
        deadline = time.time() + 10
        while mon.state != "stopped" and time.time() < deadline:
            time.sleep(0.02)
        with pytest.raises(TrainingStopped):
            mon.step_boundary()      # a stop issued while it runs still stops it
    finally:
        mon.close()


def test_an_operator_resume_clears_a_stop(services):
    run = f"clear-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], Command(run_id=run, action="stop", ts=time.time()))
    state = apply_command(services["redis"], Command(run_id=run, action="resume", ts=time.time()))
    assert state.state == "running"


def test_the_sdk_does_not_log_the_redis_password(services, caplog):
    url = services["redis"].replace("redis://", "redis://:s3cret-pw@")
    caplog.set_level(logging.DEBUG)
    mon = Monitor(f"pw-{uuid.uuid4().hex[:6]}", kafka=False, redis=url, heartbeat_seconds=0)
    try:
        mon.control.wait_ready(10)
        time.sleep(1.5)
    finally:
        mon.close()
    assert "s3cret-pw" not in caplog.text


def test_an_adjust_sent_while_the_worker_was_away_is_applied_when_it_connects(services):
    run = f"away-{uuid.uuid4().hex[:6]}"
    apply_command(services["redis"], Command(run_id=run, action="adjust", params={"beta": 1.5},
                                      ts=time.time(), reason="kl rising"))
    got = []
    # the worker started (its first reading of the clock says) before the command, but connects
    # only now
    started = [time.time() - 30]
    mon = Monitor(run, kafka=False, redis=services["redis"], heartbeat_seconds=0,
                  clock=lambda: started.pop() if started else time.time(),
                  on_adjust=lambda params, cmd: got.append(params))
    try:
        assert mon.control.wait_ready(10)
        deadline = time.time() + 5
        while not got and time.time() < deadline:
            mon.step_boundary()
            time.sleep(0.02)
        assert got == [{"beta": 1.5}]
    finally:
        mon.close()


def test_the_cli_says_what_each_rank_of_a_paused_run_answered_to_an_adjust_and_a_rollback(services):
    """`rlwatch adjust` / `rollback` / `snapshot` wait for the answers of the run's ranks (as
    many as its fleet record's world size): "applied" by all is printed; a rank without the
    callback ("ignored") or whose callback raised ("failed") exits 3, saying which rank
    answered what; a rank that does not answer exits 4. With a control secret, only signed
    answers count."""
    import asyncio
    import os
    import subprocess
    import sys
    import threading

    from alerts.control import RedisControl
    from streams.fleet_store import FleetStore, make_record
    from tests.integration.conftest import ROOT

    secret = "edges-" + uuid.uuid4().hex[:6]
    app = "answers-" + uuid.uuid4().hex[:6]
    run = f"answers-{uuid.uuid4().hex[:6]}"
    rolled: list[dict] = []

    async def record():          # what a worker would have written: a run of two ranks
        control = RedisControl(services["redis"])
        try:
            now = time.time()
            await FleetStore(control.redis, app).put([make_record(
                {"run_id": run, "last_step": 10, "last_event_ts": now, "world_size": 2, "open_alerts": []},
                None, now)])
        finally:
            await control.close()
    asyncio.run(record())

    def broken(params, cmd):
        raise RuntimeError("no such parameter: gamma")

    # rank 0 can roll back and adjusts badly; rank 1 has neither callback
    mons = [Monitor(run, kafka=False, redis=services["redis"], heartbeat_seconds=0, control_secret=secret,
                    rank=0, world_size=2, on_adjust=broken, on_rollback=lambda p, c: rolled.append(p)),
            Monitor(run, kafka=False, redis=services["redis"], heartbeat_seconds=0, control_secret=secret,
                    rank=1, world_size=2)]
    halt = threading.Event()

    def train(mon):
        while not halt.is_set():
            try:
                mon.step_boundary()
            except TrainingStopped:
                return
            time.sleep(0.02)
    trainers = [threading.Thread(target=train, args=(m,), daemon=True) for m in mons]
    env = dict(os.environ, RLWATCH_REDIS=services["redis"], RLWATCH_CONTROL_SECRET=secret, RLWATCH_APP_ID=app)

    def rlwatch(*args, **extra):
        return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT,
                              env=dict(env, **extra), capture_output=True, text=True, timeout=60)
    try:
        for m in mons:
            assert m.control.wait_ready(10) and m.control.connected
        for t in trainers:
            t.start()
        out = rlwatch("pause", run, "--wait", "10")
        assert out.returncode == 0 and f"{run} answered: applied (ranks 0-1)" in out.stdout, out
        out = rlwatch("rollback", run, "--to-step", "3", "--checkpoint", "/ck/3")
        assert out.returncode == 3, out
        assert out.stderr.strip() == (f"rlwatch rollback: run {run} answered ignored (rank 1): "
                                      f"no on_rollback callback; applied (rank 0)"), out.stderr
        assert rolled == [{"to_step": 3, "checkpoint": "/ck/3"}]
        out = rlwatch("adjust", run, "gamma=0.5")
        assert out.returncode == 3, out
        assert ("answered failed (rank 0): no such parameter: gamma; ignored (rank 1): no on_adjust "
                "callback") in out.stderr, out.stderr
        out = rlwatch("snapshot", run)
        assert out.returncode == 3 and "answered ignored (ranks 0-1): no on_snapshot callback" in out.stderr, out
        assert all(m.state == "paused" for m in mons)
        out = rlwatch("adjust", run, "beta=2", "--wait", "0")         # not waited for
        assert out.returncode == 0 and "answered" not in out.stdout and "note: the run's script" in out.stdout
        # another secret: the ranks refuse the command, and no answer comes
        out = rlwatch("rollback", run, "--to-step", "3", "--checkpoint", "/ck/3", "--wait", "1.5",
                      RLWATCH_CONTROL_SECRET="not-the-secret")
        assert out.returncode == 4 and f"{run}: no answer within 1.5s" in out.stdout, out
        # rank 1 is gone: rank 0's answer alone does not confirm the command
        mons[1].close()
        out = rlwatch("rollback", run, "--to-step", "4", "--checkpoint", "/ck/4", "--wait", "2")
        assert out.returncode == 4, out
        assert f"{run} answered: applied (rank 0); no answer yet (rank 1)" in out.stdout, out
        out = rlwatch("resume", run, "--wait", "2")
        assert out.returncode == 4 and "applied (rank 0): resumed at step" in out.stdout, out
    finally:
        halt.set()
        for m in mons:
            m.close()
        for t in trainers:
            t.join(5)


def test_a_command_needs_force_only_for_a_run_nobody_knows(services):
    """A run the control channel knows (a command was sent to it) takes commands without
    --force, though no worker has written its fleet record; an unknown one (a typo) is refused."""
    import os
    import subprocess
    import sys

    from tests.integration.conftest import ROOT

    env = dict(os.environ, RLWATCH_REDIS=services["redis"], RLWATCH_APP_ID="force-" + uuid.uuid4().hex[:6])
    known, typo = f"known-{uuid.uuid4().hex[:6]}", f"typo-{uuid.uuid4().hex[:6]}"

    def rlwatch(*args):
        return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
    assert rlwatch("adjust", known, "beta=2").returncode == 1
    assert rlwatch("pause", known, "--force").returncode == 0
    out = rlwatch("adjust", known, "beta=2", "--wait", "0")
    assert out.returncode == 0 and f"{known}: paused (adjust beta=2 sent" in out.stdout, out
    out = rlwatch("rollback", typo, "--to-step", "3", "--checkpoint", "/ck/3")
    assert out.returncode == 1 and f"no run {typo!r} is known" in out.stderr, out


def test_a_command_sent_by_hand_is_told_to_the_runs_receivers(services, recorder):
    """`rlwatch pause` tells the run's Slack (webhook and bot) and webhook receivers who paused
    it and why, as a worker would route an alert; a receiver that cannot be reached is named on
    stderr and the command stands; --no-announce tells nobody."""
    import getpass
    import os
    import subprocess
    import sys

    from tests.integration.conftest import ROOT
    from tests.support.ports import free_port

    run = f"by-hand-{uuid.uuid4().hex[:6]}"
    env = dict(os.environ, RLWATCH_REDIS=services["redis"], RLWATCH_APP_ID="by-hand-" + uuid.uuid4().hex[:6],
               RLWATCH_SLACK_WEBHOOK=f"{recorder.url}/slack/webhook", RLWATCH_SLACK_TOKEN="test-bot-token",
               RLWATCH_SLACK_CHANNEL="#rl-alerts", RLWATCH_SLACK_API_URL=f"{recorder.url}/api/",
               RLWATCH_WEBHOOK_URL=f"{recorder.url}/hook")
    env.pop("RLWATCH_ROUTES", None)

    def rlwatch(*args, **extra):
        return subprocess.run([sys.executable, "-m", "rlwatch", *args], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=60)

    out = rlwatch("pause", run, "--force", "--reason", "grad norm spikes")
    assert out.returncode == 0, out
    assert f"{run}: told slack-webhook, slack-bot, webhook" in out.stdout, out
    assert "operator_command" not in out.stdout          # no alert JSON on the operator's terminal
    who = f"cli:{getpass.getuser()}"
    (hook,) = recorder.on("/hook")
    body = hook.json()
    assert body["fingerprint"] in hook.headers["Idempotency-Key"]
    assert (body["rule"], body["severity"], body["run_id"]) == ("operator_command", "info", run)
    assert body["labels"]["command"] == "pause" and body["labels"]["issuer"] == who
    assert body["summary"] == f"run {run}: pause sent by {who}: grad norm spikes; the run is paused"
    (slack,) = recorder.on("/slack/webhook")
    assert f"pause sent by {who}: grad norm spikes" in slack.json()["text"]
    (bot,) = recorder.on("/api/chat.postMessage")
    assert bot.form_or_json()["channel"] == "#rl-alerts"

    # a second command's notice is not a repeat of the first to a receiver that drops repeats
    out = rlwatch("snapshot", run, "--wait", "0", "--reason", "keep samples")
    assert out.returncode == 0 and f"{run}: told slack-webhook, slack-bot, webhook" in out.stdout, out
    first, second = recorder.on("/hook")
    assert second.json()["summary"] == (f"run {run}: snapshot sent by {who}: keep samples; the run is paused "
                                        "(the script applies it at its next step boundary)")
    keys = [h.headers["Idempotency-Key"] for h in (first, second)]
    assert keys[0] != keys[1] and all(h.json()["fingerprint"] in k for h, k in zip((first, second), keys))

    # a worker of the deployment sends to the webhook (its timer says so in the outbox)
    import asyncio

    from alerts.factory import build_dispatcher
    from contract.settings import Settings

    async def a_worker_ticks(*later: float) -> None:
        d = build_dispatcher(Settings(redis=services["redis"], app_id=env["RLWATCH_APP_ID"],
                                      webhook_url=f"{recorder.url}/hook"))
        try:
            for t in later:
                await d.tick(time.time() + t)
        finally:
            await d.close()

    asyncio.run(a_worker_ticks(0))
    # the webhook unreachable: said on stderr, the others told, the command applied
    dead = f"http://127.0.0.1:{free_port()}/hook"
    out = rlwatch("resume", run, "--reason", "looked fine", RLWATCH_WEBHOOK_URL=dead)
    assert out.returncode == 0, out
    assert f"{run}: running (resume sent" in out.stdout and f"{run}: told slack-webhook, slack-bot" in out.stdout
    assert "rlwatch resume: the command was sent, but telling webhook failed" in out.stderr, out
    assert "a worker retries it" in out.stderr, out
    assert len(recorder.on("/slack/webhook")) == 3 and len(recorder.on("/hook")) == 2
    # the notice was kept in the deployment's outbox: a worker's timer sends it once the webhook
    # answers again (here: a worker whose webhook is reachable), once
    asyncio.run(a_worker_ticks(120, 300))
    hooks = recorder.on("/hook")
    assert len(hooks) == 3 and hooks[2].json()["summary"] == f"run {run}: resume sent by {who}: looked fine; the run is running"
    # the bot: the run's first notice starts a thread; a snapshot goes in it, quietly; a resume
    # (a change of the run's state) goes in it and to the channel
    first_bot, snap_bot, resume_bot = (q.form_or_json() for q in recorder.on("/api/chat.postMessage"))
    assert "thread_ts" not in first_bot
    assert snap_bot.get("thread_ts") and not snap_bot.get("reply_broadcast")
    assert resume_bot.get("thread_ts") == snap_bot["thread_ts"]
    assert str(resume_bot.get("reply_broadcast")).lower() == "true"
    status = rlwatch("status", run, "--json")
    assert json.loads(status.stdout)["state"] == "running"

    # a receiver setting that is wrong does not keep the brake from being sent
    out = rlwatch("pause", run, RLWATCH_SLACK_CHANNEL="")
    assert out.returncode == 0 and f"{run}: paused (pause sent" in out.stdout, out
    assert "the command was sent, but its receivers are not configured right" in out.stderr
    assert "RLWATCH_SLACK_CHANNEL" in out.stderr

    # a silence of the run mutes its notices: the operator is told so
    out = rlwatch("silence", "add", f"run={run}", "--duration", "10m", "--comment", "noisy run")
    assert out.returncode == 0, out
    out = rlwatch("resume", run, "--reason", "checked")
    assert out.returncode == 0 and f"{run}: not told (silenced): slack-webhook (silence " in out.stdout, out
    assert ": told " not in out.stdout
    assert len(recorder.on("/hook")) == 3 and len(recorder.on("/slack/webhook")) == 3

    out = rlwatch("stop", run, "--no-announce")
    assert out.returncode == 0 and ": told " not in out.stdout and f"{run}: stopped" in out.stdout, out
    assert len(recorder.on("/hook")) == 3 and len(recorder.on("/slack/webhook")) == 3


def test_a_notice_for_a_receiver_only_the_operator_has_is_not_kept_for_a_retry(services, recorder):
    """The operator's shell has a webhook the workers do not (RLWATCH_WEBHOOK_URL set for the
    CLI only): its notice, failed, is not left in the outbox, where no worker would ever send
    it, and the operator reads why; the Slack the workers send to, failed too, is kept and a
    worker sends it later. Notices an older version kept for such a receiver are dead-lettered
    by a worker once old."""
    import asyncio
    import os
    import subprocess
    import sys

    import redis.asyncio as aioredis

    from alerts.delivery import notice_item
    from alerts.factory import build_dispatcher, namespace
    from alerts.operator import operator_notice
    from alerts.outbox import RedisOutbox
    from contract.settings import Settings
    from tests.integration.conftest import ROOT
    from tests.support.ports import free_port

    app, run = "only-here-" + uuid.uuid4().hex[:6], f"only-here-{uuid.uuid4().hex[:6]}"
    worker_settings = Settings(redis=services["redis"], app_id=app, slack_webhook=f"{recorder.url}/slack/webhook")
    ns = namespace(worker_settings)

    async def a_worker_ticks(*later: float, strays: bool = False) -> None:
        d = build_dispatcher(worker_settings)
        try:
            for t in later:
                await d.tick(time.time() + t)
            if strays:
                await d.drainer.bury_strays(time.time())
        finally:
            await d.close()

    async def in_redis(what):
        r = aioredis.from_url(services["redis"])
        try:
            return await what(r, RedisOutbox(r, ns))
        finally:
            await r.aclose()

    asyncio.run(a_worker_ticks(0))

    async def noted(r, box):
        return sorted((await r.hgetall(f"{ns}:outbox:receivers")).keys()), sorted(await box.receivers_seen())
    assert asyncio.run(in_redis(noted)) == ([b"console", b"slack-webhook"], ["console", "slack-webhook"])

    dead = f"http://127.0.0.1:{free_port()}"
    env = dict(os.environ, RLWATCH_REDIS=services["redis"], RLWATCH_APP_ID=app,
               RLWATCH_SLACK_WEBHOOK=f"{dead}/slack", RLWATCH_WEBHOOK_URL=f"{dead}/hook")
    env.pop("RLWATCH_ROUTES", None)
    out = subprocess.run([sys.executable, "-m", "rlwatch", "pause", run, "--force", "--reason", "spikes"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"{run}: paused (pause sent" in out.stdout, out
    said = [line for line in out.stderr.splitlines() if line.startswith("rlwatch pause: ")]
    assert len(said) == 2, out
    assert "telling slack-webhook failed" in said[0] and said[0].endswith("; a worker retries it"), said
    assert "telling webhook failed" in said[1] and said[1].endswith(
        "; no monitor worker sends to webhook (it is configured only here): not kept for a retry"), said

    async def pending(r, box):
        return await box.pending("slack-webhook"), await box.pending("webhook"), await box.pending()
    assert asyncio.run(in_redis(pending)) == (1, 0, 1)
    asyncio.run(a_worker_ticks(120, 300))          # the worker's Slack answers: sent, once
    (slack,) = recorder.on("/slack/webhook")
    assert f"run {run}: pause sent by" in slack.json()["text"]
    assert asyncio.run(in_redis(pending)) == (0, 0, 0)

    # a notice an older version kept for the webhook (no worker sends to it): dead-lettered once old
    async def kept_long_ago(r, box):
        from alerts.delivery import STRAY_AGE

        then = time.time() - STRAY_AGE - 60
        notice = operator_notice(Command(run_id=run, action="stop", ts=then), "stopped", then)
        await box.enqueue(notice_item(notice, "webhook", then, then + 1, attempts=1))
        return await box.queued_receivers()
    assert asyncio.run(in_redis(kept_long_ago)) == ["webhook"]
    asyncio.run(a_worker_ticks(strays=True))

    async def buried(r, box):
        return await box.pending(), [it.last_error for it in await box.dead("webhook")]
    assert asyncio.run(in_redis(buried)) == (0, ["no monitor worker sends to webhook"])

    # a receiver no worker has noted for a day (renamed, dropped) leaves the outbox's list
    async def noted_long_ago(r, box):
        from alerts.delivery import FORGET_AFTER

        await box.note_receivers(["old-pager"], time.time() - FORGET_AFTER - 60)
        return sorted(await box.receivers_seen())
    assert asyncio.run(in_redis(noted_long_ago)) == ["console", "old-pager", "slack-webhook"]
    asyncio.run(a_worker_ticks(strays=True))
    assert asyncio.run(in_redis(noted)) == ([b"console", b"slack-webhook"], ["console", "slack-webhook"])
