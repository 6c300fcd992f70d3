"""Attention masks as pure functions of query and key positions.

Every mask here is a boolean array broadcastable to ``[batch, heads, q_len, k_len]`` where
``True`` means "may attend". Masks are built from *positions* rather than materialised once
for the whole sequence, so the chunked kernel can build them block by block and keep its
memory linear in the sequence length. ``visibility`` materialises one ``[B|1, 1, T, S]`` mask
for reading attention weights after the fact (``ops.stats``, the regularisers).

The one fill value used for masked logits everywhere is :func:`mask_value`: the most negative
finite number of the logits' dtype. Logits are always computed in float32 or wider (see
``attention.py``), so the fill never overflows even when inputs are float16 or bfloat16, and
masked entries are selected with ``jnp.where`` (never added), so nothing becomes ``-inf``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def mask_value(dtype) -> float:
    """The finite fill for masked logits: the most negative value representable in ``dtype``."""
    return float(jnp.finfo(dtype).min)


def causal_mask(q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """Key j is visible from query i iff ``k_pos[j] <= q_pos[i]``.

    Args:
      q_pos: int positions ``[B|1, Tq]``.
      k_pos: int positions ``[B|1, Tk]``.

    Returns:
      bool ``[B|1, 1, Tq, Tk]``.
    """
    return (k_pos[:, None, None, :] <= q_pos[:, None, :, None])


def sliding_window_mask(q_pos: jax.Array, k_pos: jax.Array, left: int | None,
                        right: int | None) -> jax.Array:
    """Visible iff ``q - left <= k <= q + right`` (``None`` means unbounded on that side).

    ``left=w-1, right=0`` combined with nothing else is causal attention over the last ``w``
    tokens (Mistral's window of size ``w``); ``right=None`` keeps the future visible.
    """
    offset = k_pos[:, None, None, :] - q_pos[:, None, :, None]
    ok = jnp.ones(offset.shape, bool)
    if left is not None:
        ok &= offset >= -left
    if right is not None:
        ok &= offset <= right
    return ok


def block_causal_mask(q_pos: jax.Array, k_pos: jax.Array, block_size: int) -> jax.Array:
    """Block-causal: full attention within a block of ``block_size`` positions and to every
    earlier block; nothing from later blocks. ``block_size=1`` is ordinary causal attention."""
    return (k_pos[:, None, None, :] // block_size) <= (q_pos[:, None, :, None] // block_size)


def padding_mask(q_valid: jax.Array | None, k_valid: jax.Array | None) -> jax.Array | None:
    """Combine per-position validity ``[B, Tq]`` and ``[B, Tk]`` into ``[B, 1, Tq, Tk]``."""
    if q_valid is None and k_valid is None:
        return None
    if q_valid is None:
        return k_valid[:, None, None, :]
    if k_valid is None:
        return q_valid[:, None, :, None]
    return q_valid[:, None, :, None] & k_valid[:, None, None, :]


def lengths_to_valid(lengths: jax.Array, index: jax.Array) -> jax.Array:
    """Validity ``[B, T]`` of positions ``index`` ``[T]`` for per-example lengths ``[B]``."""
    return index[None, :] < lengths[:, None]


def segment_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array) -> jax.Array:
    """Packed sequences: a query sees only keys with the same segment id. ``[B, 1, Tq, Tk]``."""
    return q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :]


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the given masks, ignoring ``None``; ``None`` if all are ``None``."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def visibility(T: int, S: int, causal: bool, token_mask: jax.Array | None = None,
               window: tuple[int | None, int | None] | None = None, offset: int = 0) -> jax.Array:
    """Which keys each query may see, from what a model knows: bool ``[B|1, 1, T, S]``, the
    ``visible`` argument of the attention statistics and regularisers.

    Query i stands at position ``i + offset``, key j at ``j``; key j is visible from query i
    iff every given condition holds:

    - ``causal``: ``j <= i + offset``;
    - ``window`` ``(left, right)``, as the kernels' ``local_window_size``: ``i + offset - left
      <= j <= i + offset + right`` (``None``: unbounded on that side);
    - ``token_mask`` bool ``[B, T]`` (needs ``T == S``, real tokens True): ``token_mask[i]``
      and ``token_mask[j]``, so a padded query's row is all False.
    """
    if token_mask is not None and (jnp.ndim(token_mask) != 2 or jnp.shape(token_mask)[1] != T
                                   or T != S):
        raise ValueError(f"token_mask must be [B, T] with T = S, got shape "
                         f"{list(jnp.shape(token_mask))} for T={T}, S={S}")
    q_pos, k_pos = (offset + jnp.arange(T))[None, :], jnp.arange(S)[None, :]
    real = None if token_mask is None else jnp.asarray(token_mask, bool)
    return combine_masks(jnp.ones((1, 1, T, S), bool),
                         causal_mask(q_pos, k_pos) if causal else None,
                         None if window is None else sliding_window_mask(q_pos, k_pos, *window),
                         padding_mask(real, real))


def _take(x: jax.Array, start, size: int, axis: int) -> jax.Array:
    """Rows ``start:start+size`` of ``x`` along ``axis`` (clipped at the end), or ``x`` itself
    if that axis is broadcast (size 1)."""
    if x.shape[axis] == 1:
        return x
    index = jnp.minimum(start + jnp.arange(size), x.shape[axis] - 1)
    return jnp.take(x, index, axis=axis)


class MaskSpec(NamedTuple):
    """Everything that decides which keys a query may see, evaluated lazily per block.

    Positions default to the array index. ``q_positions``/``kv_positions`` let a KV cache
    place new queries after the cached keys. Lengths and segment ids follow
    ``jax.nn.dot_product_attention`` (``*_seq_lengths`` int ``[B]``).
    """
    dense: jax.Array | None = None                 # bool, broadcastable to [B, N, Tq, Tk]
    is_causal: bool = False
    window: tuple[int | None, int | None] | None = None
    causal_block_size: int | None = None
    query_seq_lengths: jax.Array | None = None
    key_value_seq_lengths: jax.Array | None = None
    q_segment_ids: jax.Array | None = None
    kv_segment_ids: jax.Array | None = None
    q_positions: jax.Array | None = None
    kv_positions: jax.Array | None = None

    def positions(self, q_start, q_size: int, k_start, k_size: int):
        """Positions ``[B|1, q_size]`` and ``[B|1, k_size]`` of a query and key block."""
        def pos(given, start, size):
            if given is None:
                return (start + jnp.arange(size))[None, :]
            return _take(jnp.atleast_2d(given), start, size, axis=1)
        return pos(self.q_positions, q_start, q_size), pos(self.kv_positions, k_start, k_size)

    def key_range(self, q_start: int, q_end: int, k_len: int) -> tuple[int, int]:
        """``(lo, hi)``: the keys ``lo <= k < hi`` that the queries ``q_start <= q < q_end``
        may see at most, from the causal mask and the sliding window when positions are the
        array index (given positions are values, not known when tracing: all ``k_len``)."""
        lo, hi = 0, k_len
        if self.q_positions is not None or self.kv_positions is not None:
            return lo, hi
        if self.is_causal:
            hi = min(hi, q_end)
        if self.window is not None:
            left, right = self.window
            lo = lo if left is None else max(lo, q_start - left)
            hi = hi if right is None else min(hi, q_end + right)
        return lo, max(lo, hi)

    def block(self, q_start, q_size: int, k_start, k_size: int) -> jax.Array | None:
        """The mask of one block, bool ``[B|1, N|1, q_size, k_size]``, or ``None`` if nothing
        is masked. ``q_start``/``k_start`` may be traced; sizes are static."""
        q_pos, k_pos = self.positions(q_start, q_size, k_start, k_size)
        q_index, k_index = q_start + jnp.arange(q_size), k_start + jnp.arange(k_size)
        parts = []
        if self.dense is not None:
            parts.append(_take(_take(self.dense, q_start, q_size, 2), k_start, k_size, 3))
        if self.is_causal:
            parts.append(causal_mask(q_pos, k_pos))
        if self.window is not None:
            parts.append(sliding_window_mask(q_pos, k_pos, *self.window))
        if self.causal_block_size is not None:
            parts.append(block_causal_mask(q_pos, k_pos, self.causal_block_size))
        q_valid = (None if self.query_seq_lengths is None
                   else lengths_to_valid(self.query_seq_lengths, q_index))
        k_valid = (None if self.key_value_seq_lengths is None
                   else lengths_to_valid(self.key_value_seq_lengths, k_index))
        parts.append(padding_mask(q_valid, k_valid))
        if self.q_segment_ids is not None:
            parts.append(segment_mask(_take(self.q_segment_ids, q_start, q_size, 1),
                                      _take(self.kv_segment_ids, k_start, k_size, 1)))
        return combine_masks(*parts)
