"""Beam search with a KV cache, one compiled program, for the decoding families.

Beams are a batch axis: source (or prompt) ``b`` owns rows ``b K .. b K + K - 1`` of every
self-attention cache, one slot per beam, reordered by parent index at every step; an
encoder–decoder's cross-attention cache has one row per source, read by all of its beams and
never copied (``nn.attention.MultiHeadAttention``). Each step scores the ``K V`` extensions of
the live beams, keeps the best ``2K`` (at most ``K`` of them end in EOS, one per parent, so
``K`` live beams always survive), moves those ending in EOS to a pool of finished hypotheses
(the best ``K`` kept) scored with the GNMT length penalty

    score(y) = log P(y) / lp(|y|),   lp(L) = ((5 + L) / 6) ** alpha

(``|y|`` counts EOS), and continues the ``K`` best others. It stops at ``num_tokens`` or
when no live beam can still beat the worst finished one (for ``alpha >= 0`` a live beam's
best reachable score is ``log P / lp(num_tokens)``, as log-probabilities only fall); if none
finished, the live beams are returned, scored at their length.

References: Wu et al. 2016, "Google's Neural Machine Translation System" (length penalty).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attnjax import sharding
from attnjax.data.seq2seq import seq2seq_specials
from attnjax.generate import check_sampling, decode_step, empty_cache
from attnjax.translate import check_translation, encode, start
from attnjax.translate import decode_step as translation_step
from attnjax.train import footprint


class Hypotheses(NamedTuple):
    """The ``K`` best hypotheses of each of ``B`` sources, best first: ``tokens`` ``[B, K,
    num_tokens]`` (EOS included, PAD after it), ``scores`` ``[B, K]`` (``log P / lp(L)``),
    ``lengths`` ``[B, K]`` (``L``) and ``finished`` ``[B, K]`` (ended in EOS)."""
    tokens: np.ndarray
    scores: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray


def length_penalty(length, alpha: float):
    """GNMT's ``lp(L) = ((5 + L) / 6) ** alpha``."""
    return ((5.0 + length) / 6.0) ** alpha


def reorder_cache(cache, rows: jax.Array):
    """The cache with every self-attention leaf's rows taken from ``rows`` ``[B K]`` (each
    beam's parent row); the cross-attention cache (one row per source) and the counters kept."""
    def take(path, leaf):
        if jnp.ndim(leaf) == 0 or any(getattr(p, "key", None) == "cross_attention"
                                      for p in path):
            return leaf
        return jnp.take(leaf, rows, axis=0)
    return jax.tree_util.tree_map_with_path(take, cache)


def _top(scores, k: int, *arrays):
    """The ``k`` best of ``scores`` ``[B, M]`` and the same entries of each ``[B, M, ...]``."""
    best, index = jax.lax.top_k(scores, k)
    return best, *(jnp.take_along_axis(a, index.reshape(index.shape + (1,) * (a.ndim - 2)), 1)
                   for a in arrays)


