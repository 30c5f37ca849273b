"""producers.integrations.adapters: plain logged dicts through the presets to Monitor.log, in
the call shapes of veRL, OpenRLHF and NeMo-RL."""

from __future__ import annotations

import json

import numpy as np
import pytest

from producers import Monitor
from producers.integrations import DictLogger, NemoRLLogger, OpenRLHFLogger, VerlTracking
from producers.integrations.adapters import to_metrics
from contract.events import parse_event
from tests.support.transports import RecordingTransport


@pytest.fixture
def mon():
    transport = RecordingTransport()
    m = Monitor("adapters-run", redis=False, transport=transport, heartbeat_seconds=0)
    m.transport = transport

    def events():
        assert m.flush(10.0)
        return [json.loads(v) for _, v in transport.items]

    m.events = events
    yield m
    m.close(2.0)


def test_to_metrics_keeps_numbers_and_counts_the_rest():
    metrics, skipped = to_metrics({
        "a": 1, "b": 2.5, "c": np.float32(0.25), "d": np.int64(3), "e": np.array(4.0),
        "f": np.array([5.0]), "g": "text", "h": None, "i": True, "j": [1, 2], "k": np.ones(3),
        "step": 9, "epoch": 0.5, "nan": float("nan"),
    })
    assert metrics == {"a": 1.0, "b": 2.5, "c": 0.25, "d": 3.0, "e": 4.0, "f": 5.0,
                       "nan": pytest.approx(float("nan"), nan_ok=True)}
    assert all(type(v) is float for v in metrics.values())
    assert sorted(skipped) == ["g", "h", "i", "j", "k"]


def test_dict_logger_maps_through_the_preset(mon):
    rl = DictLogger(mon, preset="verl")
    sent = rl.log(12, {"actor/pg_loss": 0.1, "critic/vf_loss": 2.3, "actor/entropy": np.float64(1.9),
                       "custom/thing": 7, "timing/gen": "n/a"})
    assert sent == {"loss/policy": 0.1, "loss/value": 2.3, "entropy/mean": 1.9, "custom/thing": 7.0}
    (ev,) = mon.events()
    assert ev["step"] == 12 and ev["metrics"] == sent and ev["run_id"] == "adapters-run"
    parse_event(json.dumps(ev), 0.0)
    assert rl.skipped == 1 and rl.logged == 1


def test_dict_logger_without_preset_finds_the_step_in_the_dict(mon):
    rl = DictLogger(mon)
    rl.log(None, {"_step": 4, "kl/mean": 0.02, "_runtime": 33.0})
    rl.log(None, {"global_step": 5, "kl/mean": 0.03})
    assert [(e["step"], e["metrics"]) for e in mon.events()] == [(4, {"kl/mean": 0.02}), (5, {"kl/mean": 0.03})]
    with pytest.raises(ValueError, match="no step"):
        rl.log(None, {"kl/mean": 0.1})
    with pytest.raises(TypeError):
        rl.log(1, [("kl", 0.1)])
    with pytest.raises(ValueError, match="unknown preset"):
        DictLogger(mon, preset="nope")


def test_dict_logger_passes_dists_and_hashes_through(mon):
    DictLogger(mon, preset="openrlhf").log(3, {"train/kl": 0.1}, dists={"reward": [1.0, 2.0]},
                                           hashes={"actor": "sha256:ab"})
    (ev,) = mon.events()
    assert ev["metrics"] == {"kl/mean": 0.1}
    assert ev["dists"] == {"reward": [1.0, 2.0]} and ev["hashes"] == {"actor": "sha256:ab"}


def test_verl_tracking_shape_and_wrapping(mon):
    class Tracking:                       # veRL's verl.utils.tracking.Tracking interface
        def __init__(self):
            self.calls = []
            self.default_backend = ["console"]

        def log(self, data, step, backend=None):
            self.calls.append((dict(data), step, backend))

    inner = Tracking()
    logger = VerlTracking(mon, inner)
    data = {"actor/pg_loss": 0.1, "critic/vf_loss": 2.3, "actor/ppo_kl": 0.01,
            "response_length/clip_ratio": 0.05, "critic/score/mean": 0.7}
    logger.log(data=data, step=12)
    logger.log(data, 13, backend="console")
    assert [c[1:] for c in inner.calls] == [(12, None), (13, "console")]
    assert logger.default_backend == ["console"]        # the wrapped tracker's attributes
    evs = mon.events()
    assert [e["step"] for e in evs] == [12, 13]
    assert evs[0]["metrics"] == {"loss/policy": 0.1, "loss/value": 2.3, "kl/ppo": 0.01,
                                 "response/truncated_frac": 0.05, "reward/mean": 0.7}
    alone = VerlTracking(mon)
    alone.log({"actor/entropy": 1.2}, step=14)
    assert mon.events()[-1]["metrics"] == {"entropy/mean": 1.2}
    with pytest.raises(AttributeError):
        _ = alone.default_backend


def test_openrlhf_logs_with_and_without_prefix(mon):
    rl = OpenRLHFLogger(mon)
    rl.log(5, {"kl": 0.01, "reward": 0.5, "policy_loss": 0.2, "actor_lr": 1e-6})
    # as OpenRLHF hands it to wandb: prefixed, with the step inside
    rl.log(None, {"train/kl": 0.02, "train/return": 0.4, "train/response_length": 300,
                  "train/global_step": 6})
    a, b = mon.events()
    assert (a["step"], a["metrics"]) == (5, {"kl/mean": 0.01, "reward/mean": 0.5, "loss/policy": 0.2,
                                             "lr/actor": 1e-6})
    assert (b["step"], b["metrics"]) == (6, {"kl/mean": 0.02, "returns/mean": 0.4,
                                             "response/length_mean": 300.0})


def test_nemo_rl_log_metrics_with_prefix(mon):
    rl = NemoRLLogger(mon)
    rl.log_metrics({"loss": 0.3, "reward": 0.8, "grad_norm": 1.1, "gen_kl_error": 0.001}, 9, prefix="train")
    rl.log_metrics({"train/critic/loss": 1.5}, 10)
    a, b = mon.events()
    assert (a["step"], a["metrics"]) == (9, {"loss/policy": 0.3, "reward/mean": 0.8,
                                             "grad_norm/actor": 1.1, "kl/gen_error": 0.001})
    assert b["metrics"] == {"loss/value": 1.5}
