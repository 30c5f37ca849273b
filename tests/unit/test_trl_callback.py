"""RlwatchCallback against the real transformers classes (TrainerCallback, TrainerState,
TrainerControl, TrainingArguments, and the CallbackHandler + DefaultFlowCallback that Trainer
drives its callbacks with); the Monitor runs with an in-process transport and command inbox."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from producers import Monitor
from producers.control import CommandInbox
from producers.integrations import RlwatchCallback
from producers.integrations.trl import detect_preset
from contract.commands import Command
from contract.events import parse_event
from tests.support.transports import RecordingTransport
from tests.support.paths import REAL_LOGS

RUN = "trl-run-a"
WAIT = 10.0


class GRPOConfig(TrainingArguments):
    """What TRL's config classes are: TrainingArguments subclasses (only the name matters)."""


class FakeOptimizer:
    def __init__(self, lr):
        self.param_groups = [{"lr": lr}, {"lr": lr / 10}]


class FakeScheduler:
    def __init__(self, lr):
        self.base_lrs = [lr, lr / 10]


class Rig:
    """A Monitor + callback wired into a real CallbackHandler, driven as Trainer drives it."""

    def __init__(self, tmp_path, *, args=None, optimizer=None, scheduler=None, **cb_kw):
        self.transport = RecordingTransport()
        self.inbox = CommandInbox(RUN)
        self.acks: list[dict] = []
        self.inbox.on_ack = self.acks.append
        self.mon = Monitor(RUN, redis=False, transport=self.transport, inbox=self.inbox,
                           heartbeat_seconds=0)
        self.cb = RlwatchCallback(self.mon, **cb_kw)
        self.args = args or TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none",
                                              save_strategy="no")
        self.state = TrainerState()
        self.control = TrainerControl()
        self.handler = CallbackHandler([DefaultFlowCallback(), self.cb], None, None, optimizer, scheduler)

    def begin(self):
        self.control = self.handler.on_train_begin(self.args, self.state, self.control)

    def step_begin(self):
        self.control = self.handler.on_step_begin(self.args, self.state, self.control)

    def step_end(self):
        self.state.global_step += 1
        self.control = self.handler.on_step_end(self.args, self.state, self.control)

    def log(self, logs):
        self.control = self.handler.on_log(self.args, self.state, self.control, logs)

    def save(self):
        self.control = self.handler.on_save(self.args, self.state, self.control)

    def send(self, action, params=None):
        self.inbox.deliver_command(Command(run_id=RUN, action=action, params=params or {},
                                           ts=time.time(), reason=f"test {action}", issuer="test"))

    def flushed(self, kind="step"):
        assert self.mon.flush(WAIT)
        return self.transport.events(kind)

    def close(self):
        self.inbox.close()
        self.mon.close(2.0)


@pytest.fixture
def rig(tmp_path):
    made = []

    def build(**kw):
        r = Rig(tmp_path, **kw)
        made.append(r)
        return r

    yield build
    for r in made:
        r.close()


def real_log(name, n=3):
    lines = (REAL_LOGS / name).read_text().splitlines()[:n]
    return [json.loads(x) for x in lines]


def test_is_a_real_transformers_callback():
    cb = RlwatchCallback(Monitor(RUN, redis=False, kafka=False, heartbeat_seconds=0))
    assert isinstance(cb, TrainerCallback)
    for event in ("on_log", "on_step_begin", "on_step_end", "on_save", "on_train_begin", "on_train_end"):
        assert getattr(type(cb), event) is not getattr(TrainerCallback, event), event
    cb.monitor.close(1.0)


def test_grpo_logs_are_mapped_by_the_auto_detected_preset(rig):
    r = rig()
    r.begin()
    for rec in real_log("trl_grpo_wordle_400.jsonl"):
        r.state.global_step = rec["step"]
        r.log(dict(rec["metrics"]))
    events = r.flushed()
    assert [e["step"] for e in events] == [1, 2, 3]
    m = events[0]["metrics"]
    src = real_log("trl_grpo_wordle_400.jsonl", 1)[0]["metrics"]
    assert r.cb.preset.name == "trl-grpo"
    assert m["reward/mean"] == pytest.approx(src["reward"])
    assert m["reward/std"] == pytest.approx(src["reward_std"])
    assert m["kl/mean"] == pytest.approx(src["kl"])
    assert m["entropy/mean"] == pytest.approx(src["entropy"])
    assert m["response/truncated_frac"] == pytest.approx(src["completions/clipped_ratio"])
    assert m["grad_norm/actor"] == pytest.approx(src["grad_norm"])
    assert m["rewards/wordle_reward_func/mean"] == pytest.approx(src["rewards/wordle_reward_func/mean"])
    assert "epoch" not in m and "reward" not in m
    for e in events:
        parse_event(json.dumps(e), 0.0)          # contract-valid


