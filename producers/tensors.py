"""Tensor helpers: the canonical metrics of a step (contract section 2), from the tensors a
trainer already has.

Every function accepts PyTorch tensors or NumPy arrays and dispatches on the type of its input:
torch is imported lazily, only when a torch tensor is passed, so the SDK never needs it. With
torch tensors everything is computed on the tensor's device; the scalars are stacked on that
device and moved to the host with one copy per call (one synchronisation), never the tensors.

    from producers.tensors import kl_stats, entropy_from_logits, response_stats

    m = {}
    m.update(kl_stats(logprobs, ref_logprobs, response_mask))
    m.update(entropy_from_logits(logits, response_mask))
    m.update(response_stats(lengths, max_new_tokens, eos=ended_with_eos))
    m.update(grad_norm(model.parameters()))
    mon.log(step, m)

Each function returns a :class:`Stats`: a plain ``dict`` of metric name -> float that
``Monitor.log`` accepts as it is, plus an ``extra`` dict for what is not a metric (the position
and token of the largest per-token KL, for instance). Empty inputs (a mask that selects nothing)
give an empty ``Stats``: nothing is logged rather than a made-up value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = [
    "Stats",
    "entropy_from_logits",
    "grad_norm",
    "kl_stats",
    "param_hash",
    "response_stats",
    "update_ratio",
]


class Stats(dict):
    """Metric name -> float (loggable as it is), with non-metric details in ``extra``."""

    def __init__(self, metrics: Mapping[str, float] | None = None, extra: Mapping[str, Any] | None = None):
        super().__init__(metrics or {})
        self.extra: dict[str, Any] = dict(extra or {})


# -- dispatch ------------------------------------------------------------------------------------

def _is_torch(x: Any) -> bool:
    """True for a torch tensor (or Parameter), without importing torch."""
    mod = type(x).__module__
    return mod == "torch" or mod.startswith("torch.")


def _torch():
    import torch  # lazily: only when the caller already uses torch

    return torch


def _acc(device):
    """The accumulation dtype on ``device``: float64, except where the backend has none (MPS)."""
    torch = _torch()
    return torch.float32 if getattr(device, "type", "cpu") == "mps" else torch.float64


def _to_host(values: list, like) -> list[float]:
    """Scalars computed on the device of ``like`` -> Python floats, in one copy."""
    if _is_torch(like):
        torch = _torch()
        dt = _acc(like.device)
        return [float(v) for v in torch.stack([v.to(dt).reshape(()) for v in values]).cpu().tolist()]
    return [float(v) for v in values]


def _mask_of(values, mask):
    """A boolean mask with the shape of ``values`` (all True when ``mask`` is None)."""
    if _is_torch(values):
        torch = _torch()
        if mask is None:
            return torch.ones_like(values, dtype=torch.bool)
        m = mask if _is_torch(mask) else torch.as_tensor(np.asarray(mask))
        m = m.to(device=values.device)
        m = m.bool() if m.dtype != torch.bool else m
        return m.expand_as(values) if m.shape != values.shape else m
    if mask is None:
        return np.ones(np.shape(values), dtype=bool)
    m = np.asarray(mask).astype(bool)
    return np.broadcast_to(m, np.shape(values)) if m.shape != np.shape(values) else m


def _float(x):
    """Floating point of at least 32 bits (bf16/fp16 are upcast: their sums are too coarse)."""
    if _is_torch(x):
        torch = _torch()
        return x.float() if x.dtype in (torch.float16, torch.bfloat16) or not x.is_floating_point() else x
    a = np.asarray(x)
    return a.astype(np.float64) if a.dtype.kind != "f" or a.dtype.itemsize < 4 else a


def _quantile_sorted_linear(n: int, q: float) -> tuple[int, int, float]:
    """numpy's default ('linear') quantile: the two order statistics and the weight."""
    pos = q * (n - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, n - 1)
    return lo, hi, pos - lo


def _quantile(values, q: float):
    """The q-quantile of a 1-D array/tensor, as numpy.quantile(method='linear') computes it."""
    if _is_torch(values):
        n = values.numel()
        lo, hi, w = _quantile_sorted_linear(n, q)
        # kthvalue: no size limit (torch.quantile refuses inputs over 2**24 elements)
        v_lo = values.kthvalue(lo + 1).values
        v_hi = values.kthvalue(hi + 1).values if hi != lo else v_lo
        return v_lo + (v_hi - v_lo) * w
    return np.quantile(values, q)


# -- KL --------------------------------------------------------------------------------------------

