"""The control channel's rules on a real redis-server (alerts.control.RedisControl): a command
is applied once whoever sends it and however often, every send publishes it again for workers
that missed it, two workers racing with the same brake apply it once, a brake sent again never
undoes an operator's later resume, and a state record nobody signed is not trusted."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

import pytest
import redis as redis_sync

from alerts.control import RedisControl
from contract.commands import Command, ack_signature, acks_key, applied_key, audit_key, channel, state_key
from tests.support.redis_trips import counting_round_trips

pytestmark = pytest.mark.integration

SECRET = "control-" + uuid.uuid4().hex[:8]


def run(coro):
    return asyncio.run(coro)


def audit(r, run_id: str) -> list[dict]:
    return [json.loads(f[b"entry"]) for _, f in r.xrange(audit_key(run_id))]


def listening(services, runs: list[str]):
    """A subscription to these runs' control channels (subscribed before anything is sent)."""
    sub = redis_sync.Redis.from_url(services["redis"]).pubsub()
    sub.subscribe(*[channel(rid) for rid in runs])
    return sub


def heard(sub, n: int, seconds: float = 5.0) -> dict[str, list[Command]]:
    """The commands published on ``sub``'s channels, by run, until ``n`` came (or the time
    ran out); the subscription is closed."""
    got: dict[str, list[Command]] = {}
    deadline = time.time() + seconds
    while time.time() < deadline and sum(len(v) for v in got.values()) < n:
        m = sub.get_message(timeout=0.2)
        if m and m["type"] == "message":
            c = Command.model_validate_json(m["data"])
            got.setdefault(c.run_id, []).append(c)
    sub.close()
    return got


@pytest.fixture
def rid(services) -> str:
    return "ctl-" + uuid.uuid4().hex[:8]


async def warm_lane(services, rid: str):
    """(control channel, acknowledgement tracker, brake lane) on the shared Redis, connected
    and their scripts known to Redis (a snapshot of another run pulled first)."""
    from alerts.brake import BrakeLane
    from alerts.escalation import RedisAcks

    control = RedisControl(services["redis"], SECRET)
    acks = RedisAcks(control.redis, f"rlwatch:{rid}", SECRET)
    lane = BrakeLane(control, acks, clock=time.time, secret=SECRET)
    await lane.pull([Command(run_id=rid + "-warm", action="snapshot", ts=time.time()).signed(SECRET)])
    for script in acks.scripts:      # (a snapshot is not tracked: the tracker's script too)
        script.sha = await control.redis.script_load(script.script)
    return control, acks, lane


def test_a_command_is_applied_once_and_published_every_time_it_is_sent(services, rid):
    r = redis_sync.Redis.from_url(services["redis"])
    sub = r.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel(rid))
    cmd = Command(run_id=rid, action="pause", ts=time.time(), reason="test").signed(SECRET)

    async def go():
        control = RedisControl(services["redis"], SECRET)
        try:
            return [await control.send(cmd), await control.send(cmd), await control.send(cmd)], \
                await control.status(rid)
        finally:
            await control.close()
    try:
        firsts, status = run(go())
        assert firsts == [True, False, False]
        assert status.state == "paused" and status.command.id == cmd.id
        assert [e["id"] for e in audit(r, rid)] == [cmd.id]          # one audit entry
        assert r.exists(applied_key(cmd.id))
        got = []
        deadline = time.time() + 5
        while len(got) < 3 and time.time() < deadline:
            m = sub.get_message(timeout=0.2)
            if m:
                got.append(json.loads(m["data"])["id"])
        assert got == [cmd.id] * 3                                    # published each time
    finally:
        sub.close()
        r.close()


def test_two_workers_sending_the_same_brake_at_once_apply_it_once(services, rid):
    cmd = Command(run_id=rid, action="pause", ts=time.time()).signed(SECRET)

    async def go():
        a, b = RedisControl(services["redis"], SECRET), RedisControl(services["redis"], SECRET)
        try:
            return await asyncio.gather(*[(a if i % 2 else b).send(cmd) for i in range(20)])
        finally:
            await a.close()
            await b.close()
    firsts = run(go())
    assert firsts.count(True) == 1
    with redis_sync.Redis.from_url(services["redis"]) as r:
        assert [e["id"] for e in audit(r, rid)] == [cmd.id]


