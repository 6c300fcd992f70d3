"""The ``seq2seq`` family: an encoder–decoder (Vaswani et al. 2017) trained by teacher forcing
on a source sequence and its target (``attnjax.data.seq2seq``).

The encoder (``encoder/``): the source's token embeddings (+ its absolute position encoding),
``encoder_layers`` bidirectional blocks with the source's pads hidden as keys, and, pre-norm,
its final norm. The decoder (the top level, so its blocks are ``block_i`` as in the decoder
family and every per-layer tool reads them): the target's embeddings, ``num_layers`` blocks of
causal self-attention, cross-attention over the encoder's output (the source's pads hidden)
and the MLP, each sub-layer with its norm placement, then the logits. ``share_embeddings``:
one token embedding ``embed`` for source, target and (tied) output, as in T5; else the
encoder's own ``encoder/embed``. Relative position encodings act in self-attention only
(``MultiHeadAttention``'s cross-attention has none).

The objective is the next target token's cross-entropy at the real target tokens
(``weights``), the source and target both padded. ``exact`` counts the examples whose every
target token is the argmax under teacher forcing, which is exactly the examples that greedy
decoding reproduces (if every step's argmax given the gold prefix is the gold token, greedy
decoding feeds back the gold prefix; if greedy decoding returns the gold sequence, each of
its steps was such an argmax).

References: Vaswani et al. 2017, "Attention Is All You Need"; Raffel et al. 2020, "Exploring
the Limits of Transfer Learning with a Unified Text-to-Text Transformer" (shared embeddings,
no position bias in cross-attention).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.config.fields import derive
from attnjax.config.kernel import kernel_request
from attnjax.models.family import Family, scored_sums
from attnjax.nn.attention import Dropout
from attnjax.nn.transformer import (decoding_positions, embed_tokens, knockout_gates,
                                    output_logits, stack_blocks, token_embedding)
from attnjax.ops.stats import argmax_hits
from attnjax.registry import MODELS

ARGUMENTS = ("source", "source_mask")   # what a batch hands the model besides its inputs


def seq2seq_arguments(batch: dict) -> dict:
    return {key: batch[key] for key in ARGUMENTS if key in batch}


SEQ2SEQ_FIELDS = ("encoder_layers", "encoder_position", "cross_heads", "cross_int8",
                  "share_embeddings")


def encoder_config(config: ModelConfig) -> ModelConfig:
    """The encoder stack's config: the same fields, under the bidirectional ``encoder``
    family (so causality, windows and T5 buckets are bidirectional), ``encoder_layers``
    blocks, ``encoder_position`` encoding (derived, so traced hyperparameters pass through;
    the family's check validates it)."""
    position = derive(config.position, kind=config.encoder_position or config.position.kind)
    return derive(config, family="encoder", position=position,
                  num_layers=config.encoder_layers or config.num_layers, **_unset(config))


def cross_config(config: ModelConfig) -> ModelConfig:
    """The cross-attention's config: ``cross_heads`` heads (each of width ``d_model /
    cross_heads`` unless ``attention.head_dim`` is set), as many key/value heads, no
    knockout, ``cross_int8`` (None: the self-attention's ``int8``); the rest as the
    self-attention's. A plain ``decoder``-family config of the same fields (cross-attention
    reads its attention, width and dtype: no mask, no position)."""
    heads = config.cross_heads or config.attention.num_heads
    attention = derive(config.attention, num_heads=heads, knockout=(),
                       num_kv_heads=None if config.cross_heads else config.attention.num_kv_heads,
                       int8=config.cross_int8 or config.attention.int8)
    return derive(config, family="decoder", attention=attention, **_unset(config))


def _unset(config: ModelConfig) -> dict:
    """The seq2seq fields at their defaults (a stack's config is a plain one)."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    return {name: fields[name].default for name in SEQ2SEQ_FIELDS}


class SourceEncoder(nn.Module):
    """The encoder: ``(states [B, S, d_model], weights per layer)`` of ``source`` ``[B, S]``
    with ``source_mask`` ``[B, S]`` (True at real tokens; None: all real); ``head_gates``
    ``[layers, heads]`` gate its heads."""
    config: ModelConfig               # the encoder_config
    embed: nn.Module | None = None    # the shared token embedding, or None for its own

    @nn.compact
    def __call__(self, source, source_mask=None, *, deterministic=True, return_weights=False,
                 head_gates=None):
        cfg = self.config
        positions = jnp.arange(source.shape[1])[None, :]
        x, _ = embed_tokens(self, cfg, source, positions, embed=self.embed)
        x = Dropout(cfg.residual_dropout)(x, deterministic=deterministic)
        return stack_blocks(cfg, x, positions, head_gates=head_gates,
                            deterministic=deterministic, return_weights=return_weights,
                            token_mask=source_mask)


class Seq2SeqModel(nn.Module):
    """The encoder–decoder of the module docstring.

    ``__call__(inputs, source=..., source_mask=...)``: logits ``[B, T, vocab]`` of the target
    ``inputs`` ``[B, T]`` given the source; ``aux`` under ``return_weights``: ``attn_weights``
    (the decoder's self-attention, per layer), ``cross_weights`` ``[B, heads, T, S]`` and
    ``encoder_weights`` per layer. ``encode=True``: only the encoder's states. ``encoded``
    (states the encoder returned) skips the encoder. With ``decode=True`` the decoder runs
    token by token: a call with ``encoded`` fills every layer's static cross-attention cache,
    the later calls pass neither ``source`` nor ``encoded`` and only read it. At
    initialisation without a source the inputs stand in for it (shapes only).
    ``head_gates`` ``[num_layers, num_heads]`` gate the decoder's self-attention heads,
    ``group_gates["cross"]`` ``[num_layers, cross heads]`` the cross-attention's and
    ``group_gates["encoder"]`` ``[encoder layers, num_heads]`` the encoder's
    (``attention.knockout`` gates the decoder's self-attention heads only).
    """
    config: ModelConfig

    @nn.compact
    def __call__(self, inputs, positions=None, *, source=None, source_mask=None, encoded=None,
                 encode: bool = False, deterministic: bool = True, decode: bool = False,
                 return_weights: bool = False, head_gates=None, group_gates=None):
        cfg = self.config
        if source is None and encoded is None and not decode:
            if not self.is_initializing() or encode:
                raise ValueError("a seq2seq model needs the source sequence (source=...)")
            source = inputs
        embed = token_embedding(cfg)
        encoder = SourceEncoder(encoder_config(cfg), embed if cfg.share_embeddings else None,
                                name="encoder")
        encoder_weights = None
        if encoded is None and source is not None:
            encoded, encoder_weights = encoder(source, source_mask, deterministic=deterministic,
                                               return_weights=return_weights,
                                               head_gates=(group_gates or {}).get("encoder"))
        if encode:
            return encoded
        if positions is None:
            positions = decoding_positions(self, inputs, decode)
        x, _ = embed_tokens(self, cfg, inputs, positions, embed=embed)
        x = Dropout(cfg.residual_dropout)(x, deterministic=deterministic)
        x, weights = stack_blocks(cfg, x, positions, head_gates=knockout_gates(cfg, head_gates),
                                  cross_attention=cross_config(cfg),
                                  cross_gates=(group_gates or {}).get("cross"),
                                  deterministic=deterministic,
                                  decode=decode, return_weights=return_weights,
                                  source=encoded, source_mask=source_mask)
        logits = output_logits(cfg, embed, x).astype(jnp.float32)
        if not return_weights:
            return logits, {}
        return logits, {"attn_weights": tuple(w[0] for w in weights),
                        "cross_weights": tuple(w[1] for w in weights),
                        "encoder_weights": encoder_weights}


def seq2seq_sums(logits, batch: dict) -> dict:
    """``scored_sums`` and ``exact`` (examples whose every target is the argmax; see the module
    docstring) over ``examples`` (those with a target)."""
    sums = scored_sums(logits, batch)
    scored = batch["weights"] > 0
    right = (logits.argmax(-1) == batch["targets"]) | ~scored
    return {**sums, "exact": right.all(-1).sum().astype(jnp.float32),
            "examples": scored.any(-1).sum().astype(jnp.float32)}


def seq2seq_scores(logits, aux, batch: dict) -> dict:
    """``aligned`` ``[layers, heads]``: per cross-attention head, the target tokens whose largest
    weight is on their gold source position (``ops.stats.argmax_hits`` of ``alignment``), over
    ``aligned_weight``, the target tokens that have one; the evaluation reports the best
    head's share as ``alignment``."""
    hits, count = argmax_hits(jnp.stack(aux["cross_weights"]), batch["alignment"],
                              batch["weights"] > 0)
    return {"aligned": hits, "aligned_weight": count}


def _check(config: ModelConfig):
    if not config.attention.causal:
        raise ValueError(f"model.attention.causal=False means nothing with family="
                         f"{config.family!r}: its decoder is causal to decode and its encoder "
                         "bidirectional")
    heads = config.cross_heads
    if heads and config.attention.head_dim is None and config.d_model % heads:
        raise ValueError(f"model.cross_heads={heads} must divide d_model={config.d_model} (or "
                         "set model.attention.head_dim)")
    dataclasses.replace(encoder_config(config))            # validated: the stacks' refusals
    kernel_request(dataclasses.replace(cross_config(config)), padded=True, cross=True)


MODELS.register("seq2seq", Family(
    module=Seq2SeqModel, arguments=seq2seq_arguments, sums=seq2seq_sums, decodes=False,
    reads=SEQ2SEQ_FIELDS, check=_check,
    objective=lambda config: "seq2seq", scores=seq2seq_scores,
    head_groups=lambda config: {
        "cross": (config.num_layers, config.cross_heads or config.attention.num_heads),
        "encoder": (config.encoder_layers or config.num_layers, config.attention.num_heads)},
    ratios=(("exact_match", "exact", "examples"), ("alignment", "aligned", "aligned_weight"))))
