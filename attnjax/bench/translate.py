"""Encoder–decoder decoding (``attnjax bench generate`` on a ``seq2seq`` config; claim XA1's
latency): the static cross-attention cache against recomputing the cross keys and values at
every step, and beam search against greedy decoding.

- ``cross cache`` rows: the time per decoding step (``attnjax.translate.decode_step``) of the
  ``steps`` steps after BOS, run in one ``lax.scan``, for a source of ``source`` tokens:
  ``static``, reading the cross keys and values the first step stored, and ``recompute``,
  projecting the encoder's output to them again in every layer (what a decoder without the
  cache does; behind an optimisation barrier per step, since XLA otherwise hoists part of
  the loop-invariant projections out of the ``lax.scan`` on its own). Per step, recomputing
  costs ``2 S d^2`` multiply-adds per layer for the projections, against ``2 S d`` for
  attending, so the cache should win by a factor that grows with ``d`` and with ``S`` until
  the projections dominate.
- ``beam`` rows: seconds per target token of a whole compiled decoding of ``tokens`` tokens
  (``translate`` for greedy, ``beam.beam_translate`` for ``beams`` K), at the first source
  length; the ratio to greedy. A random initialisation rarely ends a hypothesis early, so
  every decoding runs its ``tokens`` steps.

Times are medians of ``repeats`` calls after a warm-up (compilation excluded), each waited for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.beam import beam_translate
from attnjax.bench.common import median_seconds, write_json
from attnjax.config import Config
from attnjax.data.seq2seq import seq2seq_specials
from attnjax.train.state import init_params
from attnjax.translate import compiled_encode, compiled_start, decode_step, translate


def _source(config: Config, batch: int, length: int) -> jax.Array:
    content = seq2seq_specials(config.model.vocab_size).pad
    return jax.random.randint(jax.random.key(0), (batch, length), 0, content)


def cross_cache_seconds(config: Config, source_length: int, steps: int, *, batch: int = 1,
                        repeats: int = 5) -> dict:
    """``{"static": s, "recompute": s}``: median seconds per decoding step of ``steps`` steps
    after BOS, one ``lax.scan`` (the caches carried in place, as decoding carries them), for
    a source of ``source_length`` tokens."""
    params, source = init_params(config), _source(config, batch, source_length)
    mask = jnp.ones(source.shape, bool)
    encoded = compiled_encode(config)(params, source, mask)
    cache, _ = compiled_start(config, batch)(params, encoded, mask)
    tokens = _source(config, batch, steps).T[:, :, None]          # [steps, B, 1]

    def decoding(recompute: bool):
        step = decode_step(config, recompute)

        def run(params, cache, tokens, encoded, mask):
            def one(carry, token):
                cache, encoded = carry
                # a barrier per step, so XLA cannot hoist the loop-invariant projections of
                # ``encoded`` out of the loop (which would make recomputing a cache itself)
                encoded = jax.lax.optimization_barrier(encoded)
                return (step(params, cache, token, encoded, mask)[0], encoded), None
            return jax.lax.scan(one, (cache, encoded), tokens)[0][0]
        return jax.jit(run)

    return {name: median_seconds(decoding(name == "recompute"), params, cache, tokens, encoded,
                                 mask, repeats=repeats) / steps
            for name in ("static", "recompute")}


def beam_seconds(config: Config, source_length: int, tokens: int, beams, *, batch: int = 1,
                 repeats: int = 3) -> dict:
    """``{0: greedy s, K: beam s}``: seconds per target token of whole decodings."""
    params, source = init_params(config), _source(config, batch, source_length)
    seconds = {0: median_seconds(lambda: translate(config, params, source, None, tokens),
                                 repeats=repeats) / tokens}
    for k in beams:
        seconds[k] = median_seconds(lambda k=k: beam_translate(
            config, params, source, None, tokens, beams=k, alpha=0.6), repeats=repeats) / tokens
    return seconds


def run_translation_benchmark(config: Config, sources=(64, 256, 1024), beams=(1, 4, 8), *,
                              tokens: int = 14, batch: int = 1, repeats: int = 5,
                              out: str | None = None) -> list:
    """The rows of the module docstring as two tables; JSON to ``out`` if given."""
    rows = []
    for length in sources:
        seconds = cross_cache_seconds(config, length, tokens, batch=batch, repeats=repeats)
        rows.append({"kind": "cross cache", "source": length, "steps": tokens, "batch": batch,
                     "static_step_s": seconds["static"],
                     "recompute_step_s": seconds["recompute"],
                     "speedup": seconds["recompute"] / seconds["static"]})
    per_token = beam_seconds(config, sources[0], tokens, beams, batch=batch)
    for k, seconds in per_token.items():
        rows.append({"kind": "beam", "source": sources[0], "beams": k or "greedy",
                     "tokens": tokens, "batch": batch, "per_token_s": seconds,
                     "vs_greedy": seconds / per_token[0]})
    m = config.model
    print(f"seq2seq decoding: d_model {m.d_model}, {m.encoder_layers or m.num_layers}+"
          f"{m.num_layers} layers, {m.attention.num_heads} heads, kernel {m.attention.kernel}, "
          f"batch {batch}, {jax.default_backend()}")
    print(f"{'source':>7} {'static ms':>10} {'recompute ms':>13} {'speedup':>8}   "
          f"(per decoding step, {tokens} steps after BOS)")
    for r in rows:
        if r["kind"] == "cross cache":
            print(f"{r['source']:>7} {r['static_step_s'] * 1e3:>10.3f} "
                  f"{r['recompute_step_s'] * 1e3:>13.3f} {r['speedup']:>7.2f}x")
    print(f"{'beams':>7} {'ms/token':>10} {'vs greedy':>10}   (whole decoding of {tokens} "
          f"tokens, source {sources[0]})")
    for r in rows:
        if r["kind"] == "beam":
            print(f"{r['beams']:>7} {r['per_token_s'] * 1e3:>10.3f} {r['vs_greedy']:>9.2f}x")
    write_json(out, {"backend": jax.default_backend(), "rows": rows})
    return rows