def test_a_brake_sent_again_never_undoes_a_later_resume(services, rid):
    pause = Command(run_id=rid, action="pause", ts=time.time()).signed(SECRET)
    resume = Command(run_id=rid, action="resume", ts=time.time() + 1, issuer="operator").signed(SECRET)

    async def go():
        control = RedisControl(services["redis"], SECRET)
        try:
            assert await control.send(pause)
            assert await control.send(resume)
            assert not await control.send(pause)        # the brake lane's retry, or a successor's
            return await control.status(rid)
        finally:
            await control.close()
    status = run(go())
    assert status.state == "running" and status.command.id == resume.id


def test_a_state_record_nobody_signed_is_not_trusted(services, rid, caplog):
    with redis_sync.Redis.from_url(services["redis"]) as r:
        forged = Command(run_id=rid, action="stop", ts=time.time()).signed("not-the-secret")
        r.set(state_key(rid), json.dumps({"run_id": rid, "state": "stopped",
                                          "command": json.loads(forged.model_dump_json())}))
    pause = Command(run_id=rid, action="pause", ts=time.time()).signed(SECRET)

    async def go():
        control = RedisControl(services["redis"], SECRET)
        try:
            before = await control.status(rid)
            took = await control.send(pause)
            return before, took, await control.status(rid)
        finally:
            await control.close()
    with caplog.at_level(logging.ERROR, logger="rlwatch.alerts"):
        before, took, after = run(go())
    assert before.state == "running"                   # the planted stop is ignored...
    assert any("no valid signed command" in r.getMessage() for r in caplog.records)
    assert took and after.state == "paused" and after.command.id == pause.id   # ...and replaced


def test_a_state_changed_by_another_client_is_read_again_before_the_next_brake(services, rid):
    """Each client starts a send from the state it last saw; one changed since by someone else
    (an operator's stop, a state deleted by hand) is read again, and the brake applies to it."""
    pause = Command(run_id=rid, action="pause", ts=time.time()).signed(SECRET)
    stop = Command(run_id=rid, action="stop", ts=time.time() + 1, issuer="operator").signed(SECRET)
    pause2 = Command(run_id=rid, action="pause", ts=time.time() + 2).signed(SECRET)
    resume = Command(run_id=rid, action="resume", ts=time.time() + 3, issuer="operator").signed(SECRET)
    pause3 = Command(run_id=rid, action="pause", ts=time.time() + 4).signed(SECRET)

    async def go():
        worker, operator = RedisControl(services["redis"], SECRET), RedisControl(services["redis"], SECRET)
        try:
            assert await worker.send(pause)
            assert await operator.send(stop)               # the worker still thinks "paused"
            assert await worker.send(pause2)               # a pause never lifts a stop
            after_stop = await worker.status(rid)
            assert await operator.send(resume)
            with redis_sync.Redis.from_url(services["redis"]) as r:
                r.delete(state_key(rid))                   # and then the record is gone
            assert await worker.send(pause3)
            return after_stop, await worker.status(rid)
        finally:
            await worker.close()
            await operator.close()
    after_stop, last = run(go())
    assert after_stop.state == "stopped" and after_stop.command.id == stop.id
    assert last.state == "paused" and last.command.id == pause3.id
    with redis_sync.Redis.from_url(services["redis"]) as r:
        assert [e["id"] for e in audit(r, rid)] == [pause.id, stop.id, pause2.id, resume.id, pause3.id]


def test_a_lanes_brake_of_several_commands_lands_in_one_round_trip_in_order_and_tracked(services, rid):
    """The brake lane sends an alert's commands and their acknowledgement tracking together
    (RedisControl.send_all): one round trip for a stop, a rollback and a snapshot, applied in
    order, the stop waiting for its acknowledgement; sent again by a successor, nothing is
    applied twice."""
    from alerts.brake import BrakeLane

    r = redis_sync.Redis.from_url(services["redis"])
    now = time.time()
    cmds = [Command(run_id=rid, action=a, ts=now, reason="test", step=7).signed(SECRET)
            for a in ("stop", "rollback", "snapshot")]
    trips = [0]

    async def go():
        control, acks, lane = await warm_lane(services, rid)     # (nothing of it counted)
        try:
            with counting_round_trips() as count:
                first = await lane.pull(cmds)
            trips[0] = count[0]
            again = await BrakeLane(control, acks, clock=time.time, secret=SECRET).pull(cmds)
            return first, again, await control.status(rid), await acks.outstanding()
        finally:
            await control.close()

    first, again, status, waiting = run(go())
    assert [c.action for c in first] == ["stop", "rollback", "snapshot"] and again == []
    assert trips[0] == 1
    assert status.state == "stopped" and status.command.id == cmds[0].id
    assert [e["action"] for e in audit(r, rid)] == ["stop", "rollback", "snapshot"]
    assert [c.id for c in waiting] == [cmds[0].id]           # the stop waits for its ack


