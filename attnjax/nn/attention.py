"""MultiHeadAttention: parameters for the fixed slots, all math in ``attnjax.ops``.

Slots, in order (each set by one config field, none aware of the others):
1. projections (fused qkv or separate; ``num_kv_heads`` for GQA/MQA)
2. q/k transform: qk-norm per head, then the position encoding's ``rotate`` hook (RoPE)
3. score bias: the position encoding's ``bias`` hook (ALiBi, T5); masks (causal, window)
4. kernel: ``attention.kernel`` from the registry
5. score shaping: scale policy, soft-capping, sink logit
6. probability dropout: shared across heads or per head
7. output projection and output dropout
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.ops import dot_product_attention
from attnjax.ops.attention import rate_active, scaled_logits
from attnjax.registry import KERNELS, POSITIONS

NORMS = {"rms": nn.RMSNorm, "layer": nn.LayerNorm}


class Dropout(nn.Module):
    """Inverted dropout ``where(keep, x / (1 - rate), 0)``, ``keep ~ Bernoulli(1 - rate)``.

    ``flax.linen.Dropout`` with the same masks for the same rng, except that ``rate`` may be
    traced (a hyperparameter a vmapped sweep varies), so it never branches on its value.
    """
    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or not rate_active(self.rate):
            return x
        keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.rate, x.shape)
        return jax.lax.select(keep, (x / (1.0 - self.rate)).astype(x.dtype), jnp.zeros_like(x))


def normalize_rms(x: jax.Array, kappa) -> jax.Array:
    """``sqrt(kappa) * x / rms(x)`` over the last axis: q and k with RMS ``sqrt(kappa)``, so
    ``q.k`` is at most ``kappa * head_dim``; no learned gain (Wortsman et al. 2023 probe)."""
    x32 = x.astype(jnp.float32)
    rms = jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (jnp.sqrt(kappa) * x32 / rms).astype(x.dtype)


def base_scale(policy: str, head_dim: int, multiplier: float) -> float:
    """Logit scale of a fixed policy: ``m/sqrt(d)``, ``m/d`` or the constant ``m``."""
    return multiplier * {"inv_sqrt_d": 1.0 / math.sqrt(head_dim), "inv_d": 1.0 / head_dim,
                         "constant": 1.0}[policy]


def max_causal_logit(q: jax.Array, k: jax.Array, scale) -> jax.Array:
    """Largest scaled score ``scale * q.k`` over causal pairs (before bias and soft-capping):
    the attention-logit growth that precedes divergence (Wortsman et al. 2023)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float32), (N,)).reshape(K, N // K)
    logits = scaled_logits(q.reshape(B, T, K, N // K, H), k, scale, None)
    causal = jnp.tril(jnp.ones((T, T), bool))
    return jnp.where(causal, logits, -jnp.inf).max()


class MultiHeadAttention(nn.Module):
    """Causal multi-head self-attention of a decoder.

    Call with ``x`` ``[B, T, d_model]`` and ``positions`` ``[B|1, T]``. With ``decode=True`` the
    keys and values are appended to a cache of ``max_length`` entries (collection ``cache``)
    and the queries attend to everything cached so far. With ``return_weights=True`` the
    probabilities ``[B, N, T, S]`` are returned and sown as ``intermediates/attn_weights``;
    kernels that cannot return them (chunked, xla) are swapped for ``reference`` for that call,
    which computes the same function. When applied with ``mutable=["intermediates"]`` it also
    sows ``max_logit`` (see ``max_causal_logit``) for diagnostics, and with ``return_weights``
    as well the queries and keys that meet in the scores (after qk-norm and the ``rotate``
    hook) as ``queries`` ``[B, T, N, H]`` and ``keys`` ``[B, T, K, H]``.

    ``head_gates`` ``[N]`` (optional) multiplies head h's output ``[B, T, N, H]`` by
    ``head_gates[h]`` before the output projection: 0 knocks the head out, and the gradient
    with respect to the gates is the head importance of Michel et al. 2019. ``None`` leaves
    the computation untouched.
    """
    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, *, deterministic: bool = True, decode: bool = False,
                 return_weights: bool = False, head_gates=None):
        cfg, att = self.config, self.config.attention
        N, K, H = att.num_heads, att.kv_heads, cfg.head_dim
        dtype = jnp.dtype(cfg.dtype)
        dense = lambda features, name: nn.DenseGeneral(features, use_bias=att.use_bias,
                                                       dtype=dtype, name=name)
        if att.fused_qkv:
            q, k, v = jnp.split(dense((N + 2 * K, H), "qkv")(x), [N, N + K], axis=2)
        else:
            q, k, v = dense((N, H), "query")(x), dense((K, H), "key")(x), dense((K, H), "value")(x)
        if att.qk_norm == "kappa":
            q, k = normalize_rms(q, att.qk_kappa), normalize_rms(k, att.qk_kappa)
        elif att.qk_norm != "none":
            q = NORMS[att.qk_norm](dtype=dtype, name="query_norm")(q)
            k = NORMS[att.qk_norm](dtype=dtype, name="key_norm")(k)
        position = POSITIONS.get(cfg.position.kind)
        if position.rotate is not None:
            q, k = position.rotate(q, k, positions, positions, cfg)

        extra = {}
        if decode:
            k, v, extra = self._update_cache(k, v, positions)
        bias = position.bias(self, cfg) if position.bias is not None else None

        if att.scale == "learned":
            log_scale = self.param("log_scale", nn.initializers.constant(math.log(
                base_scale("inv_sqrt_d", H, att.scale_multiplier))), (N,))
            scale = jnp.exp(log_scale)
        else:
            scale = base_scale(att.scale, H, att.scale_multiplier)
        if self.is_mutable_collection("intermediates") and not decode:
            self.sow("intermediates", "max_logit", max_causal_logit(q, k, scale))
            if return_weights:
                self.sow("intermediates", "queries", q)
                self.sow("intermediates", "keys", k)
        sink = None
        if att.sink == "learned":
            sink = self.param("sink", nn.initializers.zeros, (N,))
        elif att.sink == "plus_one":
            sink = 0.0
        probs_dropout = not deterministic and att.dropout.startswith("probs")
        kernel, spec = att.kernel, KERNELS.get(att.kernel)
        if return_weights and "return_weights" not in spec.supports:
            if not spec.exact:
                raise ValueError(f"model.attention.kernel={kernel!r} cannot return attention "
                                 "weights (it is not softmax attention)")
            kernel = "reference"  # computes the same function, and can
        result = dot_product_attention(
            q, k, v, bias, scale=scale, is_causal=True,
            local_window_size=None if att.window is None else (att.window - 1, 0),
            logit_soft_cap=att.logit_soft_cap, sink=sink,
            dropout_rate=att.dropout_rate if probs_dropout else 0.0,
            dropout_rng=self.make_rng("dropout") if probs_dropout else None,
            dropout_shared_across_heads=att.dropout == "probs_shared",
            return_weights=return_weights, implementation=kernel,
            **({"block_q": att.block_q, "block_k": att.block_k} if kernel == "chunked" else {}),
            **extra)
        out, weights = result if return_weights else (result, None)
        if return_weights:
            self.sow("intermediates", "attn_weights", weights)
        if head_gates is not None:
            out = out * jnp.asarray(head_gates)[:, None].astype(out.dtype)
        out = nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=att.use_bias, dtype=dtype,
                              name="out")(out)
        if att.dropout == "output":
            out = Dropout(att.dropout_rate)(out, deterministic=deterministic)
        return out, weights

    def _update_cache(self, k, v, positions):
        """Write this step's keys/values at the cache index; return the whole cache and the
        kernel arguments that place the queries after the cached keys."""
        B, T, K, H = k.shape
        length = self.config.max_length
        initialized = self.has_variable("cache", "key")
        cached_k = self.variable("cache", "key", jnp.zeros, (B, length, K, H), k.dtype)
        cached_v = self.variable("cache", "value", jnp.zeros, (B, length, K, H), v.dtype)
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        if not initialized:  # the init call only creates the cache
            return k, v, {}
        start = index.value
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, start, 0, 0))
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, start, 0, 0))
        index.value = start + T
        extra = dict(query_positions=jnp.broadcast_to(positions, (B, T)),
                     key_positions=jnp.arange(length)[None, :],
                     key_value_seq_lengths=jnp.full((B,), start + T, jnp.int32))
        return cached_k.value, cached_v.value, extra
