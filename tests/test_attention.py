"""Tests for the attention front door and every registered kernel.

Kernels are taken from ``attnjax.registry.KERNELS`` at collection time, so a newly registered
kernel is picked up with no edits: ``spec.exact`` decides whether it must match ``reference``
and ``spec.supports`` decides which options it is run with (an option it does not support must
be refused by the front door instead). Correctness is anchored on the float64 NumPy oracle in
``attnjax.parity`` (whose gradients are themselves checked against finite differences here).

Compilation dominates the runtime on CPU, so every function under test is jitted once per
(kernel, static options) through :func:`_compiled` and array-valued options (lengths, masks,
biases, sinks, per-head scales, rngs) are passed as jit arguments.
"""

import functools
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import attnjax  # noqa: F401  (registers every kernel)
from attnjax.ops.attention import (OPTIONS, Dropout, check_kernel_supports, dot_product_attention,
                                   dropout_keep)
from attnjax.ops.positions import alibi_bias, alibi_slopes, t5_bias
from attnjax.parity import oracle_attention, oracle_grads, parity_settings
from attnjax.registry import KERNELS
from helpers import REPO, subprocess_env

BACKEND = jax.default_backend()

# float32 tolerances of the whole file (never loosened to get green).
RTOL, ATOL = 1e-5, 1e-6

# Kernel-specific keyword options: each kernel's own test settings (chunked gets blocks that
# do not divide the test lengths 16, 13, 7, so the zero-padded last block is exercised).
KERNEL_OPTIONS = {name: dict(spec.test_options) for name, spec in KERNELS.items()}


def _kernel_param(name):
    # cudnn only runs on a CUDA GPU: a hardware fact, not a failure.
    return pytest.param(name, id=name, marks=pytest.mark.skipif(
        not KERNELS.get(name).available(),
        reason=f"{name} does not run on this process's backend {BACKEND!r}"))


def _spec(name):
    return KERNELS.get(name)


# every kernel that keeps the numerical contract (masked_fill breaks it on purpose)
ALL_KERNELS = [_kernel_param(n) for n in KERNELS.names() if KERNELS.get(n).safe]
EXACT_KERNELS = [_kernel_param(n) for n in KERNELS.names()
                 if KERNELS.get(n).exact and n != "reference"]
WEIGHTS_KERNELS = [_kernel_param(n) for n in KERNELS.names()
                   if "return_weights" in KERNELS.get(n).supports and KERNELS.get(n).safe]
NO_WEIGHTS_KERNELS = [n for n in KERNELS.names() if "return_weights" not in KERNELS.get(n).supports]


# ----------------------------------------------------------------------------- helpers


def qkv(T=16, S=None, N=4, K=2, H=8, B=2, seed=0, mult=1.0, dtype=np.float32):
    """Random NumPy q ``[B,T,N,H]``, k/v ``[B,S,K,H]``."""
    S = T if S is None else S
    rng = np.random.default_rng(seed)
    q = mult * rng.normal(size=(B, T, N, H))
    k = mult * rng.normal(size=(B, S, K, H))
    v = rng.normal(size=(B, S, K, H))
    return tuple(np.asarray(x, dtype) for x in (q, k, v))


def cotangent(shape, dtype=np.float32):
    return np.random.default_rng(1234).normal(size=shape).astype(dtype)


def _is_static(x):
    if isinstance(x, tuple):
        return all(_is_static(e) for e in x)
    return x is None or isinstance(x, (bool, int, float, str)) or callable(x)


@functools.cache
def _compiled(name, static_items, with_grads):
    """One jitted function per (kernel, static options); jit re-specialises per shape/dtype."""
    options = {**KERNEL_OPTIONS.get(name, {}), **dict(static_items)}

    def forward(q, k, v, dynamic):
        return dot_product_attention(q, k, v, implementation=name, **options, **dynamic)

    if not with_grads:
        return jax.jit(forward)

    def forward_backward(q, k, v, cot, dynamic):
        out, vjp = jax.vjp(lambda q, k, v: forward(q, k, v, dynamic), q, k, v)
        return out, vjp(cot)

    return jax.jit(forward_backward)


def _split(kwargs):
    static = tuple(sorted((k, v) for k, v in kwargs.items() if _is_static(v)))
    dynamic = {k: v for k, v in kwargs.items() if not _is_static(v)}
    return static, dynamic


def attend(name, q, k, v, **kwargs):
    """Jitted forward of kernel ``name``."""
    static, dynamic = _split(kwargs)
    return _compiled(name, static, False)(q, k, v, dynamic)


def attend_grads(name, q, k, v, cot=None, **kwargs):
    """Jitted ``(out, (dq, dk, dv))`` of ``sum(out * cot)`` for kernel ``name``."""
    static, dynamic = _split(kwargs)
    if cot is None:
        cot = cotangent(q.shape[:3] + v.shape[3:], q.dtype)
    return _compiled(name, static, True)(q, k, v, cot, dynamic)


def f64(tree):
    """Arrays -> float64 NumPy; tuples -> lists (so (dq, dk, dv) compares with the oracle's)."""
    if isinstance(tree, (tuple, list)):
        return [f64(x) for x in tree]
    return np.asarray(tree, np.float64)


def assert_close(got, want, rtol=RTOL, atol=ATOL):
    """Elementwise ``|got - want| <= atol * scale + rtol * |want|`` for every leaf, where
    ``scale = max(1, max|want|)``: the absolute floor is for entries that are near zero
    *relative to the array*. Gradient entries come out of sums with cancellation, so their
    float32 rounding error is a few ulp of the array's largest terms, not of the entry itself
    (e.g. dq of size 1e-2 in an array whose max is 2.7 differs by 1.7e-6 between two correct
    float32 kernels, and each is that far from the float64 oracle)."""
    got, want = f64(got), f64(want)
    chex.assert_trees_all_equal_shapes(got, want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale)