def test_a_lanes_brake_on_a_state_changed_under_it_goes_one_by_one_and_keeps_its_order(services, rid):
    """Another writer resumed the run since this client last saw it paused: the commands sent
    together expected the wrong state, were not applied, and go one by one after, in order."""
    from alerts.brake import BrakeLane

    r = redis_sync.Redis.from_url(services["redis"])
    now = time.time()
    pause = Command(run_id=rid, action="pause", ts=now, reason="test").signed(SECRET)
    resume = Command(run_id=rid, action="resume", ts=now + 1, reason="operator").signed(SECRET)
    later = [Command(run_id=rid, action=a, ts=now + 2, reason="test", step=9).signed(SECRET)
             for a in ("pause", "snapshot")]

    async def go():
        control, other = RedisControl(services["redis"], SECRET), RedisControl(services["redis"], SECRET)
        try:
            await control.send(pause)              # this client saw the run paused
            await other.send(resume)               # another resumed it since
            together = control.send_all
            answers = []

            async def send_all(*a, **kw):
                answers.append(await together(*a, **kw))
                return answers[-1]
            control.send_all = send_all
            fresh = await BrakeLane(control, clock=time.time, secret=SECRET).pull(later)
            assert answers == [[None, None]]       # both expected "paused": not applied
            return fresh, await control.status(rid)
        finally:
            await control.close()
            await other.close()

    fresh, status = run(go())
    assert [c.action for c in fresh] == ["pause", "snapshot"]
    assert status.state == "paused" and status.command.id == later[0].id
    assert [e["action"] for e in audit(r, rid)] == ["pause", "resume", "pause", "snapshot"]


def test_a_tick_checks_the_brakes_of_many_runs_in_as_many_round_trips_as_of_one(services):
    """RedisAcks.check reads every run's acknowledgements and control state in one round trip:
    a fleet with brakes outstanding on many runs costs a tick no more trips than one run. An
    acknowledged brake (signed) and one a later command overtook are settled; a brake past
    the timeout without either is escalated, once."""
    from alerts.escalation import RedisAcks
    from contract.commands import ack_signature, acks_key

    ns = "rlwatch:acks-" + uuid.uuid4().hex[:8]
    r = redis_sync.Redis.from_url(services["redis"])

    async def pauses(control, acks, runs, now):
        out = []
        for rid in runs:
            cmd = Command(run_id=rid, action="pause", ts=now, reason="test", step=3).signed(SECRET)
            await control.send(cmd)
            await acks.expect(cmd)
            out.append(cmd)
        return out

    async def tick(acks, now) -> tuple[int, tuple]:
        with counting_round_trips() as count:
            got = await acks.check(now, timeout=60)
        return count[0], got

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, ns, SECRET)
        now = time.time()
        try:
            await control.redis.ping()
            one = await pauses(control, acks, ["acks-a-" + uuid.uuid4().hex[:6]], now)
            alone = (await tick(acks, now + 1))[0]
            many = await pauses(control, acks, [f"acks-{k}-" + uuid.uuid4().hex[:6] for k in range(12)],
                                now)
            fleet = (await tick(acks, now + 1))[0]
            # the first of the fleet acknowledges (signed), the second is resumed by an operator
            ack = {"type": "ack", "command_id": many[0].id, "run_id": many[0].run_id, "ts": now + 2}
            ack["signature"] = ack_signature(ack, SECRET)
            r.hset(acks_key(many[0].run_id), many[0].id, json.dumps(ack))
            await control.send(Command(run_id=many[1].run_id, action="resume", ts=now + 2,
                                       reason="operator").signed(SECRET))
            _, first = await tick(acks, now + 61)
            _, again = await tick(acks, now + 62)
            left = {c.id for c in await acks.outstanding()}
            return alone, fleet, first, again, left, one, many
        finally:
            await control.close()

    alone, fleet, first, again, left, one, many = run(go())
    assert fleet == alone, (alone, fleet)
    assert sorted(s.command_id for s in first.overdue) == sorted(c.id for c in [*one, *many[2:]])
    # the acknowledged brake is confirmed with its acknowledgement; the one overtaken by the
    # operator's resume is not (nobody applied it)
    assert [(s.command_id, [a["command_id"] for a in answers.values()]) for s, answers in first.confirmed] == \
        [(many[0].id, [many[0].id])]
    assert again.overdue == [] and again.confirmed == []     # escalated once, confirmed once
    assert many[0].id not in left and many[1].id not in left


