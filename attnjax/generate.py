"""Sampling from a trained run with the KV cache, as one compiled program: the prompts in one
call of the model (a family that decodes, ``attnjax.models``) with ``decode=True``, then
every further token inside a ``lax.scan`` of one-token decoding steps, so a generation is one
dispatch rather than one per token. A run's
config and parameters come from ``attnjax.rundir.RunDir(path).params()``. ``empty_cache``
and ``decode_step`` are the pieces ``generate`` and ``attnjax bench generate`` share."""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from attnjax import sharding
from attnjax.config.kernel import kernel_request
from attnjax.models import build, family
from attnjax.programs import kept_call
from attnjax.registry import MODELS


def _cache_tree(config, batch: int):
    tokens = jnp.zeros((batch, 1), jnp.int32)
    return build(config.model).init(jax.random.key(0), tokens, decode=True)["cache"]


def empty_cache(config, batch: int = 1):
    """The KV cache of ``batch`` sequences, ``model.max_length`` slots per layer, holding
    nothing yet; a model whose kernel or position encoding cannot decode is refused here,
    before tracing."""
    check_decodes(config)
    return jax.jit(_cache_tree, static_argnums=(0, 1))(config, batch)


def decode_step(config):
    """``step(params, cache, tokens) -> (cache, logits)``: the logits ``[B, T, vocab]`` of
    ``tokens`` ``[B, T]`` placed after the ``t`` tokens the cache holds (positions ``t ..
    t+T-1``, attending to those ``t`` and causally to each other), and the cache holding
    ``t + T``. Pure: jit it alone or inside a caller's function."""
    model = build(config.model)

    def step(params, cache, tokens):
        (logits, _), updated = model.apply({"params": params, "cache": cache}, tokens,
                                           decode=True, mutable=["cache"])
        return updated["cache"], logits

    return step


def next_tokens(logits, key, temperature: float, top_k: int | None):
    """The next token of each row from the last position's logits ``[B, T, vocab]``: the
    argmax for ``temperature`` 0, else a draw from ``softmax(logits / temperature)`` over the
    ``top_k`` largest (all with None)."""
    last = logits[:, -1]
    if temperature == 0:
        return jnp.argmax(last, axis=-1)
    if top_k:
        threshold = jax.lax.top_k(last, top_k)[0][:, -1:]
        last = jnp.where(last < threshold, -jnp.inf, last)
    return jax.random.categorical(key, last / temperature)


def generate(config, params, prompts, num_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int = 0, mesh=None) -> np.ndarray:
    """``num_tokens`` tokens after each prompt: ``prompts`` ``[B, P]`` token ids (one length
    for all) -> ``[B, num_tokens]``. Token 0 is drawn with ``jax.random.key(seed)``, token
    ``i`` after it with that key folded with ``i - 1``; temperature 0 is greedy (the same
    tokens as feeding the argmax back one call at a time). Bad arguments are refused before
    anything compiles. ``mesh``: ``params`` are split over it (``sharding.place_parameters``),
    and so are the activations and the KV cache (its heads over ``tensor``)."""
    prompts = check_sampling(config, prompts, num_tokens, temperature, top_k, seed)
    settings = (config, num_tokens, float(temperature), top_k)
    args = (params, jnp.asarray(prompts, jnp.int32), jax.random.key(seed))
    if mesh is None:      # a later process calls the program this one traces (``programs``)
        return np.asarray(kept_call(f"generate{settings!r}", _generation(*settings, None),
                                    *args))
    return np.asarray(_generation(*settings, mesh)(*args))


SEEDS = (0, 2**31 - 1)     # the sampler's seeds, as the config's (``seed``)


def check_sampling(config, prompts, num_tokens: int, temperature: float, top_k: int | None,
                   seed: int) -> np.ndarray:
    """``prompts`` as an array, or a one-line ``ValueError`` naming the argument (and the
    command line's option) that ``generate`` cannot honour, before anything is loaded or
    compiled."""
    prompts = np.asarray(prompts)
    if prompts.ndim != 2 or prompts.shape[1] == 0:
        raise ValueError(f"prompts (--prompt) must be [batch, length] with length >= 1, got "
                         f"shape {prompts.shape}")
    if num_tokens < 1:
        raise ValueError(f"the number of tokens to generate (--tokens) must be >= 1, got "
                         f"{num_tokens}")
    total = prompts.shape[1] + num_tokens
    if total > config.model.max_length:
        raise ValueError(f"prompt + tokens = {total} exceeds the cache (model.max_length="
                         f"{config.model.max_length}): a --prompt of {prompts.shape[1]} tokens "
                         f"and --tokens {num_tokens}")
    if not (isinstance(temperature, numbers.Real) and math.isfinite(temperature)
            and temperature >= 0):
        raise ValueError(f"temperature (--temperature) must be a finite number >= 0 (0 is "
                         f"greedy), got {temperature!r}")
    vocab = config.model.vocab_size
    if top_k is not None and not (_integer(top_k) and 1 <= top_k <= vocab):
        raise ValueError(f"top_k (--top-k) must be in [1, {vocab}] (model.vocab_size), or "
                         f"None for every token, got {top_k!r}")
    if not (_integer(seed) and SEEDS[0] <= seed <= SEEDS[1]):
        raise ValueError(f"seed (--seed) must be in [{SEEDS[0]}, {SEEDS[1]}], got {seed!r}")
    check_decodes(config)
    return prompts


def check_decodes(config) -> None:
    """Refuse, in one line, a model whose family, kernel or position encoding cannot decode
    token by token with a cache."""
    if not family(config.model).decodes:
        decoding = [name for name, entry in MODELS.items() if entry.decodes]
        raise ValueError(f"model.family={config.model.family!r} does not decode token by "
                         f"token; families that do: {', '.join(decoding)}")
    kernel_request(config.model, decode=True)


def _integer(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@functools.lru_cache(maxsize=16)
def _generation(config, num_tokens: int, temperature: float, top_k: int | None, mesh):
    """The compiled generation ``(params, prompts, key) -> tokens [B, num_tokens]``, laid out
    on ``mesh`` (or not: ``None``)."""
    decode = decode_step(config)

    @sharding.traced_on(config, mesh)
    def run(params, prompts, key):
        cache, logits = decode(params, _cache_tree(config, prompts.shape[0]), prompts)
        first = next_tokens(logits, key, temperature, top_k)

        def one_token(carry, i):
            cache, token = carry
            cache, logits = decode(params, cache, token[:, None])
            token = next_tokens(logits, jax.random.fold_in(key, i), temperature, top_k)
            return (cache, token), token

        _, rest = jax.lax.scan(one_token, (cache, first), jnp.arange(num_tokens - 1))
        return jnp.concatenate([first[:, None], rest.T], axis=1)

    return jax.jit(run)


def sample(config, params, prompt: list[int], num_tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0, mesh=None) -> list[int]:
    """``generate`` for one prompt: ``num_tokens`` tokens after ``prompt``, as a list."""
    if not prompt:
        raise ValueError("prompt must not be empty")
    return generate(config, params, [prompt], num_tokens, temperature=temperature,
                    top_k=top_k, seed=seed, mesh=mesh)[0].tolist()
