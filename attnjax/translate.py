"""Decoding an encoder–decoder (the ``seq2seq`` family) with a static cross-attention cache,
as one compiled program.

The encoder runs once per source. Every decoder layer's cross-attention keys and values are
computed once from its output and stored in the ``cache`` collection (``cross_key``,
``cross_value``, ``source_mask``), which the decoding steps read and never rewrite; the
self-attention keeps its append-only cache. ``recompute=True`` is the baseline without the
static cache: every step projects the encoder's output to keys and values again (what t5x
and flaxformer decoders do). ``translate`` decodes greedily: BOS, then the argmax fed back
until EOS (then PAD) or ``num_tokens``, inside a ``lax.scan``; ``freeze_self=True`` is the
ablation that treats self-attention like cross-attention (claim XA1c): its cache kept as it
was after BOS, so each later token attends to BOS and to itself only.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config.kernel import kernel_request
from attnjax.data.seq2seq import seq2seq_specials
from attnjax.models import build, family


def check_translates(config) -> None:
    """Refuse, in one line, a model that is not an encoder–decoder or whose kernel or
    position encoding cannot decode."""
    if family(config.model).objective(config.model) != "seq2seq":
        raise ValueError(f"model.family={config.model.family!r} has no source to translate "
                         "from; family 'seq2seq' does")
    kernel_request(config.model, decode=True)
    kernel_request(config.model, decode=True, cross=True)


def encode(config, params, source, source_mask=None):
    """The encoder's states ``[B, S, d_model]`` of ``source`` ``[B, S]``."""
    return build(config.model).apply({"params": params}, None, source=source,
                                     source_mask=source_mask, encode=True)


def start(config, params, encoded, source_mask, rows: int):
    """``(cache, logits [rows, 1, vocab])`` after BOS for ``rows`` target sequences (a multiple
    of the ``B`` sources; rows ``b R .. b R + R - 1`` read source ``b``): the call that
    passes the encoder's states ``encoded`` ``[B, S, d_model]``, so every layer's
    cross-attention cache is filled from them, here and only here."""
    model = build(config.model)
    bos = jnp.full((rows, 1), seq2seq_specials(config.model.vocab_size).bos, jnp.int32)
    empty = model.init(jax.random.key(0), bos, encoded=encoded, source_mask=source_mask,
                       decode=True)["cache"]           # the cache's shapes (its values unused)
    (logits, _), cache = model.apply({"params": params, "cache": empty}, bos, encoded=encoded,
                                     source_mask=source_mask, decode=True, mutable=["cache"])
    return cache["cache"], logits


@functools.lru_cache(maxsize=16)
def compiled_encode(config):
    """``encode`` of ``config`` as one compiled program ``(params, source, source_mask) ->
    encoded``, for callers outside a compiled decoding loop (a step-by-step loop, a
    benchmark): op by op, the encoder would compile each of its operations alone."""
    return jax.jit(functools.partial(encode, config))


@functools.lru_cache(maxsize=16)
def compiled_start(config, rows: int):
    """``start`` of ``config`` for ``rows`` target sequences as one compiled program
    ``(params, encoded, source_mask) -> (cache, logits)`` (see ``compiled_encode``)."""
    return jax.jit(lambda params, encoded, source_mask: start(config, params, encoded,
                                                              source_mask, rows))


def decode_step(config, recompute: bool = False):
    """``step(params, cache, tokens, encoded, source_mask) -> (cache, logits [rows, T,
    vocab])``: ``tokens`` ``[rows, T]`` placed after those the cache holds. With the static
    cache ``encoded`` and ``source_mask`` are not read; with ``recompute`` every
    cross-attention layer projects ``encoded`` again."""
    model = build(config.model)

    def step(params, cache, tokens, encoded, source_mask):
        again = dict(encoded=encoded, source_mask=source_mask) if recompute else {}
        (logits, _), updated = model.apply({"params": params, "cache": cache}, tokens,
                                           decode=True, mutable=["cache"], **again)
        return updated["cache"], logits

    return step


def decoded_logits(config, params, source, source_mask, tokens, recompute: bool = False):
    """``[R B, N, vocab]``: the logits of decoding ``tokens`` ``[R B, N]`` (``R`` rows per
    source, as ``start`` lays out beams) step by step with a fresh cache (BOS, then ``tokens[:,
    :-1]`` fed back, in one ``lax.scan``), each row's distribution over its next token."""
    source, mask, _ = check_translation(config, source, source_mask, tokens.shape[1])
    return _forced(config, recompute)(params, source, mask, jnp.asarray(tokens, jnp.int32))


