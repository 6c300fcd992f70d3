"""Data parallelism: ``jit`` over a device mesh (default) or ``pmap``.

Mesh: the batch is sharded over the ``data`` axis, parameters and optimizer state are
replicated, and the compiler inserts the gradient all-reduce. The mesh spans every process's
devices (``attnjax.distributed``); a host batch is handed over shard by shard, so each
process transfers only its own rows. pmap: the same step runs per
device on its slice with explicit ``psum``s. Both generate the *global* batch from the same
key and take their slice, so any device count gives the numbers of one device (up to the
order of floating-point sums).

With on-device data, ``steps_per_dispatch`` steps run in one compiled ``lax.scan``, batches
generated inside it; host data (token files) is fed one step per call.

The program is compiled for the config's structure and takes its scalar hyperparameters as an
argument (``attnjax.train.hyper``), so runs that differ only in those reuse it. With
``group=K`` it is ``vmap``-ed over K runs: state, hyperparameters and metrics gain a leading
run axis, and every run computes what it would alone.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from attnjax.config import Config
from attnjax.data import Dataset, batch_key, load_dataset
from attnjax.train import hyper
from attnjax.train.state import TrainState
from attnjax.train.step import make_train_step


class Runner:
    """Runs training steps on ``devices`` with the configured strategy; ``group=K`` runs K
    configs of one structure in lockstep as one vmapped program (mesh strategy only)."""

    def __init__(self, config: Config, dataset: Dataset, devices=None, group: int | None = None):
        self.config, self.dataset, self.group = config, dataset, group
        self.devices = list(devices or jax.devices())
        n, cfg = len(self.devices), config.train
        if cfg.batch_size % (n * cfg.grad_accum):
            raise ValueError(f"train.batch_size={cfg.batch_size} must be divisible by "
                             f"{n} devices x train.grad_accum={cfg.grad_accum}")
        if jax.process_count() > 1 and cfg.parallel != "mesh":
            raise ValueError("train.parallel='pmap' runs in one process; a multi-process run "
                             "needs train.parallel=mesh")
        if group is not None and cfg.parallel != "mesh":
            raise ValueError("train.parallel='pmap' cannot train a vmapped group of runs; "
                             "use train.parallel=mesh or another launcher")
        self.steps_per_call = cfg.steps_per_dispatch if dataset.on_device else 1
        if cfg.parallel == "mesh":
            self.mesh = jax.make_mesh((n,), ("data",), (AxisType.Auto,), devices=self.devices)
            self._replicated = NamedSharding(self.mesh, PartitionSpec())
            self._sharded = NamedSharding(self.mesh, PartitionSpec(*(
                (None, "data") if group and not dataset.on_device else ("data",))))
        self._fn = _program(hyper.structure(config), tuple(self.devices), group)

    def place(self, state: TrainState) -> TrainState:
        """Put a host/single-device state where the runner expects it."""
        if self.config.train.parallel == "mesh":
            return jax.device_put(state, self._replicated)
        n = len(self.devices)
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)

    def abstract(self, state) -> TrainState:
        """``place`` for a state of shapes (``jax.eval_shape`` of ``init_state``): the
        ``jax.ShapeDtypeStruct``s, shardings included, that ``lower`` needs, no array built."""
        if self.config.train.parallel == "mesh":
            return jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self._replicated), state)
        n = len(self.devices)
        return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((n,) + x.shape, x.dtype),
                                      state)

    def unplace(self, state: TrainState) -> TrainState:
        """One copy of the state (for checkpoints and evaluation)."""
        if self.config.train.parallel == "mesh":
            return state
        return jax.tree_util.tree_map(lambda x: x[0], state)

    def run(self, state: TrainState, values: dict, host_batch: dict | None = None):
        """Advance ``steps_per_call`` steps with hyperparameter ``values`` (``hyper.as_arrays``);
        metrics are stacked over those steps (``[runs, steps]`` for a group)."""
        state, metrics = self._fn(*self._arguments(state, values, host_batch))
        if self.config.train.parallel == "pmap":
            metrics = jax.tree_util.tree_map(lambda x: x[0], metrics)
        if self.dataset.on_device:
            return state, metrics
        return state, jax.tree_util.tree_map(lambda x: x[..., None], metrics)

    def lower(self, state: TrainState, values: dict, host_batch: dict | None = None):
        """The program ``run`` dispatches, lowered for these arguments and not run:
        ``.compile().memory_analysis()`` is what one dispatch allocates."""
        return self._fn.lower(*self._arguments(state, values, host_batch))

    def _arguments(self, state: TrainState, values: dict, host_batch: dict | None) -> tuple:
        """The program's arguments: values, state and the host batch, placed on the mesh or
        split per device (pmap)."""
        if self.dataset.on_device:
            return values, state
        if self.config.train.parallel == "mesh":
            return values, state, jax.tree_util.tree_map(
                lambda x: jax.make_array_from_callback(x.shape, self._sharded,
                                                       lambda index: x[index]), host_batch)
        n = len(self.devices)
        return values, state, jax.tree_util.tree_map(lambda x: x.reshape(n, -1, *x.shape[1:]),
                                                     host_batch)


@functools.lru_cache(maxsize=16)
def _program(structure: Config, devices: tuple, group: int | None):
    """The compiled training program of a structure: ``(values, state[, batch]) -> (state,
    metrics)``. Cached, so runs that share a structure share one program."""
    n, cfg, dataset = len(devices), structure.train, load_dataset(structure.data)
    steps = cfg.steps_per_dispatch if dataset.on_device else 1

    def scanned(step_fn, config, shard):
        def body(state, _):
            key = batch_key(config.seed, state.step, "train")
            batch = dataset.sample(key, cfg.batch_size, config.data.length, "train")
            return step_fn(state, shard(batch))
        return lambda state: jax.lax.scan(body, state, None, length=steps)

    if cfg.parallel == "pmap":
        local = cfg.batch_size // n

        def my_slice(batch):
            start = jax.lax.axis_index("data") * local
            return jax.tree_util.tree_map(
                lambda x: jax.lax.dynamic_slice_in_dim(x, start, local), batch)

        def per_device(values, state, *batch):
            config = hyper.inject(structure, values)
            step = make_train_step(config, axis_name="data")
            return step(state, *batch) if batch else scanned(step, config, my_slice)(state)
        return jax.pmap(per_device, axis_name="data", devices=devices, donate_argnums=1,
                        in_axes=(None, 0) + (() if dataset.on_device else (0,)))

    mesh = jax.make_mesh((n,), ("data",), (AxisType.Auto,), devices=list(devices))
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    constrain = lambda batch: jax.lax.with_sharding_constraint(batch, sharded)

    def program(values, state, *batch):
        config = hyper.inject(structure, values)
        step = make_train_step(config)
        return step(state, *batch) if batch else scanned(step, config, constrain)(state)
    return jax.jit(program if group is None else jax.vmap(program), donate_argnums=1)
