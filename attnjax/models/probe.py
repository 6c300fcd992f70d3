"""Probing a model's forward pass: the attention probabilities of every layer and the
per-head statistics of ``attnjax.ops.stats`` computed from them and from what the attention
modules sow (queries, keys, scales), and the hidden states every block sows: the attention
sub-layer's output ``attn_out`` (before the residual add) and the residual stream ``residual``
after the block. Jittable; used by the training diagnostics (``train.head_metrics``) and by the
analysis tools."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.models.family import build
from attnjax.nn.slots import visible_keys
from attnjax.nn.transformer import sown_by_layer
from attnjax.ops import stats

STATS = stats.WEIGHT_STATS + ("induction",) + stats.QK_STATS
STREAMS = ("attn_out", "residual")


def capture(model: ModelConfig, params, tokens, arguments=None) -> tuple[jax.Array, list[dict]]:
    """``(weights [layers, B, heads, T, T] float32, what each layer sowed)`` from one forward
    pass with ``return_weights`` (``sown_by_layer``: the attention module's values and the
    block's ``attn_out`` and ``residual``); ``arguments``: the model's keyword arguments of
    the batch (its family's ``arguments``: a padded batch's positions and mask, segments)."""
    (_, aux), state = build(model).apply({"params": params}, tokens, **(arguments or {}),
                                         return_weights=True, mutable=["intermediates"])
    weights = jnp.stack([w.astype(jnp.float32) for w in aux["attn_weights"]])
    return weights, sown_by_layer(state["intermediates"], model.num_layers)


def stream_weights(model: ModelConfig, params, tokens, arguments=None) -> dict[str, jax.Array]:
    """The attention weights a family returns besides its main self-attention's, by stream
    (``aux`` ``<stream>_weights``; an encoder–decoder's ``cross`` ``[layers, B, heads, T, S]``
    and ``encoder`` ``[layers, B, heads, S, S]``), float32; empty for the other families."""
    _, aux = build(model).apply({"params": params}, tokens, **(arguments or {}),
                                return_weights=True)
    return {name.removesuffix("_weights"): jnp.stack([w.astype(jnp.float32) for w in weights])
            for name, weights in aux.items() if name != "attn_weights" and weights}


def head_stat_arrays(model: ModelConfig, params, tokens, arguments=None) -> dict[str, jax.Array]:
    """The weight, induction and q/k statistics of every head, name -> ``[layers, heads]``,
    over the entries each query sees (``nn.slots.visible_keys``: causal or bidirectional, the
    pads of a padded batch excluded)."""
    arguments = arguments or {}
    weights, sown = capture(model, params, tokens, arguments)
    visible = visible_keys(model, tokens.shape[1], arguments.get("token_mask"))
    per_layer = [stats.qk_statistics(s["queries"], s["keys"], s["scale"], visible) for s in sown]
    return {**stats.weight_statistics(weights, visible),
            "induction": stats.induction_score(weights, tokens, visible),
            **{name: jnp.stack([s[name] for s in per_layer]) for name in stats.QK_STATS}}


def special_attention(model: ModelConfig, params, tokens, arguments, ids: dict) -> dict:
    """Per layer, the attention mass each query puts on each kind of special token, averaged
    over heads, examples and the real query rows: name -> ``[layers]``, for ``ids`` name ->
    token id (e.g. ``{"cls": 257, "sep": 258}``)."""
    weights, _ = capture(model, params, tokens, arguments)
    visible = visible_keys(model, tokens.shape[1], arguments.get("token_mask"))
    return {name: stats.attention_to(weights, tokens == token, visible).mean(-1)
            for name, token in ids.items()}


def capture_streams(model: ModelConfig, params, tokens, arguments=None) -> dict[str, jax.Array]:
    """``{"attn_out", "residual"}``, each ``[layers, B, T, d_model]`` float32, from one forward
    pass (the model's own kernel: no weights are materialised)."""
    _, state = build(model).apply({"params": params}, tokens, **(arguments or {}),
                                  mutable=["intermediates"])
    sown = sown_by_layer(state["intermediates"], model.num_layers)
    return {name: jnp.stack([s[name].astype(jnp.float32) for s in sown]) for name in STREAMS}


def stream_cosines(model: ModelConfig, params, tokens, arguments=None) -> dict[str, jax.Array]:
    """``stats.mean_pairwise_cosine`` of each stream per layer, name -> ``[layers]``:
    ``attn_out`` is SC10's "mean pairwise cosine of attention outputs across positions"."""
    return {name: stats.mean_pairwise_cosine(x)
            for name, x in capture_streams(model, params, tokens, arguments).items()}
