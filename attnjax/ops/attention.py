"""Scaled dot-product attention: one front door, several interchangeable kernels.

Layout is BTNH (``[batch, seq, heads, head_dim]``) as in ``jax.nn.dot_product_attention``; key
and value may have fewer heads ``K`` than the query's ``N`` (GQA; ``K = 1`` is MQA) as long as
``K`` divides ``N``: query head ``n`` reads kv head ``n // (N // K)``. Query and key share their
width ``H`` (the scores are ``q.k``); the value may have its own width ``D`` (option
``value_head_dim``), which is then the width of the output.

For one query row the math every softmax kernel implements is::

    s_j = c * tanh(scale * q.k_j / c)  (soft-capping, optional)  + bias_j,   j visible
    p_j = exp(s_j - m) / (exp(sink - m) + sum_visible exp(s - m))          (sink optional)
    out = sum_j dropout(p)_j v_j

Differences from ``jax.nn.dot_product_attention`` (all deliberate, all tested):

* a query row that sees no key returns **zeros** (jax.nn returns the mean of V);
* logits and softmax are computed in float32 (or wider) whatever the input dtype, and masked
  logits are *selected away* with one finite fill (:func:`masks.mask_value`), so float16 and
  bfloat16 never produce NaN;
* ``scale`` may be a per-head array (a temperature per head), ``bias`` may be a function of
  positions (so ALiBi / T5 biases never need an n x n array in the chunked kernel).

References: Vaswani et al. 2017, "Attention Is All You Need" (scaled dot-product attention);
Ainslie et al. 2023, "GQA"; Gemma Team 2024, "Gemma 2" (logit soft-capping);
Miller 2023 / Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.ops.masks import MaskSpec, mask_value
from attnjax.registry import KERNELS

BiasFn = Callable[[jax.Array, jax.Array], jax.Array]
Bias = jax.Array | BiasFn | None

# Option names a kernel may or may not honour; the front door and the config check use these
# (``bias``: any additive bias; ``dense_bias``: one given as an array, not a function of
# positions).
OPTIONS = ("bias", "dense_bias", "mask", "positions", "window", "block_causal", "segment",
           "padding", "per_head_scale", "softcap", "sink", "dropout", "return_weights",
           "cross_attention", "value_head_dim")


class KernelSpec(NamedTuple):
    """A registered attention kernel: every fact about it that code outside it needs.

    ``fn(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
    return_weights, **settings)``. ``supports``: the ``OPTIONS`` it honours (the front door
    and the config refuse the rest). ``exact``: it computes softmax attention and must match
    ``reference`` within float tolerance (the parity tests check every such kernel).
    ``causal_only_aligned``: causal attention only for queries and keys of equal length.
    ``settings``: the ``model.attention`` fields it reads, passed as keyword arguments when
    set (e.g. ``block_q``); a model with another kernel may not set them. ``backends``: the JAX
    backends it runs on (``None``: all). ``test_options``: settings that exercise it on tiny
    inputs (e.g. several blocks at length 9), used by the parity table. ``safe``: it keeps the
    numerical contract of the module docstring (rows that see no key give zeros, logits in
    float32 or wider, masks selected with a finite fill); the contract tests check every such
    kernel. ``runs_as``: the kernel whose program this one runs when nothing is split over
    devices (``ring`` and ``allgather`` outside ``ops.context.sequence_parallel``: ``chunked``);
    the tests that run every kernel inside a model run that one in its place.
    """
    fn: Callable
    supports: frozenset
    exact: bool = True
    causal_only_aligned: bool = False
    settings: tuple[str, ...] = ()
    backends: frozenset | None = None
    test_options: tuple[tuple[str, int], ...] = ()
    safe: bool = True
    runs_as: str | None = None

    def available(self) -> bool:
        """Whether it runs on this process's default JAX backend."""
        return self.backends is None or jax.default_backend() in self.backends


class Dropout(NamedTuple):
    """Dropout on the attention probabilities.

    The keep decision for (batch b, head n, query i, key j) is a counter-based hash of the rng
    and those indices, so every kernel (and every block order) drops exactly the same entries.
    ``shared_across_heads`` uses n = 0 for all heads (one mask per example, as in the original
    Transformer's broadcast dropout); otherwise each head draws its own.
    """
    rate: float
    rng: jax.Array
    shared_across_heads: bool = False


def rate_active(rate) -> bool:
    """True unless ``rate`` is a concrete zero. A traced rate (a hyperparameter vmapped over,
    see ``attnjax.train.hyper``) counts as active: the computation cannot branch on it."""
    return isinstance(rate, jax.core.Tracer) or rate > 0