def repeat_heads(x, N):
    """kv heads ``[B, S, K, H]`` -> ``[B, S, N, H]`` (query head n reads kv head n // (N/K))."""
    return np.repeat(np.asarray(x, np.float64), N // x.shape[2], axis=2)


def oracle_probs(q, k, **kwargs):
    """Oracle attention probabilities ``[B, N, T, S]``: attend to one-hot values (V = I)."""
    B, S, K = k.shape[:3]
    eye = np.broadcast_to(np.eye(S), (B, K, S, S)).transpose(0, 2, 1, 3)   # v[b, s, k, :] = e_s
    return oracle_attention(q, k, eye, **kwargs).transpose(0, 2, 1, 3)


def lengths_mask(q_len, kv_len, T, S):
    """NumPy padding mask ``[B, 1, T, S]``."""
    q_ok = np.arange(T)[None, :] < np.asarray(q_len)[:, None]
    k_ok = np.arange(S)[None, :] < np.asarray(kv_len)[:, None]
    return (q_ok[:, :, None] & k_ok[:, None, :])[:, None]


# The masks the oracle tests run under: causal, bidirectional (encoder-style, no causal mask)
# with per-example padding of queries and keys, and cross-attention (9 queries over 13 keys of
# another sequence) with padding on both sides.
MASK_KINDS = ("causal", "bidirectional_padding", "cross_padding")
KEYS_OF = {"causal": 9, "bidirectional_padding": 9, "cross_padding": 13}   # S for T = 9


def mask_kind_case(kind, T=9):
    """``(kernel kwargs, oracle mask broadcastable to [B, N, T, S])`` of mask kind ``kind`` for
    ``T`` queries over ``S = KEYS_OF[kind]`` keys (T = 9) with batch 2. Bidirectional: batch 1
    has queries ``>= T - 2`` padded (rows that see no key: zeros) and keys ``>= S - 3`` padded
    (a valid query row that sees fewer keys than there are); cross-attention the same over 13
    keys of another sequence, its key padding as the attention module hides a source's pads
    (segment ids: every query in segment 1, real keys 1, pads 0)."""
    S = KEYS_OF[kind]
    if kind == "causal":
        return dict(is_causal=True), np.tril(np.ones((T, S), bool))
    q_len, kv_len = np.array([T, T - 2], np.int32), np.array([S, S - 3], np.int32)
    mask = lengths_mask(q_len, kv_len, T, S)
    if kind == "cross_padding":
        kv_ids = (np.arange(S)[None, :] < kv_len[:, None]).astype(np.int32)
        return (dict(query_seq_lengths=q_len, segment_ids=(np.ones((2, T), np.int32), kv_ids)),
                mask)
    return dict(query_seq_lengths=q_len, key_value_seq_lengths=kv_len), mask


def _unsupported_error(name, asked):
    """The front door's error for kernel ``name`` asked for options it lacks."""
    missing = sorted(set(asked) - _spec(name).supports)
    able = [n for n, s in KERNELS.items() if set(asked) <= s.supports]
    return missing, able


# -------------------------------------------------------------------------------- 1. registry-wide

# Causal self-attention with GQA (N=4, K=2), query padding (batch 0 rows >= 13) and key
# padding (batch 0 keys >= 11; batch 1 has no keys at all, so every row of it is fully masked).
# Shared by the registry-wide, fully-masked-row and low-precision tests (one compile per kernel
# and dtype).
MASKED_Q_LEN = np.array([13, 16], np.int32)
MASKED_KV_LEN = np.array([11, 0], np.int32)


def masked_run(name, q, k, v, is_causal=True):
    return attend_grads(name, q, k, v, is_causal=is_causal, query_seq_lengths=MASKED_Q_LEN,
                        key_value_seq_lengths=MASKED_KV_LEN)


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_every_kernel_shape_and_finite(name):
    q, k, v = qkv(T=16, K=2)
    out, grads = masked_run(name, q, k, v)
    chex.assert_shape(out, (2, 16, 4, 8))
    chex.assert_shape(grads, [(2, 16, 4, 8), (2, 16, 2, 8), (2, 16, 2, 8)])
    assert out.dtype == jnp.float32
    chex.assert_tree_all_finite((out, grads))
    # Not trivially zero where something is visible.
    assert np.abs(np.asarray(out[0, :13])).min(axis=-1).max() > 0


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_every_kernel_is_causal(name):
    t = 7
    q, k, v = qkv(T=16, K=2)
    rng = np.random.default_rng(5)
    k2, v2 = k.copy(), v.copy()
    k2[:, t:] = rng.normal(size=k2[:, t:].shape)
    v2[:, t:] = rng.normal(size=v2[:, t:].shape)
    out, _ = masked_run(name, q, k, v)
    out2, _ = masked_run(name, q, k2, v2)
    chex.assert_trees_all_close(out[:, :t], out2[:, :t], rtol=0, atol=1e-6)
    # ...while the future rows did change (the perturbation reaches visible keys 7..10).
    assert np.abs(np.asarray(out[0, t:11] - out2[0, t:11])).max() > 1e-2


# -------------------------------------------------------------------------- 2. reference vs oracle


def test_oracle_grads_match_finite_differences():
    """The analytic oracle gradients against central differences (float64, h = 1e-5)."""
    rng = np.random.default_rng(3)
    B, T, S, N, K, H = 1, 3, 4, 2, 1, 3
    q = rng.normal(size=(B, T, N, H))
    k, v = rng.normal(size=(B, S, K, H)), rng.normal(size=(B, S, K, H))
    mask = np.ones((B, 1, T, S), bool)
    mask[0, 0, 0, 2:] = False
    mask[0, 0, 2, :] = False                       # a fully masked row
    kwargs = dict(scale=np.array([0.7, 1.3]), bias=rng.normal(size=(1, N, T, S)), mask=mask,
                  logit_soft_cap=1.5, sink=np.array([0.3, -0.4]))
    cot = rng.normal(size=(B, T, N, H))
    analytic = oracle_grads(q, k, v, cot, **kwargs)
    loss = lambda q, k, v: float((oracle_attention(q, k, v, **kwargs) * cot).sum())
    h = 1e-5
    arrays = [q, k, v]
    for which, grad in enumerate(analytic):
        numeric = np.zeros_like(arrays[which])
        for index in np.ndindex(arrays[which].shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[which][index] += h
            minus[which][index] -= h
            numeric[index] = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6)
    # The soft-cap and sink actually matter in this case.
    assert np.abs(analytic[0]).max() > 1e-2
    no_cap = oracle_attention(q, k, v, **{**kwargs, "logit_soft_cap": None})
    assert np.abs(no_cap - oracle_attention(q, k, v, **kwargs)).max() > 1e-2


@pytest.mark.parametrize("setting", parity_settings(), ids=lambda s: s[0])
def test_reference_matches_oracle(setting):
    _, (q, k, v), kernel_kwargs, oracle_kwargs = setting
    cot = cotangent(q.shape)
    out, grads = attend_grads("reference", q, k, v, cot, **kernel_kwargs)
    assert_close(out, oracle_attention(q, k, v, **oracle_kwargs))
    assert_close(grads, oracle_grads(q, k, v, cot, **oracle_kwargs))


def _reference_vs_oracle(q, k, v, oracle_kwargs, **kernel_kwargs):
    cot = cotangent(q.shape)
    out, grads = attend_grads("reference", q, k, v, cot, **kernel_kwargs)
    expected = oracle_attention(q, k, v, **oracle_kwargs)
    assert_close(out, expected)
    assert_close(grads, oracle_grads(q, k, v, cot, **oracle_kwargs))
    return expected


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
def test_reference_per_head_scale_vs_oracle(mask_kind):
    q, k, v = qkv(T=9, S=KEYS_OF[mask_kind], K=2)
    scale = np.array([0.2, 0.35, 0.5, 0.9], np.float32)
    mask_kwargs, mask = mask_kind_case(mask_kind)
    expected = _reference_vs_oracle(q, k, v, dict(scale=scale, mask=mask),
                                    scale=scale, **mask_kwargs)
    # A per-head scale is not the default scalar one.
    assert np.abs(expected - oracle_attention(q, k, v, mask=mask)).max() > 1e-2


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
def test_reference_softcap_vs_oracle(mask_kind):
    # Inputs x3: raw logits have std ~ 9, so c * tanh(s / c) with c = 5 is far from identity.
    q, k, v = qkv(T=9, S=KEYS_OF[mask_kind], K=2, mult=3.0)
    mask_kwargs, mask = mask_kind_case(mask_kind)
    expected = _reference_vs_oracle(q, k, v, dict(logit_soft_cap=5.0, mask=mask),
                                    logit_soft_cap=5.0, **mask_kwargs)
    assert np.abs(expected - oracle_attention(q, k, v, mask=mask)).max() > 0.1


# Both sinks share one compilation per mask kind (the sink is a jit argument); "softmax plus
# one" is a zero sink logit on every head (the scalar sink=0.0 form is checked in
# test_return_weights).
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("sink", [np.array([-1.0, 0.5, 2.0, 0.0], np.float32),
                                  np.zeros(4, np.float32)],
                         ids=["learned_per_head", "softmax_plus_one"])
def test_reference_sink_vs_oracle(sink, mask_kind):
    q, k, v = qkv(T=9, S=KEYS_OF[mask_kind], K=2)
    mask_kwargs, mask = mask_kind_case(mask_kind)
    expected = _reference_vs_oracle(q, k, v, dict(sink=sink, mask=mask), sink=sink,
                                    **mask_kwargs)
    assert np.abs(expected - oracle_attention(q, k, v, mask=mask)).max() > 1e-2


# Position biases as the kernels take them (functions of query and key positions, evaluated
# per block) and, for the oracle, written out densely from the formulas for T = 9:
# ALiBi -m_n |i - j| (symmetric, so usable bidirectionally) and the bidirectional T5 bias.
_ALIBI_SLOPES = alibi_slopes(4).astype(np.float32)                  # 2^-2, 2^-4, 2^-6, 2^-8
_ALIBI = functools.partial(alibi_bias, _ALIBI_SLOPES)
_T5_TABLE = np.random.default_rng(11).normal(size=(32, 4)).astype(np.float32)
_T5 = functools.partial(t5_bias, jnp.asarray(_T5_TABLE), bidirectional=True)
_OFFSET_9 = np.arange(9)[None, :] - np.arange(9)[:, None]          # k - q, [T, S]
_ALIBI_9 = -_ALIBI_SLOPES[None, :, None, None] * np.abs(_OFFSET_9)[None, None]
# 32 buckets, bidirectional: 16 per side, keys after the query (k > q) in the upper half; the
# first 8 distances get buckets of their own and distance 8 is the first logarithmic bucket,
# 8 + floor(ln(8 / 8) ...) = 8, so for |k - q| <= 8 the bucket is 16 [k > q] + |k - q|.
_T5_9 = _T5_TABLE[16 * (_OFFSET_9 > 0) + np.abs(_OFFSET_9)].transpose(2, 0, 1)[None]
_BAND_2_9 = np.abs(_OFFSET_9) <= 2                                  # local_window_size=(2, 2)
_SINK_4 = np.array([0.0, 1.0, -1.0, 2.0], np.float32)

# case -> (qkv kwargs, kernel kwargs, oracle kwargs); each runs under every mask kind, whose
# mask is added to both sides (and-ed with the case's own oracle mask).
ORACLE_CASES = {
    "gqa": (dict(K=2), {}, {}),
    "mqa": (dict(K=1), {}, {}),
    "alibi_bias": (dict(K=2), dict(bias=_ALIBI), dict(bias=_ALIBI_9)),
    "t5_bias_bidirectional": (dict(K=2), dict(bias=_T5), dict(bias=_T5_9)),
    "window_2_2": (dict(K=2), dict(local_window_size=(2, 2)), dict(mask=_BAND_2_9)),
    "t5_window_2_2_softcap_sink": (
        dict(K=2, mult=3.0),
        dict(bias=_T5, local_window_size=(2, 2), logit_soft_cap=5.0, sink=_SINK_4),
        dict(bias=_T5_9, mask=_BAND_2_9, logit_soft_cap=5.0, sink=_SINK_4)),
}


# Cross-attention runs the cases without position terms (a bias or window between positions
# of two sequences is not what the attention module asks of a kernel).
@pytest.mark.parametrize("case,mask_kind", [
    (case, kind) for kind in MASK_KINDS for case in ORACLE_CASES
    if kind != "cross_padding" or case in ("gqa", "mqa")])
def test_reference_gqa_bias_window_vs_oracle(case, mask_kind):
    shape_kwargs, kernel_kwargs, oracle_kwargs = ORACLE_CASES[case]
    q, k, v = qkv(T=9, S=KEYS_OF[mask_kind], **shape_kwargs)
    mask_kwargs, mask = mask_kind_case(mask_kind)
    oracle_kwargs = {**oracle_kwargs, "mask": mask & oracle_kwargs.get("mask", True)}
    expected = _reference_vs_oracle(q, k, v, oracle_kwargs, **kernel_kwargs, **mask_kwargs)
    if kernel_kwargs:
        # The case's options change the output (under this mask kind).
        assert np.abs(expected - oracle_attention(q, k, v, mask=mask)).max() > 1e-2


# ------------------------------------------------------------------- 3. exact kernels vs reference

_RNG = np.random.default_rng(42)
_DENSE_MASK = _RNG.random((2, 1, 16, 16)) < 0.6
_DENSE_MASK[0, 0, 3, :] = False                    # one fully masked row
_DENSE_BIAS = _RNG.normal(size=(1, 4, 16, 16)).astype(np.float32)
_SEGMENTS = np.array([[0] * 5 + [1] * 7 + [2] * 4, [0] * 9 + [1] * 7], np.int32)
_SEGMENTS_13 = np.array([[0] * 6 + [1] * 7, [0] * 3 + [1] * 10], np.int32)
_SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
_PAD_SEGMENTS = np.array([[0] * 7 + [1] * 6 + [99] * 3, [0] * 10 + [99] * 6], np.int32)


def distance_bias(q_pos, k_pos):
    """ALiBi-style callable bias: ``-slope_n * |q - k|`` -> ``[B|1, N, tq, tk]``."""
    d = jnp.abs(q_pos[:, None, :, None] - k_pos[:, None, None, :]).astype(jnp.float32)
    return -jnp.asarray(_SLOPES)[None, :, None, None] * d


# id -> (qkv kwargs, attention kwargs, option names asked for (see OPTIONS)). Options are
# combined into a few scenarios because every (kernel, scenario) pair costs one compilation.
SCENARIOS = {
    "causal_gqa_padding": (
        dict(T=16, K=2), dict(is_causal=True, query_seq_lengths=np.array([16, 11], np.int32),
                              key_value_seq_lengths=np.array([16, 9], np.int32)),
        {"padding"}),
    "mqa_window_2_1_block_causal_3_segments": (
        dict(T=16, K=1), dict(local_window_size=(2, 1), causal_block_size=3,
                              segment_ids=_SEGMENTS,
                              key_value_seq_lengths=np.array([16, 12], np.int32)),
        {"window", "block_causal", "segment", "padding"}),
    "dense_mask_bias_per_head_scale": (
        dict(T=16, K=2), dict(mask=_DENSE_MASK, bias=_DENSE_BIAS,
                              scale=np.array([0.2, 0.3, 0.4, 0.5], np.float32)),
        {"mask", "bias", "dense_bias", "per_head_scale"}),
    # KV-cache style cross-attention: 7 new queries at positions 6..12 over 13 keys, causal by
    # position, with an ALiBi-like bias computed from those positions.
    "cross_7x13_positions_callable_bias": (
        dict(T=7, S=13, K=2), dict(is_causal=True, query_positions=np.arange(6, 13)[None],
                                   bias=distance_bias,
                                   key_value_seq_lengths=np.array([13, 10], np.int32)),
        {"cross_attention", "positions", "bias", "padding"}),
    # Everything that acts on the probabilities at once, on a length no block size divides.
    "len13_softcap_sink_segments_dropout": (
        dict(T=13, K=2, mult=3.0),
        dict(is_causal=True, logit_soft_cap=5.0, sink=np.array([0.0, 1.0, -1.0, 2.0], np.float32),
             segment_ids=_SEGMENTS_13, key_value_seq_lengths=np.array([13, 10], np.int32),
             dropout_rate=0.3, dropout_rng=jax.random.key(0)),
        {"softcap", "sink", "segment", "padding", "dropout"}),
    # Cross-attention as the attention module asks for it: 9 queries (batch 1's >= 6 padded)
    # over 13 keys of another sequence whose pads (batch 1's >= 10) are segment 0 while every
    # query is in segment 1, with the probability options on a length no block size divides.
    "cross_9x13_segments_padding_softcap_sink_dropout": (
        dict(T=9, S=13, K=2, mult=3.0),
        dict(segment_ids=(np.ones((2, 9), np.int32),
                          (np.arange(13)[None, :] < np.array([[13], [10]])).astype(np.int32)),
             query_seq_lengths=np.array([9, 6], np.int32), logit_soft_cap=5.0, sink=_SINK_4,
             dropout_rate=0.3, dropout_rng=jax.random.key(0)),
        {"cross_attention", "segment", "padding", "softcap", "sink", "dropout"}),
    # Bidirectional (no causal mask) with padding: batch 1 pads queries >= 11 (zero rows) and
    # keys >= 9.
    "bidirectional_gqa_padding": (
        dict(T=16, K=2), dict(query_seq_lengths=np.array([16, 11], np.int32),
                              key_value_seq_lengths=np.array([16, 9], np.int32)),
        {"padding"}),
    # Packed bidirectional sequences whose pads form a segment of their own (id 99), keys past
    # 12 of batch 1 padded, a symmetric window and a symmetric (ALiBi-like) position bias.
    # Batch 1 query 15 sees no key at all (its window 12..15 is all padding).
    "bidirectional_window_3_3_segments_bias": (
        dict(T=16, K=2), dict(local_window_size=(3, 3), segment_ids=_PAD_SEGMENTS,
                              key_value_seq_lengths=np.array([16, 12], np.int32),
                              bias=distance_bias),
        {"window", "segment", "padding", "bias"}),
    # Bidirectional probability options at once, on a length no block size divides, with the
    # bidirectional T5 bias and query and key padding.
    "bidirectional_len13_softcap_sink_t5_bias_padding_dropout": (
        dict(T=13, K=2, mult=3.0),
        dict(logit_soft_cap=5.0, sink=_SINK_4, bias=_T5,
             query_seq_lengths=np.array([13, 8], np.int32),
             key_value_seq_lengths=np.array([13, 10], np.int32),
             dropout_rate=0.3, dropout_rng=jax.random.key(0)),
        {"softcap", "sink", "bias", "padding", "dropout"}),
}


def test_scenario_option_names_are_known():
    for _, _, asked in SCENARIOS.values():
        assert asked <= set(OPTIONS)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("name", EXACT_KERNELS)
def test_exact_kernel_matches_reference(name, scenario):
    shape_kwargs, kwargs, asked = SCENARIOS[scenario]
    q, k, v = qkv(**shape_kwargs)
    if not asked <= _spec(name).supports:
        missing, able = _unsupported_error(name, asked)
        with pytest.raises(ValueError, match="does not support: " + ", ".join(missing)):
            attend(name, q, k, v, **kwargs)
        with pytest.raises(ValueError):
            check_kernel_supports(name, frozenset(asked))
        return
    out, grads = attend_grads(name, q, k, v, **kwargs)
    want_out, want_grads = attend_grads("reference", q, k, v, **kwargs)
    assert_close(out, want_out)
    assert_close(grads, want_grads)
    chex.assert_tree_all_finite(grads)


# -------------------------------------------------------------------------- 4. reference vs jax.nn

_NN_MASK = (np.random.default_rng(7).random((2, 1, 12, 12)) < 0.5) | np.eye(12, dtype=bool)
_NN_BIAS = np.random.default_rng(8).normal(size=(2, 4, 12, 12)).astype(np.float32)
JAX_NN_CASES = {
    "plain": (4, {}),
    "gqa_causal": (2, dict(is_causal=True)),
    "mqa_bias": (1, dict(bias=_NN_BIAS)),
    "mask_no_empty_row": (2, dict(mask=_NN_MASK)),
    # kv length 10 keeps key 9 inside every row's window: no fully masked row.
    "kv_lengths_window_2_1": (2, dict(key_value_seq_lengths=np.array([12, 10], np.int32),
                                      local_window_size=(2, 1))),
}


@pytest.mark.parametrize("case", list(JAX_NN_CASES))
def test_reference_matches_jax_nn(case):
    K, kwargs = JAX_NN_CASES[case]
    q, k, v = qkv(T=12, K=K)
    ours = attend("reference", q, k, v, **kwargs)
    nn_kwargs = {key: jnp.asarray(x) if isinstance(x, np.ndarray) else x
                 for key, x in kwargs.items()}
    theirs = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, **nn_kwargs))(q, k, v)
    assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_int_window_means_what_it_means_in_jax_nn():
    """``local_window_size=w`` is the symmetric window ``(w, w)``, as in jax.nn."""
    q, k, v = qkv(T=8, K=2)
    offset = np.arange(8)[None, :] - np.arange(8)[:, None]            # k - q
    expected = oracle_attention(q, k, v, mask=np.abs(offset) <= 2)
    assert_close(attend("reference", q, k, v, local_window_size=2), expected)
    theirs = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, local_window_size=2))(
        q, k, v)
    assert_close(theirs, expected)


