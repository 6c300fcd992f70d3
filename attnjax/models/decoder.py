"""The ``decoder`` family (the default): a decoder-only language model trained on next-token
prediction, decoded token by token with a KV cache.

References: Vaswani et al. 2017 (post-norm block); Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners" (GPT-2, pre-norm decoder).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.data.padding import model_arguments
from attnjax.models.family import Family, scored_sums
from attnjax.nn.attention import Dropout
from attnjax.nn.transformer import (decoding_positions, embed_tokens, knockout_gates,
                                    output_logits, stack_blocks)
from attnjax.registry import MODELS


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
        head_gates = knockout_gates(cfg, head_gates)
        if token_mask is not None and decode:
            raise ValueError("token_mask (a padded batch) cannot be decoded with the KV cache")
        if positions is None:
            positions = decoding_positions(self, tokens, decode)
        x, embed = embed_tokens(self, cfg, tokens, positions)
        x = Dropout(cfg.residual_dropout)(x, deterministic=deterministic)
        x, weights = stack_blocks(cfg, x, positions, head_gates=head_gates,
                                  deterministic=deterministic, decode=decode,
                                  return_weights=return_weights, token_mask=token_mask)
        logits = output_logits(cfg, embed, x)
        aux = {"attn_weights": weights} if return_weights else {}
        return logits.astype(jnp.float32), aux


MODELS.register("decoder", Family(module=DecoderLM, arguments=model_arguments,
                                  sums=scored_sums, decodes=True))