def _keep_threshold(rate) -> jax.Array:
    """``round(rate * 2^32)`` as uint32: exact for a Python float, float32 for a traced one."""
    if isinstance(rate, jax.core.Tracer):
        return jnp.minimum(jnp.round(rate * 2.0**32), 4294967040.0).astype(jnp.uint32)
    return jnp.uint32(min(int(round(rate * 2.0**32)), 2**32 - 1))


def _mix32(h: jax.Array) -> jax.Array:
    """A bijective 32-bit integer hash (the "lowbias32" finaliser by C. Wellons)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def dropout_keep(dropout: Dropout, batch_idx, head_idx, q_idx, k_idx) -> jax.Array:
    """Boolean keep mask for broadcastable index arrays; True with probability ``1 - rate``."""
    rng = dropout.rng
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        rng = jax.random.key_data(rng)
    seed = rng.reshape(-1).astype(jnp.uint32)
    h = _mix32(seed[0] ^ _mix32(seed[-1]))
    if dropout.shared_across_heads:
        head_idx = jnp.zeros_like(head_idx)
    for index in (batch_idx, head_idx, q_idx, k_idx):
        h = _mix32(h ^ jnp.asarray(index).astype(jnp.uint32))
    return h >= _keep_threshold(dropout.rate)


def apply_dropout(dropout: Dropout, p: jax.Array, q_index, k_index) -> jax.Array:
    """``p`` ``[B, N, tq, tk]`` (probabilities of the queries at absolute indices ``q_index``
    ``[tq]`` over the keys at ``k_index`` ``[tk]``) with dropout: dropped entries 0, the rest
    over ``1 - rate``."""
    keep = dropout_keep(dropout, jnp.arange(p.shape[0])[:, None, None, None],
                        jnp.arange(p.shape[1])[:, None, None], q_index[:, None], k_index)
    return jnp.where(keep, p / (1.0 - dropout.rate), 0.0)


def scaled_logits(q: jax.Array, k: jax.Array, scale: jax.Array,
                  logit_soft_cap: float | None) -> jax.Array:
    """Logits ``[B, N, Tq, Tk]`` in float32 (or wider) from ``q`` ``[B, Tq, N, H]`` and ``k``
    ``[B, Tk, N, H]`` (kv heads expanded, ``expand_kv_heads``); ``scale`` ``[N]``."""
    dtype = jnp.promote_types(q.dtype, jnp.float32)
    s = jnp.einsum("bqnh,bknh->bnqk", q, k, preferred_element_type=dtype)
    s = s * scale[:, None, None]
    if logit_soft_cap is not None:
        s = logit_soft_cap * jnp.tanh(s / logit_soft_cap)
    return s


def expand_kv_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """``[B, T, K, ...]`` -> ``[B, T, N, ...]``: query head ``n`` reads kv head ``n // (N //
    K)`` (GQA). One layout for every head count keeps the scores ``[B, N, Tq, Tk]``, whose
    einsums XLA lowers without transposing them (a grouped ``[B, K, G, Tq, Tk]`` layout makes
    XLA:CPU transpose the probabilities)."""
    groups = num_heads // x.shape[2]
    return x if groups == 1 else jnp.repeat(x, groups, axis=2)


def visible_rows(visible: jax.Array | None) -> jax.Array | None:
    """``[B|1, N|1, Tq, 1]``: whether a query row sees any key (``None``: every row does)."""
    return None if visible is None else visible.any(axis=-1, keepdims=True)


def block_bias(bias: Bias, mask: MaskSpec, q_start, q_size: int, k_start,
               k_size: int) -> jax.Array | None:
    """The additive bias of one block, ``[B|1, N|1, q_size, k_size]``, or ``None``."""
    if bias is None:
        return None
    if callable(bias):
        return bias(*mask.positions(q_start, q_size, k_start, k_size))
    dense = MaskSpec(dense=bias)  # reuse the block slicing of a dense array
    return dense.block(q_start, q_size, k_start, k_size)


def attend_block(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
                 q_start: int = 0, k_start: int = 0, point=None):
    """``(out, probs)`` of the queries ``query`` ``[B, tq, N, H]`` at ``q_start`` over the keys
    ``key`` ``[B, tk, K, H]`` at ``k_start`` (masks, bias and dropout read absolute indices):
    materialise the logits, masked softmax, weighted sum (einsum). ``point(name, value)``
    (optional) sees, and may replace, the ``scores``, the ``masked_scores`` and the ``probs``
    ``[B, N, tq, tk]`` (``attnjax.nn.points``).

    Masked logits are selected to the finite fill, so ``exp(s - m)`` is exactly 0 for them in
    every row that sees a key; a row that sees none (its max is the fill) is zeroed at the
    end, in the output and the weights."""
    B, T, N, H = query.shape
    S = key.shape[1]
    key, value = expand_kv_heads(key, N), expand_kv_heads(value, N)
    s = scaled_logits(query, key, scale, logit_soft_cap)                   # [B,N,T,S]
    b = block_bias(bias, mask, q_start, T, k_start, S)
    if b is not None:
        s = s + b
    point = point or (lambda name, x: x)
    s = point("scores", s)
    visible = mask.block(q_start, T, k_start, S)
    if visible is not None:
        s = jnp.where(visible, s, mask_value(s.dtype))
    s = point("masked_scores", s)
    m = s.max(axis=-1, keepdims=True)
    if sink is not None:
        m = jnp.maximum(m, sink[:, None, None])
    m = jax.lax.stop_gradient(m)                  # softmax is invariant to the shift
    p = jnp.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + jnp.exp(sink[:, None, None] - m)
    probs = point("probs", p / denom)
    dropped = probs
    if dropout is not None:
        dropped = apply_dropout(dropout, probs, q_start + jnp.arange(T), k_start + jnp.arange(S))
    out = jnp.einsum("bnqk,bknh->bqnh", dropped.astype(value.dtype), value,
                     preferred_element_type=probs.dtype)
    rows = visible_rows(visible)
    if rows is not None and sink is None:       # with a sink an empty row's p is already 0
        out, probs = out * jnp.moveaxis(rows, 1, 2), probs * rows
    return out.astype(query.dtype), probs


def _reference(query, key, value, *, return_weights, **options):
    """Reference kernel: ``attend_block`` over the whole sequence (``point``, a kernel option
    of its own, as there)."""
    out, probs = attend_block(query, key, value, **options)
    return (out, probs) if return_weights else out


KERNELS.register("reference", KernelSpec(_reference, frozenset(OPTIONS)))


def _as_4d(x: jax.Array | None, name: str) -> jax.Array | None:
    if x is None or callable(x):
        return x
    if x.ndim > 4:
        raise ValueError(f"{name} must broadcast to [batch, heads, q_len, k_len], got shape "
                         f"{x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


def requested_options(*, bias=None, mask=None, positions=False, window=None,
                      block_causal=None, segment=False, padding=False, scale=None,
                      logit_soft_cap=None, sink=None, dropout_rate=0.0, return_weights=False,
                      cross_attention=False, value_head_dim=False,
                      dense_bias=False) -> frozenset:
    """The option names (see ``OPTIONS``) a call or a config asks a kernel to honour
    (``value_head_dim``: the value's width differs from the query's and key's;
    ``dense_bias``: the bias is an array)."""
    asked = {
        "bias": bias is not None, "dense_bias": dense_bias, "mask": mask is not None,
        "positions": positions,
        "window": window is not None, "block_causal": block_causal is not None,
        "segment": segment, "padding": padding,
        "per_head_scale": scale is not None and np.ndim(scale) > 0,
        "softcap": logit_soft_cap is not None, "sink": sink is not None,
        "dropout": rate_active(dropout_rate), "return_weights": return_weights,
        "cross_attention": cross_attention, "value_head_dim": value_head_dim,
    }
    return frozenset(name for name, on in asked.items() if on)


def check_kernel_supports(implementation: str, asked: frozenset, field: str = "implementation"):
    """Raise a one-line ValueError if kernel ``implementation`` cannot honour ``asked``."""
    spec = KERNELS.get(implementation, field)
    missing = sorted(asked - spec.supports)
    if missing:
        able = [n for n, s in KERNELS.items() if asked <= s.supports]
        raise ValueError(f"{field}={implementation!r} does not support: {', '.join(missing)}; "
                         f"kernels that do: {', '.join(able) or 'none'}")
    return spec


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                          bias: Bias = None, mask: jax.Array | None = None, *,
                          scale: float | jax.Array | None = None, is_causal: bool = False,
                          query_seq_lengths: jax.Array | None = None,
                          key_value_seq_lengths: jax.Array | None = None,
                          local_window_size: int | tuple[int | None, int | None] | None = None,
                          causal_block_size: int | None = None,
                          segment_ids: jax.Array | tuple[jax.Array, jax.Array] | None = None,
                          query_positions: jax.Array | None = None,
                          key_positions: jax.Array | None = None,
                          logit_soft_cap: float | None = None,
                          sink: float | jax.Array | None = None,
                          dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None,
                          dropout_shared_across_heads: bool = False,
                          return_weights: bool = False,
                          implementation: str = "reference", **kernel_options):
    """Scaled dot-product attention over BTNH arrays with a choice of kernel.

    Args:
      query: ``[B, Tq, N, H]``.
      key: ``[B, Tk, K, H]`` with ``K`` dividing ``N`` (GQA / MQA).
      value: ``[B, Tk, K, D]``; ``D != H`` asks for the option ``value_head_dim``.
      bias: additive logit bias broadcastable to ``[B, N, Tq, Tk]``, or a function
        ``bias(q_positions [B|1, tq], k_positions [B|1, tk]) -> [B|1, N|1, tq, tk]``.
      mask: boolean, broadcastable to ``[B, N, Tq, Tk]``; True = may attend.
      scale: logit multiplier; ``None`` = ``1/sqrt(H)``; a float; or a per-head array ``[N]``.
      is_causal: key j visible from query i iff ``key_pos[j] <= query_pos[i]``.
      query_seq_lengths, key_value_seq_lengths: int ``[B]``; positions past them are padding.
      local_window_size: ``w`` (= ``(w, w)``, as in jax.nn) or ``(left, right)``: keys with
        ``q - left <= k <= q + right`` are visible (``None`` on a side = unbounded).
      causal_block_size: block-causal mask (full attention within blocks, causal across).
      segment_ids: ``[B, T]`` for self-attention or ``(q_ids [B, Tq], kv_ids [B, Tk])``.
      query_positions, key_positions: int ``[B|1, T]``; default ``arange``. All position
        based masks and bias functions read these (a KV cache offsets its queries this way).
      logit_soft_cap: ``c`` in ``c * tanh(logits / c)``, applied before bias and masking.
      sink: sink logit per head ``[N]`` (or scalar): an extra softmax entry with no value.
        ``0.0`` gives "softmax plus one".
      dropout_rate, dropout_rng, dropout_shared_across_heads: dropout on the probabilities.
      return_weights: also return the probabilities ``[B, N, Tq, Tk]`` (float32, before dropout).
      implementation: a registered kernel: ``reference``, ``chunked``, ``triangular``,
        ``xla``, ``cudnn``, ``linear`` (see ``attnjax.registry.KERNELS``).
      **kernel_options: passed to the kernel (e.g. ``block_q``, ``block_k`` for ``chunked``,
        ``block_q`` for ``triangular``, ``point`` for ``reference``: see ``attend_block``).

    Returns:
      ``[B, Tq, N, D]`` in the query's dtype (and the weights if asked).
    """
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ValueError("query, key and value must be [batch, seq, heads, head_dim] (BTNH)")
    B, T, N, H = query.shape
    S, K = key.shape[1], key.shape[2]
    if key.shape[3] != H or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"key {key.shape} and value {value.shape} must agree in batch, "
                         f"length and heads, and key's head_dim must equal the query's ({H})")
    if key.shape[0] != B or N % K:
        raise ValueError(f"query heads ({N}) must be a multiple of kv heads ({K}) and batch "
                         f"sizes must agree (query {B}, key {key.shape[0]})")
    if rate_active(dropout_rate) and dropout_rng is None:
        raise ValueError("dropout_rate > 0 needs dropout_rng")
    if not isinstance(dropout_rate, jax.core.Tracer) and not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
    if isinstance(local_window_size, int):
        local_window_size = (local_window_size, local_window_size)
    if segment_ids is not None and not isinstance(segment_ids, tuple):
        segment_ids = (segment_ids, segment_ids)
    asked = requested_options(
        bias=bias, mask=mask, positions=query_positions is not None or key_positions is not None,
        window=local_window_size, block_causal=causal_block_size,
        segment=segment_ids is not None,
        padding=query_seq_lengths is not None or key_value_seq_lengths is not None,
        scale=scale, logit_soft_cap=logit_soft_cap, sink=sink, dropout_rate=dropout_rate,
        return_weights=return_weights, cross_attention=T != S,
        value_head_dim=value.shape[3] != H, dense_bias=bias is not None and not callable(bias))
    spec = check_kernel_supports(implementation, asked)
    if spec.causal_only_aligned and is_causal and T != S:
        raise ValueError(f"implementation={implementation!r} needs query and key of equal "
                         f"length for causal attention, got {T} and {S}")

    if scale is None:
        scale = 1.0 / math.sqrt(H)
    scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float32), (N,))
    if sink is not None:
        sink = jnp.broadcast_to(jnp.asarray(sink, jnp.float32), (N,))
    mask_spec = MaskSpec(
        dense=None if mask is None else _as_4d(jnp.asarray(mask, bool), "mask"),
        is_causal=is_causal, window=local_window_size, causal_block_size=causal_block_size,
        query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
        q_segment_ids=None if segment_ids is None else segment_ids[0],
        kv_segment_ids=None if segment_ids is None else segment_ids[1],
        q_positions=query_positions, kv_positions=key_positions)
    dropout = (Dropout(dropout_rate, dropout_rng, dropout_shared_across_heads)
               if rate_active(dropout_rate) else None)
    return spec.fn(query, key, value, bias=_as_4d(bias, "bias"), mask=mask_spec, scale=scale,
                   logit_soft_cap=logit_soft_cap, sink=sink, dropout=dropout,
                   return_weights=return_weights, **kernel_options)
