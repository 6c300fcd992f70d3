"""TrainState and its initialisation. Randomness is derived from (seed, stream, step), so the
state holds no PRNG key and a restored state continues exactly."""

from __future__ import annotations

import functools
import sys
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict
from jax.sharding import Mesh

from attnjax import sharding
from attnjax.config import Config
from attnjax.models import build
from attnjax.rundir import RunDir
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
    return _init_program(hyper.structure(config), None)(config.seed)[0]


def init_state(config: Config, mesh: Mesh | None = None) -> TrainState:
    """The state at initialisation; with ``mesh`` made on it, laid out as
    ``attnjax.sharding.Layout.state`` says, so no device ever holds more than its shards."""
    return _init_program(hyper.structure(config), mesh)(config.seed)[1]


def start_state(config: Config, quiet: bool = False, mesh: Mesh | None = None) -> TrainState:
    """The state a new run starts from: ``init_state`` (on ``mesh``), with the parameters of
    the best checkpoint of ``train.init_from`` (an imported model's run, say) when it names
    one, each placed on the mesh from the host, shard by shard. Its parameters the model has
    must have the model's shapes (else a one-line refusal); the model's parameters it lacks (a
    new head) keep their initialisation, and its parameters the model lacks (an old head) are
    left out, both said on stderr."""
    state = init_state(config, mesh)
    if config.train.init_from is None:
        return state
    _, loaded, _ = RunDir(config.train.init_from).params("best")
    wanted = flatten_dict(state.params, sep="/")
    found = flatten_dict(loaded, sep="/")
    for name in sorted(wanted.keys() & found.keys()):
        if np.shape(found[name]) != np.shape(wanted[name]):
            raise ValueError(f"train.init_from={config.train.init_from!r}: its parameter "
                             f"{name!r} has shape {tuple(np.shape(found[name]))}, this "
                             f"model's {tuple(np.shape(wanted[name]))}: the models differ")
    for names, what in ((wanted.keys() - found.keys(), "initialised anew"),
                        (found.keys() - wanted.keys(), "left out")):
        if names and not quiet:
            print(f"attnjax: train.init_from={config.train.init_from!r}: {len(names)} "
                  f"parameter(s) {what}: {', '.join(sorted(names))}", file=sys.stderr)
    params = {name: jax.device_put(np.asarray(found[name], mine.dtype), mine.sharding)
              if name in found else mine for name, mine in wanted.items()}
    return state.replace(params=unflatten_dict(params, sep="/"))


@functools.lru_cache(maxsize=16)
def _init_program(structure: Config, mesh: Mesh | None):
    """``seed -> (params, state)`` compiled once per structure and mesh (seeds share it)."""
    model, tx = build(structure.model), make_optimizer(structure.train)

    def initialise(seed):        # (arrays made inside: a trace that first calls this keeps none)
        tokens = jnp.zeros((1, structure.data.length), jnp.int32)
        params = model.init(stream_key(seed, PARAMS_STREAM), tokens)["params"]
        return params, TrainState(step=jnp.zeros((), jnp.int32), params=params,
                                  opt_state=tx.init(params), skipped=jnp.zeros((), jnp.int32))
    if mesh is None:
        return jax.jit(initialise)
    state = sharding.Layout(structure, mesh).state(jax.eval_shape(initialise, 0)[1])
    return jax.jit(initialise, out_shardings=(state.params, state))
