"""Decoding (``attnjax bench generate``): generation timed with and without the KV cache
(claim CX5).

- ``cached`` rows: the time of one decoding step, ``attnjax.generate.decode_step`` (the step
  ``sample`` runs), for the ``t``-th token: ``t - 1`` tokens are in the cache (prefilled in one
  call) and the step attends to ``t`` keys, at two cache layouts, ``model.max_length`` = the
  largest ``t`` (every step reads all slots, those past ``t`` masked) and ``max_length = t``.
- ``forward`` rows: the time of one full forward without a cache over ``n`` tokens, to the
  last position's logits (what the next token needs). Generating ``n`` tokens that way, one
  full forward per token over a fixed ``n``-token buffer (causal, so its not yet generated
  tail changes nothing), takes ``uncached_generation_s = n x forward_s``.
- ``loop`` rows: the seconds per token of a whole greedy generation of ``tokens`` tokens
  after a ``prompt``-token prompt into a cache of ``max_length`` slots, for a batch of prompts,
  two ways: ``python``, the prompt in one call and then one jitted one-token step per token,
  each token brought back to the host to be fed to the next step (a decoding loop written in
  Python), and ``compiled``, ``attnjax.generate.generate`` (one dispatch for the whole
  generation).

Times are medians of ``repeats`` calls after a warm-up call (compilation excluded), each
waited for; parameters are a random initialisation (time does not depend on their values).
"""

from __future__ import annotations

import jax
import numpy as np

from attnjax.bench.common import median_seconds, write_json
from attnjax.config import Config, apply_overrides
from attnjax.generate import decode_step, empty_cache, generate, next_tokens
from attnjax.models import build
from attnjax.train.state import init_params


def _with_max_length(config: Config, max_length: int) -> Config:
    """``config`` with a cache (and position table) of ``max_length`` slots; the training
    length shortened to fit, and no extra evaluation lengths (neither is read here)."""
    return apply_overrides(config, {"model.max_length": max_length, "data.eval_lengths": (),
                                    "data.length": min(config.data.length, max_length)})


def _tokens(config: Config, batch: int, length: int) -> jax.Array:
    return jax.random.randint(jax.random.key(0), (batch, length), 0, config.model.vocab_size)


def cached_step_seconds(config: Config, fills, *, batch: int = 1, repeats: int = 5) -> list:
    """Median seconds of the decoding step that brings the cache of ``config`` to ``t``
    tokens, for each ``t`` in ``fills`` (``2 <= t <= model.max_length``)."""
    params, cache = init_params(config), empty_cache(config, batch)
    step = jax.jit(decode_step(config))
    seconds = []
    for t in fills:
        tokens = _tokens(config, batch, t)
        filled, _ = step(params, cache, tokens[:, :t - 1])
        seconds.append(median_seconds(step, params, filled, tokens[:, t - 1:], repeats=repeats))
    return seconds


def forward_seconds(config: Config, n: int, *, batch: int = 1, repeats: int = 5) -> float:
    """Median seconds of one full forward over ``n`` tokens, to the last position's logits."""
    model = build(config.model)
    forward = jax.jit(lambda params, tokens: model.apply({"params": params}, tokens)[0][:, -1])
    return median_seconds(forward, init_params(config), _tokens(config, batch, n),
                          repeats=repeats)


def loop_seconds(config: Config, batch: int, prompt: int, tokens: int, *,
                 repeats: int = 3) -> dict:
    """``{"python": s, "compiled": s}``: seconds per token of the two ``loop`` generations of
    the module docstring, greedy, on a random initialisation of ``config``'s model."""
    params, prompts = init_params(config), np.asarray(_tokens(config, batch, prompt))
    decode = decode_step(config)

    @jax.jit
    def step(params, cache, tokens):
        cache, logits = decode(params, cache, tokens)
        return cache, next_tokens(logits, None, 0.0, None)

    def python_loop():
        cache, token = step(params, empty_cache(config, batch), prompts)
        out = [np.asarray(token)]
        for _ in range(tokens - 1):
            cache, token = step(params, cache, out[-1][:, None])
            out.append(np.asarray(token))
        return np.stack(out, axis=1)

    compiled = lambda: generate(config, params, prompts, tokens, temperature=0.0)
    if not np.array_equal(python_loop(), compiled()):
        raise AssertionError("the compiled generation and the Python loop chose other tokens")
    return {name: median_seconds(fn, repeats=repeats) / tokens
            for name, fn in (("python", python_loop), ("compiled", compiled))}


