"""The ``decoder`` family (the default): a decoder-only language model trained on next-token
prediction, decoded token by token with a KV cache.

References: Vaswani et al. 2017 (post-norm block); Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners" (GPT-2, pre-norm decoder).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.data.padding import model_arguments
from attnjax.models.family import Family
from attnjax.nn.attention import Dropout
from attnjax.nn.slots import make_norm
from attnjax.nn.transformer import (VOCAB_PARAMS, Block, added_positions, knockout_gates,
                                    token_scale)
from attnjax.registry import MODELS, POSITIONS


def next_token_sums(logits: jax.Array, batch: dict) -> dict:
    """Weighted sums over a batch of next-token predictions (``targets`` the inputs shifted by
    one, ``weights`` 0 where not scored): cross-entropy, ``log^2 Z``, correct predictions,
    weight."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
    w = batch["weights"]
    return {"ce": ((logz - target_logit) * w).sum(), "z": (logz**2 * w).sum(),
            "correct": ((jnp.argmax(logits, -1) == batch["targets"]) * w).sum(), "weight": w.sum()}


class DecoderLM(nn.Module):
    """Token embedding (+ absolute positions), ``num_layers`` blocks, final norm, logits.

    ``positions`` default to ``arange(T)``; with ``decode=True`` they continue from the
    number of tokens already decoded (a counter in the ``cache`` collection).

    ``head_gates`` ``[num_layers, num_heads]`` multiplies each head's output before its
    layer's output projection (see ``MultiHeadAttention``); the heads listed in
    ``attention.knockout`` are gated to 0 on top, in training and evaluation alike. With no
    gates and no knockout nothing is multiplied (the computation is exactly the ungated one).

    ``token_mask`` ``[B, T]`` (a padded batch, see ``attnjax.data.padding``) is True at real
    tokens and False at pads; ``positions`` ``[B, T]`` then number each example's real tokens
    0..n-1 wherever its pads are. Every layer's attention gets the positions (for its masks
    and biases) and, with ``attention.key_padding_mask``, the key-padding mask: query i sees
    key j only where ``token_mask[i] == token_mask[j]`` (and causally, unless
    ``attention.causal=False``), so a real token never sees a pad and its logits are those of
    the unpadded sequence; a pad sees pads only, so no row is empty. With
    ``key_padding_mask=False`` the pads stay visible (the ablation). ``None``: unpadded.
    """
    config: ModelConfig

    @nn.compact
    def __call__(self, tokens, positions=None, *, deterministic: bool = True,
                 decode: bool = False, return_weights: bool = False, head_gates=None,
                 token_mask=None):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        head_gates = knockout_gates(cfg, head_gates)
        if token_mask is not None and decode:
            raise ValueError("token_mask (a padded batch) cannot be decoded with the KV cache")
        if positions is None:
            offset = 0
            if decode:
                initialized = self.has_variable("cache", "position")
                counter = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
                if initialized:
                    offset = counter.value
                    counter.value = offset + tokens.shape[1]
            positions = (offset + jnp.arange(tokens.shape[1]))[None, :]
        embed = nn.Embed(cfg.vocab_size, cfg.d_model,
                         embedding_init=nn.initializers.normal(cfg.embed_init_std),
                         name=VOCAB_PARAMS[0])
        position = POSITIONS.get(cfg.position.kind)
        x = embed(tokens).astype(dtype) * token_scale(cfg)
        if position.embed is not None:
            x = x + added_positions(self, position.embed(self, positions, cfg).astype(dtype), cfg)
        x = Dropout(cfg.residual_dropout)(x, deterministic=deterministic)
        weights = []
        for i in range(cfg.num_layers):
            x, w = Block(cfg, name=f"block_{i}")(
                x, positions, deterministic=deterministic, decode=decode,
                return_weights=return_weights,
                head_gates=None if head_gates is None else head_gates[i], token_mask=token_mask)
            weights.append(w)
        if cfg.norm_position == "pre":
            x = make_norm(cfg, "final_norm")(x)
        if cfg.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=dtype, name=VOCAB_PARAMS[1])(x)
        aux = {"attn_weights": tuple(weights)} if return_weights else {}
        return logits.astype(jnp.float32), aux


MODELS.register("decoder", Family(module=DecoderLM, arguments=model_arguments,
                                  sums=next_token_sums, decodes=True))