def beam_search(step, cache, logits, *, beams: int, num_tokens: int, eos: int | None,
                pad: int, alpha: float, reorder=reorder_cache) -> Hypotheses:
    """Beam search of the module docstring, traceable (one ``lax.while_loop``).

    ``step(cache, tokens [B K, 1]) -> (cache, logits [B K, 1, V])`` decodes one token per
    row; ``cache`` and ``logits`` ``[B K, V]`` are those after the prompt (or BOS), the ``K``
    rows of a source alike. ``eos`` None: no hypothesis ends before ``num_tokens``.
    ``reorder(cache, rows)`` moves each beam's cache slot to its parent's (``reorder_cache``;
    the tests and claim CX9c swap it for broken ones)."""
    rows, V = logits.shape[0], logits.shape[-1]
    B, K, N = rows // beams, beams, num_tokens
    first = jnp.arange(B)[:, None] * K                         # each source's first row
    blank = jnp.full((B, K, N), pad, jnp.int32)
    start_raw = jnp.where(jnp.arange(K) == 0, 0.0, -jnp.inf)[None].repeat(B, 0)
    state = dict(t=jnp.zeros((), jnp.int32), cache=cache, logits=logits.astype(jnp.float32),
                 live=blank, raw=start_raw, done=blank, done_score=jnp.full((B, K), -jnp.inf),
                 done_length=jnp.zeros((B, K), jnp.int32))

    def extend(tokens, parent, token, t):
        """``tokens`` ``[B, K, N]`` rows ``parent`` ``[B, M]`` with ``token`` at ``t``."""
        picked = jnp.take_along_axis(tokens, parent[..., None], 1)
        return jax.lax.dynamic_update_slice_in_dim(picked, token[..., None], t, axis=2)

    def body(s):
        t = s["t"]
        logp = jax.nn.log_softmax(s["logits"], -1).reshape(B, K, V)
        raw, index = jax.lax.top_k((s["raw"][..., None] + logp).reshape(B, K * V), 2 * K)
        parent, token = index // V, (index % V).astype(jnp.int32)
        ends = (token == eos) if eos is not None else jnp.zeros_like(token, bool)
        ended = jnp.where(ends, raw / length_penalty(t + 1, alpha), -jnp.inf)
        done_score, done, done_length = _top(
            jnp.concatenate([s["done_score"], ended], 1), K,
            jnp.concatenate([s["done"], extend(s["live"], parent, token, t)], 1),
            jnp.concatenate([s["done_length"], jnp.full((B, 2 * K), t + 1, jnp.int32)], 1))
        raw, parent, token = _top(jnp.where(ends, -jnp.inf, raw), K, parent, token)
        cache = reorder(s["cache"], (first + parent).reshape(-1))
        cache, logits = step(cache, token.reshape(rows, 1))
        return dict(t=t + 1, cache=cache, logits=logits[:, -1].astype(jnp.float32),
                    live=extend(s["live"], parent, token, t), raw=raw, done=done,
                    done_score=done_score, done_length=done_length)

    def running(s):
        worst = s["done_score"].min(1)                       # -inf until K have finished
        best_live = s["raw"].max(1) / length_penalty(N, alpha)
        settled = (worst > -jnp.inf) & (best_live < worst)
        return (s["t"] < N) & ~settled.all()

    s = jax.lax.while_loop(running, body, state)
    # the live beams join the pool at their length: the result when none finished
    live_score = s["raw"] / length_penalty(s["t"], alpha)
    scores, tokens, lengths, finished = _top(
        jnp.concatenate([s["done_score"], live_score], 1), K,
        jnp.concatenate([s["done"], s["live"]], 1),
        jnp.concatenate([s["done_length"], jnp.full((B, K), s["t"], jnp.int32)], 1),
        jnp.concatenate([jnp.ones((B, K), bool), jnp.zeros((B, K), bool)], 1))
    return Hypotheses(tokens, scores, lengths, finished)


def check_beams(beams: int, alpha: float, config=None, *, num_tokens: int = 1,
                sources: int = 1, prompt: int = 1, params=None) -> None:
    """A one-line ValueError for a beam width or length penalty beam search cannot use; with
    ``config``, also for more beams than the ``vocab ** num_tokens`` distinct hypotheses of
    ``num_tokens`` tokens, and for a search of ``sources`` prompts of ``prompt`` tokens (1:
    BOS) that cannot fit in memory (``footprint.check_inference``: the parameters,
    ``params``' or the config's, the KV cache of ``sources x beams`` rows, the prompt's
    forward pass and each step's scores over the vocabulary)."""
    if not isinstance(beams, (int, np.integer)) or isinstance(beams, bool) or beams < 1:
        raise ValueError(f"beams (--beams) must be an integer >= 1, got {beams!r}")
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"the length penalty alpha (--length-penalty) must be a finite number "
                         f">= 0 (0: none), got {alpha!r}")
    if config is None:
        return
    V = config.model.vocab_size
    hypotheses = V ** min(num_tokens, int(beams).bit_length())   # V**n, or past beams anyway
    if beams > hypotheses:
        raise ValueError(f"beams (--beams) must be at most {hypotheses} = {V}**{num_tokens}, "
                         f"the sequences there are of {num_tokens} token(s) (--tokens) over "
                         f"model.vocab_size={V}, got {beams}")
    rows = sources * int(beams)
    parts = {"KV cache": footprint.cache_bytes(config, rows),
             "activations": footprint.forward_bytes(config, rows, prompt),
             "scores": 2 * rows * V * 4}     # each step's float32 logits and log-probabilities
    footprint.check_inference(
        config, parts, f"--beams {beams}: a beam search of {rows} rows",
        "fewer --beams (or a smaller model.max_length, the cache's slots per row)",
        parameters=None if params is None else footprint.tree_bytes(params))


