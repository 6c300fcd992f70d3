"""Parallel training: ``jit`` over a device mesh (default) or ``pmap``.

Mesh (``train.mesh``: ``data x fsdp x tensor``, ``attnjax.sharding``): the batch is split over
``data`` and ``fsdp``; parameters and optimizer state are split as the rules table says (over
``fsdp`` along the model width, over ``tensor`` by heads and MLP width) or, on a mesh of
``data`` alone, replicated; the compiler inserts the gathers, reductions and reduce-scatters.
A new state is made on the mesh already split, and a checkpoint is restored into the mesh's
layout (any layout it was saved in). The mesh spans every process's devices
(``attnjax.distributed``); a host batch is handed over shard by shard, so each process
transfers only its own rows. pmap: the same step runs per device on its slice with explicit
``psum``s (parameters replicated). Both generate the *global* batch from the same key and take
their slice, so any mesh gives the numbers of one device (up to the order of floating-point
sums).

With on-device data, ``dispatch_steps()`` steps run in one compiled ``lax.scan``, batches
generated inside it; host data (token files) is fed one step per call.

The program is compiled for the config's structure and takes its scalar hyperparameters as an
argument (``attnjax.train.hyper``), so runs that differ only in those reuse it. With
``group=K`` it is ``vmap``-ed over K runs: state, hyperparameters and metrics gain a leading
run axis, and every run computes what it would alone (on a mesh of ``data`` alone).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp

from attnjax import sharding
from attnjax.config import Config
from attnjax.data import Dataset, batch_key, load_dataset
from attnjax.train import hyper
from attnjax.train.state import TrainState, init_state, start_state
from attnjax.train.step import make_train_step


class Runner:
    """Runs training steps on ``devices`` with the configured strategy; ``group=K`` runs K
    configs of one structure in lockstep as one vmapped program (mesh strategy only)."""

    def __init__(self, config: Config, dataset: Dataset, devices=None, group: int | None = None):
        self.config, self.dataset, self.group = config, dataset, group
        self.devices = list(devices or jax.devices())
        n, cfg = len(self.devices), config.train
        if cfg.parallel == "pmap" and cfg.batch_size % (n * cfg.grad_accum):
            raise ValueError(f"train.batch_size={cfg.batch_size} must be divisible by "
                             f"{n} devices x train.grad_accum={cfg.grad_accum}")
        if jax.process_count() > 1 and cfg.parallel != "mesh":
            raise ValueError("train.parallel='pmap' runs in one process; a multi-process run "
                             "needs train.parallel=mesh")
        if group is not None and cfg.parallel != "mesh":
            raise ValueError("train.parallel='pmap' cannot train a vmapped group of runs; "
                             "use train.parallel=mesh or another launcher")
        if group is not None and cfg.mesh.splits_a_run():
            raise ValueError(f"train.mesh.fsdp={cfg.mesh.fsdp}, sequence={cfg.mesh.sequence}, "
                             f"tensor={cfg.mesh.tensor}: a vmapped group of runs keeps every "
                             "run's parameters and sequences whole on each device; use the "
                             "sequential, processes or ray launcher")
        self.steps_per_call = cfg.dispatch_steps() if dataset.on_device else 1
        self.mesh = None
        if cfg.parallel == "mesh":
            sharding.check(config, n)
            self.mesh = sharding.make_mesh(cfg.mesh, self.devices)
            self.layout = sharding.Layout(config, self.mesh)
            self._sharded = self.layout.batch(leading=int(bool(group) and not dataset.on_device))
        self._fn = _program(hyper.structure(config), tuple(self.devices), group)

    def start(self, config: Config, quiet: bool = False) -> TrainState:
        """A run's first state (``start_state``), made on the mesh when its parameters are
        split there."""
        split = self.mesh if self.config.train.mesh.model_axes() else None
        return start_state(config, quiet=quiet, mesh=split)

    def template(self, config: Config) -> TrainState:
        """One run's state as ``jax.ShapeDtypeStruct``s with its shardings on this runner (a
        group's: each run's, before they are stacked): what a checkpoint is restored into."""
        state = jax.eval_shape(lambda: init_state(config))
        if self.config.train.parallel == "pmap" or self.group is not None:
            return state
        return _with_shardings(state, self._state_sharding(state))

    def place(self, state: TrainState) -> TrainState:
        """Put a state where the runner expects it."""
        if self.config.train.parallel == "mesh":
            return jax.device_put(state, self._state_sharding(state))
        n = len(self.devices)
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)

    def abstract(self, state) -> TrainState:
        """``place`` for a state of shapes (``jax.eval_shape`` of ``init_state``): the
        ``jax.ShapeDtypeStruct``s, shardings included, that ``lower`` needs, no array built."""
        if self.config.train.parallel == "mesh":
            return _with_shardings(state, self._state_sharding(state))
        n = len(self.devices)
        return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((n,) + x.shape, x.dtype),
                                      state)

    def _state_sharding(self, state):
        """The shardings of ``state`` (a group's stack, replicated) on the mesh."""
        if self.group is not None or not self.config.train.mesh.model_axes():
            return jax.tree_util.tree_map(lambda _: self.layout.replicated, state)
        return self.layout.state(state)

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
    steps = cfg.dispatch_steps() if dataset.on_device else 1

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

    layout = sharding.Layout(structure, sharding.make_mesh(cfg.mesh, devices))
    split, laid_out = cfg.mesh.model_axes(), cfg.mesh.splits_a_run()
    constrain = lambda batch: jax.lax.with_sharding_constraint(batch, layout.batch())

    def program(values, state, *batch):
        config = hyper.inject(structure, values)
        step = make_train_step(config)
        with layout.activations() if laid_out else contextlib.nullcontext():
            return step(state, *batch) if batch else scanned(step, config, constrain)(state)
    if group is not None:
        return jax.jit(jax.vmap(program), donate_argnums=1)
    if not split:
        return jax.jit(program, donate_argnums=1)
    state = layout.state(jax.eval_shape(lambda: init_state(structure)))
    return jax.jit(program, donate_argnums=1, out_shardings=(state, layout.replicated))


def _with_shardings(state, shardings):
    """``state``'s leaves as ``jax.ShapeDtypeStruct``s carrying ``shardings``."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