# -------------------------------------------------------------------------------------- 5. dropout

RATE = 0.3


def _dropout_kwargs(seed=0, shared=False):
    return dict(dropout_rate=RATE, dropout_rng=jax.random.key(seed),
                dropout_shared_across_heads=shared)


DROPOUT_SCENARIO = "len13_softcap_sink_segments_dropout"


@pytest.mark.parametrize("name", [_kernel_param(n) for n in KERNELS.names()
                                  if "dropout" in KERNELS.get(n).supports and n != "reference"])
def test_dropout_kernel_matches_reference(name):
    """The keep mask is a hash of absolute (batch, head, query, key) indices, so any kernel
    with dropout (chunked: any block order) drops exactly the same entries as reference.
    Uses the dropout scenario of test_exact_kernel_matches_reference (same compilations)."""
    shape_kwargs, kwargs, asked = SCENARIOS[DROPOUT_SCENARIO]
    if not asked <= _spec(name).supports:
        pytest.skip(f"{name} lacks {sorted(asked - _spec(name).supports)} (refusal is tested "
                    "in test_exact_kernel_matches_reference)")
    q, k, v = qkv(**shape_kwargs)
    out, grads = attend_grads(name, q, k, v, **kwargs)
    want_out, want_grads = attend_grads("reference", q, k, v, **kwargs)
    assert_close(out, want_out)
    assert_close(grads, want_grads)
    # Dropout is active: another rng gives another mask (same compiled functions), and the
    # kernels still agree on it.
    other_kwargs = {**kwargs, "dropout_rng": jax.random.key(1)}
    other, other_grads = attend_grads(name, q, k, v, **other_kwargs)
    assert np.abs(np.asarray(out - other)).max() > 1e-2
    assert_close((other, other_grads), attend_grads("reference", q, k, v, **other_kwargs))