def beam_generate(config, params, prompts, num_tokens: int, *, beams: int,
                  alpha: float = 0.6, mesh=None, eos: int | None = None) -> Hypotheses:
    """The ``beams`` most likely continuations of at most ``num_tokens`` tokens of each
    prompt (``prompts`` ``[B, P]``) of a decoding family; ``eos``: the token that ends a
    hypothesis (e.g. a chat model's end of turn; None: every hypothesis has ``num_tokens``
    tokens); ``mesh``: as ``generate``'s."""
    prompts = check_sampling(config, prompts, num_tokens, 0.0, None, 0)
    check_beams(beams, alpha, config, num_tokens=num_tokens, sources=prompts.shape[0],
                prompt=prompts.shape[1], params=params)
    if eos is not None and not 0 <= eos < config.model.vocab_size:
        raise ValueError(f"eos must be a token id in [0, {config.model.vocab_size}), got {eos}")
    program = _generation_program(config, num_tokens, beams, float(alpha), mesh,
                                  None if eos is None else int(eos))
    return Hypotheses(*map(np.asarray, program(params, jnp.asarray(prompts, jnp.int32))))


@functools.lru_cache(maxsize=16)
def _generation_program(config, num_tokens: int, beams: int, alpha: float, mesh,
                        eos: int | None = None):
    step = decode_step(config)

    @sharding.traced_on(config, mesh)
    def run(params, prompts):
        rows = jnp.repeat(prompts, beams, axis=0)
        cache, logits = step(params, empty_cache(config, rows.shape[0]), rows)
        return beam_search(lambda c, tokens: step(params, c, tokens), cache, logits[:, -1],
                           beams=beams, num_tokens=num_tokens, eos=eos, pad=0, alpha=alpha)

    return jax.jit(run)


def beam_translate(config, params, source, source_mask=None, num_tokens: int | None = None,
                   *, beams: int, alpha: float = 0.6, reorder=reorder_cache) -> Hypotheses:
    """The ``beams`` best translations of each source (``source`` ``[B, S]``) of a seq2seq
    run, at most ``num_tokens`` tokens each (default ``model.max_length - 1``); ``reorder``:
    see ``beam_search``."""
    source, mask, num_tokens = check_translation(config, source, source_mask, num_tokens)
    check_beams(beams, alpha, config, num_tokens=num_tokens, sources=source.shape[0],
                params=params)
    program = _translation_program(config, num_tokens, beams, float(alpha), reorder)
    return Hypotheses(*map(np.asarray, program(params, source, mask)))


@functools.lru_cache(maxsize=16)
def _translation_program(config, num_tokens: int, beams: int, alpha: float, reorder):
    specials = seq2seq_specials(config.model.vocab_size)
    step = translation_step(config)

    def run(params, source, mask):
        encoded = encode(config, params, source, mask)
        cache, logits = start(config, params, encoded, mask, source.shape[0] * beams)
        return beam_search(lambda c, tokens: step(params, c, tokens, encoded, mask), cache,
                           logits[:, -1], beams=beams, num_tokens=num_tokens, eos=specials.eos,
                           pad=specials.pad, alpha=alpha, reorder=reorder)

    return jax.jit(run)
