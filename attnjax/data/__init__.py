"""Datasets: every batch is a pure function of (seed, step, split), so runs are reproducible
and resumable without saving iterator state.

``Dataset.sample(key, batch_size, length, split)`` is jittable for on-device data (synthetic
tasks, byte corpora), which lets the training loop generate batches inside a ``lax.scan``;
token files are read on the host instead (``on_device`` is False).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attnjax.config import DataConfig
from attnjax.data import encoder, seq2seq, synthetic, text  # noqa: F401  (they register tasks)
from attnjax.registry import TASKS

SPLITS = {"train": 0, "val": 1}
_DATA_STREAM = 0x0DA7A  # separates data keys from model-init and dropout keys of the same seed


def batch_key(seed: int, step, split: str) -> jax.Array:
    """The key of batch ``step`` of ``split``; ``step`` may be traced."""
    key = jax.random.fold_in(jax.random.key(seed), _DATA_STREAM)
    return jax.random.fold_in(jax.random.fold_in(key, SPLITS[split]), step)


class Dataset:
    """A task or corpus (``data.task``, from ``attnjax.registry.TASKS``) with one sampling
    interface and a scoring rule (``weights``)."""

    def __init__(self, config: DataConfig):
        self.config = config
        self._source = TASKS.get(config.task, "data.task").source(config)
        self.on_device = self._source.on_device
        self.vocab_size = self._source.vocab_size

    @functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
    def _device_batch(self, seed, step, batch_size: int, length: int, split: str) -> dict:
        return self.sample(batch_key(seed, step, split), batch_size, length, split)

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        """Jittable batch for on-device datasets. Synthetic tasks draw train and validation
        examples from the same distribution with independent keys."""
        if not self.on_device:
            raise TypeError("token files are sampled on the host: use Dataset.batch")
        return self._source.sample(key, batch_size, length, split)

    def batch(self, seed: int, step: int, batch_size: int, length: int, split: str) -> dict:
        """Batch ``step`` of ``split`` for run seed ``seed`` (host or device arrays)."""
        if self.on_device:
            return self._device_batch(seed, step, batch_size, length, split)
        return self._source.sample_host([seed, SPLITS[split], step], batch_size, length, split)


@functools.lru_cache(maxsize=4)
def load_dataset(config: DataConfig) -> Dataset:
    """The ``Dataset`` of a data config, built once per process (a sweep reads its corpus once)."""
    return Dataset(config)


def accuracy(logits: jax.Array, batch: dict) -> jax.Array:
    """Fraction of scored positions whose argmax prediction equals the target."""
    hit = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
    return (hit * batch["weights"]).sum() / jnp.maximum(batch["weights"].sum(), 1.0)