def _keep_grid(rate, rng, shared, B=2, N=4, T=64, S=64):
    d = Dropout(rate, rng, shared)
    return np.asarray(jax.jit(lambda: dropout_keep(
        d, jnp.arange(B)[:, None, None, None], jnp.arange(N)[None, :, None, None],
        jnp.arange(T)[:, None], jnp.arange(S)))())


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5, 0.9])
def test_dropout_keep_fraction(rate):
    # 2*4*64*64 = 32768 Bernoulli(1 - rate) draws: the kept fraction has binomial standard
    # deviation sqrt(rate (1 - rate) / 32768) <= 0.0028; accept 5 standard deviations. (The
    # hash is deterministic, so this cannot flake: it either is or is not well distributed.)
    for rng in (jax.random.key(0), jax.random.PRNGKey(123)):
        keep = _keep_grid(rate, rng, False)
        assert keep.dtype == bool and keep.shape == (2, 4, 64, 64)
        std = np.sqrt(rate * (1 - rate) / keep.size)
        assert abs(keep.mean() - (1 - rate)) < 5 * std
        # No structure along any single axis: every query row keeps about 1 - rate too
        # (64 draws per row; 5 std of the row mean).
        rows = keep.mean(axis=-1)
        assert np.abs(rows - (1 - rate)).max() < 5 * np.sqrt(rate * (1 - rate) / 64)


