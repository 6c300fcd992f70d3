"""TrainState and its initialisation. Randomness is derived from (seed, stream, step), so the
state holds no PRNG key and a restored state continues exactly."""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from attnjax.config import Config
from attnjax.models import build
from attnjax.train import hyper
from attnjax.train.optim import make_optimizer

PARAMS_STREAM, DROPOUT_STREAM, EVAL_DROPOUT_STREAM = 1, 2, 3


class TrainState(flax.struct.PyTreeNode):
    step: jax.Array        # int32 scalar: updates attempted so far
    params: Any
    opt_state: Any
    skipped: jax.Array     # int32 scalar: updates skipped because loss or gradient was not finite


def stream_key(seed: int, stream: int) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), stream)


def init_params(config: Config):
    return _init_program(hyper.structure(config))(config.seed)[0]


def init_state(config: Config) -> TrainState:
    return _init_program(hyper.structure(config))(config.seed)[1]


@functools.lru_cache(maxsize=16)
def _init_program(structure: Config):
    """``seed -> (params, state)`` compiled once per structure (seeds share it)."""
    model, tx = build(structure.model), make_optimizer(structure.train)

    def initialise(seed):        # (arrays made inside: a trace that first calls this keeps none)
        tokens = jnp.zeros((1, structure.data.length), jnp.int32)
        params = model.init(stream_key(seed, PARAMS_STREAM), tokens)["params"]
        return params, TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                  opt_state=tx.init(params), skipped=jnp.zeros((), jnp.int32))
    return jax.jit(initialise)
