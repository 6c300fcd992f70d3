"""Position encodings as registry entries: where each one acts, and how.

An entry fills at most three hooks (see ``PositionEncoding``): ``embed`` adds to the token
embeddings (absolute encodings), ``rotate`` transforms q and k (rotary), ``bias`` returns a
score-bias function of positions (ALiBi, T5). The math is in ``attnjax.ops.positions``; these
hooks only own parameters and read the config. Adding an encoding = one ops function, one
``POSITIONS.register`` call here, and its config fields.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import flax.linen as nn
import jax.numpy as jnp

from attnjax.config import ModelConfig
from attnjax.ops import positions as P
from attnjax.registry import POSITIONS


class PositionEncoding(NamedTuple):
    """Hooks; ``None`` = this encoding does not act there.

    embed(module, positions [B|1, T], config) -> [B|1, T, d_model], called in the embedding.
    rotate(q, k, q_positions, k_positions, config) -> (q, k), on BTNH arrays.
    bias(module, config) -> fn(q_positions, k_positions) -> [B|1, N, tq, tk].
    check(config) -> None: raise ValueError (naming the config field) for settings the
      encoding cannot honour, so they fail when the config is built.
    """
    embed: Callable | None = None
    rotate: Callable | None = None
    bias: Callable | None = None
    check: Callable | None = None


def _sinusoidal_embed(module: nn.Module, positions, config: ModelConfig):
    return P.sinusoidal_embedding(positions, config.d_model)


def _check_sinusoidal(config: ModelConfig):
    if config.d_model % 2:
        raise ValueError(f"model.d_model={config.d_model} must be even for sinusoidal positions")


def _learned_embed(module: nn.Module, positions, config: ModelConfig):
    """Learned table of ``max_length`` rows. Longer inputs are refused, or, with
    ``position.learned_interpolate``, read from the table stretched linearly to the input
    length (position p reads row p * (L - 1) / (T - 1))."""
    length = config.max_length
    table = module.param("position_embedding", nn.initializers.normal(0.02),
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


def _rope_rotate(q, k, q_positions, k_positions, config: ModelConfig):
    pos = config.position
    kwargs = dict(base=pos.rope_base, rotary_fraction=pos.rope_fraction,
                  schedule=pos.rope_scaling, scale=pos.rope_scale,
                  train_length=pos.train_length or config.max_length)
    return P.apply_rope(q, q_positions, **kwargs), P.apply_rope(k, k_positions, **kwargs)


def _check_rope(config: ModelConfig):
    pos = config.position
    try:
        rotary_dim = P.rope_rotary_dim(config.head_dim, pos.rope_fraction)
    except ValueError:
        raise ValueError(f"model.position.rope_fraction={pos.rope_fraction} leaves fewer than 2 "
                         f"rotary features of head_dim={config.head_dim}") from None
    if pos.rope_scaling in ("ntk", "dynamic_ntk") and rotary_dim < 4:
        raise ValueError(f"model.position.rope_scaling={pos.rope_scaling!r} needs >= 4 rotary "
                         "features (raise rope_fraction or head_dim)")


def _alibi_bias(module: nn.Module, config: ModelConfig):
    slopes = jnp.asarray(P.alibi_slopes(config.attention.num_heads), jnp.float32)
    return lambda q_pos, k_pos: P.alibi_bias(slopes, q_pos, k_pos)


def _t5_bias(module: nn.Module, config: ModelConfig):
    pos = config.position
    table = module.param("relative_bias", nn.initializers.normal(0.02),
                         (pos.t5_num_buckets, config.attention.num_heads))
    return lambda q_pos, k_pos: P.t5_bias(table, q_pos, k_pos, bidirectional=False,
                                          num_buckets=pos.t5_num_buckets,
                                          max_distance=pos.t5_max_distance)


POSITIONS.register("none", PositionEncoding())
POSITIONS.register("sinusoidal", PositionEncoding(embed=_sinusoidal_embed,
                                                  check=_check_sinusoidal))
POSITIONS.register("learned", PositionEncoding(embed=_learned_embed))
POSITIONS.register("rope", PositionEncoding(rotate=_rope_rotate, check=_check_rope))
POSITIONS.register("alibi", PositionEncoding(bias=_alibi_bias))
POSITIONS.register("t5", PositionEncoding(bias=_t5_bias))
