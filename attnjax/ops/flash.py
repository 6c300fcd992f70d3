"""Flash attention for the CPU: tiles that stay in cache, a backward pass that recomputes.

The queries are cut into tiles of ``block_q`` rows and the keys into tiles of ``block_k``;
heads are laid out ``[B, N, T, H]`` so that every product is a batched matrix product over
contiguous rows. The forward pass sweeps each query tile's key tiles with the online softmax
(running max ``m``, normaliser ``l``, unnormalised output ``acc``; ``m = sink, l = 1`` with a
sink) and keeps, per query row, only the output and ``L = m + log l``::

    s = c tanh(q k^T / c) + bias      m' = max(m, max_j s_j)      p_j = e^(s_j - m')
    l' = l e^(m - m') + sum_j p_j     acc' = acc e^(m - m') + sum_j dropout(p)_j v_j

The backward pass recomputes each tile's probabilities from ``L``, ``P = e^(S - L)``, and
with ``D_i = dO_i . O_i`` and ``Z`` the dropout keep mask over ``1 - rate``::

    dV = (P Z)^T dO     dP = (dO V^T) Z     dS = P (dP - D)     dK = dS'^T q     dq = dS' K
    dS' = dS (1 - tanh^2)  (the soft cap)     d sink = -sum_i e^(sink - L_i) D_i

and ``dS`` is also the cotangent of the bias, pulled back to the arrays a bias function of
positions closes over (ALiBi slopes, a T5 table). It runs key tile by key tile with the
tiles transposed (``[keys, queries]``), so that ``dK`` and ``dV`` are plain products of
rows held in the loop's carry; ``dq`` is accumulated transposed, ``K^T dS'^T``: XLA:CPU runs a
product that contracts the rows of both operands (``dS^T q`` from a ``[queries, keys]``
tile) several times slower. The per-head scale is folded into the queries before the kernel,
so autodiff gives its gradient.

**Tiles.** Whether a tile of (query, key) pairs is hidden, wholly visible or mixed is read
from the static parts of the mask (causal, sliding window, block-causal, the lengths of the
arrays) when positions are the array indices: hidden tiles are never computed, wholly
visible ones skip the mask, mixed ones select. Padding lengths, segment ids and given
positions are known only when the program runs: every tile they touch selects. Runs of
tiles of one kind are a ``lax.fori_loop`` (the program grows with the number of query
tiles, not with their square). Examples are processed a group at a time (``lax.map``), the
group as large as keeps a tile of every head within ``TILE_BYTES``, so the logits of a tile
stay in the core's cache.

Results equal the ``reference`` kernel's to float32 rounding, masks, biases and dropout
included (the keep mask hashes absolute indices); rows that see no key give zeros.
Time against PyTorch's fused SDPA and the other kernels: ``attnjax bench torch``,
``attnjax bench attention`` (docs/PERFORMANCE.md).

References: Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning"; Dao et al. 2022, "FlashAttention"; Milakov & Gimelshein 2018, "Online
normalizer calculation for softmax".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attnjax.ops.attention import OPTIONS, Dropout, KernelSpec, dropout_keep, expand_kv_heads
from attnjax.ops.context import closed_bias
from attnjax.ops.masks import (MaskSpec, block_causal_mask, causal_mask, mask_value,
                               sliding_window_mask)
from attnjax.registry import KERNELS

TILE_BYTES = 1 << 20            # the logits of one tile of a group: a core's L2 cache
HIDDEN, FULL, MIXED = "hidden", "full", "mixed"
# the MaskSpec fields that are arrays with one row per example (split into groups): those
# that only the running program knows, then the positions
RUN_TIME = ("query_seq_lengths", "key_value_seq_lengths", "q_segment_ids", "kv_segment_ids")
PER_EXAMPLE = RUN_TIME + ("q_positions", "kv_positions")


class _Plan(NamedTuple):
    """Everything static about one call (the custom VJP's non-differentiable argument)."""
    T: int
    S: int
    block_q: int
    block_k: int
    is_causal: bool
    window: tuple | None
    causal_block_size: int | None
    dynamic_mask: bool          # lengths or segment ids given: known when it runs
    positions_given: bool       # positions given: the static parts too are known only then
    logit_soft_cap: float | None
    bias_fn: object             # bias(q_pos, k_pos, *consts) or None
    dropout_rate: float | None  # a Python rate (a traced one travels as an argument)
    dropout_traced: bool
    dropout_shared: bool

    @property
    def q_tiles(self) -> range:
        return range(0, _padded(self.T, self.block_q), self.block_q)

    @property
    def k_tiles(self) -> range:
        return range(0, _padded(self.S, self.block_k), self.block_k)

    @property
    def static_mask(self) -> bool:
        """Whether the mask is known when tracing: no lengths, segment ids or positions."""
        return not (self.dynamic_mask or self.positions_given)

    def seen(self, q_start: int, k_start: int) -> np.ndarray:
        """bool ``[1, 1, bq, bk]``: what the static parts of the mask (causal, window,
        block-causal, the keys' length) show of a tile, positions being the indices."""
        q = np.arange(q_start, q_start + self.block_q)[None]
        k = np.arange(k_start, k_start + self.block_k)[None]
        seen = (k < self.S)[:, None, None, :] & np.ones((1, 1, q.size, 1), bool)
        with jax.ensure_compile_time_eval():       # the mask functions on constants, here
            if self.is_causal:
                seen = seen & np.asarray(causal_mask(q, k))
            if self.window is not None:
                seen = seen & np.asarray(sliding_window_mask(q, k, *self.window))
            if self.causal_block_size is not None:
                seen = seen & np.asarray(block_causal_mask(q, k, self.causal_block_size))
        return seen

    def kind(self, q_start: int, k_start: int) -> str:
        """``hidden``, ``full`` or ``mixed``: what the static mask shows of a tile."""
        if self.positions_given:
            return MIXED
        rows = self.seen(q_start, k_start)[..., np.arange(q_start, q_start + self.block_q)
                                           < self.T, :]
        if not rows.any():
            return HIDDEN
        return MIXED if self.dynamic_mask or not rows.all() else FULL


def _padded(n: int, block: int) -> int:
    return -(-n // block) * block


def _runs(kinds: list[str]) -> list[tuple[str, int, int]]:
    """Adjacent tiles of one kind, ``hidden`` ones dropped: ``[(kind, first, count)]``."""
    runs: list[tuple[str, int, int]] = []
    for index, kind in enumerate(kinds):
        if kind != HIDDEN and index and kinds[index - 1] == kind:
            runs[-1] = (kind, runs[-1][1], runs[-1][2] + 1)
        elif kind != HIDDEN:
            runs.append((kind, index, 1))
    return runs


def _sweep(runs, body, carry):
    """``carry = body(index, kind, carry)`` over every tile of ``runs``: a run of several
    tiles as one ``lax.fori_loop`` (its index traced), a lone tile as it is."""
    for kind, first, count in runs:
        if count == 1:
            carry = body(first, kind, carry)
        else:
            carry = lax.fori_loop(first, first + count,
                                  lambda i, c, kind=kind: body(i, kind, c), carry)
    return carry


# ------------------------------------------------------------------------------- one group


class _Group(NamedTuple):
    """One group of examples: its mask, its examples' global indices ``[g]``, the bias
    parameters, sink and dropout."""
    mask: MaskSpec
    examples: jax.Array
    consts: tuple
    sink: jax.Array | None
    dropout_rng: jax.Array | None
    dropout_rate: jax.Array | float | None


def _tiles(x: jax.Array, size: int) -> jax.Array:
    """``[g, N, n size, .]`` -> ``[n, g, N, size, .]``: tile ``i`` a contiguous array."""
    g, N, length = x.shape[:3]
    return jnp.moveaxis(x.reshape(g, N, length // size, size, *x.shape[3:]), 2, 0)


def _tile(tiles, index):
    """Tile ``index`` (static or traced) of ``tiles`` (``_tiles``)."""
    return lax.dynamic_index_in_dim(tiles, index, 0, keepdims=False)


def _visible(plan: _Plan, grp: _Group, q_start, k_start) -> jax.Array:
    """bool ``[g|1, 1, bq, bk]``: the mask of a tile, the padded keys hidden (a constant
    when the mask is static and the tile's place known)."""
    if plan.static_mask and isinstance(q_start, int) and isinstance(k_start, int):
        return jnp.asarray(plan.seen(q_start, k_start))
    bq, bk = plan.block_q, plan.block_k
    inside = (k_start + jnp.arange(bk) < plan.S)[None, None, None, :]
    shown = grp.mask.block(q_start, bq, k_start, bk)
    return inside if shown is None else shown & inside


def _logits(plan: _Plan, grp: _Group, s, q_start, k_start, transposed: bool):
    """Soft cap and bias of a tile of raw logits ``s`` (``transposed``: ``[keys, queries]``);
    returns ``(logits, tanh)`` (``tanh``: the soft cap's, for its derivative, or ``None``)."""
    t = None
    if plan.logit_soft_cap is not None:
        t = jnp.tanh(s / plan.logit_soft_cap)
        s = plan.logit_soft_cap * t
    if plan.bias_fn is not None:
        b = _bias(plan, grp, grp.consts, q_start, k_start)
        s = s + (jnp.swapaxes(b, -1, -2) if transposed else b)
    return s, t


def _bias(plan: _Plan, grp: _Group, consts, q_start, k_start):
    q_pos, k_pos = grp.mask.positions(q_start, plan.block_q, k_start, plan.block_k)
    return plan.bias_fn(q_pos, k_pos, *consts)


def _keep(plan: _Plan, grp: _Group, q_start, k_start, N: int, transposed: bool):
    """The dropout keep mask of a tile over ``1 - rate`` (float), or ``None``."""
    if grp.dropout_rng is None:
        return None
    dropout = Dropout(grp.dropout_rate, grp.dropout_rng, plan.dropout_shared)
    q_index = q_start + jnp.arange(plan.block_q)
    k_index = k_start + jnp.arange(plan.block_k)
    q_index, k_index = ((q_index[None, :], k_index[:, None]) if transposed
                        else (q_index[:, None], k_index[None, :]))
    keep = dropout_keep(dropout, grp.examples[:, None, None, None],
                        jnp.arange(N)[None, :, None, None], q_index, k_index)
    return keep.astype(jnp.float32) / (1.0 - grp.dropout_rate)


def _forward_group(plan: _Plan, grp: _Group, q, k, v):
    """``(out [g, N, Tp, D], L [g, N, Tp])`` of one group (``q`` ``[g, N, Tp, H]``, ``k``,
    ``v`` ``[g, N, Sp, .]``, float32, the scale folded into ``q``)."""
    N, D = q.shape[1], v.shape[3]
    fill = mask_value(jnp.float32)
    k, v = _tiles(k, plan.block_k), _tiles(v, plan.block_k)
    outs, lses = [], []
    for q_start in plan.q_tiles:
        q_tile = q[:, :, q_start:q_start + plan.block_q]

        def step(j, kind, state, q_start=q_start, q_tile=q_tile):
            m, l, acc = state
            k_start = j * plan.block_k
            s, _ = _logits(plan, grp, jnp.einsum("gnqh,gnkh->gnqk", q_tile, _tile(k, j)),
                           q_start, k_start, transposed=False)
            seen = _visible(plan, grp, q_start, k_start) if kind == MIXED else None
            if seen is not None:
                s = jnp.where(seen, s, fill)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[..., None])
            if seen is not None:
                p = jnp.where(seen, p, 0.0)
            correction = jnp.exp(m - m_new)
            l = l * correction + p.sum(axis=-1)
            keep = _keep(plan, grp, q_start, k_start, N, transposed=False)
            if keep is not None:
                p = p * keep
            acc = acc * correction[..., None] + jnp.einsum(
                "gnqk,gnkd->gnqd", p, _tile(v, j))
            return m_new, l, acc

        zeros = jnp.zeros_like(q_tile[..., 0])    # q's type, sharding included (a carry)
        state = ((zeros + fill, zeros, zeros[..., None] + jnp.zeros(D)) if grp.sink is None
                 else (zeros + grp.sink[None, :, None], zeros + 1.0,
                       zeros[..., None] + jnp.zeros(D)))
        kinds = [plan.kind(q_start, k_start) for k_start in plan.k_tiles]
        m, l, acc = _sweep(_runs(kinds), step, state)
        seen = l > 0
        outs.append(acc / jnp.where(seen, l, 1.0)[..., None])
        lses.append(jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0))
    return jnp.concatenate(outs, axis=2), jnp.concatenate(lses, axis=2)


def _backward_group(plan: _Plan, grp: _Group, q, k, v, lse, delta, d_out, d_consts):
    """``(dq, dk, dv, d consts)`` of one group (``q``, ``d_out`` ``[g, N, Tp, .]``, ``lse``,
    ``delta`` ``[g, N, Tp]``; ``d_consts``: the running sums of the bias parameters')."""
    N = q.shape[1]
    floats = [i for i, c in enumerate(grp.consts) if jnp.issubdtype(c.dtype, jnp.inexact)]
    dq_t = jnp.zeros_like(jnp.swapaxes(q, 2, 3))                # dq, transposed
    dks, dvs = [], []
    q, d_out = _tiles(q, plan.block_q), _tiles(d_out, plan.block_q)
    lse, delta = (_tiles(x[..., None], plan.block_q)[..., 0] for x in (lse, delta))
    k, v = _tiles(k, plan.block_k), _tiles(v, plan.block_k)
    k_t = jnp.swapaxes(k, -1, -2)                               # [nk, g, N, H, bk]
    for j, k_start in enumerate(plan.k_tiles):
        k_tile, v_tile, k_tile_t = k[j], v[j], k_t[j]

        def step(i, kind, carry, k_start=k_start, k_tile=k_tile, v_tile=v_tile,
                 k_tile_t=k_tile_t):
            dk, dv, dq_t, d_consts = carry
            q_start = i * plan.block_q
            q_tile, do_tile = _tile(q, i), _tile(d_out, i)
            rows = lambda per_row: _tile(per_row, i)[:, :, None]
            s, t = _logits(plan, grp, jnp.einsum("gnkh,gnqh->gnkq", k_tile, q_tile),
                           q_start, k_start, transposed=True)
            p = jnp.exp(s - rows(lse))                                  # [g, N, bk, bq]
            if kind == MIXED:
                p = jnp.where(jnp.swapaxes(_visible(plan, grp, q_start, k_start), -1, -2),
                              p, 0.0)
            dp = jnp.einsum("gnkd,gnqd->gnkq", v_tile, do_tile)
            keep = _keep(plan, grp, q_start, k_start, N, transposed=True)
            kept = p if keep is None else p * keep
            if keep is not None:
                dp = dp * keep
            dv = dv + jnp.einsum("gnkq,gnqd->gnkd", kept, do_tile)
            ds = p * (dp - rows(delta))
            if floats:
                d_consts = _bias_grads(plan, grp, floats, q_start, k_start,
                                       jnp.swapaxes(ds, -1, -2), d_consts)
            if t is not None:
                ds = ds * (1.0 - t * t)
            dk = dk + jnp.einsum("gnkq,gnqh->gnkh", ds, q_tile)
            dq_t = lax.dynamic_update_slice_in_dim(
                dq_t, lax.dynamic_slice_in_dim(dq_t, q_start, plan.block_q, 3)
                + jnp.einsum("gnhk,gnkq->gnhq", k_tile_t, ds), q_start, 3)
            return dk, dv, dq_t, d_consts

        kinds = [plan.kind(q_start, k_start) for q_start in plan.q_tiles]
        dk, dv, dq_t, d_consts = _sweep(_runs(kinds), step, (
            jnp.zeros_like(k_tile), jnp.zeros_like(v_tile), dq_t, d_consts))
        dks.append(dk)
        dvs.append(dv)
    return (jnp.swapaxes(dq_t, 2, 3), jnp.concatenate(dks, axis=2),
            jnp.concatenate(dvs, axis=2), d_consts)


def _bias_grads(plan: _Plan, grp: _Group, floats, q_start, k_start, ds, d_consts):
    """Add the pull-back of a tile's ``dS`` ``[g, N, bq, bk]`` through the bias function to
    the gradients of its floating-point parameters."""
    def bias_of(float_consts):
        consts = list(grp.consts)
        for i, c in zip(floats, float_consts):
            consts[i] = c
        return jnp.broadcast_to(_bias(plan, grp, consts, q_start, k_start), ds.shape)

    _, pull = jax.vjp(bias_of, [grp.consts[i] for i in floats])
    (grads,) = pull(ds)
    return tuple(a + b for a, b in zip(d_consts, grads))


# ------------------------------------------------------------------------- all the groups


def _group(plan: _Plan, per_example, shared, examples, consts, sink, rng, rate) -> _Group:
    fields = {name: (mine if mine is not None else whole)
              for name, mine, whole in zip(PER_EXAMPLE, per_example, shared)}
    mask = MaskSpec(is_causal=plan.is_causal, window=plan.window,
                    causal_block_size=plan.causal_block_size, **fields)
    dropout_rate = rate if plan.dropout_traced else plan.dropout_rate
    return _Group(mask, examples, consts, sink, rng, dropout_rate)


def _forward(plan: _Plan, diff, aux):
    q, k, v, sink, consts = diff
    per_example, shared, examples, rng, rate = aux

    def one(xs):
        q, k, v, mine, ex = xs
        grp = _group(plan, mine, shared, ex, consts, sink, rng, rate)
        return _forward_group(plan, grp, q, k, v)

    return lax.map(one, (q, k, v, per_example, examples))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(plan: _Plan, diff, aux):
    return _forward(plan, diff, aux)[0]


def _attention_fwd(plan: _Plan, diff, aux):
    out, lse = _forward(plan, diff, aux)
    return out, (diff, aux, out, lse)


def _attention_bwd(plan: _Plan, residuals, d_out):
    diff, aux, out, lse = residuals
    q, k, v, sink, consts = diff
    per_example, shared, examples, rng, rate = aux
    delta = (d_out * out).sum(axis=-1)                          # [groups, g, N, Tp]
    floats = [c for c in consts if jnp.issubdtype(c.dtype, jnp.inexact)]

    def one(d_consts, xs):
        q, k, v, lse, delta, d_out, mine, ex = xs
        grp = _group(plan, mine, shared, ex, consts, sink, rng, rate)
        dq, dk, dv, d_consts = _backward_group(plan, grp, q, k, v, lse, delta, d_out, d_consts)
        return d_consts, (dq, dk, dv)

    d_floats, (dq, dk, dv) = lax.scan(one, tuple(jnp.zeros_like(c) for c in floats),
                                      (q, k, v, lse, delta, d_out, per_example, examples))
    d_sink = None
    if sink is not None:     # d sink_n = -sum_i e^(sink_n - L_i) D_i (padded rows: D = 0)
        d_sink = -(jnp.exp(sink[:, None] - lse) * delta).sum(axis=(0, 1, 3))
    d_floats = iter(d_floats)
    d_consts = tuple(next(d_floats) if jnp.issubdtype(c.dtype, jnp.inexact) else None
                     for c in consts)
    return (dq, dk, dv, d_sink, d_consts), jax.tree.map(lambda _: None, aux)


_attention.defvjp(_attention_fwd, _attention_bwd)


def default_blocks(key_length: int) -> tuple[int, int]:
    """``(block_q, block_k)``: 128 queries by 128 keys, 256 keys from 1024 on and 256 queries
    from 2048: the fastest gradient of those timed on a 2-core CPU at 256, 1024, 2048 and 4096
    tokens (a longer key tile below 1024 leaves more of each diagonal tile hidden; a longer
    query tile cuts the key tiles the forward pass copies per product). ``attnjax bench
    torch`` and ``attnjax bench attention`` time the default against PyTorch's SDPA."""
    if key_length < 1024:
        return 128, 128
    return (128 if key_length < 2048 else 256), 256


def group_size(batch: int, heads: int, block_q: int, block_k: int) -> int:
    """Examples per group: the most, dividing ``batch``, whose tile of logits (float32, every
    head) fits ``TILE_BYTES``; with several devices a multiple of their count (a batch split
    over them is split the same way in every group), or the whole batch."""
    devices = jax.device_count()
    step = devices if batch % devices == 0 else batch
    fits = max(TILE_BYTES // (heads * block_q * block_k * 4), 1)
    sizes = [g for g in range(step, batch + 1, step) if batch % g == 0]
    return max([g for g in sizes if g <= fits], default=sizes[0])


def _by_group(x: jax.Array, groups: int) -> jax.Array:
    """``[B, ...]`` -> ``[groups, B / groups, ...]``, group ``i`` holding examples ``i, i +
    groups, ...`` (a batch split over devices in contiguous runs splits every group alike)."""
    return jnp.swapaxes(x.reshape(x.shape[0] // groups, groups, *x.shape[1:]), 0, 1)


def _grouped(x: jax.Array, groups: int, length: int) -> jax.Array:
    """``[B, T, N, .]`` -> ``[groups, B / groups, N, length, .]`` (zero-padded along T)."""
    x = jnp.pad(x, [(0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)])
    return jnp.swapaxes(_by_group(x, groups), 2, 3)


def _ungrouped(x: jax.Array, length: int) -> jax.Array:
    """Inverse of ``_grouped``: ``[groups, g, N, Tp, .]`` -> ``[B, length, N, .]``."""
    x = jnp.moveaxis(x, (0, 2), (1, 3))
    return x.reshape(-1, *x.shape[2:])[:, :length]


def flash_attention(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
                    return_weights, block_q: int | None = None, block_k: int | None = None):
    """The flash kernel with the signature shared by all registered kernels (attention.py)."""
    del return_weights      # not in ``supports``: the front door refuses it
    B, T, N, H = query.shape
    S = key.shape[1]
    bq, bk = (min(block or default, length) for block, default, length
              in zip((block_q, block_k), default_blocks(S), (T, S)))
    groups = B // group_size(B, N, bq, bk)
    mask = mask._replace(**{name: jnp.atleast_2d(getattr(mask, name))
                            for name in ("q_positions", "kv_positions")
                            if getattr(mask, name) is not None})
    bias_fn, consts = closed_bias(bias, mask.q_positions, mask.kv_positions, bq, bk)
    traced = dropout is not None and isinstance(dropout.rate, jax.core.Tracer)
    plan = _Plan(T, S, bq, bk, mask.is_causal, mask.window, mask.causal_block_size,
                 any(getattr(mask, name) is not None for name in RUN_TIME),
                 mask.q_positions is not None or mask.kv_positions is not None,
                 logit_soft_cap, bias_fn, None if dropout is None or traced else dropout.rate,
                 traced, dropout is not None and dropout.shared_across_heads)
    f32 = lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32))
    q = f32(query) * scale[:, None]                             # the scale folded into q
    k, v = (f32(expand_kv_heads(x, N)) for x in (key, value))
    split = lambda x: None if x is None or x.shape[0] != B else _by_group(x, groups)
    fields = [getattr(mask, name) for name in PER_EXAMPLE]
    per_example = tuple(split(x) for x in fields)
    shared = tuple(x if x is not None and x.shape[0] != B else None for x in fields)
    examples = split(jnp.arange(B, dtype=jnp.int32))
    diff = (_grouped(q, groups, _padded(T, bq)), _grouped(k, groups, _padded(S, bk)),
            _grouped(v, groups, _padded(S, bk)), sink, consts)
    aux = (per_example, shared, examples, None if dropout is None else dropout.rng,
           dropout.rate if traced else None)
    out = _ungrouped(_attention(plan, diff, aux), T)
    return out.astype(query.dtype)


KERNELS.register("flash", KernelSpec(
    flash_attention, frozenset(OPTIONS) - {"mask", "dense_bias", "return_weights"},
    settings=("block_q", "block_k"), test_options=(("block_q", 4), ("block_k", 5))))