def _per_token_kl(lp, ref, estimator: str):
    """Per-token KL(policy || reference) estimates from the log-probs of the sampled tokens.

    k1: log p - log q (unbiased, can be negative; TRL's and veRL's default "kl")
    k2: (log p - log q)^2 / 2 ("mse")
    k3: exp(log q - log p) - 1 - (log q - log p) (non-negative, low variance; "low_var_kl")
    abs: |log p - log q|
    """
    d = lp - ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        r = -d
        return (r.exp() if _is_torch(r) else np.exp(r)) - 1 - r
    if estimator == "abs":
        return d.abs() if _is_torch(d) else np.abs(d)
    raise ValueError(f"unknown KL estimator {estimator!r}; one of k1, k2, k3, abs")


def kl_stats(logprobs, ref_logprobs, mask=None, *, tokens=None,
             decode: Callable[[int], str] | None = None, estimator: str = "k1",
             q: float = 0.99) -> Stats:
    """Per-token KL between the policy and the reference over the masked (response) tokens.

    ``logprobs``, ``ref_logprobs``: log-probabilities of the sampled tokens, shape (batch, seq)
    (any shape works; positions are reported in it). ``mask``: 1/True for tokens that count.
    ``tokens``: the token ids (same shape) to report the token with the largest KL, and
    ``decode`` (e.g. ``tokenizer.decode``) to turn it into text.

    Returns ``kl/mean`` (mean over masked tokens), ``kl/token_max``, ``kl/token_p99`` (the
    ``q``-quantile, numpy's linear interpolation); ``extra`` holds ``argmax`` (the index tuple of
    the largest per-token KL), ``argmax_flat`` and, with ``tokens``, ``argmax_token_id`` and (with
    ``decode``) ``argmax_token``. The argmax is kept out of the metrics: it is a position, not a
    signal to alert on.
    """
    lp, ref = _float(logprobs), _float(ref_logprobs)
    if tuple(lp.shape) != tuple(ref.shape):
        raise ValueError(f"logprobs {tuple(lp.shape)} and ref_logprobs {tuple(ref.shape)} differ in shape")
    if _is_torch(lp) and not _is_torch(ref):
        ref = _torch().as_tensor(ref, device=lp.device, dtype=lp.dtype)
    elif _is_torch(ref) and not _is_torch(lp):
        lp = _torch().as_tensor(lp, device=ref.device, dtype=ref.dtype)
    kl = _per_token_kl(lp, ref, estimator)
    m = _mask_of(kl, mask)
    if _is_torch(kl):
        torch = _torch()
        sel = kl[m]
        if sel.numel() == 0:
            return Stats()
        masked = torch.where(m, kl, torch.full_like(kl, float("-inf")))
        flat_arg = masked.reshape(-1).argmax()
        mean, top, p = _to_host([sel.mean(), sel.max(), _quantile(sel, q)], kl)
        arg = int(flat_arg.item())
    else:
        sel = kl[m]
        if sel.size == 0:
            return Stats()
        masked = np.where(m, kl, -np.inf)
        arg = int(np.argmax(masked))
        mean, top, p = float(sel.mean()), float(sel.max()), float(_quantile(sel, q))
    idx = tuple(int(i) for i in np.unravel_index(arg, tuple(kl.shape)))
    extra: dict[str, Any] = {"argmax": idx, "argmax_flat": arg, "estimator": estimator}
    if tokens is not None:
        tok = tokens[idx]
        tok_id = int(tok.item() if hasattr(tok, "item") else tok)
        extra["argmax_token_id"] = tok_id
        if decode is not None:
            try:
                extra["argmax_token"] = decode(tok_id)
            except TypeError:  # tokenizers that want a list of ids
                extra["argmax_token"] = decode([tok_id])
    return Stats({"kl/mean": mean, "kl/token_max": top, "kl/token_p99": p}, extra)


# -- entropy ---------------------------------------------------------------------------------------

def _entropy_rows(x):
    """Entropy of softmax(x) along the last axis, numerically stable."""
    if _is_torch(x):
        torch = _torch()
        logp = torch.log_softmax(x, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1)
    z = x - x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = z - logz
    return -(np.exp(logp) * logp).sum(axis=-1)


