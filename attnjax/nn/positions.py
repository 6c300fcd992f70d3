"""Position encodings as registry entries: where each one acts, and how.

An entry fills at most three hooks where it acts (see ``PositionEncoding``): ``embed`` adds
to the token embeddings (absolute encodings), ``rotate`` transforms q and k (rotary), ``bias``
returns a score-bias function of positions (ALiBi, T5); and the hooks others read:
``check`` (settings it cannot honour), ``similarity`` (what analysis reports), ``reads`` (its
own ``model.position`` fields) and ``tables`` (its lookup-table parameters). The math is in
``attnjax.ops.positions``; these hooks only own parameters and read the config. Adding an
encoding = one ops function, one ``POSITIONS.register`` call here, and its config fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from attnjax.config import ModelConfig
from attnjax.nn.axes import with_axes
from attnjax.ops import positions as P
from attnjax.ops.stats import cosine
from attnjax.registry import POSITIONS


class PositionEncoding(NamedTuple):
    """Hooks; ``None`` = this encoding does not act there.

    embed(module, positions [B|1, T], config) -> [B|1, T, d_model], called in the embedding.
    rotate(q, k, q_positions, k_positions, config) -> (q, k), on BTNH arrays.
    bias(module, config) -> fn(q_positions, k_positions) -> [B|1, N, tq, tk].
    check(config, lengths) -> None: raise ValueError (naming the config field) for settings
      the encoding cannot honour, with ``lengths`` the input lengths the model will see
      (training and evaluation), so they fail when the config is built.
    decode_check(config) -> None: the same for decoding with a KV cache.
    similarity(config, params, p) -> [layers, heads]: how alike the encoding makes positions
      0 and p < max_length (see ``attnjax.analysis.diagnostics``); ``None``: NaN.
    token_scale(config) -> float: the default factor on the token embeddings when it is used
      (``model.embed_scale`` overrides it); ``None``: 1.
    reads: the ``model.position`` fields only this encoding reads (refused for others).
    tables: names of the parameters it owns that are lookup tables, not matmuls.
    """
    embed: Callable | None = None
    rotate: Callable | None = None
    bias: Callable | None = None
    check: Callable | None = None
    decode_check: Callable | None = None
    similarity: Callable | None = None
    token_scale: Callable | None = None
    reads: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()


def _layers_heads(config: ModelConfig, values) -> np.ndarray:
    """``values`` (a scalar, ``[heads]`` or ``[layers, heads]``) as ``[layers, heads]``."""
    shape = (config.num_layers, config.attention.num_heads)
    return np.broadcast_to(np.asarray(values, np.float64), shape).copy()


def _sinusoidal_embed(module: nn.Module, positions, config: ModelConfig):
    return P.sinusoidal_embedding(positions, config.d_model)


def _check_sinusoidal(config: ModelConfig, lengths):
    if config.d_model % 2:
        raise ValueError(f"model.d_model={config.d_model} must be even for sinusoidal positions")


def _learned_embed(module: nn.Module, positions, config: ModelConfig):
    """Learned table of ``max_length`` rows. Longer inputs are refused, or, with
    ``position.learned_interpolate``, read from the table stretched linearly to the input
    length (position p reads row p * (L - 1) / (T - 1))."""
    length = config.max_length
    table = module.param("position_embedding",
                         with_axes(nn.initializers.normal(0.02), "position", "embed"),
                         (length, config.d_model))
    needed = positions.shape[-1]
    if needed <= length:
        return jnp.take(table, positions, axis=0)
    if not config.position.learned_interpolate:
        raise ValueError(f"input length {needed} exceeds model.max_length={length} of the learned "
                         "position table; set model.position.learned_interpolate=true to "
                         "interpolate it")
    where = positions * ((length - 1) / (needed - 1))
    low = jnp.floor(where).astype(jnp.int32)
    high = jnp.minimum(low + 1, length - 1)
    frac = (where - low)[..., None]
    return (1 - frac) * jnp.take(table, low, axis=0) + frac * jnp.take(table, high, axis=0)


def _sinusoidal_similarity(config: ModelConfig, params, offset: int):
    """Cosine of the embedding vectors of positions 0 and p."""
    e = np.asarray(P.sinusoidal_embedding(jnp.asarray([0, offset]), config.d_model))
    return _layers_heads(config, cosine(e[0], e[1]))


def _check_learned(config: ModelConfig, lengths):
    longer = [n for n in lengths if n > config.max_length]
    if longer and not config.position.learned_interpolate:
        raise ValueError(f"data.eval_lengths: {longer[0]} exceeds model.max_length="
                         f"{config.max_length}, the rows of the learned position table; set "
                         "model.position.learned_interpolate=true to interpolate it")


def _learned_similarity(config: ModelConfig, params, offset: int):
    """Cosine of the learned embedding vectors of positions 0 and p."""
    table = np.asarray(params["position_embedding"])
    return _layers_heads(config, cosine(table[0], table[offset]))


def _rope_settings(config: ModelConfig) -> dict:
    """``apply_rope``'s keyword arguments from ``model.position``."""
    pos = config.position
    return dict(base=pos.rope_base, rotary_fraction=pos.rope_fraction, schedule=pos.rope_scaling,
                scale=pos.rope_scale, train_length=pos.train_length or config.max_length,
                low_freq_factor=pos.rope_low_freq_factor,
                high_freq_factor=pos.rope_high_freq_factor)


