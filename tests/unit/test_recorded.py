"""producers.recorded: trainer_state.json, TensorBoard event files (written here by a tiny
independent TFRecord/protobuf writer, CRCs included), W&B exports, veRL/OpenRLHF console logs;
and their replay through `rlwatch replay`."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

from rlwatch.cli import main
from producers.recorded import crc32c, iter_recorded, masked_crc32c, read_recorded
from rlwatch.replay import iter_records

# -- an independent writer (bitwise CRC, hand-rolled protobuf), so reader bugs cannot cancel out --


def crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def mask(crc: int) -> int:   # tensorflow/core/lib/hash/crc32c.h: Mask()
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num: int, wt: int, payload: bytes) -> bytes:
    key = varint((num << 3) | wt)
    if wt == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def simple_value(tag: str, x: float) -> bytes:
    return field(1, 2, tag.encode()) + field(2, 5, struct.pack("<f", x))


def tensor_value(tag: str, x: float, *, double=False, packed=True, plugin="scalars") -> bytes:
    if double:
        tensor = field(1, 0, varint(2)) + field(6, 2, struct.pack("<d", x))
    elif packed:
        tensor = field(1, 0, varint(1)) + field(5, 2, struct.pack("<f", x))
    else:  # tensor_content, as TF2 writers produce
        tensor = field(1, 0, varint(1)) + field(2, 2, b"") + field(4, 2, struct.pack("<f", x))
    meta = field(1, 2, field(1, 2, plugin.encode()))          # metadata.plugin_data.plugin_name
    return field(1, 2, tag.encode()) + field(9, 2, meta) + field(8, 2, tensor)


def event(step: int | None, values: list[bytes] = (), wall_time=1.7e9, version: str | None = None) -> bytes:
    out = field(1, 1, struct.pack("<d", wall_time))
    if step:
        out += field(2, 0, varint(step))
    if version:
        out += field(3, 2, version.encode())
    if values:
        out += field(5, 2, b"".join(field(1, 2, v) for v in values))
    return out


def tfrecord(payload: bytes, corrupt_data_crc=False) -> bytes:
    header = struct.pack("<Q", len(payload))
    crc = mask(crc32c_bitwise(payload)) ^ (1 if corrupt_data_crc else 0)
    return header + struct.pack("<I", mask(crc32c_bitwise(header))) + payload + struct.pack("<I", crc)


# -- CRC ----------------------------------------------------------------------------------------

def test_crc32c_known_answers():
    # RFC 3720 B.4 and the usual check value
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    data = bytes(range(256)) * 3
    assert crc32c(data) == crc32c_bitwise(data)
    assert masked_crc32c(data) == mask(crc32c_bitwise(data))
    assert masked_crc32c(b"") == mask(0)


# -- TensorBoard --------------------------------------------------------------------------------

def write_events(path: Path, records: list[bytes]) -> Path:
    path.write_bytes(b"".join(records))
    return path


def test_tensorboard_scalars_simple_and_tensor_values(tmp_path):
    f = write_events(tmp_path / "events.out.tfevents.1700000000.host.1.0", [
        tfrecord(event(None, version="brain.Event:2")),
        tfrecord(event(1, [simple_value("train/kl", 0.25), simple_value("train/reward", 1.5)])),
        tfrecord(event(1, [simple_value("train/entropy", 2.0)])),           # same step: merged
        tfrecord(event(2, [tensor_value("train/kl", 0.5)])),
        tfrecord(event(2, [tensor_value("train/reward", 2.25, double=True)])),
        tfrecord(event(3, [tensor_value("train/kl", 0.75, packed=False)])),
        tfrecord(event(3, [tensor_value("sample_text", 1.0, plugin="text")])),  # not a scalar plugin
        tfrecord(event(0, [simple_value("train/kl", 0.125)])),               # step 0 (left out on the wire)
        tfrecord(event(2**40, [simple_value("late", -1.0)])),                # a large step
    ])
    records, skipped = read_recorded(f)
    assert skipped == 0
    assert records == [
        {"step": 0, "metrics": {"train/kl": 0.125}},
        {"step": 1, "metrics": {"train/kl": 0.25, "train/reward": 1.5, "train/entropy": 2.0}},
        {"step": 2, "metrics": {"train/kl": 0.5, "train/reward": 2.25}},
        {"step": 3, "metrics": {"train/kl": 0.75}},
        {"step": 2**40, "metrics": {"late": -1.0}},
    ]


def test_tensorboard_bad_crc_is_skipped_and_counted_and_a_cut_tail_too(tmp_path):
    good = tfrecord(event(1, [simple_value("kl", 0.1)]))
    bad = tfrecord(event(2, [simple_value("kl", 0.2)]), corrupt_data_crc=True)
    tail = tfrecord(event(3, [simple_value("kl", 0.3)]))[:-6]      # the writer was interrupted
    f = write_events(tmp_path / "events.out.tfevents.x", [good, bad, tfrecord(event(4, [simple_value("kl", 0.4)])), tail])
    items = list(iter_recorded(f))
    errors = [r for _, r in items if isinstance(r, str)]
    assert len(errors) == 2
    assert any("data CRC" in e for e in errors) and any("truncated" in e for e in errors)
    assert [r["step"] for _, r in items if isinstance(r, dict)] == [1, 4]
    assert read_recorded(f)[1] == 2


def test_tensorboard_found_by_content_and_in_directories(tmp_path):
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    write_events(run / "events.out.tfevents.1", [tfrecord(event(1, [simple_value("a", 1.0)]))])
    write_events(run / "sub" / "events.out.tfevents.2", [tfrecord(event(1, [simple_value("b", 2.0)]))])
    blob = write_events(tmp_path / "oddly_named.bin", [tfrecord(event(5, [simple_value("c", 3.0)]))])
    assert read_recorded(run) == ([{"step": 1, "metrics": {"a": 1.0, "b": 2.0}}], 0)
    assert read_recorded(blob) == ([{"step": 5, "metrics": {"c": 3.0}}], 0)


def test_garbage_that_is_not_a_tfrecord_is_not_read_as_one(tmp_path):
    f = tmp_path / "events.out.tfevents.junk"
    f.write_bytes(b"\x00" * 7 + b"garbage that is not a tfrecord at all")
    records, skipped = read_recorded(f)
    assert records == [] and skipped == 1


def test_tensorboard_long_tags_and_malformed_events(tmp_path):
    long_tag = "train/" + "k" * 300                     # lengths that need multi-byte varints
    many = [simple_value(f"m{i}", float(i)) for i in range(20)]
    broken = event(2, [simple_value("kl", 0.2)])[:-3]    # framing cut inside the Event
    f = write_events(tmp_path / "events.out.tfevents.long", [
        tfrecord(event(1, [simple_value(long_tag, 0.5), tensor_value(long_tag + "/t", 1.5)])),
        tfrecord(broken),
        tfrecord(event(300, many)),
    ])
    items = list(iter_recorded(f))
    errors = [(k, r) for k, r in items if isinstance(r, str)]
    assert errors == [(2, "record 2 is not a valid Event: truncated length-delimited field")]
    assert [r for _, r in items if isinstance(r, dict)] == [
        {"step": 1, "metrics": {long_tag: 0.5, long_tag + "/t": 1.5}},
        {"step": 300, "metrics": {f"m{i}": float(i) for i in range(20)}},
    ]


def test_tensorboard_integer_and_non_scalar_tensors(tmp_path):
    def tensor(tag: str, body: bytes) -> bytes:
        meta = field(1, 2, field(1, 2, b"scalars"))
        return field(1, 2, tag.encode()) + field(9, 2, meta) + field(8, 2, body)

    int64 = field(1, 0, varint(9)) + field(10, 0, varint(7))            # DT_INT64, int64_val 7
    neg = field(1, 0, varint(3)) + field(7, 2, varint(-2))              # DT_INT32, packed int_val -2
    shape_2 = field(2, 2, field(2, 2, field(1, 0, varint(2))))          # a shape [2]
    pair = field(1, 0, varint(1)) + shape_2 + field(5, 2, struct.pack("<2f", 1.0, 2.0))
    shape_1 = field(2, 2, field(2, 2, field(1, 0, varint(1))))          # a shape [1]: one value
    one = field(1, 0, varint(1)) + shape_1 + field(5, 2, struct.pack("<f", 0.5))
    f = write_events(tmp_path / "events.out.tfevents.ints", [
        tfrecord(event(1, [tensor("steps_done", int64), tensor("delta", neg),
                           tensor("pair", pair), tensor("one", one)])),
    ])
    assert read_recorded(f) == ([{"step": 1, "metrics": {"steps_done": 7.0, "delta": -2.0,
                                                         "one": 0.5}}], 0)


def test_without_google_crc32c_reading_tensorboard_says_what_to_install(tmp_path):
    tb = write_events(tmp_path / "oddly_named.bin", [tfrecord(event(5, [simple_value("c", 3.0)]))])
    csv_file = tmp_path / "h.csv"
    csv_file.write_text("_step,kl\n1,0.5\n")
    script = (
        "import sys\n"
        "sys.modules['google_crc32c'] = None\n"          # as if it were not installed
        "from producers.recorded import read_recorded\n"
        f"print(read_recorded({str(csv_file)!r}))\n"
        f"read_recorded({str(tb)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 1
    assert proc.stdout.strip() == "([{'step': 1, 'metrics': {'kl': 0.5}}], 0)"   # other formats read
    assert proc.stderr.strip().splitlines()[-1] == (
        "producers.recorded.tensorboard.MissingCRC32C: reading TensorBoard event files needs the "
        "google-crc32c package, a dependency of rlwatch: pip install google-crc32c")


# -- trainer_state.json -------------------------------------------------------------------------

def test_trainer_state_log_history(tmp_path):
    f = tmp_path / "trainer_state.json"
    f.write_text(json.dumps({"global_step": 3, "log_history": [
        {"step": 1, "epoch": 0.1, "loss": 0.5, "kl": 0.01, "learning_rate": 1e-6},
        {"step": 2, "epoch": 0.2, "loss": 0.4, "kl": 0.02},
        {"step": 2, "epoch": 0.2, "eval_loss": 0.6},                     # eval at the same step
        "not an entry",
        {"loss": 0.3},                                                   # no step
        {"step": 3, "train_runtime": 100.0, "train_loss": 0.45, "train_samples_per_second": 2.0},
    ]}))
    items = list(iter_recorded(f))
    recs = [r for _, r in items if isinstance(r, dict)]
    errs = [(n, r) for n, r in items if isinstance(r, str)]
    assert recs == [{"step": 1, "metrics": {"loss": 0.5, "kl": 0.01, "learning_rate": 1e-6}},
                    {"step": 2, "metrics": {"loss": 0.4, "kl": 0.02, "eval_loss": 0.6}}]
    assert [n for n, _ in errs] == [4, 5]
    assert read_recorded(f)[1] == 2


def test_json_list_and_contract_events_pass_through(tmp_path):
    ev = {"schema": 1, "kind": "checkpoint", "run_id": "r", "step": 3, "path": "/c"}
    f = tmp_path / "recs.json"
    f.write_text(json.dumps([ev, {"step": 4, "metrics": {"kl": 1.0}}, {"_step": 5, "kl": 2.0}, 7]))
    records, skipped = read_recorded(f)
    assert records == [ev, {"step": 4, "metrics": {"kl": 1.0}}, {"step": 5, "metrics": {"kl": 2.0}}]
    assert skipped == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert read_recorded(bad) == ([], 1)


# -- W&B ----------------------------------------------------------------------------------------

def test_wandb_history_csv(tmp_path):
    f = tmp_path / "history.csv"
    f.write_text("_step,_runtime,_timestamp,train/kl,train/reward,note\n"
                 "0,1.0,1700000000,0.01,0.5,a\n"
                 "1,2.0,1700000001,,0.6,b\n"              # sparse: kl not logged this step
                 "2,3.0,1700000002,NaN,0.7,\n"
                 "x,4.0,1700000003,0.02,0.8,\n"             # bad step
                 "3,5.0,1700000004,,,\n")                   # nothing logged: not a record
    records, skipped = read_recorded(f)
    assert records[:2] == [{"step": 0, "metrics": {"train/kl": 0.01, "train/reward": 0.5}},
                           {"step": 1, "metrics": {"train/reward": 0.6}}]
    assert records[2]["step"] == 2 and math.isnan(records[2]["metrics"]["train/kl"])
    assert len(records) == 3 and skipped == 1


def test_wandb_ui_csv_export(tmp_path):
    f = tmp_path / "export.csv"
    f.write_text('"Step","grpo-7b - train/kl","grpo-7b - train/kl__MIN","grpo-7b - train/kl__MAX"\n'
                 '"10","0.02","0.01","0.03"\n"20","0.04","0.03","0.05"\n')
    assert read_recorded(f) == ([{"step": 10, "metrics": {"train/kl": 0.02}},
                                 {"step": 20, "metrics": {"train/kl": 0.04}}], 0)
    two = tmp_path / "two.csv"
    two.write_text("Step,a - kl,b - kl\n1,0.1,0.9\n")
    records, skipped = read_recorded(two)
    assert records == [{"step": 1, "metrics": {"kl": 0.1}}] and skipped == 1
    nostep = tmp_path / "nostep.csv"
    nostep.write_text("kl,reward\n0.1,0.2\n")
    assert read_recorded(nostep) == ([], 1)


def test_wandb_history_jsonl(tmp_path):
    f = tmp_path / "wandb-history.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"_step": 0, "_runtime": 3.2, "_timestamp": 1.7e9, "train/kl": 0.01,
         "samples": {"_type": "table-file", "path": "x"}},
        {"_step": 1, "train/kl": 0.02, "_wandb": {"runtime": 4}},
        {"_runtime": 9.0},                                          # no step: not a record
    ]) + "\n{oops\n")
    records, skipped = read_recorded(f)
    assert records == [{"step": 0, "metrics": {"train/kl": 0.01}}, {"step": 1, "metrics": {"train/kl": 0.02}}]
    assert skipped == 1


# -- console logs --------------------------------------------------------------------------------

VERL_LOG = """\
2025-01-01 12:00:00 INFO Started a local Ray instance.
(TaskRunner pid=4242) step:1 - actor/pg_loss:np.float64(0.1) - critic/vf_loss:2.3 - actor/entropy:1.5e-1 - actor/lr:1e-06
(TaskRunner pid=4242) step:2 - actor/pg_loss:0.2 - critic/vf_loss:2.1 - training/flag:True
some warning: step:three - nothing here
(TaskRunner pid=4242) step:3 - actor/pg_loss:nan - critic/vf_loss:inf
(TaskRunner pid=4242) step:4 - gibberish - more gibberish
"""


def test_verl_console_log(tmp_path):
    f = tmp_path / "verl_run.log"
    f.write_text(VERL_LOG)
    records, skipped = read_recorded(f)
    assert records[0] == {"step": 1, "metrics": {"actor/pg_loss": 0.1, "critic/vf_loss": 2.3,
                                                 "actor/entropy": 0.15, "actor/lr": 1e-6}}
    assert records[1] == {"step": 2, "metrics": {"actor/pg_loss": 0.2, "critic/vf_loss": 2.1}}
    assert records[2]["step"] == 3 and math.isnan(records[2]["metrics"]["actor/pg_loss"])
    assert records[2]["metrics"]["critic/vf_loss"] == math.inf
    assert len(records) == 3 and skipped == 1                    # step:4 has no parsable pair


OPENRLHF_LOG = """\
[2025-01-01 12:00:00] Loading checkpoint ...
{'train/kl': 0.01, 'train/reward': np.float64(0.5), 'train/policy_loss': tensor(0.2, device='cuda:0'), 'train/global_step': 4}
{'train/kl': 0.02, 'train/reward': 0.55, 'train/global_step': 5}
args: {'pretrain': 'meta-llama/Llama-3-8b', 'micro_train_batch_size': 2}
{'train/kl': 0.03, 'train/rew
Train epoch [1/1]:  40%|####      | 6/15 [00:30<00:45, policy_loss=0.11, kl=0.04, reward=0.6]
"""


def test_openrlhf_console_log(tmp_path):
    f = tmp_path / "openrlhf.txt"
    f.write_text(OPENRLHF_LOG)
    records, skipped = read_recorded(f)
    assert records[0] == {"step": 4, "metrics": {"train/kl": 0.01, "train/reward": 0.5, "train/policy_loss": 0.2}}
    assert records[1] == {"step": 5, "metrics": {"train/kl": 0.02, "train/reward": 0.55}}
    assert records[2] == {"step": 6, "metrics": {"policy_loss": 0.11, "kl": 0.04, "reward": 0.6}}
    # the settings dict (a number but no step) and the cut-off dict are skipped and counted
    assert len(records) == 3 and skipped == 2
    errors = [r for _, r in iter_recorded(f) if isinstance(r, str)]
    assert any("without a step" in e for e in errors) and any("cut off" in e for e in errors)


# -- replay wiring ---------------------------------------------------------------------------------

def replay_alerts(capsys, path, *extra):
    code = main(["replay", str(path), "--json", *extra])
    cap = capsys.readouterr()
    return code, [json.loads(x) for x in cap.out.splitlines() if x.strip()], cap.err


def test_replay_reads_a_tensorboard_file(tmp_path, capsys):
    recs = [tfrecord(event(None, version="brain.Event:2"))]
    for s in range(40):
        recs.append(tfrecord(event(s, [simple_value("train/kl", 0.02 if s < 20 else 0.9)])))
    f = write_events(tmp_path / "events.out.tfevents.1700000000.host", recs)
    code, alerts, err = replay_alerts(capsys, f, "--preset", "trl-grpo")
    assert code == 0 and "0 lines skipped" in err
    assert any(a["rule"] == "kl_above_target" and a["severity"] == "black" and a["step"] >= 20
               for a in alerts)


def test_replay_reads_verl_console_logs_and_wandb_jsonl(tmp_path, capsys):
    lines = [f"step:{s} - actor/kl_loss:{0.02 if s < 20 else 0.9} - actor/pg_loss:0.1" for s in range(40)]
    f = tmp_path / "verl.log"
    f.write_text("noise\n" + "\n".join(lines) + "\n")
    code, alerts, _ = replay_alerts(capsys, f, "--preset", "verl")
    assert code == 0 and any(a["rule"] == "kl_above_target" and a["run_id"] == "verl" for a in alerts)
    w = tmp_path / "wandb-history.jsonl"
    w.write_text("".join(json.dumps({"_step": s, "_runtime": s * 2.0,
                                     "train/kl": 0.02 if s < 20 else 0.9}) + "\n" for s in range(40)))
    code, alerts, err = replay_alerts(capsys, w, "--preset", "trl-grpo")
    assert code == 0 and "0 lines skipped" in err
    assert any(a["rule"] == "kl_above_target" and a["severity"] == "black" for a in alerts)


def test_iter_records_keeps_jsonl_semantics(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"step": 1, "metrics": {"kl": 1}}\n[1]\n{bad\n{"_step": 2, "kl": 3}\n')
    assert list(iter_records(f)) == [(1, {"step": 1, "metrics": {"kl": 1}}),
                                     (2, "a line must be a JSON object"),
                                     (3, "bad JSON: Expecting property name enclosed in double quotes"),
                                     (4, {"step": 2, "metrics": {"kl": 3.0}})]