def test_a_rules_adjust_and_rollback_are_answered_once_never_resent_nor_escalated(services):
    """RedisAcks keeps a rule's adjust and rollback (sent together with its brake, in the
    brake's round trip) until a rank answers: the answer is returned once, with every rank's
    answer from the run's audit stream; an unanswered one is never re-sent or escalated, and is
    forgotten after a day."""
    from alerts.brake import BrakeLane
    from alerts.escalation import FORGET_AFTER, RedisAcks

    ns = "rlwatch:asked-" + uuid.uuid4().hex[:8]
    rid = "asked-" + uuid.uuid4().hex[:6]
    r = redis_sync.Redis.from_url(services["redis"])

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, ns, SECRET)
        lane = BrakeLane(control, acks, clock=time.time, secret=SECRET)
        now = time.time()
        try:
            cmds = [Command(run_id=rid, action=a, ts=now, rule="kl_rising", severity="orange", step=30,
                            params=p).signed(SECRET)
                    for a, p in (("adjust", {"beta": 1.5}), ("rollback", {"to_step": 20, "checkpoint": "/ck/20"}))]
            await lane.pull(cmds)
            quiet = await acks.check(now + 120, timeout=60)
            resent = await acks.due_again(now + 120, 5.0, 60.0)
            for rank in (0, 1):       # each rank answers the adjust, as the SDK's listener writes it
                ack = {"type": "ack", "command_id": cmds[0].id, "run_id": rid, "action": "adjust",
                       "status": "ignored", "detail": "no on_adjust callback", "rank": rank, "ts": now + 1}
                ack["signature"] = ack_signature(ack, SECRET)
                r.xadd(audit_key(rid), {"entry": json.dumps(ack)})
                r.hset(acks_key(rid), cmds[0].id, json.dumps(ack))
            first = await acks.check(now + 121, timeout=60)
            again = await acks.check(now + 122, timeout=60)
            left = r.hkeys(acks.asked)
            await acks.check(now + FORGET_AFTER + 1, timeout=60)
            return cmds, quiet, resent, first, again, left, r.hkeys(acks.asked)
        finally:
            await lane.close()
            await control.close()

    cmds, quiet, resent, first, again, left, gone = run(go())
    assert (quiet.overdue, quiet.late, quiet.confirmed) == ([], [], []) and resent == []
    ((sent, answers),) = first.confirmed
    assert (sent.command_id, sent.action, sent.said) == (cmds[0].id, "adjust", "adjust beta=1.5")
    assert sorted(answers) == [0, 1] and {a["status"] for a in answers.values()} == {"ignored"}
    assert again.confirmed == [] and [k.decode() for k in left] == [cmds[1].id]
    assert gone == []
    r.close()


