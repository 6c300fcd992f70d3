"""Data parallelism: ``jit`` over a device mesh (default) or ``pmap``.

Mesh: the batch is sharded over the ``data`` axis, parameters and optimizer state are
replicated, and the compiler inserts the gradient all-reduce. pmap: the same step runs per
device on its slice with explicit ``psum``s. Both generate the *global* batch from the same
key and take their slice, so any device count gives the numbers of one device (up to the
order of floating-point sums).

With on-device data, ``steps_per_dispatch`` steps run in one compiled ``lax.scan``, batches
generated inside it; host data (token files) is fed one step per call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from attnjax.config import Config
from attnjax.data import Dataset, batch_key
from attnjax.train.state import TrainState
from attnjax.train.step import make_train_step


class Runner:
    """Runs training steps on ``devices`` with the configured strategy."""

    def __init__(self, config: Config, dataset: Dataset, devices=None):
        self.config, self.dataset = config, dataset
        self.devices = list(devices or jax.devices())
        n, cfg = len(self.devices), config.train
        if cfg.batch_size % (n * cfg.grad_accum):
            raise ValueError(f"train.batch_size={cfg.batch_size} must be divisible by "
                             f"{n} devices x train.grad_accum={cfg.grad_accum}")
        self.steps_per_call = cfg.steps_per_dispatch if dataset.on_device else 1
        if cfg.parallel == "mesh":
            self.mesh = jax.make_mesh((n,), ("data",), (AxisType.Auto,), devices=self.devices)
            self._replicated = NamedSharding(self.mesh, PartitionSpec())
            self._sharded = NamedSharding(self.mesh, PartitionSpec("data"))
            self._fn = self._build_mesh()
        else:
            self._fn = self._build_pmap()

    def _global_batch(self, step):
        cfg = self.config
        return self.dataset.sample(batch_key(cfg.seed, step, "train"), cfg.train.batch_size,
                                   cfg.data.length, "train")

    def _scan(self, step_fn, shard):
        def run(state):
            def body(state, _):
                return step_fn(state, shard(self._global_batch(state.step)))
            return jax.lax.scan(body, state, None, length=self.steps_per_call)
        return run

    def _build_mesh(self):
        step = make_train_step(self.config)
        if not self.dataset.on_device:
            return jax.jit(step, donate_argnums=0)
        constrain = lambda batch: jax.lax.with_sharding_constraint(batch, self._sharded)
        return jax.jit(self._scan(step, constrain), donate_argnums=0)

    def _build_pmap(self):
        step = make_train_step(self.config, axis_name="data")
        local = self.config.train.batch_size // len(self.devices)
        def my_slice(batch):
            start = jax.lax.axis_index("data") * local
            return jax.tree_util.tree_map(
                lambda x: jax.lax.dynamic_slice_in_dim(x, start, local), batch)
        body = step if not self.dataset.on_device else self._scan(step, my_slice)
        return jax.pmap(body, axis_name="data", devices=self.devices, donate_argnums=0)

    def place(self, state: TrainState) -> TrainState:
        """Put a host/single-device state where the runner expects it."""
        if self.config.train.parallel == "mesh":
            return jax.device_put(state, self._replicated)
        n = len(self.devices)
        return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)

    def unplace(self, state: TrainState) -> TrainState:
        """One copy of the state (for checkpoints and evaluation)."""
        if self.config.train.parallel == "mesh":
            return state
        return jax.tree_util.tree_map(lambda x: x[0], state)

    def run(self, state: TrainState, host_batch: dict | None = None):
        """Advance ``steps_per_call`` steps; metrics are stacked over those steps."""
        if self.dataset.on_device:
            state, metrics = self._fn(state)
            if self.config.train.parallel == "pmap":
                metrics = jax.tree_util.tree_map(lambda x: x[0], metrics)
            return state, metrics
        if self.config.train.parallel == "mesh":
            state, metrics = self._fn(state, jax.device_put(host_batch, self._sharded))
        else:
            n = len(self.devices)
            split = jax.tree_util.tree_map(lambda x: x.reshape(n, -1, *x.shape[1:]), host_batch)
            state, metrics = self._fn(state, split)
            metrics = jax.tree_util.tree_map(lambda x: x[0], metrics)
        return state, jax.tree_util.tree_map(lambda x: x[None], metrics)
