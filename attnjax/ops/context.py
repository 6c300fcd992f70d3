"""Context-parallel attention: one sequence split along its length over a mesh axis, exact.

Two kernels, ``ring`` and ``allgather``, take the same *global* arrays as every kernel (query
``[B, T, N, H]``, key and value ``[B, S, K, .]`` in natural token order). Inside
``with sequence_parallel(mesh, axis):`` (entered by the program while it traces) they run
``jax.shard_map`` over that one axis: device ``d`` of ``n`` holds the ``d``-th contiguous run
of the queries (``T / n``) and of the keys and values (``S / n``), and every per-token array
(positions, segment ids) travels with its tokens. Outside it (one device, or an axis of
size 1) both are the chunked kernel (the same online softmax on one device), so a run
evaluates identically anywhere. Both compute, for each query row, the softmax of
``attention.py``'s docstring; masks, bias functions and the dropout hash read each token's
*global* index and position, so they equal one device's.

**Sharding.** ``jax.shard_map(..., axis_names={axis}, check_vma=False)`` is manual over the
sequence axis only: every other mesh axis (data, fsdp, tensor) stays with the compiler, so
a batch split over ``data`` or heads over ``tensor`` stay split. Specs: ``P(None, axis)``
for per-token arrays (queries, keys, values, positions, segment ids, the output), ``P()``
for the rest (lengths, scales, sinks, bias parameters, the dropout key); the kernel does its
own collectives and sums (hence no ``check_vma``). Under a mesh of explicit axis types a
per-token array not yet split along the axis is resharded onto it first.

**Forward (the online softmax across devices).** A device keeps, for each of its query rows,
a running max ``m``, normaliser ``l`` and unnormalised output ``acc`` (``m = sink, l = 1``
with a sink, else ``m = -inf, l = 0``). A key block of logits ``s_j`` (masked ones excluded)
updates them as the chunked kernel does::

    m' = max(m, max_j s_j)    l' = l e^(m - m') + sum_j e^(s_j - m')
    acc' = acc e^(m - m') + sum_j dropout(e^(s_j - m')) v_j

which is the log-sum-exp merge of two partial softmaxes: with ``L = m + log l`` the merged
output is ``(e^(L1 - L) o1 + e^(L2 - L) o2)`` for ``L = log(e^L1 + e^L2)``, ``o = acc / l``.
The order of the blocks does not matter (up to float rounding), so the key blocks may arrive
in any order. ``ring`` passes each device's key/value block to its neighbour with
``lax.ppermute`` ``n - 1`` times, so every query block meets every key block; ``allgather``
gathers all keys and values (``lax.all_gather``) and sweeps them. Each device finally holds
``out = acc / l`` (zeros for a row that sees no key) and ``L = m + log l`` per row.

**Backward (the ring again, recomputing).** With ``P_ij = e^(s_ij - L_i)`` (the
probabilities, masked entries 0), ``Z`` the dropout keep mask over ``1 - rate`` and
``D_i = dO_i . O_i``, the gradient of the logits is the flash-attention one::

    dP = (dO V^T) Z     dS = P (dP - D)     dV = (P Z)^T dO     dsink = -sum_i e^(sink - L_i) D_i

and ``dS`` flows back through the soft cap, the scale (per head) and a bias function of
positions (ALiBi slopes, T5 tables: the parameters it closes over get their gradient) into
``dq`` and ``dk``. Each key block's share is computed as the vector-Jacobian product of the
scalar ``phi = sum_ij P_ij Z_ij (dO_i . v_j) - sum_ij P_ij D_i`` with ``L`` and ``D`` held
fixed (its derivative in ``s_ij`` is ``dS_ij``, in ``v_j`` is ``dV_j``), so the soft cap,
bias and dropout need no hand-written derivative. ``ring``'s custom VJP runs the ring once
more: the key/value blocks travel again, each with its ``dK``/``dV`` accumulator, which
after ``n`` hops is back on its owner; ``allgather`` gathers again and reduce-scatters
(an all-to-all and a sum) the key gradients. Per device, the forward saves only its inputs,
output (in float32: ``D`` from a rounded output would cost the scale's and bias's gradients
their precision) and ``L`` (``O(T / n)``): no ``T x T`` matrix and no full-length keys.

**Blocks.** Each device cuts its queries into blocks of ``block_q`` and each key block it
holds into blocks of ``block_k``; a pair of blocks whose every (query, key) the mask hides
(causal, sliding window, block-causal, padding, segments, read from the positions and ids
of the tokens themselves) is skipped by ``lax.cond``, forward and backward, so a sliding
window of ``w`` costs ``O(T (w + block))``.

**Load balance.** Under a causal mask, device ``d`` of a contiguous split does ``2d + 1``
units of work (max/mean about 2). The ``zigzag`` layout (the default for causal masks)
re-lays the queries inside the kernel, with two ``ppermute``s, so that device ``d`` holds
query chunks ``d`` and ``2n - 1 - d`` of ``2n``: each does ``2n + 1`` units; the output is
permuted back. Keys stay contiguous (which keys a device holds does not change its work).
:func:`layout_work` counts each device's visible pairs and computed blocks under a layout.

Refused (in one line): a dense mask or bias array (it would be ``[B, N, T, S]`` on every
device: give a bias *function* of positions) and ``return_weights`` (it would gather the
whole score matrix). Lengths must divide by ``n`` (``2n`` for ``zigzag``): a decoding step
(one query) is refused inside ``sequence_parallel``; outside it the compiler gathers a
cache split along its length.

References: Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context"; Brandon et al. 2023, "Striped Attention: Faster Ring Attention for
Causal Transformers"; Dao et al. 2022, "FlashAttention" (the backward pass with ``L``, ``D``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from attnjax.ops.attention import (OPTIONS, Dropout, KernelSpec, apply_dropout, block_bias,
                                   expand_kv_heads, scaled_logits)
from attnjax.ops.chunked import (chunked_attention, online_softmax_step, reshape,
                                  split_blocks)
from attnjax.ops.masks import MaskSpec, combine_masks, mask_value
from attnjax.registry import KERNELS

LAYOUTS = ("auto", "contiguous", "zigzag")
DEFAULT_BLOCK = 256

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("attnjax_sequence_parallel",
                                                         default=None)


@contextlib.contextmanager
def sequence_parallel(mesh, axis: str = "sequence"):
    """Inside it (while a program is traced), the ``ring`` and ``allgather`` kernels split the
    sequence over mesh axis ``axis`` of ``mesh``; the other mesh axes are left to the
    compiler (shard_map is manual over ``axis`` only)."""
    if axis not in mesh.axis_names:
        raise ValueError(f"sequence_parallel: the mesh has no axis {axis!r} (its axes: "
                         f"{', '.join(mesh.axis_names)})")
    token = _ACTIVE.set((mesh, axis))
    try:
        yield mesh
    finally:
        _ACTIVE.reset(token)


def current():
    """``(mesh, axis)`` of the innermost ``sequence_parallel``, or ``None``."""
    return _ACTIVE.get()


def _ring_size() -> tuple:
    """``(mesh, axis, n)`` of the active split, ``(None, None, 1)`` when nothing is split."""
    active = current()
    if active is None or active[0].shape[active[1]] == 1:
        return None, None, 1
    mesh, axis = active
    return mesh, axis, mesh.shape[axis]


def _triangular(mask: MaskSpec) -> bool:
    """Whether the mask hides the keys after each query and keeps all before it (causal,
    block-causal): the masks under which a contiguous split is unbalanced."""
    hides_future = (mask.is_causal or mask.causal_block_size is not None
                    or (mask.window is not None and mask.window[1] == 0))
    return hides_future and (mask.window is None or mask.window[0] is None)


def choose_layout(layout: str, mask: MaskSpec, T: int, n: int) -> str:
    """``contiguous`` or ``zigzag`` for ``layout`` (``auto``: zigzag under a causal mask
    when ``T`` divides by ``2n``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    if n == 1:
        return "contiguous"
    if layout == "auto":
        return "zigzag" if _triangular(mask) and T % (2 * n) == 0 else "contiguous"
    return layout


class _Plan(NamedTuple):
    """Everything static about one call (hashable: the custom VJP's non-differentiable
    argument)."""
    strategy: str               # ring | allgather
    mesh: object
    axis: str
    n: int                      # devices along the axis (at least 2)
    zigzag: bool
    T: int
    S: int
    block_q: int
    block_k: int
    is_causal: bool
    window: tuple | None
    causal_block_size: int | None
    logit_soft_cap: float | None
    bias_fn: object             # bias(q_pos, k_pos, *consts) or None
    dropout_rate: float | None  # a Python rate (a traced one travels as an argument)
    dropout_traced: bool
    dropout_shared: bool
    on_block: object            # on_block(pass, device, q_start, k_start) or None

    @property
    def slots(self) -> int:     # query chunks per device
        return 2 if self.zigzag else 1

    @property
    def chunk(self) -> int:     # tokens per query chunk
        return self.T // (self.n * self.slots)

    @property
    def kv_local(self) -> int:  # keys per device
        return self.S // self.n


class _Side(NamedTuple):
    """One side's blocks (or one block of them, inside a scan): tokens ``x`` (and ``y``: the
    values of a key side) ``[nb, B, b, heads, .]``, positions ``[nb, B|1, b]`` and segment
    ids ``[nb, B, b]`` (or ``None``), global ``start`` ``[nb]``, ``ok`` ``[nb, b]`` (not
    padding)."""
    x: jax.Array
    y: jax.Array | None
    pos: jax.Array | None
    seg: jax.Array | None
    start: jax.Array
    ok: jax.Array


# ----------------------------------------------------------------------------- the layouts


def chunk_table(n: int, zigzag: bool) -> np.ndarray:
    """``[n, slots]``: the global query chunks device ``d`` holds (``zigzag``: ``d`` and
    ``2n - 1 - d`` of ``2n``; else ``d`` of ``n``)."""
    d = np.arange(n)
    return np.stack([d, 2 * n - 1 - d], axis=1) if zigzag else d[:, None]


def _zigzag_perms(n: int):
    """The two permutations that move contiguous chunks ``2d`` and ``2d + 1`` (device
    ``d``'s halves) to their zig-zag devices; each is a permutation of the devices."""
    dest = lambda c: c if c < n else 2 * n - 1 - c
    return ([(d, dest(2 * d)) for d in range(n)], [(d, dest(2 * d + 1)) for d in range(n)])


def _relayout(plan: _Plan, d, arrays, inverse: bool = False):
    """Contiguous -> zig-zag (``inverse``: back) along axis 1 of each array (``None`` passes).
    A device of even index receives its chunk ``d`` through the first permutation, an odd
    one its chunk ``2n - 1 - d``."""
    if not plan.zigzag:
        return arrays
    perm_a, perm_b = _zigzag_perms(plan.n)
    even = d % 2 == 0
    flip = lambda p: [(j, i) for i, j in p]

    def move(x):
        if x is None:
            return None
        first, second = jnp.split(x, 2, axis=1)
        if inverse:
            by_a, by_b = jnp.where(even, first, second), jnp.where(even, second, first)
            return jnp.concatenate([jax.lax.ppermute(by_a, plan.axis, flip(perm_a)),
                                    jax.lax.ppermute(by_b, plan.axis, flip(perm_b))], axis=1)
        by_a = jax.lax.ppermute(first, plan.axis, perm_a)
        by_b = jax.lax.ppermute(second, plan.axis, perm_b)
        return jnp.concatenate([jnp.where(even, by_a, by_b), jnp.where(even, by_b, by_a)],
                               axis=1)

    return tuple(move(x) for x in arrays)


def _merge_blocks(x: jax.Array, length: int, chunks: int) -> jax.Array:
    """Inverse of ``split_blocks``: ``[chunks * nb, B, b, ...]`` -> ``[B, length, ...]``."""
    B = x.shape[1]
    x = reshape(jnp.moveaxis(x, 0, 1), (B, chunks, x.shape[0] * x.shape[2] // chunks,
                                        *x.shape[3:]))
    return reshape(x[:, :, :length // chunks], (B, length, *x.shape[3:]))


def _sides(x, y, pos, seg, block: int, chunks: int, chunk_starts) -> _Side:
    """Blocks of ``chunks`` equal runs of tokens whose global starts are ``chunk_starts``."""
    length = x.shape[1] // chunks
    nb = -(-length // block)
    within = jnp.arange(nb)[:, None] * block + jnp.arange(block)              # [nb, b]
    split = lambda a: None if a is None else split_blocks(a, block, chunks)
    return _Side(split(x), split(y), split(pos), split(seg),
                 (chunk_starts[:, None] + within[:, 0]).reshape(-1),
                 jnp.tile(within < length, (chunks, 1)))


# ------------------------------------------------------------------------------ block pairs


class _Shared(NamedTuple):
    """The per-call values every block pair reads."""
    plan: _Plan
    device: jax.Array
    scale: jax.Array
    consts: tuple
    q_len: jax.Array | None
    kv_len: jax.Array | None
    dropout: Dropout | None


def _pair(sh: _Shared, q: _Side, k: _Side):
    """``(visible [B|1, N|1, bq, bk], bias function of the pair's positions)`` of one query
    block and one key block (their ``start`` scalars, ``ok`` ``[b]``)."""
    plan = sh.plan
    bq, bk = q.ok.shape[0], k.ok.shape[0]
    q_pos = q.pos if q.pos is not None else (q.start + jnp.arange(bq))[None]
    k_pos = k.pos if k.pos is not None else (k.start + jnp.arange(bk))[None]
    shift = lambda n, start: None if n is None else n - start
    # The pair's own mask: positions given explicitly, lengths moved to the block's start.
    local = MaskSpec(is_causal=plan.is_causal, window=plan.window,
                     causal_block_size=plan.causal_block_size,
                     query_seq_lengths=shift(sh.q_len, q.start),
                     key_value_seq_lengths=shift(sh.kv_len, k.start),
                     q_segment_ids=q.seg, kv_segment_ids=k.seg, q_positions=q_pos,
                     kv_positions=k_pos)
    visible = combine_masks(local.block(0, bq, 0, bk), (q.ok[:, None] & k.ok[None, :]))

    def bias(consts):
        if plan.bias_fn is None:
            return None
        return block_bias(lambda qp, kp: plan.bias_fn(qp, kp, *consts), local, 0, bq, 0, bk)

    return visible, bias


def _report(sh: _Shared, which: str, q: _Side, k: _Side):
    if sh.plan.on_block is not None:
        jax.debug.callback(functools.partial(sh.plan.on_block, which), sh.device, q.start,
                           k.start)


def _forward_pairs(sh: _Shared, qs: _Side, carry, ks: _Side):
    """The online softmax of every query block over every key block of ``ks``."""
    N = qs.x.shape[3]

    def per_query(args):
        state, q = args

        def per_key(state, k):
            visible, bias = _pair(sh, q, k)

            def compute(state):
                _report(sh, "forward", q, k)
                return online_softmax_step(
                    state, q.x, expand_kv_heads(k.x, N), expand_kv_heads(k.y, N), visible,
                    bias(sh.consts), scale=sh.scale, logit_soft_cap=sh.plan.logit_soft_cap,
                    dropout=sh.dropout, q_index=q.start + jnp.arange(q.ok.shape[0]),
                    k_index=k.start + jnp.arange(k.ok.shape[0]))

            return jax.lax.cond(visible.any(), compute, lambda state: state, state), None

        return jax.lax.scan(per_key, state, ks)[0]

    return jax.lax.map(per_query, (carry, qs))


def _backward_pairs(sh: _Shared, qs: _Side, rows, grads, ks: _Side, kv_grads):
    """Add every (query block, key block) pair's share of the gradients: ``rows`` = (dO
    ``[nq, B, bq, N, D]``, L and D ``[nq, B, N, bq]``), ``grads`` = (dq blocks, d scale,
    d consts), ``kv_grads`` = (dk, dv) blocks of ``ks``."""
    plan = sh.plan
    N = qs.x.shape[3]
    acc_dtype = grads[0].dtype
    fill = mask_value(acc_dtype)
    floats = [i for i, c in enumerate(sh.consts) if jnp.issubdtype(c.dtype, jnp.inexact)]

    def per_query(carry, xs):
        kv_grads, d_scale, d_consts = carry
        q, (d_out, lse, delta), dq = xs

        def per_key(carry, ys):
            dq, d_scale, d_consts = carry
            k, (dk, dv) = ys
            visible, bias = _pair(sh, q, k)

            def compute(args):
                dq, d_scale, d_consts, dk, dv = args
                _report(sh, "backward", q, k)

                def phi(qx, kx, vx, scale, float_consts):
                    consts = list(sh.consts)
                    for i, c in zip(floats, float_consts):
                        consts[i] = c
                    s = scaled_logits(qx, expand_kv_heads(kx, N), scale, plan.logit_soft_cap)
                    b = bias(consts)
                    if b is not None:
                        s = s + b
                    s = jnp.where(visible, s, fill)
                    p = jnp.where(visible, jnp.exp(s - lse[..., None]), 0.0)
                    dp = jnp.einsum("bqnd,bknd->bnqk", d_out, expand_kv_heads(vx, N),
                                    preferred_element_type=acc_dtype)
                    kept = p if sh.dropout is None else apply_dropout(
                        sh.dropout, p, q.start + jnp.arange(p.shape[2]),
                        k.start + jnp.arange(p.shape[3]))
                    return (kept * dp).sum() - (p * delta[..., None]).sum()

                cast = lambda x: x.astype(acc_dtype)
                _, pull = jax.vjp(phi, cast(q.x), cast(k.x), cast(k.y), sh.scale,
                                  [sh.consts[i] for i in floats])
                g_q, g_k, g_v, g_scale, g_consts = pull(jnp.ones((), acc_dtype))
                return (dq + g_q, d_scale + g_scale,
                        tuple(a + g for a, g in zip(d_consts, g_consts)), dk + g_k, dv + g_v)

            dq, d_scale, d_consts, dk, dv = jax.lax.cond(
                visible.any(), compute, lambda args: args, (dq, d_scale, d_consts, dk, dv))
            return (dq, d_scale, d_consts), (dk, dv)

        (dq, d_scale, d_consts), kv_grads = jax.lax.scan(per_key, (dq, d_scale, d_consts),
                                                         (ks, kv_grads))
        return (kv_grads, d_scale, d_consts), dq

    (kv_grads, d_scale, d_consts), dq = jax.lax.scan(
        per_query, (kv_grads, grads[1], grads[2]), (qs, rows, grads[0]))
    return (dq, d_scale, d_consts), kv_grads


# ------------------------------------------------------------------- one device's program


def _dropout(plan: _Plan, rng, rate) -> Dropout | None:
    if plan.dropout_rate is None and not plan.dropout_traced:
        return None
    return Dropout(rate if plan.dropout_traced else plan.dropout_rate, rng,
                   plan.dropout_shared)


def _query_side(plan: _Plan, d, q, q_pos, q_seg) -> _Side:
    starts = jnp.asarray(chunk_table(plan.n, plan.zigzag) * plan.chunk)[d]
    return _sides(q, None, q_pos, q_seg, plan.block_q, plan.slots, starts)


def _key_side(plan: _Plan, held, first: int | jax.Array, chunks: int) -> _Side:
    k, v, k_pos, k_seg = held
    starts = (first + jnp.arange(chunks)) * plan.kv_local
    return _sides(k, v, k_pos, k_seg, plan.block_k, chunks, starts)


def _gather(plan: _Plan, arrays):
    return tuple(None if x is None else jax.lax.all_gather(x, plan.axis, axis=1, tiled=True)
                 for x in arrays)


def _reduce_scatter(plan: _Plan, x):
    """``[B, S, ...]`` summed over the devices, this device's ``S / n`` kept: an all-to-all
    (each device receives its run from every other), then a sum (``lax.psum_scatter``'s
    communication; psum_scatter itself fails to lower under explicit axis types in jax 0.12)."""
    x = jax.lax.all_to_all(x, plan.axis, 1, 1, tiled=True)
    return x.reshape(x.shape[0], plan.n, -1, *x.shape[2:]).sum(axis=1)


def _sweep(plan: _Plan, d, step, state, held, travelling=()):
    """Meet every key block: ``state, travelling = step(state, held, travelling, ks)`` per
    key side ``ks``. ``ring``: ``n`` steps, ``held`` passed on after all but the last,
    ``travelling`` (gradient accumulators of the held block) after every one, so it ends on
    the block's owner. ``allgather``: one step over the gathered keys."""
    if plan.strategy == "allgather":
        return step(state, _key_side(plan, _gather(plan, held), 0, plan.n), travelling)
    n = plan.n
    right = [(i, (i + 1) % n) for i in range(n)]
    send = lambda tree: jax.tree.map(lambda x: jax.lax.ppermute(x, plan.axis, right), tree)

    def body(carry, r):
        state, held, travelling = carry
        state, travelling = step(state, _key_side(plan, held, (d - r) % n, 1), travelling)
        held = jax.lax.cond(r < n - 1, send, lambda tree: tree, held)
        return (state, held, send(travelling)), None

    (state, _, travelling), _ = jax.lax.scan(body, (state, held, travelling), jnp.arange(n))
    return state, travelling


def _device_forward(plan: _Plan, diff, aux):
    """One device's ``out`` ``[B, T/n, N, D]`` (float32 or wider, in token order) and
    ``L`` ``[B, T/n, N]`` (in its layout's order)."""
    q, k, v, scale, sink, consts = diff
    q_pos, q_seg, kv_pos, kv_seg, q_len, kv_len, rng, rate = aux
    d = jax.lax.axis_index(plan.axis)
    sh = _Shared(plan, d, scale, consts, q_len, kv_len, _dropout(plan, rng, rate))
    q, q_pos, q_seg = _relayout(plan, d, (q, q_pos, q_seg))
    qs = _query_side(plan, d, q, q_pos, q_seg)
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)
    l0 = jnp.zeros_like(jnp.moveaxis(qs.x, 2, 3)[..., 0], dtype=acc_dtype)    # [nq,B,N,bq]
    acc0 = jnp.repeat(l0[..., None], v.shape[3], axis=-1)
    if sink is None:
        state = (l0 + mask_value(acc_dtype), l0, acc0)
    else:
        state = (l0 + sink[:, None].astype(acc_dtype), l0 + 1.0, acc0)

    def step(state, ks, travelling):
        return _forward_pairs(sh, qs, state, ks), travelling

    (m, l, acc), _ = _sweep(plan, d, step, state, (k, v, kv_pos, kv_seg))
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)[..., None]                          # [nq,B,N,bq,D]
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)        # [nq,B,N,bq]
    length = q.shape[1]
    out = _merge_blocks(jnp.moveaxis(out, 3, 2), length, plan.slots)
    lse = _merge_blocks(jnp.moveaxis(lse, 3, 2), length, plan.slots)
    (out,) = _relayout(plan, d, (out,), inverse=True)
    return out, lse


def _device_backward(plan: _Plan, diff, aux, out, lse, d_out):
    """One device's ``(dq, dk, dv)`` shards and its summed ``(d scale, d sink, d consts)``."""
    q, k, v, scale, sink, consts = diff
    q_pos, q_seg, kv_pos, kv_seg, q_len, kv_len, rng, rate = aux
    d = jax.lax.axis_index(plan.axis)
    sh = _Shared(plan, d, scale, consts, q_len, kv_len, _dropout(plan, rng, rate))
    acc_dtype = jnp.promote_types(q.dtype, jnp.float32)
    delta = (d_out.astype(acc_dtype) * out.astype(acc_dtype)).sum(axis=-1)  # [B, T/n, N]
    q, q_pos, q_seg, d_out, delta = _relayout(plan, d, (q, q_pos, q_seg, d_out, delta))
    qs = _query_side(plan, d, q, q_pos, q_seg)
    rows = (split_blocks(d_out.astype(acc_dtype), plan.block_q, plan.slots),
            *(jnp.moveaxis(split_blocks(x, plan.block_q, plan.slots), 2, 3)
              for x in (lse, delta)))
    float_consts = [c for c in consts if jnp.issubdtype(c.dtype, jnp.inexact)]
    grads = (jnp.zeros_like(qs.x, dtype=acc_dtype), jnp.zeros_like(scale),
             tuple(jnp.zeros_like(c) for c in float_consts))
    zeros = lambda x: jnp.zeros_like(x, dtype=acc_dtype)

    def step(grads, ks, travelling):
        chunks = ks.x.shape[0] // -(-plan.kv_local // plan.block_k)
        kv_grads = tuple(split_blocks(g, plan.block_k, chunks) for g in travelling)
        grads, kv_grads = _backward_pairs(sh, qs, rows, grads, ks, kv_grads)
        length = travelling[0].shape[1]
        return grads, tuple(_merge_blocks(g, length, chunks) for g in kv_grads)

    if plan.strategy == "allgather":
        whole = lambda x: jnp.tile(zeros(x), (1, plan.n, 1, 1))     # [B, S, K, .]
        (dq, d_scale, d_consts), (dk, dv) = _sweep(
            plan, d, step, grads, (k, v, kv_pos, kv_seg), (whole(k), whole(v)))
        dk, dv = (_reduce_scatter(plan, g) for g in (dk, dv))
    else:
        (dq, d_scale, d_consts), (dk, dv) = _sweep(
            plan, d, step, grads, (k, v, kv_pos, kv_seg), (zeros(k), zeros(v)))
    (dq,) = _relayout(plan, d, (_merge_blocks(dq, q.shape[1], plan.slots).astype(q.dtype),),
                      inverse=True)
    d_sink = None
    if sink is not None:
        # d sink_n = -sum_i e^(sink_n - L_i) D_i over this device's rows (pads have D = 0)
        d_sink = -(jnp.exp(sink[:, None] - rows[1]) * rows[2]).sum(axis=(0, 1, 3))
    d_scale, d_sink, d_consts = jax.lax.psum((d_scale, d_sink, d_consts), plan.axis)
    d_consts = iter(d_consts)
    d_consts = tuple(next(d_consts) if jnp.issubdtype(c.dtype, jnp.inexact) else None
                     for c in consts)
    cast = lambda g, x: None if g is None else g.astype(x.dtype)
    return (dq, cast(dk, k), cast(dv, v), cast(d_scale, scale),
            cast(d_sink, sink), tuple(cast(g, c) for g, c in zip(d_consts, consts)))


# ------------------------------------------------------------------ across the devices


def _specs(plan: _Plan):
    """shard_map specs: per-token arrays split along their axis 1, the rest replicated
    over the sequence axis (every other mesh axis is left automatic)."""
    tokens, same = P(None, plan.axis), P()
    diff = (tokens, tokens, tokens, same, same, same)
    aux = (tokens, tokens, tokens, tokens, same, same, same, same)
    return diff, aux, tokens, same


def _on_devices(plan: _Plan, fn, args, in_specs, out_specs):
    return jax.shard_map(fn, mesh=plan.mesh, in_specs=in_specs, out_specs=out_specs,
                         axis_names={plan.axis}, check_vma=False)(*args)


def _forward(plan: _Plan, diff, aux):
    diff_spec, aux_spec, tokens, _ = _specs(plan)
    return _on_devices(plan, functools.partial(_device_forward, plan), (diff, aux),
                       (diff_spec, aux_spec), (tokens, tokens))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(plan: _Plan, diff, aux):
    return _forward(plan, diff, aux)[0].astype(diff[0].dtype)


def _attention_fwd(plan: _Plan, diff, aux):
    # the output is kept in float32 (or wider): D = dO . O from a bfloat16 O would cost the
    # gradients of the scale and the bias (sums over every pair) their precision
    out, lse = _forward(plan, diff, aux)
    return out.astype(diff[0].dtype), (diff, aux, out, lse)


def _attention_bwd(plan: _Plan, residuals, d_out):
    diff, aux, out, lse = residuals
    diff_spec, aux_spec, tokens, same = _specs(plan)
    grads = _on_devices(plan, functools.partial(_device_backward, plan),
                        (diff, aux, out, lse, _like(plan, d_out, out)),
                        (diff_spec, aux_spec, tokens, tokens, tokens), diff_spec)
    return grads, jax.tree.map(lambda _: None, aux)


_attention.defvjp(_attention_fwd, _attention_bwd)


def _on_axis(plan: _Plan, x):
    """Under a mesh of explicit axis types shard_map takes a per-token array only if it is
    already split along the sequence axis: reshard it there (other dims as they were)."""
    if x is None or plan.axis not in getattr(plan.mesh, "explicit_axes", ()):
        return x
    spec = list(getattr(jax.typeof(x).sharding, "spec", ()) or ())
    spec += [None] * (x.ndim - len(spec))
    if spec[1] == plan.axis:
        return x
    drop = lambda e: (tuple(a for a in e if a != plan.axis) or None) if isinstance(e, tuple) \
        else (None if e == plan.axis else e)
    spec = [drop(e) for e in spec]
    spec[1] = plan.axis
    return jax.sharding.reshard(x, P(*spec))


def _like(plan: _Plan, x, other):
    """``x`` laid out as ``other`` under a mesh of explicit axis types (a cotangent may come
    replicated where the output it belongs to is split)."""
    if plan.axis not in getattr(plan.mesh, "explicit_axes", ()):
        return x
    return jax.sharding.reshard(x, jax.typeof(other).sharding.spec)


def closed_bias(bias, q_positions, kv_positions, block_q: int, block_k: int):
    """``(bias(q_pos, k_pos, *consts), consts)``: a bias function of positions with every
    array it closes over (a T5 table, ALiBi slopes) made an explicit argument, so its
    gradient crosses the custom VJP and the arrays cross shard_map. It is traced once, here,
    outside any mesh, and that program evaluated on each device's blocks with ``consts`` as
    shard_map passed them in. Traced inside shard_map's body (the sequence axis manual) it
    would apply its operations to the closed-over arrays themselves, whose types name the whole
    mesh when they are laid out on it (training's parameters), and JAX refuses to gather from
    those there (a T5 table); traced under the caller's mesh, its program would record that
    mesh, which the body's is not."""
    if bias is None:
        return None, ()
    example = lambda given, size: jax.ShapeDtypeStruct(
        (1 if given is None else given.shape[0], size),
        jnp.int32 if given is None else given.dtype)
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        closed = jax.make_jaxpr(bias)(example(q_positions, block_q),
                                      example(kv_positions, block_k))

    def fn(q_pos, k_pos, *consts):
        return jax.core.eval_jaxpr(closed.jaxpr, consts, q_pos, k_pos)[0]

    return fn, tuple(closed.consts)


def context_attention(strategy: str, query, key, value, *, bias, mask, scale, logit_soft_cap,
                      sink, dropout, return_weights, block_q: int | None = None,
                      block_k: int | None = None, layout: str = "auto", on_block=None):
    """The ``ring`` and ``allgather`` kernels (the signature shared by every kernel, see
    attention.py). ``layout``: ``auto`` (zigzag under a causal mask), ``contiguous`` or
    ``zigzag``. ``on_block(pass, device, q_start, k_start)``: called (``jax.debug.callback``)
    for every block pair computed, ``pass`` "forward" or "backward" (a test's counter)."""
    del return_weights      # not in ``supports``: the front door refuses it
    mesh, axis, n = _ring_size()
    T, S = query.shape[1], key.shape[1]
    chosen = choose_layout(layout, mask, T, n)
    if n == 1:      # nothing split: the chunked kernel (the same program, the same numbers)
        return chunked_attention(query, key, value, bias=bias, mask=mask, scale=scale,
                                 logit_soft_cap=logit_soft_cap, sink=sink, dropout=dropout,
                                 return_weights=False, block_q=block_q or DEFAULT_BLOCK,
                                 block_k=block_k or DEFAULT_BLOCK)
    slots = 2 if chosen == "zigzag" else 1
    if T % (n * slots) or S % n:
        raise ValueError(f"implementation={strategy!r} splits the sequence over {axis}={n} "
                         f"devices ({chosen} layout): query length {T} must divide by {n * slots} "
                         f"and key length {S} by {n}")
    plan_q = min(block_q or DEFAULT_BLOCK, T // (n * slots))
    plan_k = min(block_k or DEFAULT_BLOCK, S // n)
    mask = mask._replace(**{name: jnp.atleast_2d(getattr(mask, name))
                            for name in ("q_positions", "kv_positions")
                            if getattr(mask, name) is not None})
    bias_fn, consts = closed_bias(bias, mask.q_positions, mask.kv_positions, plan_q, plan_k)
    traced = dropout is not None and isinstance(dropout.rate, jax.core.Tracer)
    plan = _Plan(strategy, mesh, axis, n, chosen == "zigzag", T, S, plan_q, plan_k,
                 mask.is_causal, mask.window, mask.causal_block_size, logit_soft_cap, bias_fn,
                 None if dropout is None or traced else dropout.rate, traced,
                 dropout is not None and dropout.shared_across_heads, on_block)
    along = lambda x: None if x is None else _on_axis(plan, jnp.atleast_2d(x))
    diff = (*(along(x) for x in (query, key, value)), scale, sink, consts)
    aux = (along(mask.q_positions), along(mask.q_segment_ids), along(mask.kv_positions),
           along(mask.kv_segment_ids), mask.query_seq_lengths, mask.key_value_seq_lengths,
           None if dropout is None else dropout.rng, dropout.rate if traced else None)
    return _attention(plan, diff, aux)


def ring_attention(query, key, value, **options):
    """Ring attention (see the module docstring); options as ``context_attention``."""
    return context_attention("ring", query, key, value, **options)


def allgather_attention(query, key, value, **options):
    """All-gather attention (see the module docstring); options as ``context_attention``."""
    return context_attention("allgather", query, key, value, **options)


# ------------------------------------------------------------------------------ balance


def layout_work(T: int, n: int, *, S: int | None = None, layout: str = "auto",
                mask: MaskSpec | None = None, block_q: int | None = None,
                block_k: int | None = None) -> dict:
    """Each device's attention work under the kernels' schedule, counted from ``mask``
    (default causal) with NumPy: a benchmark's load-balance figure. Returns ``layout``,
    ``pairs`` ``[n]`` (the visible (query, key) pairs of its queries, summed over the mask's
    batch: the work an ideal kernel does), ``blocks`` ``[n]`` (the block pairs it computes,
    each ``B N block_q block_k (2 H + 2 D)`` matmul FLOPs forward, about twice that again
    backward), and ``max/mean`` of both (1 = balanced)."""
    S = T if S is None else S
    mask = MaskSpec(is_causal=True) if mask is None else mask
    chosen = choose_layout(layout, mask, T, n)
    slots = 2 if chosen == "zigzag" else 1
    chunk, kv_local = T // (n * slots), S // n
    bq, bk = min(block_q or DEFAULT_BLOCK, chunk), min(block_k or DEFAULT_BLOCK, kv_local)
    nkb = -(-kv_local // bk)
    pairs, blocks = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for d, chunks in enumerate(chunk_table(n, chosen == "zigzag")):
        for c in chunks:
            for q0 in range(c * chunk, (c + 1) * chunk, bq):
                size = min(bq, (c + 1) * chunk - q0)
                seen = mask.block(q0, size, 0, S)
                seen = np.ones((1, size, S), bool) if seen is None else \
                    np.asarray(seen).any(axis=1)                          # [B|1, size, S]
                pairs[d] += int(seen.sum())
                per = np.pad(seen.reshape(seen.shape[0], size, n, kv_local),
                             [(0, 0), (0, 0), (0, 0), (0, nkb * bk - kv_local)])
                blocks[d] += int(per.reshape(-1, size, n, nkb, bk).any(axis=(0, 1, 4)).sum())
    ratio = lambda x: float(x.max() / x.mean()) if x.mean() else 1.0
    return dict(layout=chosen, pairs=pairs, blocks=blocks, block_q=bq, block_k=bk,
                pairs_max_over_mean=ratio(pairs), blocks_max_over_mean=ratio(blocks))


def traffic(strategy: str, T: int, n: int, *, S: int | None = None, batch: int = 1,
            heads: int = 1, kv_heads: int = 1, head_dim: int = 1, value_dim: int | None = None,
            itemsize: int = 4, layout: str = "auto", mask: MaskSpec | None = None) -> dict:
    """The bytes one device sends in a forward and in a backward pass (the analytic figure a
    benchmark sets against the compiled program's collectives; the per-token integer arrays,
    positions and segment ids, which travel with their tokens, are left out). Keys and
    values: ``n - 1`` hops (ring) or an all-gather, each forward and again backward; their
    float32 gradient accumulators: ``n`` hops (ring, back to their owner) or an all-to-all
    (allgather, ``n - 1`` shares); zig-zag: the queries out and the (float32) outputs back, and
    backward the queries, the output cotangents and ``D`` out and ``dq`` back (at most: a
    device keeps the chunks already where they belong)."""
    S = T if S is None else S
    mask = MaskSpec(is_causal=True) if mask is None else mask
    D = value_dim or head_dim
    kv = batch * (S // n) * kv_heads * (head_dim + D) * itemsize
    kv_grads = batch * (S // n) * kv_heads * (head_dim + D) * max(itemsize, 4)
    rows = batch * (T // n) * heads
    zigzag = choose_layout(layout, mask, T, n) == "zigzag"
    forward = (n - 1) * kv + (rows * (head_dim * itemsize + D * max(itemsize, 4))
                              if zigzag else 0)
    backward = ((n - 1) * kv + (n if strategy == "ring" else n - 1) * kv_grads
                + (rows * ((2 * head_dim + D) * itemsize + 4) if zigzag else 0))
    return dict(forward=forward, backward=backward, layout="zigzag" if zigzag else "contiguous")


# Not split, both are the chunked kernel: with its test settings the registry-wide tests
# compile the very programs they compiled for it (the persistent compilation cache serves them).
# dense masks and biases, and the weights, would be whole on every device
_SUPPORTS = frozenset(OPTIONS) - {"mask", "dense_bias", "return_weights"}
KERNEL_NAMES = ("ring", "allgather")      # the kernels that split a sequence over devices
for _name, _fn in zip(KERNEL_NAMES, (ring_attention, allgather_attention)):
    KERNELS.register(_name, KernelSpec(_fn, _SUPPORTS, settings=("block_q", "block_k"),
                                       test_options=KERNELS.get("chunked").test_options,
                                       runs_as="chunked"))