def test_a_brake_is_confirmed_once_every_rank_answered_or_after_the_timeout(services):
    """With the run's world size in its acknowledgements, RedisAcks keeps an acknowledged brake
    until each rank answered (read from the run's audit stream), then returns it once with all
    the answers; a brake with a rank still silent is returned at the timeout, naming it. Neither
    escalates: a rank answered."""
    from alerts.escalation import RedisAcks
    from alerts.notices import acknowledged_notice

    ns = "rlwatch:world-" + uuid.uuid4().hex[:8]
    r = redis_sync.Redis.from_url(services["redis"])

    def answer(cmd, rank, now):
        ack = {"type": "ack", "command_id": cmd.id, "run_id": cmd.run_id, "action": "pause",
               "status": "applied", "rank": rank, "world_size": 3, "ts": now}
        ack["signature"] = ack_signature(ack, SECRET)
        r.xadd(audit_key(cmd.run_id), {"entry": json.dumps(ack)})
        r.hset(acks_key(cmd.run_id), cmd.id, json.dumps(ack))

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, ns, SECRET)
        now = time.time()
        try:
            cmds = []
            for k in range(2):
                cmd = Command(run_id=f"world-{k}-" + uuid.uuid4().hex[:6], action="pause", ts=now,
                              rule="kl_spike", severity="red", step=9).signed(SECRET)
                await control.send(cmd)
                await acks.expect(cmd)
                cmds.append(cmd)
            for k, cmd in enumerate(cmds):
                answer(cmd, 0, now + 1)
                answer(cmd, 1, now + 1)
            early = await acks.check(now + 2, timeout=60)
            answer(cmds[0], 2, now + 3)
            full = await acks.check(now + 4, timeout=60)
            waiting = {c.id for c in await acks.outstanding()}
            late = await acks.check(now + 61, timeout=60)
            after = await acks.check(now + 62, timeout=60)
            return cmds, early, full, waiting, late, after, {c.id for c in await acks.outstanding()}
        finally:
            await control.close()

    cmds, early, full, waiting, late, after, left = run(go())
    assert (early.overdue, early.confirmed) == ([], [])                  # rank 2 of each: not yet
    ((s, answers),) = full.confirmed
    assert s.command_id == cmds[0].id and sorted(answers) == [0, 1, 2]
    assert waiting == {cmds[1].id}                                       # kept for its last rank
    ((s, answers),) = late.confirmed
    assert s.command_id == cmds[1].id and sorted(answers) == [0, 1] and late.overdue == []
    n = acknowledged_notice(s, answers, s.ts + 61)
    assert n.labels["ack_status"] == "partial" and n.summary.endswith("rank 2 did not answer within 61s")
    assert (after.overdue, after.late, after.confirmed) == ([], [], []) and left == set()
    r.close()


def test_a_brake_on_a_run_of_thousands_of_ranks_is_confirmed_with_every_answer(services):
    """The answers to a brake are read from the run's audit stream since the brake was sent,
    not from its newest entries: on a run of 1,500 ranks whose stream also holds 1,200 answers
    to an earlier command, the tracker, `rlwatch pause --wait` and the cockpit (all through
    ``since``) see every rank's answer, and the brake is told as holding on all of them, not as
    partial at the timeout."""
    from alerts.escalation import RedisAcks
    from alerts.notices import acknowledged_notice
    from alerts.operator import answers_of

    world = 1500
    ns = "rlwatch:big-" + uuid.uuid4().hex[:8]
    run_id = "big-" + uuid.uuid4().hex[:6]
    r = redis_sync.Redis.from_url(services["redis"])

    def answers(cmd, ranks, now):
        pipe = r.pipeline(transaction=False)
        for rank in ranks:
            ack = {"type": "ack", "command_id": cmd.id, "run_id": cmd.run_id, "action": cmd.action,
                   "status": "applied", "rank": rank, "world_size": world, "ts": now}
            ack["signature"] = ack_signature(ack, SECRET)
            pipe.xadd(audit_key(cmd.run_id), {"entry": json.dumps(ack)})
        pipe.hset(acks_key(cmd.run_id), cmd.id, json.dumps(ack))
        pipe.execute()

    # written long before (an id of 1970): outside any brake's window, never read for one
    r.xadd(audit_key(run_id), {"entry": json.dumps({"type": "ack", "command_id": "old", "rank": 0})}, id="1000-0")

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, ns, SECRET)
        now = time.time()
        try:
            before = Command(run_id=run_id, action="adjust", params={"lr": 0.5}, ts=now - 30).signed(SECRET)
            await control.send(before)
            answers(before, range(1200), now - 29)
            cmd = Command(run_id=run_id, action="pause", ts=now, rule="kl_spike", severity="red",
                          step=9).signed(SECRET)
            await control.send(cmd)
            await acks.expect(cmd)
            answers(cmd, range(world), now + 1)
            checked = await acks.check(now + 2, timeout=60)
            read = await control.since(run_id, cmd.ts)
            return cmd, checked, read, {c.id for c in await acks.outstanding()}
        finally:
            await control.close()

    cmd, checked, read, left = run(go())
    ((s, got),) = checked.confirmed
    assert s.command_id == cmd.id and sorted(got) == list(range(world)) and checked.overdue == []
    n = acknowledged_notice(s, got, s.ts + 2)
    assert n.labels["ack_status"] != "partial" and f"ranks 0-{world - 1} of {world}" in n.summary
    assert left == set()
    assert sorted(answers_of(read, cmd.id, SECRET)) == list(range(world))
    assert all(e.get("command_id") != "old" for e in read)
    r.close()


