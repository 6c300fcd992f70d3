"""Sampling from a trained run with the KV cache: the prompt in one call, then one token per
call, each a jitted ``DecoderLM`` step with ``decode=True``. A run's config and parameters come
from ``attnjax.rundir.RunDir(path).params()``. ``empty_cache`` and ``decode_step`` are the
pieces ``sample`` and ``attnjax bench generate`` share."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.nn import DecoderLM
from attnjax.nn.slots import kernel_request


def empty_cache(config, batch: int = 1):
    """The KV cache of ``batch`` sequences, ``model.max_length`` slots per layer, holding
    nothing yet; a model whose kernel or position encoding cannot decode is refused here,
    before tracing."""
    kernel_request(config.model, decode=True)
    model, tokens = DecoderLM(config.model), jnp.zeros((batch, 1), jnp.int32)
    return jax.jit(lambda key: model.init(key, tokens, decode=True)["cache"])(jax.random.key(0))


def decode_step(config):
    """``step(params, cache, tokens) -> (cache, logits)``: the logits ``[B, T, vocab]`` of
    ``tokens`` ``[B, T]`` placed after the ``t`` tokens the cache holds (positions ``t ..
    t+T-1``, attending to those ``t`` and causally to each other), and the cache holding
    ``t + T``. Pure: jit it alone or inside a caller's function."""
    model = DecoderLM(config.model)

    def step(params, cache, tokens):
        (logits, _), updated = model.apply({"params": params, "cache": cache}, tokens,
                                           decode=True, mutable=["cache"])
        return updated["cache"], logits

    return step


def sample(config, params, prompt: list[int], num_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0) -> list[int]:
    """``num_tokens`` tokens after ``prompt`` (temperature 0 = greedy)."""
    if not prompt:
        raise ValueError("prompt must not be empty")
    total = len(prompt) + num_tokens
    if total > config.model.max_length:
        raise ValueError(f"prompt + tokens = {total} exceeds the cache (model.max_length="
                         f"{config.model.max_length})")
    cache, decode = empty_cache(config), decode_step(config)

    @jax.jit
    def step(cache, tokens, key):
        cache, logits = decode(params, cache, tokens)
        last = logits[0, -1]
        if temperature == 0:
            return cache, jnp.argmax(last)
        if top_k:
            threshold = jax.lax.top_k(last, top_k)[0][-1]
            last = jnp.where(last < threshold, -jnp.inf, last)
        return cache, jax.random.categorical(key, last / temperature)

    key = jax.random.key(seed)
    cache, token = step(cache, jnp.asarray([prompt], jnp.int32), key)
    out = [int(token)]
    for i in range(num_tokens - 1):
        cache, token = step(cache, jnp.asarray([[out[-1]]], jnp.int32), jax.random.fold_in(key, i))
        out.append(int(token))
    return out