def test_dropout_shared_across_heads_and_per_head():
    shared = _keep_grid(0.5, jax.random.key(3), True)
    for n in range(1, 4):
        np.testing.assert_array_equal(shared[:, n], shared[:, 0])
    per_head = _keep_grid(0.5, jax.random.key(3), False)
    # Independent heads disagree on a fraction 2 p (1 - p) = 0.5 of entries (8192 per pair;
    # std 0.0055 -> accept +-0.03).
    for n in range(1, 4):
        assert abs((per_head[:, n] != per_head[:, 0]).mean() - 0.5) < 0.03
    # Different batch elements and different rngs also differ.
    assert abs((per_head[0] != per_head[1]).mean() - 0.5) < 0.03
    assert abs((_keep_grid(0.5, jax.random.key(4), False) != per_head).mean() - 0.5) < 0.03


@pytest.mark.parametrize("shared", [False, True], ids=["per_head", "shared_across_heads"])
def test_dropout_output_by_hand(shared):
    """out = sum_j keep * p_j / (1 - r) * v_j with p the returned (pre-dropout) weights and keep
    from ``dropout_keep``; checked for reference and every other kernel with dropout."""
    B, T, N, K = 2, 12, 4, 2
    q, k, v = qkv(T=T, K=K)
    kwargs = dict(is_causal=True, **_dropout_kwargs(9, shared))
    out, weights = attend("reference", q, k, v, return_weights=True, **kwargs)
    keep = _keep_grid(RATE, kwargs["dropout_rng"], shared, B=B, N=N, T=T, S=T)
    if shared:
        assert all((keep[:, n] == keep[:, 0]).all() for n in range(N))
    dropped = np.where(keep, np.asarray(weights, np.float64) / (1 - RATE), 0.0)
    expected = np.einsum("bnts,bsnh->btnh", dropped, repeat_heads(v, N))
    assert_close(out, expected)
    if shared:
        # Other kernels with dropout (per-head masks are covered, with gradients, by
        # test_dropout_kernel_matches_reference).
        for name in KERNELS.names():
            if ("dropout" in _spec(name).supports and name != "reference"
                    and _spec(name).available()):
                assert_close(attend(name, q, k, v, **kwargs), expected)


