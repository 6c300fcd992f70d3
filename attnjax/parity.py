"""Kernel parity: every exact kernel against an independent float64 NumPy oracle.

The oracle is written from the formula, with no code shared with ``attnjax.ops``:
``softmax(scale * q k^T + bias, masked) v`` in float64, with soft-capping and a sink logit,
GQA by repeating kv heads, a value width of its own (v ``[..., D]`` for q and k ``[..., H]``)
and zeros for rows that see no key; its gradients are derived by
hand (and checked against central differences in the tests). ``parity_table`` measures the
max absolute and relative error of outputs AND gradients for each kernel on a few settings;
``attnjax info`` prints it and the tests assert on the same numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.ops import dot_product_attention
from attnjax.ops.attention import requested_options
from attnjax.registry import KERNELS


def _oracle_forward(q, k, v, *, scale=None, bias=None, mask=None, logit_soft_cap=None,
                    sink=None):
    """float64 forward; returns the output and what the analytic backward needs."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, T, N, H = q.shape
    K = k.shape[2]
    k, v = np.repeat(k, N // K, axis=2), np.repeat(v, N // K, axis=2)
    scale = np.broadcast_to(1 / np.sqrt(H) if scale is None else np.asarray(scale, np.float64),
                            (N,))[None, :, None, None]
    raw = np.einsum("btnh,bsnh->bnts", q, k) * scale
    logits = raw if logit_soft_cap is None else logit_soft_cap * np.tanh(raw / logit_soft_cap)
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    visible = np.ones(logits.shape, bool) if mask is None else np.broadcast_to(mask, logits.shape)
    logits = np.where(visible, logits, -np.inf)
    extra = None if sink is None else np.broadcast_to(np.asarray(sink, np.float64), (N,))
    top = logits.max(-1, keepdims=True)
    if extra is not None:
        top = np.maximum(top, extra[None, :, None, None])
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(logits - top)
    denom = weights.sum(-1, keepdims=True)
    if extra is not None:
        denom = denom + np.exp(extra[None, :, None, None] - top)
    probs = np.where(denom > 0, weights / np.where(denom > 0, denom, 1.0), 0.0)
    out = np.einsum("bnts,bsnh->btnh", probs, v)
    return out, (q, k, v, probs, raw, scale, K)


def oracle_attention(q, k, v, **kwargs) -> np.ndarray:
    """float64 attention on NumPy arrays. q ``[B,T,N,H]``, k ``[B,S,K,H]``, v ``[B,S,K,D]``,
    mask/bias broadcastable to ``[B,N,T,S]``, sink ``[N]``, scale scalar or ``[N]`` (default
    ``1/sqrt(H)``); returns ``[B,T,N,D]``; rows that see no key give zeros."""
    return _oracle_forward(q, k, v, **kwargs)[0]


def oracle_grads(q, k, v, cotangent, **kwargs):
    """float64 gradients of ``sum(oracle(q, k, v) * cotangent)`` w.r.t. q, k, v, derived by
    hand: with P the probabilities and dO the cotangent,
    ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P (dP - rowsum(P dP))`` (a sink only enlarges the
    denominator), times ``1 - tanh^2`` under soft-capping, then ``dQ = scale dS K`` and
    ``dK = scale dS^T Q``; kv-head gradients sum over their query-head group."""
    logit_soft_cap = kwargs.get("logit_soft_cap")
    _, (q64, k64, v64, probs, raw, scale, K) = _oracle_forward(q, k, v, **kwargs)
    d_out = np.asarray(cotangent, np.float64)
    d_v = np.einsum("bnts,btnh->bsnh", probs, d_out)
    d_p = np.einsum("btnh,bsnh->bnts", d_out, v64)
    d_s = probs * (d_p - (probs * d_p).sum(-1, keepdims=True))
    if logit_soft_cap is not None:
        d_s = d_s * (1 - np.tanh(raw / logit_soft_cap) ** 2)
    d_s = d_s * scale
    d_q = np.einsum("bnts,bsnh->btnh", d_s, k64)
    d_k = np.einsum("bnts,btnh->bsnh", d_s, q64)
    group = lambda g: g.reshape(*g.shape[:2], K, -1, g.shape[-1]).sum(3)
    return [d_q, group(d_k), group(d_v)]


def parity_settings(seed: int = 0):
    """Small named settings covering causal/window/padding masks, GQA, cross-attention, bias."""
    rng = np.random.default_rng(seed)
    def arrays(B, T, S, N, K, H):
        return (rng.normal(size=(B, T, N, H)).astype(np.float32),
                rng.normal(size=(B, S, K, H)).astype(np.float32),
                rng.normal(size=(B, S, K, H)).astype(np.float32))
    T = 9
    causal = np.tril(np.ones((T, T), bool))
    window = causal & ~np.tril(np.ones((T, T), bool), -3)
    padded = np.broadcast_to(np.arange(T) < np.array([[6], [9]]), (2, T))[:, None, None, :]
    bias = rng.normal(size=(1, 4, T, T)).astype(np.float32)
    return [
        ("causal", arrays(2, T, T, 4, 4, 8), dict(is_causal=True), dict(mask=causal)),
        ("gqa+window", arrays(2, T, T, 4, 2, 8), dict(is_causal=True, local_window_size=2),
         dict(mask=window)),
        ("mqa+padding", arrays(2, T, T, 4, 1, 8),
         dict(key_value_seq_lengths=jnp.array([6, 9])), dict(mask=padded)),
        ("cross+bias", arrays(2, 5, T, 4, 2, 8), dict(bias=jnp.asarray(bias[:, :, :5])),
         dict(bias=bias[:, :, :5])),
    ]


def kernel_errors(name: str, setting, with_grads: bool = True) -> dict:
    """Max abs / relative error of kernel ``name`` vs the oracle on one setting."""
    label, (q, k, v), kernel_kwargs, oracle_kwargs = setting
    options = dict(KERNELS.get(name).test_options)
    run = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, implementation=name,
                                                        **kernel_kwargs, **options))
    expected = oracle_attention(q, k, v, **oracle_kwargs)
    got = np.asarray(run(q, k, v), np.float64)
    err = lambda a, b: (float(np.abs(a - b).max()), float(np.abs(a - b).max() / np.abs(b).max()))
    row = {"kernel": name, "setting": label}
    row["out_abs"], row["out_rel"] = err(got, expected)
    if with_grads:
        cot = np.random.default_rng(1).normal(size=expected.shape)
        grads = jax.jit(jax.grad(lambda *a: (run(*a) * cot).sum(), argnums=(0, 1, 2)))(q, k, v)
        expected_grads = oracle_grads(q, k, v, cot, **oracle_kwargs)
        errors = [err(np.asarray(g, np.float64), e) for g, e in zip(grads, expected_grads)]
        row["grad_abs"] = max(e[0] for e in errors)
        row["grad_rel"] = max(e[1] for e in errors)
    return row


def setting_options(setting) -> frozenset:
    """The options (``OPTIONS``) a parity setting asks of a kernel."""
    _, (q, k, _), kwargs, _ = setting
    bias = kwargs.get("bias")
    return requested_options(bias=bias, window=kwargs.get("local_window_size"),
                             padding="key_value_seq_lengths" in kwargs,
                             cross_attention=q.shape[1] != k.shape[1],
                             dense_bias=bias is not None and not callable(bias))


def parity_table(with_grads: bool = True) -> list[dict]:
    """Rows for every exact kernel that runs on this backend and every parity setting it
    supports (``ring`` and ``allgather`` take no dense bias array)."""
    rows = []
    for name, spec in KERNELS.items():
        if not spec.exact or not spec.available():
            continue
        for setting in parity_settings():
            if setting_options(setting) <= spec.supports:
                rows.append(kernel_errors(name, setting, with_grads))
    return rows
