"""Sampling from a trained run with the KV cache: the prompt in one call, then one token per
call, each a jitted ``DecoderLM`` step with ``decode=True``."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from attnjax.nn import DecoderLM
from attnjax.train.checkpoint import Checkpoints
from attnjax.train.loop import load_config
from attnjax.train.state import init_state


def load_params(workdir: str | Path, which: str = "best"):
    """``(config, params, step)`` from a run's best or latest good checkpoint."""
    config = load_config(workdir)
    directory = Path(workdir) / "ckpt"
    if not directory.is_dir():
        raise ValueError(f"{str(workdir)!r} has no usable checkpoint")
    checkpoints = Checkpoints(directory, config.train.keep_best, read_only=True)
    step = checkpoints.best_step() if which == "best" else None
    state, step = checkpoints.restore(init_state(config), step)
    checkpoints.close()
    if state is None:
        raise ValueError(f"{str(workdir)!r} has no usable checkpoint")
    return config, state.params, step


def sample(config, params, prompt: list[int], num_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0) -> list[int]:
    """``num_tokens`` tokens after ``prompt`` (temperature 0 = greedy)."""
    if not prompt:
        raise ValueError("prompt must not be empty")
    total = len(prompt) + num_tokens
    if total > config.model.max_length:
        raise ValueError(f"prompt + tokens = {total} exceeds the cache (model.max_length="
                         f"{config.model.max_length})")
    model = DecoderLM(config.model)
    cache = model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), decode=True)["cache"]

    @jax.jit
    def step(cache, tokens, key):
        (logits, _), updated = model.apply({"params": params, "cache": cache}, tokens,
                                           decode=True, mutable=["cache"])
        last = logits[0, -1]
        if temperature == 0:
            return updated["cache"], jnp.argmax(last)
        if top_k:
            threshold = jax.lax.top_k(last, top_k)[0][-1]
            last = jnp.where(last < threshold, -jnp.inf, last)
        return updated["cache"], jax.random.categorical(key, last / temperature)

    key = jax.random.key(seed)
    cache, token = step(cache, jnp.asarray([prompt], jnp.int32), key)
    out = [int(token)]
    for i in range(num_tokens - 1):
        cache, token = step(cache, jnp.asarray([[out[-1]]], jnp.int32), jax.random.fold_in(key, i))
        out.append(int(token))
    return out
