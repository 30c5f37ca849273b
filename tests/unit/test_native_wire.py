"""The native reader of a routine rank step (streams._native.read_rank_step) and the path it
feeds (RunState.rank_step, Pipeline.feed_raw, the worker's take).

The reader is a fast path of contract.events.read_event for the commonest event of a fleet: it
may decline any event (read_event then decides), but what it takes must be an event read_event
accepts, with the same values; and a run fed that way must end in the same state, with the
same alerts and snapshots, as one fed every event through read_event.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from contract.events import EventError, dump_event, read_event
from producers.sim import SimConfig, simulate
from streams import signals
from streams.processor import Pipeline, read_routine
from streams.snapshot import RankKeeper, SnapshotRecorder, build_snapshot
from tests.unit._core import rlhf_pack

from tests.unit._core import PURE_ASKED  # noqa: E402

if PURE_ASKED:
    pytest.skip("RLWATCH_NATIVE=0: the pure core was asked for", allow_module_level=True)
# (a missing native build fails here rather than skipping: the worker would read every event
# the slower way without a word in the tests)
assert signals.CORE == "native", "the native core is not built"

BASE = {"schema": 1, "kind": "step", "run_id": "ppo-8b-a", "rank": 3, "world_size": 8,
        "step": 12, "ts": 1_700_000_000.25, "tags": {"algo": "ppo", "target.kl": "0.1"},
        "incarnation": "inc-1",
        "metrics": {"grad_norm/actor": 1.1064970301088144, "loss/policy": -0.0099382209,
                    "gpu/mem_allocated_gb": 53}, "hashes": {"actor": "sha256:95979d7c"},
        "batch_ids": ["b0000000-r3"]}

#: values that stress the reader's checks, for any field
ODD_VALUES = [None, True, False, 0, 1, -1, 2, 8, -0, 0.0, -0.0, 1.5, 5.0, 1e400, -1e400, 1e-400,
              2**53, 2**53 + 1, 2**63, 10**20, 123456789012345678, 1.7976931348623157e308,
              5e-324, 0.1, 1e-7, "", " ", "x", "NaN", "nan", "Infinity", "-inf", "1.5", "a b",
              "é", "\u4e2d", "tab\there", "quote\"d", "back\\slash", "x" * 256, "x" * 257,
              "x" * 1024, "x" * 1025, [], [1], ["a"], {}, {"a": 1}, {"a": "b"}, {"a": None}]


def _fields(ev) -> dict:
    keys = ("kind", "run_id", "rank", "step", "world_size", "ts", "incarnation", "tags",
            "metrics", "hashes", "batch_ids", "dists", "groups")
    return {k: getattr(ev, k) for k in keys}


def _same_as_read_event(raw: bytes) -> str:
    """'taken' when the reader took ``raw`` with read_event's values, 'declined' when it
    declined it (read_event accepting it or not); fails when it took what read_event refuses
    or read it otherwise."""
    rs = read_routine(raw)
    try:
        ev = read_event(raw, 7.0)
    except EventError as exc:
        assert rs is None, f"took an event read_event refuses ({exc.reason}): {raw[:300]!r}"
        return "refused"
    if rs is None:
        return "declined"
    want = _fields(ev)
    got = _fields(rs)
    if got["ts"] is None:           # read_event fills a missing ts with the receive time
        got["ts"] = 7.0
    assert json.dumps(got, default=repr) == json.dumps(want, default=repr), raw[:300]
    assert [type(v) for v in got["metrics"].values()] == [float] * len(got["metrics"])
    assert all(math.copysign(1, a) == math.copysign(1, b)
               for a, b in zip(got["metrics"].values(), want["metrics"].values()))
    assert rs.rank > 0
    assert rs.finite is all(math.isfinite(v) for v in want["metrics"].values())
    return "taken"


def _variants(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(2500):
        d = json.loads(json.dumps(BASE))
        for _ in range(rng.choice((1, 1, 2))):
            where = rng.choice(["top", "top", "metrics", "tags", "hashes", "drop", "add", "batch"])
            value = rng.choice(ODD_VALUES)
            if where == "top":
                d[rng.choice(list(BASE) + ["dists", "groups"])] = value
            elif where in ("metrics", "tags", "hashes") and not isinstance(d.get(where), dict):
                d[where] = {}
            elif where == "metrics":
                d["metrics"][rng.choice(["loss/policy", "new", "x" * 256, "x" * 257, ""])] = value
            elif where == "tags":
                d["tags"][rng.choice(["algo", "generation", "new", "x" * 257])] = value
            elif where == "hashes":
                d["hashes"][rng.choice(["actor", "critic"])] = value
            elif where == "drop":
                d.pop(rng.choice(list(BASE)), None)
            elif where == "add":
                d[rng.choice(["extra", "samples", "path", "final"])] = value
            else:
                d["batch_ids"] = rng.choice([[], ["a", "b"], [1], ["é"], ["a\\b"], "a", None])
        form = rng.random()
        if form < 0.2:
            text = json.dumps(d, indent=rng.choice((1, 2, "\t")))
        elif form < 0.6:
            text = json.dumps(d, separators=(",", ":"), ensure_ascii=rng.random() < 0.5)
        else:
            text = json.dumps(d, ensure_ascii=rng.random() < 0.5)
        out.append(text.encode())
    return out


def test_what_the_reader_takes_read_event_accepts_with_the_same_values():
    rng = random.Random(11)
    seen = {"taken": 0, "declined": 0, "refused": 0}
    for raw in _variants(rng):
        seen[_same_as_read_event(raw)] += 1
    # the cases reach all three outcomes, the reader's own many times
    assert seen["taken"] >= 300 and seen["declined"] >= 300 and seen["refused"] >= 300, seen


def test_texts_the_reader_cannot_judge_are_left_to_read_event():
    cases = [
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":1},"metrics":{"a":2}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":1,"a":2}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":NaN}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"\\u0061":1}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1.0}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":0,"step":1}',
        b'{"schema":1,"kind":"step","run_id":"r","step":1}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"dists":{"d":[1]}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1}x',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":01}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":1.}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":-0}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":1e-400}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":1e400}}',
        b'{"schema":1,"kind":"heartbeat","run_id":"r","rank":1,"step":1}',
        b'[{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1}]',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":1}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"ts":null,"world_size":null}',
        b'  {"schema" : 1 , "kind":"step","run_id":"r","rank":1,"step":1,"tags":{}} \n',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":"NaN","b":1.5}}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1' + b',"batch_ids":["a"]' * 2 + b'}',
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{' +
        b",".join(b'"m%d":%d' % (i, i) for i in range(4097)) + b"}}",
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"batch_ids":["' + b"x" * 1_000_000 + b'"]}',
        # longer than any double's shortest form: left to msgspec's rounding
        b'{"schema":1,"kind":"step","run_id":"r","rank":1,"step":1,"metrics":{"a":0.1000000000000000055511151231257827}}',
    ]
    got = [_same_as_read_event(raw) for raw in cases]
    # the last but four: nulls, blanks and a spelt NaN the reader takes; the rest is declined
    # or refused
    assert got[17] == got[18] == got[19] == "taken"
    assert "taken" not in got[:17] + got[20:], got


def test_a_metric_spelt_as_a_non_finite_value_reads_as_read_event_reads_it():
    """A diverged run sends "NaN" in every event: the reader takes the spellings read_event
    takes (any case, spaces around), with the same values, and no other text."""
    from contract.events import _NONFINITE_IN

    def ev(value) -> bytes:
        return json.dumps(dict(BASE, metrics={"loss/policy": value, "grad_norm/actor": 1.5})).encode()
    spellings = [*_NONFINITE_IN, *(w.upper() for w in _NONFINITE_IN), " NaN ", "  -Infinity", "nAn"]
    for word in spellings:
        assert _same_as_read_event(ev(word)) == "taken", word
        assert read_routine(ev(word)).finite is False
    assert read_routine(ev(0.5)).finite is True
    for word in ["nann", "1.5", "", "none", "in f", "--inf", "nan\u00a0"]:
        assert _same_as_read_event(ev(word)) != "taken", word


def test_byte_level_damage_never_makes_the_reader_disagree():
    rng = random.Random(5)
    raw = json.dumps(BASE).encode()
    outcomes = set()
    for _ in range(3000):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            op = rng.random()
            if op < 0.4:
                b[i] = rng.choice(b'{}[]":,0123456789.eE-+ \\tnulfase\x00\x7f\xc3\xa9')
            elif op < 0.7:
                del b[i]
            else:
                b.insert(i, rng.choice(b'{}[]":,0123456789.eE-+ \\n'))
        outcomes.add(_same_as_read_event(bytes(b)))
    assert outcomes == {"taken", "declined", "refused"}


def test_every_byte_anywhere_in_a_long_text_is_judged_as_read_event_judges_it():
    # the reader takes a text's plain bytes eight at a time: any one byte at any place of such a
    # chunk (in a run id, a tag value, a hash, a metric's name) must stop it where it should
    raw = json.dumps(dict(BASE, run_id="run-" + "r" * 20, tags={"algo": "p" * 19},
                          hashes={"actor": "sha256:" + "9" * 24},
                          metrics={"m" * 21: 1.5})).encode()
    outcomes = {}
    for text in (b'"run-', b'"ppppp', b'"sha256:', b'"mmmmm'):
        start = raw.index(text) + 1
        for offset in range(17):
            for byte in range(256):
                b = bytearray(raw)
                b[start + offset] = byte
                got = _same_as_read_event(bytes(b))
                outcomes[got] = outcomes.get(got, 0) + 1
    # printable bytes other than the quote and the backslash are taken, the rest are not
    assert outcomes.get("taken", 0) >= 4 * 17 * 90, outcomes
    assert outcomes.get("declined", 0) + outcomes.get("refused", 0) >= 4 * 17 * 150, outcomes


# -- the path it feeds -------------------------------------------------------------------------

def _fleet() -> list[bytes]:
    """Runs with faults on their ranks, and the events that must leave the routine path: a
    relaunch, new targets in the tags, a rollback, re-sent steps, timestamps to replace."""
    events = []
    faults = ("nan_inf", "rank_outlier", "param_hash_mismatch", "healthy")
    for i, fault in enumerate(faults):
        cfg = SimConfig(run_id=f"wire-{i}", fault=fault, onset=50, seed=3 + i, world_size=4,
                        samples_every=10, checkpoint_every=40)
        for ev in simulate(cfg, 120):
            ev["ts"] += 0.01 * i
            if i == 3 and ev["step"] >= 60:
                ev["tags"] = dict(ev.get("tags", {}), **{"target.kl": "0.5"})
            if i == 3 and ev["step"] >= 90:
                ev["tags"]["generation"] = "1"
            if i == 2 and ev["step"] >= 70:
                ev["incarnation"] = "second"
            if i == 1 and ev["step"] in (30, 31):
                ev["ts"] = 12.0                       # not epoch seconds: replaced
            if i in (1, 3) and ev["kind"] == "step" and ev.get("rank") and ev["step"] in (40, 41):
                name = next(iter(ev["metrics"]))      # non-finite on a rank, then finite again
                ev["metrics"][name] = math.nan
            events.append(ev)
            if i == 0 and ev.get("rank") == 2 and ev["step"] % 17 == 0:
                events.append(dict(ev, ts=ev["ts"] + 0.001))    # sent twice
    events.sort(key=lambda e: e["ts"])
    return [dump_event(e) for e in events]


def _run(lines: list[bytes], fast: bool):
    pipe = Pipeline(rlhf_pack())
    recorder = SnapshotRecorder()
    now = max(json.loads(raw)["ts"] for raw in lines) + 1.0
    out = []
    for raw in lines:
        if fast:     # the recorder gets what the worker's take gives it
            rs, before = read_routine(raw), pipe.routine
            alerts = pipe.feed_raw(raw, now)
            ev = rs if pipe.routine > before else read_event(raw, now)
        else:
            ev = read_event(raw, now)
            alerts = pipe.feed(ev, now)
        recorder.observe(ev, raw)
        for a in alerts:
            out.append((a.run_id, a.rule, a.severity, a.state, a.step, a.rank, repr(a.value)))
            out.append(json.dumps(build_snapshot(a, recorder, pipe.runs[a.run_id]),
                                  sort_keys=True, default=repr))
    states = {k: json.dumps(st.to_state(), sort_keys=True, default=repr)
              for k, st in pipe.runs.items()}
    return out, states, pipe.routine


def test_a_fleet_fed_as_the_worker_takes_it_ends_as_one_fed_through_read_event():
    lines = _fleet()
    fast, fast_states, routine = _run(lines, fast=True)
    slow, slow_states, _ = _run(lines, fast=False)
    rank_steps = sum(1 for raw in lines if json.loads(raw).get("rank") and b'"step"' in raw)
    assert routine > 0.4 * rank_steps       # (ranks with an alert open leave it)
    # alerts of ranks other than 0 (their ranks then leave the routine path until closed), and
    # alerts closed by a rollback
    assert sum(isinstance(x, tuple) and x[5] not in (None, 0) for x in slow) >= 6
    assert any(isinstance(x, tuple) and x[3] == "resolved" for x in slow)
    assert fast == slow
    assert fast_states == slow_states       # bookkeeping, duplicates, replaced ts included


def _run_at_once(lines: list[bytes]):
    """As the worker's events lane takes a batch: each run's records together, in order (the
    runs in the order they first come), the routine rank steps after each event taken at once
    by RunState.rank_steps."""
    from types import SimpleNamespace

    pipe = Pipeline(rlhf_pack())
    recorder = SnapshotRecorder()
    now = max(json.loads(raw)["ts"] for raw in lines) + 1.0
    records = [SimpleNamespace(key=json.loads(raw)["run_id"].encode(), value=raw) for raw in lines]
    by_run: dict = {}
    for i, r in enumerate(records):
        by_run.setdefault(r.key, []).append(i)
    order = [i for ids in by_run.values() for i in ids]
    taken = bytearray(len(records))
    out, calls, at_once, opened = [], 0, 0, 0

    def note(alerts, run_id):
        for a in alerts:
            out.append(((a.run_id, a.rule, a.severity, a.state, a.step, a.rank, repr(a.value)),
                        json.dumps(build_snapshot(a, recorder, pipe.runs[run_id]),
                                   sort_keys=True, default=repr)))
    k = 0
    while k < len(order):
        i = order[k]
        k += 1
        raw = records[i].value
        rs, before = read_routine(raw), pipe.routine
        alerts = pipe.feed_raw(raw, now)
        ev = rs if pipe.routine > before else read_event(raw, now)
        recorder.observe(ev, raw)
        taken[i] = 1
        note(alerts, ev.run_id)
        st = pipe.runs[ev.run_id]
        k, count, done, due = st.rank_steps(records, order, k, now,
                                            recorder.rank_keeper(ev.run_id), taken)
        calls += 1
        at_once += count
        opened += due is not None
        note(st.after_rank_steps(done, due) if done or due else [], ev.run_id)
    assert all(taken)
    states = {k: json.dumps(st.to_state(), sort_keys=True, default=repr)
              for k, st in pipe.runs.items()}
    return out, states, at_once, calls, opened


@pytest.mark.parametrize("limit", [None, 1, 3])
def test_a_fleet_taken_a_run_at_a_time_with_rank_steps_at_once_ends_as_one_fed_through_read_event(
        limit, monkeypatch):
    """RunState.rank_steps (the worker's events lane) takes what rank_step would, in the same
    way: the same alerts, snapshots and states as every event through read_event (with at
    most ``limit`` records a call, when given)."""
    import streams.run as run_module

    if limit is not None:
        monkeypatch.setattr(run_module, "RANK_STEPS_AT_ONCE", limit)
    lines = _fleet()
    fast, fast_states, at_once, calls, opened = _run_at_once(lines)
    slow, slow_states, _ = _run(lines, fast=False)
    rank_steps = sum(1 for raw in lines if json.loads(raw).get("rank") and b'"step"' in raw)
    assert at_once > (0.4 if limit is None else 0.2) * rank_steps
    assert opened >= 20       # steps whose rank's own rules were due (NaN, an alert open)
    if limit is not None:
        assert at_once <= limit * calls

    def by_run(pairs) -> dict:      # (the runs' alerts come a run at a time)
        runs: dict = {}
        for pair in pairs:
            runs.setdefault(pair[0][0], []).append(pair)
        return runs
    assert len(slow) > 20
    assert by_run(fast) == by_run(zip(slow[::2], slow[1::2]))
    assert fast_states == slow_states


def test_rank_steps_stop_before_what_they_do_not_take():
    """rank_steps takes this run's routine rank steps and stops before anything else: another
    run's step, a step of rank 0, a value that is not bytes; each taken one is kept and
    marked."""
    from types import SimpleNamespace

    pipe = Pipeline(rlhf_pack())
    now = 1_700_000_100.0

    def raw(rank: int, step: int, run: str = "ppo-8b-a") -> bytes:
        return json.dumps(dict(BASE, run_id=run, rank=rank, step=step, world_size=2)).encode()
    for step in range(8):        # the first steps are read to find the run's framework
        for rank in range(2):
            pipe.feed_raw(raw(rank, step), now)
    st = pipe.runs["ppo-8b-a"]
    kept = []
    cases = [([raw(1, 8), raw(1, 9), raw(1, 9, "other")], 2),      # another run's
             ([raw(1, 10), raw(0, 10)], 1),                        # rank 0's
             ([raw(1, 11), raw(1, 12).decode()], 1),               # a str, not bytes
             ([raw(1, 12), raw(1, 12)], 1)]                        # the same step again
    for values, expected in cases:
        records = [SimpleNamespace(value=v) for v in values]
        taken = bytearray(len(records))
        pos, count, done, due = st.rank_steps(records, range(len(records)), 0, now,
                                              RankKeeper(lambda row: kept.append(row[:2])), taken)
        assert (pos, count) == (expected, expected) and done == [] and due is None
        assert list(taken) == [1] * expected + [0] * (len(records) - expected)
    assert kept == [(8, 1), (9, 1), (10, 1), (11, 1), (12, 1)]
    assert st.last_step == {0: 7, 1: 12} and st.newest == 12


def test_a_routine_step_with_other_tags_leaves_the_routine_path():
    pipe = Pipeline(rlhf_pack())
    now = 1_700_000_100.0
    for step in range(6):
        for rank in range(2):
            pipe.feed_raw(json.dumps(dict(BASE, rank=rank, step=step)).encode(), now)
    before = pipe.routine
    assert before >= 2        # (the first steps are read to find the run's framework)
    pipe.feed_raw(json.dumps(dict(BASE, rank=1, step=6, tags={"target.kl": "0.3"})).encode(), now)
    assert pipe.routine == before and pipe.runs["ppo-8b-a"].targets["kl"] == 0.3
    pipe.feed_raw(json.dumps(dict(BASE, rank=1, step=7, tags={"target.kl": "0.3"})).encode(), now)
    assert pipe.routine == before + 1
    pipe.feed_raw(json.dumps(dict(BASE, rank=1, step=8, tags={"target.kl": "0.3", "generation": "1"})).encode(), now)
    assert pipe.routine == before + 1 and pipe.runs["ppo-8b-a"].generation == 1


def test_the_reader_keeps_the_contracts_limits():
    """Each limit of contract.events, at its edge and one past it: the reader takes the first
    and never the second (its own copy of the limits must follow the contract's; taking what
    read_event refuses fails in _same_as_read_event). A hash's name may be longer for the
    contract than the reader takes: it declines those to read_event."""
    from contract import events as ce

    def ev(**change) -> bytes:
        return json.dumps(dict(BASE, **change)).encode()
    pairs = [
        (ev(metrics={"m" * ce.MAX_NAME_LEN: 1.0}), ev(metrics={"m" * (ce.MAX_NAME_LEN + 1): 1.0})),
        (ev(metrics={f"m{i}": 1.0 for i in range(ce.MAX_METRICS)}),
         ev(metrics={f"m{i}": 1.0 for i in range(ce.MAX_METRICS + 1)})),
        (ev(tags={"t": "v" * ce.MAX_TAG_VALUE_LEN}), ev(tags={"t": "v" * (ce.MAX_TAG_VALUE_LEN + 1)})),
        (ev(tags={f"t{i}": "v" for i in range(ce.MAX_TAGS)}),
         ev(tags={f"t{i}": "v" for i in range(ce.MAX_TAGS + 1)})),
        (ev(hashes={"h" * ce.MAX_NAME_LEN: "x"}), ev(hashes={"h" * (ce.MAX_NAME_LEN + 1): "x"})),
        (ev(incarnation="i" * ce.MAX_INCARNATION_LEN), ev(incarnation="i" * (ce.MAX_INCARNATION_LEN + 1))),
        (ev(run_id="r" * 256), ev(run_id="r" * 257)),
        (ev(step=ce.MAX_STEP), ev(step=ce.MAX_STEP + 1)),
        (ev(world_size=1_000_000), ev(world_size=1_000_001)),
        (ev(rank=1_000_000), ev(rank=1_000_001)),
    ]
    pad = ce.MAX_EVENT_BYTES - len(ev(batch_ids=[""]))
    pairs.append((ev(batch_ids=["b" * pad]), ev(batch_ids=["b" * (pad + 1)])))
    for at, over in pairs:
        assert _same_as_read_event(at) == "taken", at[:120]
        assert _same_as_read_event(over) != "taken", over[:120]