def _rope_rotate(q, k, q_positions, k_positions, config: ModelConfig):
    settings = _rope_settings(config)
    return P.apply_rope(q, q_positions, **settings), P.apply_rope(k, k_positions, **settings)


def _check_rope(config: ModelConfig, lengths):
    pos = config.position
    try:
        rotary_dim = P.rope_rotary_dim(config.head_dim, pos.rope_fraction)
    except ValueError:
        raise ValueError(f"model.position.rope_fraction={pos.rope_fraction} leaves fewer than 2 "
                         f"rotary features of head_dim={config.head_dim}") from None
    if pos.rope_scaling in ("ntk", "dynamic_ntk") and rotary_dim < 4:
        raise ValueError(f"model.position.rope_scaling={pos.rope_scaling!r} needs >= 4 rotary "
                         "features (raise rope_fraction or head_dim)")


def _decode_rope(config: ModelConfig):
    if config.position.rope_scaling == "dynamic_ntk":
        raise ValueError("model.position.rope_scaling='dynamic_ntk' cannot decode with a KV "
                         "cache: its frequencies change with the length, so the cached keys "
                         "were rotated with other frequencies than a full forward would use; "
                         "use 'ntk' with rope_scale set to the final length / train_length")


def _rope_similarity(config: ModelConfig, params, offset: int):
    """``tr(R_p) / head_dim``: the cosine between a vector rotated to position 0 and the same
    vector rotated to p, averaged over directions (an attention factor cancels in the
    ratio); the same for every head."""
    H = config.head_dim
    basis = jnp.broadcast_to(jnp.eye(H, dtype=jnp.float32), (1, 2, H, H))   # heads = e_i
    rotated = np.asarray(P.apply_rope(basis, jnp.asarray([0, offset]),
                                      **_rope_settings(config)), np.float64)[0]
    # rows are R_0 e_i and R_p e_i: sum_i their dot products = tr(R_p)
    return _layers_heads(config, np.sum(rotated[0] * rotated[1]) /
                         np.sum(rotated[0] * rotated[0]))


def _alibi_bias(module: nn.Module, config: ModelConfig):
    slopes = jnp.asarray(P.alibi_slopes(config.attention.num_heads), jnp.float32)
    return lambda q_pos, k_pos: P.alibi_bias(slopes, q_pos, k_pos)


def _alibi_similarity(config: ModelConfig, params, offset: int):
    """``exp(-m_h p)``: the factor the bias alone puts on a key p tokens back, per head."""
    return _layers_heads(config, np.exp(-P.alibi_slopes(config.attention.num_heads) * offset))


def _t5_bias(module: nn.Module, config: ModelConfig):
    pos = config.position
    table = module.param("relative_bias", with_axes(nn.initializers.normal(0.02), "buckets",
                                                    "heads"),
                         (pos.t5_num_buckets, config.attention.num_heads))
    return lambda q_pos, k_pos: P.t5_bias(table, q_pos, k_pos, bidirectional=not config.causal,
                                          num_buckets=pos.t5_num_buckets,
                                          max_distance=pos.t5_max_distance)


def _t5_similarity(config: ModelConfig, params, offset: int):
    """``exp(b_h(-p) - b_h(0))`` from each layer's bucket table, per head."""
    pos = config.position
    buckets = np.asarray(P.t5_relative_position_bucket(
        jnp.asarray([-offset, 0]), bidirectional=not config.causal, num_buckets=pos.t5_num_buckets,
        max_distance=pos.t5_max_distance))
    tables = [np.asarray(params[f"block_{i}"]["attention"]["relative_bias"], np.float64)
              for i in range(config.num_layers)]
    return np.stack([np.exp(t[buckets[0]] - t[buckets[1]]) for t in tables])


ROPE_FIELDS = ("rope_base", "rope_fraction", "rope_scaling", "rope_scale", "train_length",
               "rope_low_freq_factor", "rope_high_freq_factor")

POSITIONS.register("none", PositionEncoding())
POSITIONS.register("sinusoidal", PositionEncoding(
    embed=_sinusoidal_embed, check=_check_sinusoidal, similarity=_sinusoidal_similarity,
    token_scale=lambda config: math.sqrt(config.d_model), reads=("added_scale", "added_norm")))
POSITIONS.register("learned", PositionEncoding(
    embed=_learned_embed, check=_check_learned, similarity=_learned_similarity,
    reads=("learned_interpolate", "added_scale", "added_norm"), tables=("position_embedding",)))
POSITIONS.register("rope", PositionEncoding(
    rotate=_rope_rotate, check=_check_rope, decode_check=_decode_rope,
    similarity=_rope_similarity, reads=ROPE_FIELDS))
POSITIONS.register("alibi", PositionEncoding(bias=_alibi_bias, similarity=_alibi_similarity))
POSITIONS.register("t5", PositionEncoding(
    bias=_t5_bias, similarity=_t5_similarity, reads=("t5_num_buckets", "t5_max_distance"),
    tables=("relative_bias",)))