def test_unacknowledged_brakes_of_many_runs_are_published_again_in_one_round_trip(services):
    """BrakeLane.resend re-signs every brake no worker acknowledged and publishes them again
    together: a fleet's outstanding brakes (runs without a listener, or gone) cost one round
    trip, not one each, every few seconds, and each run's listener gets its command again."""
    from alerts.brake import BrakeLane
    from alerts.escalation import RedisAcks

    ns = "rlwatch:resend-" + uuid.uuid4().hex[:8]
    runs = [f"resend-{k}-" + uuid.uuid4().hex[:6] for k in range(12)]
    sub = listening(services, runs)

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, ns, SECRET)
        lane = BrakeLane(control, acks, clock=time.time, secret=SECRET, resend_every=5)
        now = time.time()
        try:
            cmds = [Command(run_id=rid, action="pause", ts=now, reason="test", step=3).signed(SECRET)
                    for rid in runs]
            for cmd in cmds:
                await lane.pull([cmd])
            # connected and the script loaded (nothing is due yet): the tick is counted below
            assert await acks.due_again(now, 5, 300) == []
            with counting_round_trips() as count:
                n = await lane.resend(now + 6)
            return n, count[0], cmds
        finally:
            await control.close()

    n, trips_taken, cmds = run(go())
    got = heard(sub, 2 * len(runs))
    assert n == len(runs)
    assert trips_taken <= 2, trips_taken          # the due brakes taken, then one trip
    for cmd in cmds:
        first, again = got[cmd.run_id]
        assert again.id == cmd.id and again.sent is not None and again.verify(SECRET)


def test_the_workers_of_a_deployment_share_the_re_sends_and_their_waits_grow(services):
    """Every worker's timer re-sends the deployment's unacknowledged brakes: each due re-send
    now goes out once, whichever worker's tick takes it, the waits doubling (5 s, then 10 s);
    an acknowledged brake is re-sent no more, and its record goes."""
    from alerts.brake import BrakeLane
    from alerts.escalation import RedisAcks

    ns = "rlwatch:shared-" + uuid.uuid4().hex[:8]
    runs = [f"shared-{k}-" + uuid.uuid4().hex[:6] for k in range(4)]
    r = redis_sync.Redis.from_url(services["redis"])
    sub = listening(services, runs)

    async def go():
        workers = []
        for _ in range(2):
            control = RedisControl(services["redis"], SECRET)
            acks = RedisAcks(control.redis, ns, SECRET)
            workers.append((control, acks, BrakeLane(control, acks, clock=time.time, secret=SECRET,
                                                     resend_every=5, resend_most=300)))
        (_, acks_a, a), (_, _, b) = workers
        now = time.time()
        try:
            cmds = [Command(run_id=rid, action="pause", ts=now, reason="test", step=3).signed(SECRET)
                    for rid in runs]
            await a.pull(cmds[:2])
            await b.pull(cmds[2:])
            counts = {}
            for t in (4, 6, 6.5, 15, 16.5):        # both workers tick at each of these times
                counts[t] = await a.resend(now + t) + await b.resend(now + t)
            # the first run acknowledges its brake: settled at the next check, then re-sent no more
            ack = {"type": "ack", "command_id": cmds[0].id, "run_id": runs[0], "status": "applied", "ts": now}
            r.hset(acks_key(runs[0]), cmds[0].id, json.dumps({**ack, "signature": ack_signature(ack, SECRET)}))
            await acks_a.check(now + 20, timeout=3600)
            counts[40] = await a.resend(now + 40) + await b.resend(now + 40)
            records = {k.decode() for k in r.hkeys(acks_a.resends)}
            return counts, cmds, records
        finally:
            for control, _, _ in workers:
                await control.close()

    counts, cmds, records = run(go())
    assert counts == {4: 0, 6: 4, 6.5: 0, 15: 0, 16.5: 4, 40: 3}, counts
    assert records == {c.id for c in cmds[1:]}
    got = {rid: len(cmds) for rid, cmds in heard(sub, 4 + 4 + 4 + 3).items()}
    # the first send, a re-send at 6 s and at 16.5 s; the unacknowledged ones at 40 s too
    assert got == {runs[0]: 3, **{rid: 4 for rid in runs[1:]}}, got


