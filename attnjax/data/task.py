"""Data tasks as registry entries (``attnjax.registry.TASKS``): how to build a task's source
from a ``DataConfig``, which ``data`` fields only it reads, and what it refuses.

A source has ``vocab_size`` and ``on_device``; an on-device source has a jittable
``sample(key, batch_size, length, split) -> batch``, a host source ``sample_host(seed_sequence,
batch_size, length, split)``. Adding a synthetic task = one function ``fn(key, batch_size,
length, vocab_size) -> batch`` and one ``register_synthetic`` call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from attnjax.registry import TASKS


class Task(NamedTuple):
    source: Callable        # DataConfig -> source
    reads: tuple[str, ...] = ()
    check: Callable = lambda config: None   # DataConfig -> None, or ValueError naming a field
    # what its batches train: next_token (a decoder), mlm or classification (an encoder); a
    # model family trains the tasks of its objective (``attnjax.models.Family.objective``)
    objective: str = "next_token"
    vocab: Callable = lambda config: config.vocab_size   # DataConfig -> its vocabulary size


class SyntheticSource:
    """An on-device task: the same distribution for both splits, independent keys."""
    on_device = True

    def __init__(self, fn: Callable, vocab_size: int):
        self.fn, self.vocab_size = fn, vocab_size

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        return self.fn(key, batch_size, length, self.vocab_size)


def register_synthetic(name: str, fn: Callable, *, reads: tuple[str, ...] = (),
                       check: Callable = lambda config: None, objective: str = "next_token"):
    """Register ``fn(key, batch_size, length, vocab_size, **{field: config.field for field in
    reads})`` as the task ``name``."""
    def source(config):
        extra = {field: getattr(config, field) for field in reads}
        return SyntheticSource(functools.partial(fn, **extra) if extra else fn, config.vocab_size)
    TASKS.register(name, Task(source, ("vocab_size",) + reads, check, objective))
