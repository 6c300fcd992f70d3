"""Named points of a forward pass, where values can be captured and replaced.

Every attention module and block passes what it computes through ``point(module, name,
value)``. A point's full name is its module's path and its own name, dotted:
``block_1.attention.z``, ``block_0.cross_attention.probs``, ``encoder.block_2.resid_post``.

Attention modules (self- and cross-attention; ``ATTENTION_POINTS``):

    q               [B, T, N, H]  queries, after qk-norm and the position rotation
    k, v            [B, S, K, H]  keys (likewise) and values, K key/value heads
    scores          [B, N, T, S]  scaled logits (soft-capped, plus any position bias)
    masked_scores   [B, N, T, S]  the same with the pairs a query cannot see at the mask fill
    probs           [B, N, T, S]  the attention probabilities (before dropout)
    z               [B, T, N, D]  each head's output, before head gates and the output projection

Blocks (``BLOCK_POINTS``): ``resid_pre`` (the block's input), ``resid_mid`` (after its
attention sub-layers, before the MLP) and ``resid_post`` (its output), ``[B, T, d_model]``.

Two variable collections given to ``apply`` select points by their structure, which is
static: ``select`` (any marker at a point) sows the point's value into the ``capture``
collection; ``patch`` (``{"where", "value", "add"}`` at a point, arrays broadcastable to it)
replaces the value by ``where(where, value_patch, value) + add`` before anything reads it
(and before it is captured). Without them the forward pass is exactly the ordinary one: no
value is kept and nothing is added to the computation. ``scores``, ``masked_scores`` and
``probs`` exist in the ``reference`` kernel only, which a module selecting or patching them
runs instead of its own (every exact kernel computes the same function). Points are inactive
while decoding with a cache.

References: Nanda and Bloom 2022, TransformerLens (hook points); penzai (named
interventions in JAX).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

ATTENTION_POINTS = ("q", "k", "v", "scores", "masked_scores", "probs", "z")
BLOCK_POINTS = ("resid_pre", "resid_mid", "resid_post")
KERNEL_POINTS = ("scores", "masked_scores", "probs")       # inside the reference kernel
SELECT, PATCH, CAPTURE = "select", "patch", "capture"


def point(module: nn.Module, name: str, value):
    """``value`` at the point ``name`` of ``module``: patched if ``patch`` holds it, sown into
    ``capture`` if ``select`` does (see the module docstring)."""
    if module.has_variable(PATCH, name):
        patch = module.get_variable(PATCH, name)
        value = (jnp.where(patch["where"], jnp.asarray(patch["value"], value.dtype), value)
                 + jnp.asarray(patch["add"], value.dtype))
    if module.has_variable(SELECT, name):
        module.sow(CAPTURE, name, value)
    return value


def touched(module: nn.Module, names) -> bool:
    """Whether any point of ``names`` of ``module`` is selected or patched."""
    return any(module.has_variable(collection, name)
               for collection in (SELECT, PATCH) for name in names)
