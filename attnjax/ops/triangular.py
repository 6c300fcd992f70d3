"""Causal attention by query blocks: each block of ``block_q`` queries attends, as the
reference kernel does, to only the keys it may see.

Under a causal mask the queries ``[i b, (i + 1) b)`` see the keys ``[0, (i + 1) b)``, so the
logits of the n blocks cover ``(n + 1) / 2n`` of the ``T x T`` square instead of all of it
(62% at n = 4, 56% at n = 8), and a sliding window of ``w`` keys shrinks each block to about
``b + w`` keys. Each block is ``attention.attend_block`` on static slices: the same masked
softmax, masks, biases and dropout at absolute indices, so the results equal the reference
kernel's up to float32 summation order, gradients through autodiff (the probabilities of each
block are kept, as in the reference kernel, no recomputation). Without a mask known when
tracing (positions given, as by a KV cache or padding) every block sees every key: the
reference kernel's work. Its time against the reference kernel's, forward and gradient:
``attnjax bench attention`` (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import jax.numpy as jnp

from attnjax.ops.attention import OPTIONS, KernelSpec, attend_block
from attnjax.registry import KERNELS


def default_block(length: int) -> int:
    """``length / 8``, at least 64 (smaller blocks make the matmuls too small to pay)."""
    return max(64, -(-length // 8))


def triangular_attention(query, key, value, *, bias, mask, scale, logit_soft_cap, sink,
                         dropout, return_weights, block_q: int | None = None):
    """Query-blocked kernel with the signature shared by all registered kernels."""
    del return_weights  # not supported: the front door swaps in ``reference`` to return them
    T, S = query.shape[1], key.shape[1]
    block = block_q or default_block(T)
    outs = []
    for start in range(0, T, block):
        end = min(start + block, T)
        lo, hi = mask.key_range(start, end, S)
        if hi == lo:                     # these queries see no key: zeros, as every kernel
            outs.append(jnp.zeros(query.shape[:1] + (end - start,) + query.shape[2:3]
                                  + value.shape[3:], query.dtype))
            continue
        out, _ = attend_block(query[:, start:end], key[:, lo:hi], value[:, lo:hi], bias=bias,
                              mask=mask, scale=scale, logit_soft_cap=logit_soft_cap, sink=sink,
                              dropout=dropout, q_start=start, k_start=lo)
        outs.append(out)
    return jnp.concatenate(outs, axis=1)


KERNELS.register("triangular", KernelSpec(
    triangular_attention, frozenset(OPTIONS) - {"return_weights"}, settings=("block_q",),
    test_options=(("block_q", 4),)))