def generation_timing(config: Config, lengths=(128, 256, 512, 1024),
                      fills=(16, 64, 256, 1024), *, batch: int = 1, repeats: int = 5,
                      loops=()) -> list:
    """The rows of the module docstring for ``config``'s model; ``loops``: the ``(batch,
    prompt, tokens, max_length)`` of each ``loop`` row."""
    if min(fills) < 2:
        raise ValueError(f"--fills must be 2 or more (got {min(fills)}): the timed step "
                         "decodes token t after t - 1 cached ones")
    largest = max(fills)
    forward = _with_max_length(config, max(config.model.max_length, *lengths))
    rows = []
    for n in lengths:
        seconds = forward_seconds(forward, n, batch=batch, repeats=repeats)
        rows.append({"kind": "forward", "n": n, "batch": batch, "forward_s": seconds,
                     "uncached_generation_s": n * seconds})
    full = cached_step_seconds(_with_max_length(config, largest), fills, batch=batch,
                               repeats=repeats)
    for t, seconds in zip(fills, full):
        rows.append({"kind": "cached", "layout": f"max_length={largest}", "max_length": largest,
                     "t": t, "batch": batch, "step_s": seconds})
    for t, same in zip(fills, full):
        # max_length = t = the largest t is the program and fill just measured
        seconds = same if t == largest else cached_step_seconds(
            _with_max_length(config, t), [t], batch=batch, repeats=repeats)[0]
        rows.append({"kind": "cached", "layout": "max_length=t", "max_length": t, "t": t,
                     "batch": batch, "step_s": seconds})
    for size, prompt, tokens, max_length in loops:
        per_token = loop_seconds(_with_max_length(config, max_length), size, prompt, tokens)
        rows.append({"kind": "loop", "batch": size, "prompt": prompt, "tokens": tokens,
                     "max_length": max_length,
                     **{f"{name}_per_token_s": s for name, s in per_token.items()},
                     "speedup": per_token["python"] / per_token["compiled"]})
    return rows


# (batch, prompt, tokens, max_length) of the loop rows: a cache just large enough, and the
# 1024-slot cache of the forward and cached rows
LOOPS = tuple((batch, 16, 128, slots) for slots in (144, 1024) for batch in (1, 8))


def run_generate_benchmark(config: Config, lengths=(128, 256, 512, 1024),
                           fills=(16, 64, 256, 1024), *, batch: int = 1, repeats: int = 5,
                           loops=LOOPS, out: str | None = None) -> list:
    """``generation_timing`` as three tables; JSON to ``out`` if given."""
    rows = generation_timing(config, lengths, fills, batch=batch, repeats=repeats, loops=loops)
    m = config.model
    print(f"generation: d_model {m.d_model}, {m.num_layers} layers, {m.attention.num_heads} "
          f"heads, kernel {m.attention.kernel}, batch {batch}, {jax.default_backend()}")
    print(f"{'n':>6} {'full forward ms':>16} {'n x forward s':>14}   (no cache)")
    for r in rows:
        if r["kind"] == "forward":
            print(f"{r['n']:>6} {r['forward_s'] * 1e3:>16.3f} {r['uncached_generation_s']:>14.4f}")
    print(f"{'t':>6} {'layout':>16} {'step ms':>10}   (cached step of token t)")
    for r in rows:
        if r["kind"] == "cached":
            print(f"{r['t']:>6} {r['layout']:>16} {r['step_s'] * 1e3:>10.3f}")
    print(f"{'batch':>6} {'prompt':>7} {'tokens':>7} {'cache':>6} {'python ms/token':>16} "
          f"{'compiled ms/token':>18} {'speedup':>8}   (whole greedy generation)")
    for r in rows:
        if r["kind"] == "loop":
            print(f"{r['batch']:>6} {r['prompt']:>7} {r['tokens']:>7} {r['max_length']:>6} "
                  f"{r['python_per_token_s'] * 1e3:>16.3f} "
                  f"{r['compiled_per_token_s'] * 1e3:>18.3f} {r['speedup']:>7.1f}x")
    write_json(out, {"backend": jax.default_backend(), "rows": rows})
    return rows