# ---------------------------------------------------------------------------- 6. fully masked rows


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", ALL_KERNELS)
def test_fully_masked_rows_are_zero(name, is_causal):
    q, k, v = qkv(T=16, K=2)
    out, (dq, dk, dv) = masked_run(name, q, k, v, is_causal=is_causal)
    out, dq, dk, dv = (np.asarray(x) for x in (out, dq, dk, dv))
    # Batch 1 sees no key at all; batch 0 rows >= 13 are query padding.
    np.testing.assert_array_equal(out[1], 0.0)
    np.testing.assert_array_equal(out[0, 13:], 0.0)
    chex.assert_tree_all_finite((dq, dk, dv))
    # Nothing flows back through rows that see nothing, nor into keys nobody sees.
    np.testing.assert_array_equal(dq[1], 0.0)
    np.testing.assert_array_equal(dq[0, 13:], 0.0)
    np.testing.assert_array_equal(dk[1], 0.0)
    np.testing.assert_array_equal(dv[1], 0.0)
    np.testing.assert_array_equal(dk[0, 11:], 0.0)
    np.testing.assert_array_equal(dv[0, 11:], 0.0)


def test_fully_masked_row_zeros_vs_jax_nn_mean_of_v():
    """Pinned difference: for a query row with no visible key jax.nn.dot_product_attention
    returns the mean of V over all keys (uniform softmax over equal fill values); attnjax
    kernels return zeros (``xla`` zeroes the row after calling jax.nn)."""
    q, k, v = qkv(T=12, K=2)
    mask = np.ones((2, 1, 12, 12), bool)         # same shapes as JAX_NN_CASES: shared compiles
    mask[..., 2, :] = False
    theirs = np.asarray(jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask)))
    mean_v = repeat_heads(v, 4).mean(axis=1)                      # [B, N, H]
    np.testing.assert_allclose(theirs[:, 2], mean_v, rtol=RTOL, atol=ATOL)
    for name in KERNELS.names():
        if "mask" in _spec(name).supports and _spec(name).available() and _spec(name).safe:
            ours = np.asarray(attend(name, q, k, v, mask=mask))
            np.testing.assert_array_equal(ours[:, 2], 0.0)
            rows = [0, 1] + list(range(3, 12))
            np.testing.assert_allclose(ours[:, rows], theirs[:, rows], rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- 7. float16 / bfloat16

# Unit roundoff u = 2^-(mantissa bits + 1): float16 2^-11 ~ 4.9e-4, bfloat16 2^-8 ~ 3.9e-3.
# Against float32 on the *same rounded inputs* the only new errors are roundings of the
# probabilities to the value dtype before P @ V, of the output, and (backward) of the
# cotangent and intermediate products: each contributes <= u relative to the largest term,
# so outputs are compared with atol 4u * max|ref| and gradients with 8u * max|ref| (about
# 1.6e-2 / 3.1e-2 for bfloat16, 2e-3 / 4e-3 for float16).
LOW_PRECISION = {"float16": (jnp.float16, 2.0 ** -11), "bfloat16": (jnp.bfloat16, 2.0 ** -8)}


@pytest.mark.parametrize("dtype_name", list(LOW_PRECISION))
@pytest.mark.parametrize("name", ALL_KERNELS)
def test_low_precision_masked_no_nan_and_close_to_float32(name, dtype_name):
    dtype, u = LOW_PRECISION[dtype_name]
    q, k, v = (jnp.asarray(x, dtype) for x in qkv(T=16, K=2))
    out, grads = masked_run(name, q, k, v)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    chex.assert_tree_all_finite((out, grads))
    np.testing.assert_array_equal(np.asarray(out[1], np.float32), 0.0)
    np.testing.assert_array_equal(np.asarray(out[0, 13:], np.float32), 0.0)
    # float32 on the same (rounded) inputs and the same (rounded) cotangent.
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    cot = jnp.asarray(cotangent(out.shape), dtype).astype(jnp.float32)
    out32, grads32 = attend_grads(name, q32, k32, v32, cot, is_causal=True,
                                  query_seq_lengths=MASKED_Q_LEN,
                                  key_value_seq_lengths=MASKED_KV_LEN)

    def check(got, want, factor):
        want = np.asarray(want, np.float64)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                                   atol=factor * u * np.abs(want).max())

    check(out, out32, 4)
    for g, g32 in zip(grads, grads32):
        check(g, g32, 8)


# ------------------------------------------------------------------------------- 8. return_weights


@pytest.mark.parametrize("with_sink", [False, True], ids=["no_sink", "sink"])
@pytest.mark.parametrize("name", WEIGHTS_KERNELS)
def test_return_weights(name, with_sink):
    T = 10
    q, k, v = qkv(T=T, K=2)
    kv_len = np.array([10, 0], np.int32)             # batch 1: every row fully masked
    sink = 0.0 if with_sink else None                # softmax plus one (scalar form)
    kwargs = dict(is_causal=True, key_value_seq_lengths=kv_len)
    if with_sink:
        kwargs["sink"] = sink
    out, weights = attend(name, q, k, v, return_weights=True, **kwargs)
    chex.assert_shape(weights, (2, 4, T, T))
    assert weights.dtype == jnp.float32
    weights = np.asarray(weights, np.float64)
    sums = weights.sum(-1)
    np.testing.assert_array_equal(weights[1], 0.0)
    if with_sink:
        assert (sums[0] < 1 - 1e-3).all() and (sums[0] > 0).all()
    else:
        np.testing.assert_allclose(sums[0], 1.0, rtol=0, atol=1e-6)
    assert (weights >= 0).all()
    mask = np.tril(np.ones((T, T), bool)) & lengths_mask([T, T], kv_len, T, T)
    expected = oracle_probs(q, k, mask=mask, sink=sink)
    np.testing.assert_allclose(weights, expected, rtol=RTOL, atol=ATOL)
    # The output is the weights applied to V.
    assert_close(out, np.einsum("bnts,bsnh->btnh", weights, repeat_heads(v, 4)))


