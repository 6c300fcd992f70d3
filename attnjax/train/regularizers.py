"""Attention regularisers: terms of the training objective computed from the attention
probabilities, each one entry of ``attnjax.registry.REGULARIZERS`` with one coefficient in
``train`` (0 = off; the sign picks the direction). Each term reads the probabilities ``w`` of
every layer ``[B, heads, T, S]`` and the mask they were computed under, ``visible`` (bool,
broadcastable to ``[B, heads, T, S]``, True where query i may see key j; ``ops.masks.visibility``
builds it; None: the causal mask ``j <= i + (S - T)``, for weights computed under it, as in
``ops.stats``), and only the visible entries: a hidden entry gets no gradient, a padded query
(an all-False row) and a padded key (an all-False column) drop out. A mean over layers, heads,
examples and the query rows that see a key of:

- ``entropy`` (``train.entropy_reg``): the row entropy ``-sum_j p_ij log p_ij``; a positive
  coefficient sharpens attention, a negative one spreads it.
- ``weight_std`` (``train.weight_std_reg``): per head, the standard deviation of its weights
  over the visible entries, averaged over heads; a negative coefficient rewards peaked, uneven
  heads.
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

from attnjax.ops.stats import (counted_rows, masked_mean, masked_weights, mean_entropy,
                               row_entropy, visible_or_causal)
from attnjax.registry import REGULARIZERS


class Regularizer(NamedTuple):
    term: Callable          # (tuple of [B, heads, T, S] probabilities, visible=None) -> scalar
    coefficient: str        # the TrainConfig field that weighs it


def weight_std(weights, visible=None) -> jax.Array:
    """Mean over layers and heads of the std of a head's visible weights (population std over
    the examples' visible entries)."""
    def per_layer(w):
        shown = visible_or_causal(visible, *w.shape[-2:])
        shown = shown[(None,) * (4 - shown.ndim)]                                # [B|1,N|1,T,S]
        # visible entries per head, a scalar when the mask has no head axis (as the causal
        # default): XLA divides by a scalar through its reciprocal, and the default's float32
        # bits depend on that
        count = jnp.broadcast_to(shown, (w.shape[0], shown.shape[1], *w.shape[2:])).sum(
            axis=(0, 2, 3)).squeeze()
        mean = jnp.where(shown, w, 0.0).sum(axis=(0, 2, 3)) / count
        var = jnp.where(shown, (w - mean[None, :, None, None]) ** 2, 0.0).sum(
            axis=(0, 2, 3)) / count
        return jnp.sqrt(var).mean()
    return jnp.mean(jnp.stack([per_layer(w) for w in weights]))


def sharpening_kl(weights, visible=None) -> jax.Array:
    """Mean ``KL(p || sg(p^2 / sum p^2))`` over layers, heads, examples and counted rows, each
    row over its visible keys."""
    def per_layer(w):
        p, shown = masked_weights(w, visible)
        q = jax.lax.stop_gradient(p * p / jnp.maximum((p * p).sum(-1, keepdims=True), 1e-30))
        cross = -(p * jnp.log(jnp.where(q > 0, q, 1.0))).sum(-1)
        return masked_mean(cross - row_entropy(p), counted_rows(shown))
    return jnp.mean(jnp.stack([per_layer(w) for w in weights]))


REGULARIZERS.register("entropy", Regularizer(mean_entropy, "entropy_reg"))
REGULARIZERS.register("weight_std", Regularizer(weight_std, "weight_std_reg"))
REGULARIZERS.register("sharpen", Regularizer(sharpening_kl, "sharpen_reg"))
