"""TrainState and its initialisation. Randomness is derived from (seed, stream, step), so the
state holds no PRNG key and a restored state continues exactly."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from attnjax.config import Config
from attnjax.nn import DecoderLM
from attnjax.train.optim import make_optimizer

PARAMS_STREAM, DROPOUT_STREAM = 1, 2


class TrainState(flax.struct.PyTreeNode):
    step: jax.Array        # int32 scalar: updates attempted so far
    params: Any
    opt_state: Any
    skipped: jax.Array     # int32 scalar: updates skipped because loss or gradient was not finite


def stream_key(seed: int, stream: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), stream)


def init_params(config: Config):
    model = DecoderLM(config.model)
    tokens = jnp.zeros((1, config.data.length), jnp.int32)
    init = jax.jit(lambda key: model.init(key, tokens)["params"])  # one compile, not one per op
    return init(stream_key(config.seed, PARAMS_STREAM))


def init_state(config: Config) -> TrainState:
    def build(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=make_optimizer(config.train).init(params),
                          skipped=jnp.zeros((), jnp.int32))
    return jax.jit(build)(init_params(config))
