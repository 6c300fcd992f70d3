"""Attention regularisers: terms of the training objective computed from the attention
probabilities, each one entry of ``attnjax.registry.REGULARIZERS`` with one coefficient in
``train`` (0 = off; the sign picks the direction). With ``w`` the causal probabilities of
every layer, a mean over layers, heads, examples and query rows of:

- ``entropy`` (``train.entropy_reg``): the row entropy ``-sum_j p_ij log p_ij``; a positive
  coefficient sharpens attention, a negative one spreads it.
- ``weight_std`` (``train.weight_std_reg``): per head, the standard deviation of its weights
  over the causally allowed entries (``j <= i``), averaged over heads; a negative coefficient
  rewards peaked, uneven heads.
- ``sharpen`` (``train.sharpen_reg``): ``KL(p_i || q_i)`` to the sharpened target ``q_ij =
  p_ij^2 / sum_k p_ik^2`` (held fixed: no gradient through q), as in self-training by
  target sharpening; positive pulls each row towards its sharper self.

Adding one = a term function and a ``REGULARIZERS.register`` here, and its coefficient field
in ``TrainConfig``.

References: Xie, Girshick, Farhadi 2016, "Unsupervised Deep Embedding for Clustering
Analysis" (sharpened targets); Zhai et al. 2023, "Stabilizing Transformer Training by
Preventing Attention Entropy Collapse" (attention entropy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from attnjax.ops.stats import mean_entropy, row_entropy
from attnjax.registry import REGULARIZERS


class Regularizer(NamedTuple):
    term: Callable          # tuple of [B, heads, T, S] probabilities -> scalar
    coefficient: str        # the TrainConfig field that weighs it


def _causal(weights: jax.Array) -> jax.Array:
    T, S = weights.shape[-2:]
    return jnp.tril(jnp.ones((T, S), bool), S - T)


def weight_std(weights) -> jax.Array:
    """Mean over layers and heads of the std of a head's causally allowed weights."""
    def per_layer(w):
        allowed = _causal(w)
        count = allowed.sum() * w.shape[0]
        mean = jnp.where(allowed, w, 0.0).sum(axis=(0, 2, 3)) / count            # [heads]
        var = jnp.where(allowed, (w - mean[None, :, None, None]) ** 2, 0.0).sum(
            axis=(0, 2, 3)) / count
        return jnp.sqrt(var).mean()
    return jnp.mean(jnp.stack([per_layer(w) for w in weights]))


def sharpening_kl(weights) -> jax.Array:
    """Mean ``KL(p || sg(p^2 / sum p^2))`` over layers, heads, examples and rows."""
    def per_layer(p):
        q = jax.lax.stop_gradient(p * p / jnp.maximum((p * p).sum(-1, keepdims=True), 1e-30))
        cross = -(p * jnp.log(jnp.where(q > 0, q, 1.0))).sum(-1)
        return (cross - row_entropy(p)).mean()
    return jnp.mean(jnp.stack([per_layer(w) for w in weights]))


REGULARIZERS.register("entropy", Regularizer(mean_entropy, "entropy_reg"))
REGULARIZERS.register("weight_std", Regularizer(weight_std, "weight_std_reg"))
REGULARIZERS.register("sharpen", Regularizer(sharpening_kl, "sharpen_reg"))