@pytest.mark.parametrize("name", NO_WEIGHTS_KERNELS)
def test_return_weights_refused(name):
    q, k, v = qkv(T=4, K=2)
    able = [n for n in KERNELS.names() if "return_weights" in KERNELS.get(n).supports]
    with pytest.raises(ValueError) as info:
        dot_product_attention(q, k, v, return_weights=True, implementation=name)
    message = str(info.value)
    assert "\n" not in message
    assert "return_weights" in message and repr(name) in message
    assert message.endswith("kernels that do: " + ", ".join(able))


# ------------------------------------------------------------------------------------ 9. bad input


def test_unknown_implementation_lists_choices():
    q, k, v = qkv(T=4, K=2)
    with pytest.raises(ValueError, match="implementation='flash3' is not a known") as info:
        dot_product_attention(q, k, v, implementation="flash3")
    assert "\n" not in str(info.value)
    assert str(info.value).endswith("valid choices: " + ", ".join(KERNELS.names()))


def test_heads_not_divisible():
    q, _, _ = qkv(T=4, N=4)
    _, k, v = qkv(T=4, K=3)
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of kv heads \(3\)"):
        dot_product_attention(q, k, v)


def test_dropout_needs_rng_and_valid_rate():
    q, k, v = qkv(T=4, K=2)
    with pytest.raises(ValueError, match="dropout_rate > 0 needs dropout_rng"):
        dot_product_attention(q, k, v, dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"dropout_rate must be in \[0, 1\)"):
        dot_product_attention(q, k, v, dropout_rate=1.0, dropout_rng=jax.random.key(0))


def test_bad_ranks_and_shapes():
    q, k, v = qkv(T=4, K=2)
    with pytest.raises(ValueError, match="BTNH"):
        dot_product_attention(q[0], k, v)
    with pytest.raises(ValueError, match="head_dim"):
        dot_product_attention(q, k[..., :4], v)


# Option name -> keyword arguments that ask for it.
_ASK = {
    "softcap": dict(logit_soft_cap=5.0),
    "sink": dict(sink=0.0),
    "dropout": dict(dropout_rate=0.1, dropout_rng=jax.random.key(0)),
    "bias": dict(bias=lambda q_pos, k_pos: jnp.zeros((1, 1, q_pos.shape[-1], k_pos.shape[-1]))),
    "dense_bias": dict(bias=np.zeros((4, 4), np.float32)),
    "mask": dict(mask=np.ones((4, 4), bool)),
    "window": dict(local_window_size=(1, 1)),
    "block_causal": dict(causal_block_size=2),
    "segment": dict(segment_ids=np.zeros((2, 4), np.int32)),
    "per_head_scale": dict(scale=np.ones(4, np.float32)),
    "positions": dict(query_positions=np.arange(4)[None]),
    "padding": dict(key_value_seq_lengths=np.array([4, 2], np.int32)),
}
_REFUSED = [pytest.param(n, o, id=f"{n}-{o}") for n in KERNELS.names() for o in _ASK
            if o not in KERNELS.get(n).supports]


@pytest.mark.parametrize("name,option", _REFUSED)
def test_unsupported_option_names_it(name, option):
    q, k, v = qkv(T=4, K=2)
    asked = {option, "bias"} if option == "dense_bias" else {option}  # an array is a bias too
    able = [n for n, s in KERNELS.items() if asked <= s.supports]
    missing = ", ".join(sorted(asked - KERNELS.get(name).supports))
    with pytest.raises(ValueError) as info:
        dot_product_attention(q, k, v, implementation=name, **_ASK[option])
    message = str(info.value)
    assert "\n" not in message
    assert f"implementation={name!r} does not support: {missing};" in message
    assert message.endswith("kernels that do: " + (", ".join(able) or "none"))


def test_named_refusals():
    """The specific refusals users hit most: xla cannot softcap/sink/dropout, linear no bias."""
    q, k, v = qkv(T=4, K=2)
    for option in ("softcap", "sink", "dropout"):
        with pytest.raises(ValueError, match=f"implementation='xla' does not support: {option}"):
            dot_product_attention(q, k, v, implementation="xla", **_ASK[option])
    with pytest.raises(ValueError, match="implementation='linear' does not support: bias"):
        dot_product_attention(q, k, v, implementation="linear", **_ASK["bias"])
    with pytest.raises(ValueError, match="needs query and key of equal length"):
        dot_product_attention(q, *qkv(T=4, S=6, K=2)[1:], is_causal=True, implementation="linear")


@pytest.mark.skipif(BACKEND != "cpu", reason="checks the error raised on a CPU-only process")
def test_cudnn_on_cpu_is_a_clear_error():
    q, k, v = qkv(T=4, K=2)
    with pytest.raises(ValueError, match="implementation='cudnn' needs a CUDA GPU") as info:
        dot_product_attention(q, k, v, implementation="cudnn")
    assert "'cpu'" in str(info.value) and "\n" not in str(info.value)


# -------------------------------------------------------------------------------- 10. jit / no jit


