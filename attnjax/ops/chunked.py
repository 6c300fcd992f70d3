"""Memory-efficient attention: online softmax over key blocks, O(n) memory forward and backward.

Queries are split into blocks of ``block_q`` and keys into blocks of ``block_k``. For each
query block a ``lax.scan`` over key blocks keeps a running max ``m``, normaliser ``l`` and
unnormalised output ``acc`` per query::

    m' = max(m, max_j s_j)        l' = l e^(m - m') + sum_j e^(s_j - m')
    acc' = acc e^(m - m') + sum_j dropout(e^(s_j - m')) v_j          out = acc / l

Each key step and each query block is wrapped in ``jax.checkpoint``, so the backward pass
recomputes block logits instead of storing the ``n x n`` probabilities: live memory is
``O(n_q * head_dim * n_k / block_k)`` instead of ``O(n_q * n_k)``. Masks and position biases
(ALiBi, T5) are evaluated per block from positions, never materialised for the whole sequence.
A sink logit starts the scan as ``m = sink, l = 1``. A key block that no query of the
query block may see (under a causal mask, every block above the diagonal: about half of them
at long lengths; outside a sliding window, nearly all) is skipped by ``lax.cond``, forward
and backward: for it ``m`` and ``l`` would not change and ``acc`` would gain nothing.
Results equal the ``reference`` kernel to float32 rounding, including dropout (the keep mask
is a hash of absolute indices). Blocks of 256 by default: smaller blocks skip more of the
masked key blocks and hold less at once, larger ones make fewer, bigger products; the time
and memory of each choice: ``attnjax bench attention`` (docs/PERFORMANCE.md).

References: Rabe & Staats 2021, "Self-attention Does Not Need O(n^2) Memory";
Milakov & Gimelshein 2018, "Online normalizer calculation for softmax".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.ops.attention import (OPTIONS, KernelSpec, apply_dropout, block_bias,
                                   expand_kv_heads, scaled_logits)
from attnjax.ops.masks import combine_masks, mask_value
from attnjax.registry import KERNELS


def split_blocks(x: jax.Array, block: int, chunks: int = 1) -> jax.Array:
    """``[B, T, ...]`` -> ``[chunks * ceil(T / chunks / block), B, block, ...]``: each of
    ``chunks`` equal runs of the length cut into blocks, the last block of each zero-padded."""
    B, T = x.shape[:2]
    c = T // chunks
    n = -(-c // block)
    x = reshape(x, (B, chunks, c, *x.shape[2:]))
    x = jnp.pad(x, [(0, 0), (0, 0), (0, n * block - c)] + [(0, 0)] * (x.ndim - 3))
    return jnp.moveaxis(reshape(x, (B, chunks * n, block, *x.shape[3:])), 1, 0)


def reshape(x: jax.Array, shape: tuple) -> jax.Array:
    """``x.reshape(shape)`` for a reshape of the dims between the first (batch) and the
    trailing ones it keeps; under a mesh of explicit axis types the result is told its
    sharding: the batch's and the kept dims' as they were, the reshaped ones whole."""
    if not _explicit(x):
        return x.reshape(shape)
    spec = tuple(jax.typeof(x).sharding.spec) + (None,) * x.ndim
    keep = 0
    while (keep < min(x.ndim, len(shape)) - 1
           and x.shape[x.ndim - 1 - keep] == shape[len(shape) - 1 - keep]):
        keep += 1
    out = (spec[0],) + (None,) * (len(shape) - 1 - keep) + spec[x.ndim - keep:x.ndim]
    return jnp.reshape(x, shape, out_sharding=jax.sharding.PartitionSpec(*out))


def online_softmax_step(carry, q, k, v, visible, bias, *, scale, logit_soft_cap, dropout,
                        q_index, k_index):
    """One key block of the online softmax (the module docstring's update): ``carry`` is
    ``(m, l, acc)`` ``[B, N, bq]``, ``[B, N, bq]``, ``[B, N, bq, D]`` of the queries ``q``
    ``[B, bq, N, H]`` over the keys ``k`` and values ``v`` ``[B, bk, N, .]`` (heads expanded),
    ``visible`` bool ``[B|1, N|1, bq, bk]``, ``bias`` that block's bias or ``None``; dropout
    hashes the absolute indices ``q_index`` ``[bq]`` and ``k_index`` ``[bk]``."""
    m, l, acc = carry
    s = scaled_logits(q, k, scale, logit_soft_cap)                         # [B,N,bq,bk]
    if bias is not None:
        s = s + bias
    s = jnp.where(visible, s, mask_value(acc.dtype))
    m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(axis=-1)))
    p = jnp.where(visible, jnp.exp(s - m_new[..., None]), 0.0)
    correction = jnp.exp(m - m_new)
    l = l * correction + p.sum(axis=-1)
    if dropout is not None:
        p = apply_dropout(dropout, p, q_index, k_index)
    acc = acc * correction[..., None] + jnp.einsum(
        "bnqk,bknh->bnqh", p.astype(v.dtype), v, preferred_element_type=acc.dtype)
    return m_new, l, acc


def chunked_attention(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
                      return_weights, block_q: int = 256, block_k: int = 256):
    """Chunked kernel with the signature shared by all registered kernels (see attention.py)."""
    del return_weights  # not supported: refused by the front door (it would cost n x n memory)
    B, T, N, H = query.shape
    S, D = key.shape[1], value.shape[3]
    bq, bk = min(block_q, T), min(block_k, S)
    q_blocks = split_blocks(query, bq)                          # [nq, B, bq, N, H]
    k_blocks = split_blocks(expand_kv_heads(key, N), bk)        # [nk, B, bk, N, H]
    v_blocks = split_blocks(expand_kv_heads(value, N), bk)
    acc_dtype = jnp.promote_types(query.dtype, jnp.float32)
    fill = mask_value(acc_dtype)

    def query_block(args):
        i, q = args
        q_start = i * bq

        def key_step(carry, xs):
            j, k, v = xs
            k_start = j * bk
            in_range = (k_start + jnp.arange(bk) < S)[None, None, None, :]
            visible = combine_masks(mask.block(q_start, bq, k_start, bk), in_range)
            # a block no query of this block may see leaves m, l and acc as they are
            return jax.lax.cond(visible.any(), visible_block, lambda carry, *_: carry,
                                carry, k, v, k_start, visible), None

        def visible_block(carry, k, v, k_start, visible):
            return online_softmax_step(
                carry, q, k, v, visible, block_bias(bias, mask, q_start, bq, k_start, bk),
                scale=scale, logit_soft_cap=logit_soft_cap, dropout=dropout,
                q_index=q_start + jnp.arange(bq), k_index=k_start + jnp.arange(bk))

        # Initial carries derived from q, so they carry q's sharding (explicit-sharding meshes
        # require the scan carry types, shardings included, to stay equal).
        l0 = jnp.zeros_like(jnp.moveaxis(q, 1, 2)[..., 0], dtype=acc_dtype)  # [B,N,bq]
        acc0 = jnp.repeat(l0[..., None], D, axis=-1)                         # [B,N,bq,D]
        if sink is None:
            m0 = l0 + fill
        else:
            m0, l0 = l0 + sink[:, None].astype(acc_dtype), l0 + 1.0
        (_, l, acc), _ = jax.lax.scan(jax.checkpoint(key_step), (m0, l0, acc0),
                                      (jnp.arange(k_blocks.shape[0]), k_blocks, v_blocks))
        out = acc / jnp.where(l == 0, 1.0, l)[..., None]                   # [B,N,bq,D]
        return jnp.moveaxis(out, 2, 1).astype(query.dtype)                 # [B,bq,N,D]

    out = jax.lax.map(jax.checkpoint(query_block), (jnp.arange(q_blocks.shape[0]), q_blocks))
    # Merging the block axes: under an explicit-sharding mesh the result must be told its
    # sharding, which is the query's (batch and heads as they came in).
    out = jnp.reshape(jnp.moveaxis(out, 0, 1), (B, -1, N, D),
                      out_sharding=jax.typeof(query).sharding if _explicit(query) else None)
    return out[:, :T]


def _explicit(x: jax.Array) -> bool:
    """True under a mesh with explicit axis types (where reshapes need an output sharding)."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return bool(getattr(mesh, "explicit_axes", ()))


KERNELS.register("chunked", KernelSpec(
    chunked_attention, frozenset(OPTIONS) - {"return_weights"}, settings=("block_q", "block_k"),
    test_options=(("block_q", 4), ("block_k", 5))))
