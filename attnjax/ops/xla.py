"""Kernels that dispatch to ``jax.nn.dot_product_attention`` (XLA on any backend, cuDNN on GPU).

Position-based masks and bias functions are materialised as dense arrays first, a per-head
scale is folded into the query, and rows that see no key are zeroed afterwards (jax.nn would
return the mean of V there). jax.nn wants one width for query, key and value: a value of
another width ``D != H`` is computed exactly by zero-padding the narrower side to ``max(H, D)``
(zero columns of q and k leave ``q.k`` unchanged; zero columns of v give output columns that
are sliced off), at the cost of attending at the padded width. Soft-capping, sinks,
probability dropout and returning the weights are not available in jax.nn: the front door
refuses them with the list of kernels that can.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attnjax.ops.attention import OPTIONS, KernelSpec, block_bias
from attnjax.registry import KERNELS

_UNSUPPORTED = {"softcap", "sink", "dropout", "return_weights"}


def jax_nn_attention(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
                     return_weights, implementation: str):
    """Kernel with the shared signature (see attention.py) on top of jax.nn."""
    del logit_soft_cap, sink, dropout, return_weights  # refused by the front door
    if implementation == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(f"implementation='cudnn' needs a CUDA GPU; this process runs on "
                         f"{jax.default_backend()!r}; use 'xla', 'chunked' or 'reference'")
    if jax.default_backend() == "cpu" and query.dtype == jnp.float16:
        # XLA:CPU has no float16 x float16 -> float32 dot: compute in float32, round back.
        as32 = lambda x: None if x is None or callable(x) else x.astype(jnp.float32)
        out = jax_nn_attention(query.astype(jnp.float32), key.astype(jnp.float32),
                               value.astype(jnp.float32),
                               bias=bias if callable(bias) else as32(bias),
                               mask=mask, scale=scale, logit_soft_cap=None, sink=None,
                               dropout=None, return_weights=False, implementation=implementation)
        return out.astype(query.dtype)
    B, T, N, H = query.shape
    S = key.shape[1]
    visible = mask.block(0, T, 0, S)
    dense_bias = block_bias(bias, mask, 0, T, 0, S)
    head_scale = scale.reshape(N)
    scaled_query = (query * head_scale[:, None].astype(query.dtype))
    if dense_bias is not None:
        dense_bias = dense_bias.astype(query.dtype)
    D = value.shape[3]
    width = max(H, D)
    pad = lambda x: x if x.shape[3] == width else jnp.pad(
        x, [(0, 0)] * 3 + [(0, width - x.shape[3])])
    out = jax.nn.dot_product_attention(pad(scaled_query), pad(key), pad(value), bias=dense_bias,
                                       mask=visible, scale=1.0,
                                       implementation=implementation)[..., :D]
    if visible is not None:
        any_visible = jnp.broadcast_to(visible, (visible.shape[0], visible.shape[1], T, S)).any(-1)
        out = out * jnp.moveaxis(any_visible, 1, 2)[..., None].astype(out.dtype)
    return out


for _name, _backends in (("xla", None), ("cudnn", frozenset({"gpu"}))):
    KERNELS.register(_name, KernelSpec(functools.partial(jax_nn_attention, implementation=_name),
                                       frozenset(OPTIONS) - _UNSUPPORTED, backends=_backends))
