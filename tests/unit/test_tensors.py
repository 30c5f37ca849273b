"""producers.tensors against straightforward NumPy formulas. When torch happens to be importable,
every check also runs on torch tensors (same answers); the NumPy path must never import torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from producers.tensors import (
    Stats,
    entropy_from_logits,
    grad_norm,
    kl_stats,
    param_hash,
    response_stats,
    update_ratio,
)
from contract.events import dump_event, parse_event

ROOT = Path(__file__).resolve().parents[2]

try:  # not a dependency: the torch checks run only where torch already is
    import torch  # noqa: F401

    BACKENDS = ["numpy", "torch"]
except ImportError:
    BACKENDS = ["numpy"]


def conv(backend: str, a):
    if backend == "numpy":
        return np.asarray(a)
    import torch

    return torch.as_tensor(np.asarray(a))


def batch(seed=0, b=4, t=16):
    rng = np.random.default_rng(seed)
    lp = rng.normal(-2.0, 0.7, size=(b, t))
    ref = lp + rng.normal(0.0, 0.3, size=(b, t))
    lengths = rng.integers(3, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    return lp, ref, mask


# -- KL --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_stats_match_numpy_formulas_over_masked_tokens(backend):
    lp, ref, mask = batch()
    # a huge KL at a masked-out (padding) position must not count anywhere
    ref[0, -1] = -50.0
    mask[0, -1] = False
    d = lp - ref
    sel = d[mask]
    out = kl_stats(conv(backend, lp), conv(backend, ref), conv(backend, mask))
    assert set(out) == {"kl/mean", "kl/token_max", "kl/token_p99"}
    assert out["kl/mean"] == pytest.approx(sel.sum() / mask.sum(), rel=1e-9)
    assert out["kl/token_max"] == pytest.approx(sel.max(), rel=1e-12)
    assert out["kl/token_p99"] == pytest.approx(np.percentile(sel, 99), rel=1e-9)
    want = np.unravel_index(np.argmax(np.where(mask, d, -np.inf)), d.shape)
    assert out.extra["argmax"] == tuple(int(i) for i in want)
    assert out.extra["argmax"] != (0, lp.shape[1] - 1)
    assert all(isinstance(v, float) for v in out.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_argmax_token_is_reported_and_decoded(backend):
    lp, ref, mask = batch(seed=3)
    ref[2, 5] = lp[2, 5] - 9.0          # the largest per-token KL, at row 2, position 5
    mask[2, 5] = True
    tokens = np.arange(lp.size).reshape(lp.shape) + 1000
    vocab = {int(i): f"tok{i}" for i in tokens.reshape(-1)}
    out = kl_stats(conv(backend, lp), conv(backend, ref), conv(backend, mask),
                   tokens=conv(backend, tokens), decode=vocab.__getitem__)
    assert out.extra["argmax"] == (2, 5)
    assert out.extra["argmax_flat"] == 2 * lp.shape[1] + 5
    assert out.extra["argmax_token_id"] == int(tokens[2, 5])
    assert out.extra["argmax_token"] == f"tok{tokens[2, 5]}"
    assert out["kl/token_max"] == pytest.approx(9.0)

    def list_decoder(ids):            # tokenizers whose decode takes a list of ids
        if not isinstance(ids, list):
            raise TypeError("a list, please")
        return "|".join(vocab[i] for i in ids)

    out = kl_stats(lp, ref, mask, tokens=tokens, decode=list_decoder)
    assert out.extra["argmax_token"] == f"tok{tokens[2, 5]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs"])
def test_kl_estimators(backend, estimator):
    lp, ref, mask = batch(seed=5)
    d = lp - ref
    per_token = {"k1": d, "k2": 0.5 * d ** 2, "k3": np.exp(-d) - 1 + d, "abs": np.abs(d)}[estimator]
    sel = per_token[mask]
    out = kl_stats(conv(backend, lp), conv(backend, ref), conv(backend, mask), estimator=estimator)
    assert out["kl/mean"] == pytest.approx(sel.mean(), rel=1e-9)
    assert out["kl/token_max"] == pytest.approx(sel.max(), rel=1e-9)
    assert out["kl/token_p99"] == pytest.approx(np.quantile(sel, 0.99), rel=1e-9)
    if estimator != "k1":
        assert out["kl/mean"] >= 0


def test_kl_without_mask_uses_every_token_and_other_quantiles():
    lp, ref, _ = batch(seed=7, b=3, t=50)
    d = lp - ref
    out = kl_stats(lp, ref, q=0.5)
    assert out["kl/mean"] == pytest.approx(d.mean())
    assert out["kl/token_p99"] == pytest.approx(np.median(d))


def test_kl_of_float32_and_float16_inputs_is_computed_in_at_least_float32():
    lp, ref, mask = batch(seed=9)
    out16 = kl_stats(lp.astype(np.float16), ref.astype(np.float16), mask)
    d16 = lp.astype(np.float16).astype(np.float64) - ref.astype(np.float16).astype(np.float64)
    assert out16["kl/mean"] == pytest.approx(d16[mask].mean(), rel=1e-6)
    out32 = kl_stats(lp.astype(np.float32), ref.astype(np.float32), mask)
    assert out32["kl/mean"] == pytest.approx((lp - ref)[mask].mean(), rel=1e-4)


def test_kl_empty_mask_logs_nothing_and_bad_input_is_refused():
    lp, ref, mask = batch()
    assert kl_stats(lp, ref, np.zeros_like(mask)) == {}
    with pytest.raises(ValueError, match="shape"):
        kl_stats(lp, ref[:, :-1], mask)
    with pytest.raises(ValueError, match="estimator"):
        kl_stats(lp, ref, mask, estimator="k9")


# -- entropy -------------------------------------------------------------------------------------

def naive_entropy(logits):
    p = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    return -(p * np.log(p)).sum(axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_entropy_is_the_masked_mean_of_the_softmax_entropy(backend):
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 2.0, size=(3, 7, 13))
    mask = rng.random((3, 7)) < 0.6
    mask[0, 0] = True
    want = naive_entropy(logits)[mask].mean()
    out = entropy_from_logits(conv(backend, logits), conv(backend, mask))
    assert set(out) == {"entropy/mean"}
    assert out["entropy/mean"] == pytest.approx(want, rel=1e-9)
    # chunking changes nothing
    assert entropy_from_logits(conv(backend, logits), conv(backend, mask), chunk=2)["entropy/mean"] == \
        pytest.approx(want, rel=1e-9)


def test_entropy_of_uniform_and_of_huge_logits():
    v = 50
    assert entropy_from_logits(np.zeros((2, 4, v)))["entropy/mean"] == pytest.approx(np.log(v))
    peaked = np.zeros((1, 2, v))
    peaked[..., 3] = 1e4                         # exp() would overflow without the max shift
    out = entropy_from_logits(peaked)["entropy/mean"]
    assert np.isfinite(out) and out == pytest.approx(0.0, abs=1e-12)
    assert entropy_from_logits(np.zeros((2, 3, v)), np.zeros((2, 3), bool)) == {}


# -- responses -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_response_stats(backend):
    lengths = [10, 512, 300, 512, 7]
    eos = [True, False, True, True, True]       # the second 512 ended with EOS: not truncated
    out = response_stats(conv(backend, lengths), 512, eos=conv(backend, eos))
    assert out == {"response/length_mean": pytest.approx(np.mean(lengths)),
                   "response/length_max": 512.0,
                   "response/truncated_frac": pytest.approx(1 / 5),
                   "response/eos_frac": pytest.approx(4 / 5)}
    no_eos = response_stats(conv(backend, lengths), 512)
    assert no_eos["response/truncated_frac"] == pytest.approx(2 / 5)
    assert "response/eos_frac" not in no_eos
    assert response_stats([], 512) == {}


# -- norms ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_update_ratio_single_tensor_and_parameter_lists(backend):
    rng = np.random.default_rng(13)
    olds = [rng.normal(size=(8, 4)), rng.normal(size=(5,)), rng.normal(size=(2, 3, 3))]
    news = [o + rng.normal(scale=1e-3, size=o.shape) for o in olds]
    num = np.sqrt(sum(((n - o) ** 2).sum() for o, n in zip(olds, news, strict=True)))
    den = np.sqrt(sum((o ** 2).sum() for o in olds))
    out = update_ratio([conv(backend, o) for o in olds], [conv(backend, n) for n in news])
    assert set(out) == {"update_ratio/actor"}
    assert out["update_ratio/actor"] == pytest.approx(num / den, rel=1e-9)
    assert out.extra["update_norm"] == pytest.approx(num) and out.extra["param_norm"] == pytest.approx(den)
    one = update_ratio(conv(backend, olds[0]), conv(backend, news[0]), model="critic")
    assert one["update_ratio/critic"] == pytest.approx(
        np.linalg.norm(news[0] - olds[0]) / np.linalg.norm(olds[0]), rel=1e-9)
    assert update_ratio(conv(backend, olds[1]), conv(backend, olds[1]))["update_ratio/actor"] == 0.0


def test_update_ratio_checks_shapes_and_counts():
    with pytest.raises(ValueError, match="tensors"):
        update_ratio([np.ones(3)], [np.ones(3), np.ones(3)])
    with pytest.raises(ValueError, match="shapes"):
        update_ratio(np.ones(3), np.ones(4))
    assert update_ratio(np.zeros(3), np.ones(3))["update_ratio/actor"] == float("inf")


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_norm_is_the_global_l2_norm(backend):
    rng = np.random.default_rng(17)
    grads = [rng.normal(size=(16, 8)), rng.normal(size=(8,)), rng.normal(size=(3, 3))]
    want = np.sqrt(sum((g ** 2).sum() for g in grads))
    out = grad_norm([conv(backend, g) for g in grads])
    assert out == {"grad_norm/actor": pytest.approx(want, rel=1e-9)}
    assert grad_norm(conv(backend, grads[0]), model="critic") == \
        {"grad_norm/critic": pytest.approx(np.linalg.norm(grads[0]), rel=1e-9)}
    assert grad_norm([]) == {}


# -- parameter hash --------------------------------------------------------------------------------

def weights(seed=19):
    rng = np.random.default_rng(seed)
    return {"embed": rng.normal(size=(300, 64)).astype(np.float32),
            "layer.0.w": rng.normal(size=(64, 64)).astype(np.float32),
            "layer.0.b": np.zeros(64, dtype=np.float32)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_param_hash_equal_weights_equal_hash(backend):
    w = weights()
    h = param_hash({k: conv(backend, v) for k, v in w.items()})
    assert h.startswith("sha256:") and len(h) == len("sha256:") + 64
    assert int(h[7:], 16) >= 0
    assert param_hash({k: conv(backend, v.copy()) for k, v in w.items()}) == h
    assert param_hash({k: v.copy() for k, v in w.items()}) == h      # numpy and torch agree


def test_param_hash_sees_sampled_changes_dtype_shape_and_names():
    w = weights()
    h = param_hash(w)
    changed = {k: v.copy() for k, v in w.items()}
    changed["embed"][-1, -1] += 1.0                 # the last element is always sampled
    assert param_hash(changed) != h
    assert param_hash({**w, "layer.0.b": w["layer.0.b"].astype(np.float64)}) != h
    assert param_hash({**w, "layer.0.w": w["layer.0.w"].reshape(32, 128)}) != h
    assert param_hash({("x" + k): v for k, v in w.items()}) != h
    assert param_hash(list(w.values())) != h        # index names, not the dict's
    assert param_hash(list(w.values())) == param_hash(tuple(v.copy() for v in w.values()))


def test_param_hash_trade_off_sample_versus_every_byte():
    w = weights()
    n = w["embed"].size
    sampled = set(np.linspace(0, n - 1, num=16).round().astype(int).tolist())
    hidden = next(i for i in range(n) if i not in sampled)
    changed = {k: v.copy() for k, v in w.items()}
    changed["embed"].reshape(-1)[hidden] += 1.0
    # a change between the sampled elements is missed by a 16-element sample ...
    assert param_hash(changed, per_tensor=16) == param_hash(w, per_tensor=16)
    # ... and found by hashing every byte
    assert param_hash(changed, per_tensor=None) != param_hash(w, per_tensor=None)
    # a diverged rank differs almost everywhere: the default sample finds it
    drift = {k: v + np.float32(1e-3) for k, v in w.items()}
    assert param_hash(drift) != param_hash(w)


def test_param_hash_is_identical_across_processes():
    """Ranks are separate processes: the hash must not depend on anything process-local."""
    code = ("import numpy as np, sys; sys.path.insert(0, %r)\n"
            "from producers.tensors import param_hash\n"
            "rng = np.random.default_rng(19)\n"
            "w = {'embed': rng.normal(size=(300, 64)).astype(np.float32),"
            " 'layer.0.w': rng.normal(size=(64, 64)).astype(np.float32),"
            " 'layer.0.b': np.zeros(64, dtype=np.float32)}\n"
            "print(param_hash(w))" % str(ROOT))
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60, env={"PYTHONHASHSEED": str(seed)}).stdout.strip()
            for seed in (1, 2)}
    assert outs == {param_hash(weights())}


# -- fit with the rest of the SDK ------------------------------------------------------------------

def test_stats_are_loggable_metrics_of_a_contract_event():
    lp, ref, mask = batch()
    m = Stats()
    m.update(kl_stats(lp, ref, mask))
    m.update(entropy_from_logits(np.zeros((2, 3, 5))))
    m.update(response_stats([3, 9], 9, eos=[True, False]))
    m.update(grad_norm([np.ones(4)]))
    m.update(update_ratio(np.ones(4), np.full(4, 1.01)))
    ev = {"schema": 1, "kind": "step", "run_id": "r", "step": 3, "metrics": dict(m),
          "hashes": {"actor": param_hash(weights())}}
    parsed = parse_event(dump_event(ev), 0.0)
    assert set(parsed.metrics) == {"kl/mean", "kl/token_max", "kl/token_p99", "entropy/mean",
                                   "response/length_mean", "response/length_max",
                                   "response/truncated_frac", "response/eos_frac",
                                   "grad_norm/actor", "update_ratio/actor"}
    assert json.loads(dump_event(ev))["hashes"]["actor"].startswith("sha256:")


def test_numpy_inputs_never_import_torch():
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import numpy as np\n"
            "from producers import tensors as t\n"
            "a = np.random.default_rng(0).normal(size=(2, 5))\n"
            "t.kl_stats(a, a * 0.9, a > 0, tokens=np.ones((2, 5), int), decode=str)\n"
            "t.entropy_from_logits(np.zeros((2, 5, 7))); t.response_stats([1, 2], 2, eos=[1, 0])\n"
            "t.grad_norm([a]); t.update_ratio([a], [a * 1.1]); t.param_hash({'a': a})\n"
            "print('torch' in sys.modules)" % str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