def entropy_from_logits(logits, mask=None, *, chunk: int = 1024) -> Stats:
    """``entropy/mean``: the mean over masked tokens of the entropy (nats) of softmax(logits).

    ``logits``: shape (..., vocab); ``mask``: shape (...). Only the masked rows are used, in
    chunks of ``chunk`` rows so that the softmax of a large vocabulary never needs more than
    ``chunk x vocab`` extra memory.
    """
    x = _float(logits)
    vocab = x.shape[-1]
    lead = tuple(x.shape[:-1])
    if _is_torch(x):
        torch = _torch()
        m = _mask_of(torch.empty(lead, dtype=torch.bool, device=x.device), mask)
        rows = x.reshape(-1, vocab)[m.reshape(-1)]
        if rows.shape[0] == 0:
            return Stats()
        dt = _acc(x.device)
        total = torch.zeros((), dtype=dt, device=x.device)
        for i in range(0, rows.shape[0], chunk):
            total = total + _entropy_rows(rows[i:i + chunk]).to(dt).sum()
        (mean,) = _to_host([total / rows.shape[0]], x)
        return Stats({"entropy/mean": mean})
    m = _mask_of(np.empty(lead, dtype=bool), mask)
    rows = x.reshape(-1, vocab)[m.reshape(-1)]
    if rows.shape[0] == 0:
        return Stats()
    total = 0.0
    for i in range(0, rows.shape[0], chunk):
        total += float(_entropy_rows(rows[i:i + chunk]).sum(dtype=np.float64))
    return Stats({"entropy/mean": total / rows.shape[0]})


# -- responses -------------------------------------------------------------------------------------

def response_stats(lengths, max_length: int, eos=None) -> Stats:
    """Length, truncation and EOS statistics of a batch of generated responses.

    ``lengths``: response lengths in tokens; ``max_length``: the generation cap (max new
    tokens); ``eos``: per response, whether it ended with an EOS token (optional).

    A response is truncated when it reached ``max_length`` without an EOS (without ``eos``:
    when it reached ``max_length``). Returns ``response/length_mean``, ``response/length_max``,
    ``response/truncated_frac`` and, with ``eos``, ``response/eos_frac``.
    """
    if _is_torch(lengths):
        torch = _torch()
        n = lengths.float().reshape(-1)
        if n.numel() == 0:
            return Stats()
        capped = n >= max_length
        vals = [n.mean(), n.max()]
        if eos is not None:
            e = (eos if _is_torch(eos) else torch.as_tensor(np.asarray(eos))).to(n.device).reshape(-1).bool()
            vals += [(capped & ~e).float().mean(), e.float().mean()]
        else:
            vals.append(capped.float().mean())
        out = _to_host(vals, n)
    else:
        n = np.asarray(lengths, dtype=np.float64).reshape(-1)
        if n.size == 0:
            return Stats()
        capped = n >= max_length
        out = [n.mean(), n.max()]
        if eos is not None:
            e = np.asarray(eos).reshape(-1).astype(bool)
            out += [(capped & ~e).mean(), e.mean()]
        else:
            out.append(capped.mean())
        out = [float(v) for v in out]
    stats = Stats({"response/length_mean": out[0], "response/length_max": out[1],
                   "response/truncated_frac": out[2]})
    if eos is not None:
        stats["response/eos_frac"] = out[3]
    return stats


# -- norms -----------------------------------------------------------------------------------------

def _as_list(params) -> list:
    """A single array/tensor, a module (its parameters), a mapping or an iterable of them."""
    if callable(getattr(params, "parameters", None)):
        params = params.parameters()
    if _is_torch(params) or isinstance(params, np.ndarray):
        return [params]
    if isinstance(params, Mapping):
        return list(params.values())
    return list(params)


def _sq_norm(x):
    """Squared L2 norm, accumulated in float64 where the backend allows, on x's device."""
    if _is_torch(x):
        torch = _torch()
        x = x.detach()
        return torch.linalg.vector_norm(x, dtype=_acc(x.device)) ** 2
    a = np.asarray(x, dtype=np.float64)
    return float(np.dot(a.reshape(-1), a.reshape(-1)))


def _sum_on(values: list, like):
    """Sum scalars that may live on different devices, on the device of ``like``."""
    if _is_torch(like):
        torch = _torch()
        dev = like.device
        return torch.stack([v.to(device=dev, dtype=_acc(dev)) for v in values]).sum()
    return float(sum(values))


def grad_norm(params, *, model: str = "actor") -> Stats:
    """``grad_norm/<model>``: the L2 norm of this rank's gradients (before any all-reduce).

    ``params``: torch parameters (their ``.grad`` is used; parameters without one are skipped),
    or gradient tensors/arrays themselves.
    """
    grads = []
    for p in _as_list(params):
        # a parameter (requires_grad) contributes its .grad; a plain tensor is a gradient itself
        g = (p.grad if p.requires_grad else p) if _is_torch(p) else p
        if g is None:
            continue
        grads.append(g)
    if not grads:
        return Stats()
    sq = [_sq_norm(g) for g in grads]
    (total,) = _to_host([_sum_on(sq, grads[0]) ** 0.5], grads[0])
    return Stats({f"grad_norm/{model}": total})