class JitVariantsTest(chex.TestCase):
    """The same call with and without jit (chex.variants) against the float64 oracle."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters("reference", "chunked", "flash")
    def test_matches_oracle(self, name):
        q, k, v = qkv(T=9, K=2)
        lengths = np.array([9, 5], np.int32)
        fn = self.variant(functools.partial(dot_product_attention, implementation=name,
                                            is_causal=True, **KERNEL_OPTIONS.get(name, {})))
        out = fn(q, k, v, key_value_seq_lengths=lengths)
        chex.assert_shape(out, q.shape)
        mask = np.tril(np.ones((9, 9), bool)) & lengths_mask([9, 9], lengths, 9, 9)
        assert_close(out, oracle_attention(q, k, v, mask=mask))


# -------------------------------------------------------------------------------- 11. multi-device

_MULTI_DEVICE = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from attnjax.ops import dot_product_attention

assert jax.device_count() == 4, jax.devices()
mesh = jax.make_mesh((4,), ("data",))
rng = np.random.default_rng(0)
q = rng.normal(size=(4, 16, 4, 8)).astype(np.float32)
k = rng.normal(size=(4, 16, 2, 8)).astype(np.float32)
v = rng.normal(size=(4, 16, 2, 8)).astype(np.float32)
lengths = np.array([16, 9, 12, 5], np.int32)
failed = []
for name, opts in [("reference", {}), ("chunked", dict(block_q=4, block_k=5)),
                   ("flash", dict(block_q=4, block_k=5))]:
    try:
        fn = jax.jit(lambda q, k, v, n, name=name, opts=opts: dot_product_attention(
            q, k, v, is_causal=True, key_value_seq_lengths=n, implementation=name, **opts))
        single = np.asarray(fn(*(jax.device_put(x, jax.devices()[0]) for x in (q, k, v, lengths))))
        batch = NamedSharding(mesh, P("data"))
        with jax.set_mesh(mesh):
            args = [jax.device_put(x, batch) for x in (q, k, v, lengths)]
            out = fn(*args)
            assert len(out.sharding.device_set) == 4, out.sharding
            assert out.sharding.spec[0] == "data", out.sharding
        np.testing.assert_allclose(np.asarray(out), single, rtol=1e-6, atol=1e-6)
        print(name, "OK, max diff", float(np.abs(np.asarray(out) - single).max()))
    except Exception as e:
        failed.append(name)
        print(name, "FAILED:", type(e).__name__, str(e).strip().splitlines()[0:4])
if failed:
    raise SystemExit("kernels failing under the 4-device mesh: " + ", ".join(failed))

# flash in two groups of four examples, each group split over the four devices: outputs and
# gradients as on one device, the gradients still split along the batch
from attnjax.ops.flash import group_size
assert group_size(8, 4, 128, 128) == 4
q8 = rng.normal(size=(8, 128, 4, 8)).astype(np.float32)
kv8 = rng.normal(size=(8, 128, 2, 8)).astype(np.float32)
n8 = np.array([128, 100, 77, 128, 5, 64, 128, 90], np.int32)
step = jax.jit(jax.value_and_grad(lambda q, k, v, n: (dot_product_attention(
    q, k, v, is_causal=True, key_value_seq_lengths=n, implementation="flash") ** 2).sum(),
    argnums=(0, 1, 2)))
single = step(*(jax.device_put(x, jax.devices()[0]) for x in (q8, kv8, kv8, n8)))
with jax.set_mesh(mesh):
    split = step(*(jax.device_put(x, NamedSharding(mesh, P("data"))) for x in (q8, kv8, kv8, n8)))
    assert split[1][0].sharding.spec[0] == "data", split[1][0].sharding
# the loss sums 32k squares, in another order over four devices: within log2(n) eps ~ 1e-6;
# the gradients of each example are its own, so as tight as the outputs above
(loss, grads), (loss_1, grads_1) = split, single
np.testing.assert_allclose(float(loss), float(loss_1), rtol=2e-6)
for got, want in zip(grads, grads_1):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
print("flash in groups OK")
print("OK")
"""


def test_batch_sharded_over_four_cpu_devices_matches_single_device():
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4",
                         JAX_PLATFORMS="cpu")
    # separate process: the 4 host devices must be requested before JAX starts
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_MULTI_DEVICE)], env=env,
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "OK" in result.stdout.splitlines(), result.stdout


# ---------------------------------------------------------------------------- 12. linear attention


def _phi(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _linear_oracle(q, k, v, scale, causal, q_len=None, kv_len=None):
    """Direct float64 O(n^2) linear attention."""
    B, T, N, H = q.shape
    S = k.shape[1]
    fq = _phi(np.asarray(q, np.float64) * np.broadcast_to(scale, (N,))[None, None, :, None])
    fk, vv = _phi(repeat_heads(k, N)), repeat_heads(v, N)
    out = np.zeros((B, T, N, vv.shape[-1]))
    for b in range(B):
        for i in range(T):
            if q_len is not None and i >= q_len[b]:
                continue
            for n in range(N):
                num, den = 0.0, 0.0
                for j in range(S):
                    if (causal and j > i) or (kv_len is not None and j >= kv_len[b]):
                        continue
                    w = fq[b, i, n] @ fk[b, j, n]
                    num = num + w * vv[b, j, n]
                    den += w
                if den > 0:
                    out[b, i, n] = num / den
    return out


@pytest.mark.parametrize("mask_kind", [k for k in MASK_KINDS if k != "cross_padding"])
def test_linear_self_attention_matches_direct_computation(mask_kind):
    q, k, v = qkv(T=8, K=2)
    kwargs, _ = mask_kind_case(mask_kind, T=8)
    got = attend("linear", q, k, v, **kwargs)
    assert_close(got, _linear_oracle(q, k, v, 1 / np.sqrt(8), causal=mask_kind == "causal",
                                     q_len=kwargs.get("query_seq_lengths"),
                                     kv_len=kwargs.get("key_value_seq_lengths")))


def test_linear_noncausal_cross_padding_per_head_scale():
    q, k, v = qkv(T=5, S=8, K=2)
    scale = np.array([0.2, 0.4, 0.6, 0.8], np.float32)
    q_len, kv_len = np.array([5, 3], np.int32), np.array([8, 4], np.int32)
    got = attend("linear", q, k, v, scale=scale, query_seq_lengths=q_len,
                 key_value_seq_lengths=kv_len)
    assert_close(got, _linear_oracle(q, k, v, scale, causal=False, q_len=q_len, kv_len=kv_len))


def _matmul_flops(fn, *args) -> int:
    """``2 * output size * contracted size`` summed over every ``dot_general`` of ``fn``'s
    jaxpr (the logits and the weighted sums of an attention kernel)."""
    total = 0
    for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(
                np.prod([lhs[d] for d in contract]))
    return total


def test_triangular_computes_only_the_blocks_a_causal_mask_shows():
    """Length 64 in 4 query blocks of 16: causal, they see 16, 32, 48 and 64 keys, (4 + 1) /
    (2 * 4) = 5/8 of the reference kernel's logits and weighted sums; with a sliding window of
    8 keys back, 16, 24, 24 and 24 keys, 88/256 of them. Exact counts of the matmul FLOPs."""
    q, k, v = (jnp.zeros((1, 64, 2, 32)),) * 3
    flops = lambda name, **kw: _matmul_flops(lambda q, k, v: dot_product_attention(
        q, k, v, implementation=name, **kw), q, k, v)
    assert flops("triangular", is_causal=True, block_q=16) * 8 == flops(
        "reference", is_causal=True) * 5
    window = dict(is_causal=True, local_window_size=(8, 0))
    assert flops("triangular", block_q=16, **window) * 256 == flops("reference", **window) * 88


def test_triangular_gives_zeros_to_query_blocks_that_see_no_key():
    """Cross-attention of 12 queries over 4 keys with a window of 2 keys back: queries from 7 on
    see none, so their blocks (from 8) get no key slice at all, and zeros as every kernel."""
    q, k, v = qkv(T=12, S=4, K=2)
    kwargs = dict(local_window_size=(2, 0))
    out = attend("triangular", q, k, v, block_q=4, **kwargs)
    assert_close(out, attend("reference", q, k, v, **kwargs))
    assert not np.asarray(out[:, 7:]).any()