def test_brakes_outstanding_are_parsed_once_per_stored_text(services):
    """Every tick reads every brake still outstanding (for a day when nobody answers): a stored
    command is parsed once and the same command given back while its text is unchanged, a
    new text read afresh."""
    from alerts.escalation import RedisAcks

    ns = "rlwatch:parsed-" + uuid.uuid4().hex[:8]
    runs = [f"parsed-{k}-" + uuid.uuid4().hex[:6] for k in range(3)]

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, ns, SECRET)
        try:
            cmds = [Command(run_id=rid, action="pause", ts=time.time(), reason="test").signed(SECRET)
                    for rid in runs]
            for cmd in cmds:
                await acks.expect(cmd)
            first, second = await acks.outstanding(), await acks.outstanding()
            changed = cmds[0].model_copy(update={"reason": "changed"})
            await control.redis.hset(acks.pending, changed.id, changed.model_dump_json())
            third = await acks.outstanding()
            return cmds, first, second, third
        finally:
            await control.close()

    cmds, first, second, third = run(go())
    assert sorted(c.id for c in first) == sorted(c.id for c in cmds)
    assert all(a is b for a, b in zip(first, second))
    by_id = {c.id: c for c in third}
    assert by_id[cmds[0].id].reason == "changed"
    assert by_id[cmds[1].id] is {c.id: c for c in first}[cmds[1].id]


def test_a_brake_sent_as_redis_forgot_its_scripts_is_applied_once_and_said_to_be_applied_now(
        services, rid):
    """After a Redis restart (its scripts gone), the first brake's round trip is refused in
    part, the scripts are loaded and it is sent again: the commands that ran the first time
    keep their first answer, so the lane reports them applied now (not "applied before"),
    once each, tracked."""
    r = redis_sync.Redis.from_url(services["redis"])
    now = time.time()
    cmds = [Command(run_id=rid, action=a, ts=now, reason="test", step=9).signed(SECRET)
            for a in ("pause", "snapshot")]

    async def go():
        control, acks, lane = await warm_lane(services, rid)
        try:
            # the control script known, the tracker's not: the first trip applies the commands
            # and is refused the tracking
            await control.redis.script_flush()
            await control.redis.script_load(control._script.script)
            first = await lane.pull(cmds)
            return first, await control.status(rid), await acks.outstanding()
        finally:
            await control.close()

    first, status, waiting = run(go())
    assert [c.action for c in first] == ["pause", "snapshot"]
    assert status.state == "paused"
    assert [e["action"] for e in audit(r, rid)] == ["pause", "snapshot"]
    assert [c.id for c in waiting] == [cmds[0].id]


