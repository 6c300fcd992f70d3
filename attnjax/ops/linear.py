"""Linear attention: softmax replaced by a positive feature map, O(n) time and memory.

With ``phi(x) = elu(x) + 1`` applied to the (scaled) query and to the key::

    out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i),   S_i = sum_j phi(k_j) v_j^T,   z_i = sum_j phi(k_j)

where the sums run over all visible keys, or over ``j <= i`` for causal attention (prefix
sums). ``scale`` multiplies the query before the feature map (a temperature; 1/sqrt(d) by
default, like every kernel). Padding keys are removed by zeroing ``phi(k)``; a query that sees
no key returns zeros. This is a different attention function, not an implementation of
softmax attention, so it is registered with ``exact=False`` and left out of parity tests.

References: Katharopoulos et al. 2020, "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.ops.attention import KernelSpec
from attnjax.ops.masks import lengths_to_valid
from attnjax.registry import KERNELS


def elu_feature_map(x: jax.Array) -> jax.Array:
    """``elu(x) + 1``: positive, smooth, identity-like for x > 0."""
    return jax.nn.elu(x) + 1.0


def linear_attention(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
                     return_weights, eps: float = 1e-6):
    """Kernel with the shared signature (see attention.py); honours causal and padding only."""
    del bias, logit_soft_cap, sink, dropout, return_weights  # refused by the front door
    B, T, N, H = query.shape
    S, K = key.shape[1], key.shape[2]
    dtype = jnp.promote_types(query.dtype, jnp.float32)
    q = query.reshape(B, T, K, N // K, H).astype(dtype) * scale.reshape(K, N // K, 1).astype(dtype)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(key.astype(dtype))
    v = value.astype(dtype)
    if mask.key_value_seq_lengths is not None:
        phi_k = phi_k * lengths_to_valid(mask.key_value_seq_lengths, jnp.arange(S))[..., None, None]
    if mask.is_causal:
        state = jnp.cumsum(jnp.einsum("bskh,bskd->bskhd", phi_k, v), axis=1)   # [B,S,K,H,D]
        norm = jnp.cumsum(phi_k, axis=1)                                         # [B,S,K,H]
        num = jnp.einsum("btkgh,btkhd->btkgd", phi_q, state)
        den = jnp.einsum("btkgh,btkh->btkg", phi_q, norm)
    else:
        num = jnp.einsum("btkgh,bskh,bskd->btkgd", phi_q, phi_k, v)
        den = jnp.einsum("btkgh,bskh->btkg", phi_q, phi_k)
    out = jnp.where(den[..., None] > 0, num / (den[..., None] + eps), 0.0)
    if mask.query_seq_lengths is not None:
        out = out * lengths_to_valid(mask.query_seq_lengths, jnp.arange(T))[..., None, None, None]
    return out.reshape(B, T, N, value.shape[3]).astype(query.dtype)


KERNELS.register("linear", KernelSpec(
    linear_attention, frozenset({"padding", "per_head_scale", "cross_attention",
                                 "value_head_dim"}),
    exact=False, causal_only_aligned=True))
