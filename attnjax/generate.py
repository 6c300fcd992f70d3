"""Sampling from a trained run with the KV cache: the prompt in one call, then one token per
call, each a jitted ``DecoderLM`` step with ``decode=True``. A run's config and parameters come
from ``attnjax.rundir.RunDir(path).params()``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.nn import DecoderLM
from attnjax.nn.slots import kernel_request


def sample(config, params, prompt: list[int], num_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0) -> list[int]:
    """``num_tokens`` tokens after ``prompt`` (temperature 0 = greedy)."""
    if not prompt:
        raise ValueError("prompt must not be empty")
    total = len(prompt) + num_tokens
    if total > config.model.max_length:
        raise ValueError(f"prompt + tokens = {total} exceeds the cache (model.max_length="
                         f"{config.model.max_length})")
    kernel_request(config.model, decode=True)   # refuse what the cache cannot do, before tracing
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