def test_ppo_logs_are_mapped_by_the_auto_detected_preset(rig):
    r = rig()
    r.begin()
    rec = real_log("trl_ppo_kartik_v1_s2025.jsonl", 1)[0]
    r.state.global_step = 7
    r.log(dict(rec["metrics"]))
    (ev,) = r.flushed()
    assert r.cb.preset.name == "trl-ppo" and ev["step"] == 7
    assert ev["metrics"]["kl/mean"] == pytest.approx(rec["metrics"]["objective/kl"])
    assert ev["metrics"]["reward/mean"] == pytest.approx(rec["metrics"]["objective/scores"])
    assert ev["metrics"]["lr/actor"] == pytest.approx(rec["metrics"]["lr"])
    assert ev["metrics"]["response/eos_count"] == 0.0


def test_config_class_decides_and_train_prefix_is_stripped(rig, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "g"), report_to="none")
    r = rig(args=args)
    r.begin()
    assert r.cb.preset.name == "trl-grpo"       # before any log: the config class says GRPO
    r.state.global_step = 3
    r.log({"train/loss": 0.5, "train/kl": 0.02, "train/learning_rate": 1e-6, "note": "text"})
    (ev,) = r.flushed()
    assert ev["metrics"] == {"loss/policy": 0.5, "kl/mean": 0.02, "lr/actor": 1e-6}
    assert detect_preset({"loss"}, None) is None
    # without a config, the names decide, as everywhere else in rlwatch
    assert detect_preset({"objective/kl", "objective/scores", "policy/clipfrac_avg"}) == "trl-ppo"
    assert detect_preset({"reward", "reward_std", "frac_reward_zero_std", "kl"}) == "trl-grpo"
    assert detect_preset({"rewards/chosen", "rewards/rejected", "rewards/margins"}) == "trl-dpo"


def test_explicit_preset_or_none(rig):
    r = rig(preset="trl-ppo")
    r.begin()
    r.log({"kl": 0.1, "objective/kl": 3.0})
    r2 = rig(preset=None)
    r2.begin()
    r2.log({"kl": 0.1, "objective/kl": 3.0})
    assert r.flushed()[0]["metrics"] == {"kl": 0.1, "kl/mean": 3.0}
    assert r2.flushed()[0]["metrics"] == {"kl": 0.1, "objective/kl": 3.0}
    with pytest.raises(ValueError, match="unknown preset"):
        RlwatchCallback(r.mon, preset="trl-nope")


def test_summary_log_and_non_main_ranks_are_not_published(rig):
    r = rig()
    r.begin()
    r.log({"train_runtime": 12.0, "train_samples_per_second": 3.0, "train_loss": 0.4, "epoch": 1.0})
    r.state.is_world_process_zero = False
    r.log({"kl": 0.1})
    assert r.flushed() == []
    r_all = rig(log_all_ranks=True)
    r_all.begin()
    r_all.state.is_world_process_zero = False
    r_all.log({"kl": 0.1})
    assert len(r_all.flushed()) == 1


def test_pause_blocks_the_step_until_resume(rig):
    r = rig()
    r.begin()
    r.send("pause")
    done = threading.Event()

    def step():
        r.step_begin()
        done.set()

    th = threading.Thread(target=step, daemon=True)
    th.start()
    assert not done.wait(0.5), "a paused run must block at the step boundary"
    r.send("resume")
    assert done.wait(WAIT)
    assert not r.control.should_training_stop
    assert [a["status"] for a in r.acks] == ["applied", "applied"]


