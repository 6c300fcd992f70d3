"""The ``encoder`` family: a BERT-style bidirectional encoder trained by masked-language
modelling, or with a classification head on its pooled output.

Embeddings: tokens (times ``token_scale``) + the absolute position encoding (if it adds one)
+ segment embeddings ``type_embed[segment_ids]`` (``model.type_vocab_size > 0``), then a
LayerNorm (``model.embed_norm``) and dropout. ``num_layers`` blocks of bidirectional
self-attention (pre- or post-norm; a padded batch's pads hidden as keys by the
``token_mask``), the final norm when pre-norm. Outputs:

- ``classifier='none'``, masked-language-model logits ``[B, T, V]``: BERT's prediction head
  ``LayerNorm(gelu(W h + b)) @ E^T + bias`` (``E`` the token embedding, or an ``unembed`` of
  its own when untied);
- ``classifier='cls'`` or ``'mean'``, class logits ``[B, num_classes]``: the [CLS] token's
  state (the real token at position 0) or the mean over the real tokens, through BERT's pooler
  ``tanh(W h + b)`` and a dense layer;
- ``classifier='hidden'``, the last hidden states ``[B, T, d_model]`` (a pretrained
  ``BertModel``'s output, e.g. a sentence-embedding model's), in place of logits: nothing to
  train or evaluate, everything to analyse.

References: Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding".
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.data.encoder import encoder_specials
from attnjax.models.family import Family, mean_pool, scored_sums
from attnjax.nn import axes
from attnjax.nn.attention import Dropout
from attnjax.nn.slots import make_norm
from attnjax.nn.transformer import embed_tokens, knockout_gates, output_logits, stack_blocks
from attnjax.ops.dense import dense_dot_general
from attnjax.registry import MODELS

ARGUMENTS = ("positions", "token_mask", "segment_ids")   # what a batch hands the model


def encoder_arguments(batch: dict) -> dict:
    """The module's keyword arguments of a batch: positions and token mask (padded) and the
    segment ids."""
    return {key: batch[key] for key in ARGUMENTS if key in batch}


class MaskedLMHead(nn.Module):
    """``LayerNorm(gelu(W h + b)) @ E^T + bias`` (BERT's ``cls.predictions``)."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x, embed):
        cfg = self.config
        x = nn.Dense(cfg.d_model, dtype=jnp.dtype(cfg.dtype), name="transform",
                     dot_general=dense_dot_general,
                     **axes.dense(("embed", "embed_out"), ("norm",)))(x)
        x = nn.gelu(x, approximate=cfg.mlp == "gelu")
        x = make_norm(cfg, "transform_norm", "layer")(x)
        bias = self.param("bias", axes.with_axes(nn.initializers.zeros, "vocab"),
                          (cfg.vocab_size,), jnp.float32)
        return output_logits(cfg, embed, x) + bias.astype(x.dtype)


class Classifier(nn.Module):
    """``W_c tanh(W_p pooled + b_p) + b_c``, ``pooled`` the [CLS] state or the mean of the
    real tokens' states."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x, positions, token_mask):
        cfg = self.config
        real = (jnp.ones(x.shape[:2], bool) if token_mask is None
                else jnp.asarray(token_mask, bool))
        if cfg.classifier == "cls":                  # the real token at position 0
            chosen = real & (jnp.broadcast_to(positions, x.shape[:2]) == 0)
        else:
            chosen = real
        pooled = mean_pool(x, chosen)
        pooled = jnp.tanh(nn.Dense(cfg.d_model, dtype=jnp.dtype(cfg.dtype), name="pooler",
                                   dot_general=dense_dot_general,
                                   **axes.dense(("embed", "embed_out"), ("norm",)))(pooled))
        return nn.Dense(cfg.num_classes, dtype=jnp.dtype(cfg.dtype), name="out",
                        dot_general=dense_dot_general,
                        **axes.dense(("embed", "classes"), ("classes",)))(pooled)


class EncoderModel(nn.Module):
    """The encoder of the module docstring.

    ``positions`` ``[B|1, T]`` default to ``arange(T)``; ``token_mask`` ``[B, T]`` (a padded
    batch) is True at real tokens, and the pads are then hidden as keys (with
    ``attention.key_padding_mask``), so a real token's outputs are those of its example alone;
    ``segment_ids`` ``[B, T]`` (default 0) pick the segment embeddings. ``head_gates`` and
    ``attention.knockout`` gate heads as in the decoder. Returns ``(logits, aux)`` with
    ``aux["attn_weights"]`` (``[B, heads, T, T]`` per layer) under ``return_weights``.
    """
    config: ModelConfig

    @nn.compact
    def __call__(self, tokens, positions=None, *, segment_ids=None, token_mask=None,
                 deterministic: bool = True, decode: bool = False, return_weights: bool = False,
                 head_gates=None):
        cfg = self.config
        if decode:
            raise ValueError(f"model.family={cfg.family!r} is bidirectional and cannot be "
                             "decoded token by token")
        if positions is None:
            positions = jnp.arange(tokens.shape[1])[None, :]
        x, embed = embed_tokens(self, cfg, tokens, positions)
        if cfg.type_vocab_size:
            segments = jnp.zeros_like(tokens) if segment_ids is None else segment_ids
            x = x + nn.Embed(cfg.type_vocab_size, cfg.d_model, embedding_init=axes.with_axes(
                             nn.initializers.normal(cfg.embed_init_std), "types", "embed"),
                             name="type_embed")(segments).astype(x.dtype)
        if cfg.embed_norm:
            x = make_norm(cfg, "embed_norm", "layer")(x)
        x = Dropout(cfg.residual_dropout)(x, deterministic=deterministic)
        x, weights = stack_blocks(cfg, x, positions, head_gates=knockout_gates(cfg, head_gates),
                                  deterministic=deterministic, return_weights=return_weights,
                                  token_mask=token_mask)
        if cfg.classifier == "none":
            logits = MaskedLMHead(cfg, name="mlm_head")(x, embed)
        elif cfg.classifier == "hidden":
            logits = x
        else:
            logits = Classifier(cfg, name="classifier")(x, positions, token_mask)
        aux = {"attn_weights": weights} if return_weights else {}
        return logits.astype(jnp.float32), aux


OBJECTIVES = {"none": "mlm", "hidden": "embedding"}     # classifier -> objective; else classes


def encoder_sums(outputs, batch: dict) -> dict:
    """``scored_sums``; for hidden-state outputs with ``batch["reference"]`` ``[B, d]`` (the
    sentence embeddings of the model as it is; head analysis adds them), the drift of each
    sentence embedding (``mean_pool``) from its reference: ``ce`` sums ``1 - cos``,
    ``correct`` sums ``cos``, one weight per example."""
    if "reference" not in batch:
        return scored_sums(outputs, batch)
    pooled = mean_pool(outputs, batch.get("token_mask"))
    reference = batch["reference"]
    cos = jnp.clip((pooled * reference).sum(-1) / (jnp.linalg.norm(pooled, axis=-1)
                                                   * jnp.linalg.norm(reference, axis=-1)),
                   -1.0, 1.0)                       # rounding: the drift is never below 0
    zero = jnp.zeros((), jnp.float32)
    return {"ce": (1.0 - cos).sum(), "z": zero, "correct": cos.sum(),
            "weight": jnp.asarray(cos.shape[0], jnp.float32)}


def _check(config: ModelConfig):
    if not config.attention.causal:
        raise ValueError(f"model.attention.causal=False means nothing with family="
                         f"{config.family!r}: its self-attention is bidirectional already")
    if config.attention.causal_offset:
        raise ValueError(f"model.attention.causal_offset={config.attention.causal_offset} "
                         f"means nothing with family={config.family!r} (no causal mask)")


def _marked(data) -> dict:
    """[CLS] and [SEP] of the data's vocabulary."""
    specials = encoder_specials(data)
    return {"cls": specials.cls, "sep": specials.sep}


MODELS.register("encoder", Family(
    module=EncoderModel, arguments=encoder_arguments, sums=encoder_sums, decodes=False,
    reads=("type_vocab_size", "embed_norm", "classifier", "num_classes"), causal=False,
    check=_check, marked=_marked,
    objective=lambda config: OBJECTIVES.get(config.classifier, "classification")))