@functools.lru_cache(maxsize=16)
def _forced(config, recompute: bool):
    step = decode_step(config, recompute)

    def run(params, source, mask, tokens):
        encoded = encode(config, params, source, mask)
        cache, first = start(config, params, encoded, mask, tokens.shape[0])
        one = lambda cache, token: step(params, cache, token[:, None], encoded, mask)
        _, rest = jax.lax.scan(one, cache, tokens[:, :-1].T)           # [N - 1, B, 1, V]
        return jnp.concatenate([first, jnp.swapaxes(rest[:, :, 0], 0, 1)], axis=1)

    return jax.jit(run)


def exact_matches(config, params, batch: dict, **options) -> np.ndarray:
    """``[B]`` bool: whether greedy decoding (``translate`` with ``options``) of each of
    ``batch``'s sources reproduces its ``targets`` exactly, EOS included."""
    targets = np.asarray(batch["targets"])
    found = translate(config, params, batch["source"], batch["source_mask"], targets.shape[1],
                      **options)
    return (found == targets).all(axis=1)


def frozen_self_attention(cache, frozen):
    """``cache`` with every self-attention layer's entries (``cached_key``, ``cached_value``,
    ``index``) taken from ``frozen``; the cross-attention caches and the position counter
    kept, so the next token is placed at its true position but writes its keys and values
    over the slot after ``frozen``'s."""
    def pick(path, new, old):
        return old if any(getattr(p, "key", None) == "attention" for p in path) else new
    return jax.tree_util.tree_map_with_path(pick, cache, frozen)


def check_translation(config, source, source_mask=None, num_tokens: int | None = None):
    """``(source, source_mask, num_tokens)`` as arrays (the mask all True by default, the
    number of tokens ``model.max_length - 1`` by default), or a one-line ValueError naming
    what cannot be translated, before anything compiles."""
    check_translates(config)
    num_tokens = config.model.max_length - 1 if num_tokens is None else num_tokens
    if not 1 <= num_tokens < config.model.max_length:
        raise ValueError(f"num_tokens={num_tokens} (--tokens) must be in [1, "
                         f"{config.model.max_length - 1}] (BOS and the tokens fill the cache of "
                         "model.max_length)")
    source = jnp.asarray(source, jnp.int32)
    if source.ndim != 2 or source.shape[1] == 0:
        raise ValueError(f"source must be [batch, length] with length >= 1, got shape "
                         f"{source.shape}")
    mask = jnp.ones(source.shape, bool) if source_mask is None else jnp.asarray(source_mask, bool)
    return source, mask, num_tokens


def translate(config, params, source, source_mask=None, num_tokens: int | None = None,
              recompute: bool = False, freeze_self: bool = False) -> np.ndarray:
    """Greedy decoding of ``source`` ``[B, S]``: ``[B, num_tokens]`` target tokens (default
    ``model.max_length - 1``), EOS included, PAD after it (``recompute``, ``freeze_self``: see
    the module docstring)."""
    source, mask, num_tokens = check_translation(config, source, source_mask, num_tokens)
    return np.asarray(_greedy(config, num_tokens, recompute, freeze_self)(params, source, mask))


@functools.lru_cache(maxsize=16)
def _greedy(config, num_tokens: int, recompute: bool, freeze_self: bool):
    specials = seq2seq_specials(config.model.vocab_size)
    step = decode_step(config, recompute)

    def run(params, source, mask):
        encoded = encode(config, params, source, mask)
        cache, logits = start(config, params, encoded, mask, source.shape[0])
        first, after_bos = jnp.argmax(logits[:, -1], -1), cache

        def one_token(carry, _):
            cache, token, done = carry
            cache, logits = step(params, cache, token[:, None], encoded, mask)
            if freeze_self:
                cache = frozen_self_attention(cache, after_bos)
            token = jnp.where(done, specials.pad, jnp.argmax(logits[:, -1], -1))
            return (cache, token, done | (token == specials.eos)), token

        _, rest = jax.lax.scan(one_token, (cache, first, first == specials.eos), None,
                               length=num_tokens - 1)
        return jnp.concatenate([first[:, None], rest.T], axis=1)

    return jax.jit(run)