def test_stop_ends_training_cleanly_and_saves_without_raising(rig):
    r = rig()
    r.begin()
    r.step_begin()
    r.step_end()
    r.send("stop")
    r.step_begin()                          # must not raise TrainingStopped into the trainer
    assert r.control.should_training_stop and r.control.should_save
    assert r.cb.stopped is not None and "test stop" in str(r.cb.stopped)
    # Trainer then runs the step, calls on_step_end and saves: the flags survive the flow
    r.step_end()
    assert r.control.should_training_stop and r.control.should_save
    r.save()
    assert not r.control.should_save        # CallbackHandler.on_save resets it, as in Trainer
    (ck,) = r.flushed("checkpoint")
    assert ck["step"] == 2 and ck["path"] == os.path.join(r.args.output_dir, "checkpoint-2")
    assert r.acks[-1]["action"] == "stop" and r.acks[-1]["status"] == "applied"


def test_loops_without_on_step_begin_get_the_boundary_at_step_end(rig):
    """TRL's PPOTrainer calls on_step_end and on_save but not on_step_begin."""
    r = rig()
    r.begin()
    r.step_end()
    r.send("stop")
    r.step_end()
    assert r.control.should_training_stop and r.control.should_save


def test_builtin_adjust_scales_the_learning_rate_and_beta(rig):
    class Trainer:
        beta = 0.04

    opt, sched, trainer = FakeOptimizer(1e-5), FakeScheduler(1e-5), Trainer()
    r = rig(optimizer=opt, scheduler=sched, trainer=trainer)
    r.begin()
    r.send("adjust", {"lr": 0.5, "beta": 2.0})
    r.step_begin()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([5e-6, 5e-7])
    assert sched.base_lrs == pytest.approx([5e-6, 5e-7])
    assert trainer.beta == pytest.approx(0.08)
    assert r.cb.adjustments == [{"lr": 0.5, "beta": 2.0}]
    assert r.acks[-1]["action"] == "adjust" and r.acks[-1]["status"] == "applied"
    # nothing applicable: the command is acknowledged as failed, training goes on
    r.send("adjust", {"temperature": 0.9})
    r.step_begin()
    assert r.acks[-1]["status"] == "failed" and "temperature" in r.acks[-1]["detail"]
    assert not r.control.should_training_stop


def test_adjust_reaches_args_kl_coef_for_ppo(rig, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path / "p"), report_to="none")
    args.kl_coef = 0.05                     # PPOConfig's field; PPOTrainer reads it each step
    r = rig(args=args)
    r.begin()
    r.send("adjust", {"kl_coef": 1.5})
    r.step_begin()
    assert args.kl_coef == pytest.approx(0.075)


def test_user_adjust_callback_receives_the_parameters(rig):
    got = []
    r = rig(on_adjust=lambda params, cmd: got.append((params, cmd.action)))
    r.begin()
    r.send("adjust", {"lr": 0.5})
    r.step_begin()
    assert got == [({"lr": 0.5}, "adjust")]
    assert r.acks[-1]["status"] == "applied"


def test_monitor_failures_never_reach_the_trainer(rig):
    r = rig()
    r.begin()

    def boom(*a, **k):
        raise RuntimeError("kafka exploded")

    r.mon.log = boom
    r.mon.log_checkpoint = boom
    r.mon.step_boundary = boom
    r.log({"kl": 0.1})
    r.save()
    r.step_begin()
    assert r.cb.errors == 3 and not r.control.should_training_stop


def test_callback_can_own_its_monitor(tmp_path):
    transport = RecordingTransport()
    cb = RlwatchCallback(redis=False, transport=transport, heartbeat_seconds=0)
    args = TrainingArguments(output_dir=str(tmp_path / "o"), report_to="none", run_name="my run 7")
    state, control = TrainerState(), TrainerControl()
    handler = CallbackHandler([DefaultFlowCallback(), cb], None, None, None, None)
    control = handler.on_train_begin(args, state, control)
    assert cb.monitor is not None and cb.monitor.run_id == "my-run-7"
    state.global_step = 1
    handler.on_log(args, state, control, {"kl": 0.01, "reward": 1.0})
    handler.on_train_end(args, state, control)
    assert cb.monitor._closed
    *sent, last = [json.loads(v) for _, v in transport.items]
    assert last["kind"] == "heartbeat" and last["final"] is True   # closed cleanly: the run finished
    (ev,) = sent
    assert ev["run_id"] == "my-run-7" and ev["metrics"] == {"kl/mean": 0.01, "reward/mean": 1.0}
