"""Probing a model's forward pass: the attention probabilities of every layer and the
per-head statistics of ``attnjax.ops.stats`` computed from them and from what the attention
modules sow (queries, keys, scales). Jittable; used by the training diagnostics
(``train.head_metrics``) and by the analysis tools."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.nn.transformer import DecoderLM, sown_by_layer
from attnjax.ops import stats

STATS = stats.WEIGHT_STATS + ("induction",) + stats.QK_STATS


def capture(model: ModelConfig, params, tokens) -> tuple[jax.Array, list[dict]]:
    """``(weights [layers, B, heads, T, T] float32, what each layer sowed)`` from one forward
    pass with ``return_weights``."""
    (_, aux), state = DecoderLM(model).apply({"params": params}, tokens, return_weights=True,
                                             mutable=["intermediates"])
    weights = jnp.stack([w.astype(jnp.float32) for w in aux["attn_weights"]])
    return weights, sown_by_layer(state["intermediates"], model.num_layers)


def head_stat_arrays(model: ModelConfig, params, tokens) -> dict[str, jax.Array]:
    """The weight, induction and q/k statistics of every head, name -> ``[layers, heads]``."""
    weights, sown = capture(model, params, tokens)
    per_layer = [stats.qk_statistics(s["queries"], s["keys"], s["scale"]) for s in sown]
    return {**stats.weight_statistics(weights), "induction": stats.induction_score(weights, tokens),
            **{name: jnp.stack([s[name] for s in per_layer]) for name in stats.QK_STATS}}