def test_status_names_the_brakes_a_run_has_not_acknowledged(services):
    """`rlwatch status` says which pauses and stops a run has not acknowledged, how long ago they
    were sent and whether they escalated, from the acknowledgements as they are now: a run that
    acknowledged its pause is clear at once, before any worker's timer settled it."""
    import os
    import subprocess
    import sys

    from alerts.brake import BrakeLane
    from alerts.escalation import RedisAcks
    from streams.fleet_store import FleetStore, make_record
    from tests.integration.conftest import ROOT

    app = "status-" + uuid.uuid4().hex[:8]
    deaf, heard_it = f"deaf-{app}", f"acked-{app}"
    now = time.time()
    r = redis_sync.Redis.from_url(services["redis"])

    async def go():
        control = RedisControl(services["redis"], SECRET)
        acks = RedisAcks(control.redis, f"rlwatch:{app}", SECRET)
        lane = BrakeLane(control, acks, clock=time.time, secret=SECRET)
        try:
            store = FleetStore(control.redis, app)
            for rid in (deaf, heard_it):
                summary = {"run_id": rid, "last_step": 40, "last_event_ts": now, "open_alerts": []}
                await store.put([make_record(summary, None, now)])
            cmds = [Command(run_id=deaf, action="pause", ts=now - 130, reason="kl", step=40).signed(SECRET),
                    Command(run_id=heard_it, action="pause", ts=now - 20, reason="kl", step=40).signed(SECRET)]
            await lane.pull(cmds)
            overdue = (await acks.check(now, timeout=60)).overdue    # the deaf run's pause escalates
            return cmds, overdue
        finally:
            await control.close()

    cmds, overdue = run(go())
    assert [s.command_id for s in overdue] == [cmds[0].id]
    ack = {"type": "ack", "command_id": cmds[1].id, "run_id": heard_it, "status": "applied", "ts": now}
    r.hset(acks_key(heard_it), cmds[1].id, json.dumps({**ack, "signature": ack_signature(ack, SECRET)}))
    env = dict(os.environ, RLWATCH_REDIS=services["redis"], RLWATCH_APP_ID=app, RLWATCH_CONTROL_SECRET=SECRET)

    def status(*args):
        out = subprocess.run([sys.executable, "-m", "rlwatch", "status", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    runs = {x["run_id"]: x for x in json.loads(status("--json"))}
    [waiting] = runs[deaf]["unacknowledged"]
    assert (waiting["command_id"], waiting["action"], waiting["escalated"]) == (cmds[0].id, "pause", True)
    assert 129 <= waiting["waited_seconds"] < 200
    assert runs[heard_it]["unacknowledged"] == []
    text = status()
    assert f"  pause {cmds[0].id} not acknowledged by the run, sent 2m ago (escalated)" in text, text
    assert cmds[1].id not in text


def test_the_resend_schedule_kept_in_redis_is_the_one_kept_in_memory(services):
    """The re-send schedule of unacknowledged brakes is written twice: in Python
    (``MemoryAcks.due_again``, the demo's, from ``next_resend``) and in Lua (``RedisAcks``, the
    workers'). Driven alike (brakes sent at different times, one settled midway, the clock
    read at uneven times past the doubling waits and their cap), both give the same brakes at
    every read."""
    from alerts.control import MemoryControl
    from alerts.escalation import MemoryAcks, RedisAcks

    ns = "rlwatch:schedule-" + uuid.uuid4().hex[:8]
    t0 = 1_764_500_000.0
    cmds = [Command(run_id=f"sched-{k}-" + uuid.uuid4().hex[:6], action=a, ts=t0 + dt, reason="test",
                    step=3).signed(SECRET)
            for k, (a, dt) in enumerate([("pause", 0.0), ("stop", 2.5), ("pause", 7.0)])]
    reads = [t0 + x for x in (1, 4.9, 5, 5.1, 7.4, 9, 12.1, 14.9, 15.2, 20, 26.9, 35.5, 40, 61.3, 62,
                              75, 99.9, 100, 137, 160.2, 199, 240, 260.5, 300, 333)]

    async def go():
        control = RedisControl(services["redis"], SECRET)
        memory, redis_acks = MemoryAcks(MemoryControl(), SECRET), RedisAcks(control.redis, ns, SECRET)
        try:
            for cmd in cmds:
                await memory.expect(cmd)
                await redis_acks.expect(cmd)
            out = []
            for k, now in enumerate(reads):
                if k == 12:        # the second brake settles (acknowledged, then escalation-checked away)
                    memory.pending.pop(cmds[1].id)
                    await control.redis.hdel(redis_acks.pending, cmds[1].id)
                got = [sorted(c.id for c in await acks.due_again(now, 5.0, 40.0)) for acks in (memory, redis_acks)]
                out.append((now - t0, *got))
            return out
        finally:
            await control.redis.delete(redis_acks.pending, redis_acks.sent, redis_acks.escalated, redis_acks.resends)
            await control.close()

    out = run(go())
    for at, in_memory, in_redis in out:
        assert in_memory == in_redis, (at, in_memory, in_redis)
    # the schedule was exercised: each brake re-sent several times, the settled one no more
    sent = [i for _, m, _ in out for i in m]
    assert sent.count(cmds[0].id) >= 6 and sent.count(cmds[2].id) >= 6
    assert all(cmds[1].id not in m for _, m, _ in out[12:]) and cmds[1].id in sent