def update_ratio(old, new, *, model: str = "actor", eps: float = 0.0) -> Stats:
    """``update_ratio/<model>``: ||new - old|| / ||old|| over all parameters.

    ``old`` and ``new``: one array/tensor each, or matching iterables of them (e.g. a copy of
    ``[p.detach().clone() for p in model.parameters()]`` taken before ``optimizer.step()``, and
    the parameters after). Healthy fine-tuning updates are around 1e-4 to 1e-3 per step; a
    ratio of 1e-2 or more means the step moved the weights by a percent.
    """
    olds, news = _as_list(old), _as_list(new)
    if len(olds) != len(news):
        raise ValueError(f"old has {len(olds)} tensors, new has {len(news)}")
    if not olds:
        return Stats()
    diffs, bases = [], []
    for o, n in zip(olds, news, strict=True):
        if tuple(o.shape) != tuple(n.shape):
            raise ValueError(f"shapes differ: {tuple(o.shape)} vs {tuple(n.shape)}")
        if _is_torch(n):
            o = o.detach().to(device=n.device)
            n = n.detach()
            dt = _acc(n.device)
            d = n.to(dt) - o.to(dt)
        else:
            d = np.asarray(n, dtype=np.float64) - np.asarray(o, dtype=np.float64)
        diffs.append(_sq_norm(d))
        bases.append(_sq_norm(o))
    like = news[0]
    num, den = _to_host([_sum_on(diffs, like) ** 0.5, _sum_on(bases, like) ** 0.5], like)
    ratio = num / (den + eps) if den + eps > 0 else (0.0 if num == 0 else float("inf"))
    return Stats({f"update_ratio/{model}": ratio}, {"update_norm": num, "param_norm": den})


# -- parameter hash ----------------------------------------------------------------------------------

def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def _named(params) -> list[tuple[str, Any]]:
    """(name, tensor) pairs: a module's state_dict, a mapping, or an iterable (index names)."""
    if callable(getattr(params, "state_dict", None)):
        params = params.state_dict()
    if isinstance(params, Mapping):
        return [(str(k), v) for k, v in params.items()]
    if _is_torch(params) or isinstance(params, np.ndarray):
        return [("0", params)]
    return [(str(i), p) for i, p in enumerate(params)]


def _sample_bytes(x, per_tensor: int | None) -> bytes:
    """The raw bytes of up to ``per_tensor`` evenly spaced elements (all when None)."""
    if _is_torch(x):
        torch = _torch()
        flat = x.detach().reshape(-1)
        n = flat.numel()
        if per_tensor is not None and n > per_tensor:
            idx = torch.as_tensor(_sample_index(n, per_tensor), device=flat.device)
            flat = flat.index_select(0, idx)
        if flat.dtype == torch.bfloat16:  # numpy has no bfloat16: same bytes as int16
            flat = flat.view(torch.int16)
        return flat.contiguous().cpu().numpy().tobytes()
    flat = np.asarray(x).reshape(-1)
    n = flat.size
    if per_tensor is not None and n > per_tensor:
        flat = flat[_sample_index(n, per_tensor)]
    return np.ascontiguousarray(flat).tobytes()


def _sample_index(n: int, k: int) -> np.ndarray:
    """k evenly spaced indices in [0, n), always including the first and the last element."""
    return np.linspace(0, n - 1, num=k).round().astype(np.int64)


def param_hash(params, *, per_tensor: int | None = 4096) -> str:
    """A fast fingerprint of model weights, identical across ranks for identical weights.

    ``params``: a torch module (its ``state_dict``), a mapping name -> tensor/array, or an
    iterable of tensors/arrays. The hash covers, per tensor in order: its name, shape, dtype
    and the raw bytes of ``per_tensor`` evenly spaced elements (first and last included);
    ``per_tensor=None`` hashes every byte. Returns ``"sha256:<hex>"``.

    Trade-off: hashing every byte of an 8B-parameter model copies 16 GB to the host and takes
    tens of seconds; the strided sample copies ``per_tensor`` elements per tensor (about 1-4 MB
    for a whole LLM) and takes milliseconds. Ranks whose weights diverged (a missed all-reduce,
    a bad optimizer step on one rank, a different checkpoint loaded) differ in almost every
    element, so a sample finds it; a change confined to elements outside the sample (a single
    flipped weight) is missed. Bytes, not values, are hashed, so the result is deterministic and
    equal between torch and numpy inputs of the same dtype (bfloat16 hashes as its 16-bit
    pattern), and changes with the dtype.
    """
    h = hashlib.sha256()
    for name, x in _named(params):
        h.update(f"{name}|{tuple(int(s) for s in x.shape)}|{_dtype_name(x)}|".encode())
        h.update(_sample_bytes(x, per_tensor))
    return "sha256:" + h.hexdigest()
