"""attnjax's compiled training loop, timed: ``train_loop`` compiles and warms it up and then
advances it by whole dispatches, ``train_throughput`` turns that into tokens per second. The
training benchmark and the peer comparison both time it."""

from __future__ import annotations

import time

import jax

from attnjax.data import load_dataset
from attnjax.train import hyper
from attnjax.train.parallel import Runner
from attnjax.train.state import init_state


def train_loop(config):
    """``(advance, steps_per_call)``: attnjax's compiled training loop of ``config``, compiled
    and warmed up by one dispatch; ``advance(calls)`` runs ``calls`` more dispatches on the
    state it keeps and returns their wall seconds."""
    runner = Runner(config, load_dataset(config.data))
    values = hyper.as_arrays([config], stacked=False)
    state = runner.place(init_state(config))

    def advance(calls: int) -> float:
        nonlocal state
        start = time.perf_counter()
        for _ in range(calls):
            state, metrics = runner.run(state, values)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    advance(1)
    return advance, runner.steps_per_call


def train_throughput(config, steps: int = 50) -> dict:
    """Tokens/s of the compiled training loop (after one warm-up dispatch)."""
    advance, steps_per_call = train_loop(config)
    calls = max(steps // steps_per_call, 1)
    seconds = advance(calls)
    tokens = calls * steps_per_call * config.train.batch_size * config.data.length
    return {"tokens_per_s": tokens / seconds, "seconds": seconds,
            "steps": calls * steps_per_call}
