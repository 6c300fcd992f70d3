"""Tasks of an encoder–decoder: a source sequence in, a target sequence out, with a known
alignment (which source position each target token copies).

Special tokens are the last three ids of the vocabulary (``seq2seq_specials``): ``PAD BOS
EOS``; ids below them are content. An example has ``n`` content tokens ``x``; in a row of
``L = data.length``::

    source   x_1 ... x_n EOS PAD ...        source_mask True at the n + 1 real tokens
    inputs   BOS y_1 ... y_m PAD ...        (the decoder reads these, causally)
    targets  y_1 ... y_m EOS PAD ...        weights 1 at the m + 1 real targets

``n = L - 1`` with ``data.padding='none'``; with ``'right'`` the real source length ``n + 1``
is uniform in ``[data.min_length, L]`` per example. ``alignment`` ``[B, L]`` is the source
index target token i copies (EOS: the source's EOS), -1 at pads. The tasks:

- ``reversal``: ``y_i = x_{n+1-i}``;
- ``sorting``: ``y`` is ``x`` sorted (ties in source order);
- ``permutation``: ``x`` read in a fixed order, the positions ``j < n`` sorted by ``frac(j phi)``
  (``phi`` the golden ratio): a permutation fixed per length, the same for every example;
- ``letters`` (byte-level text, ``data.path``): ``y`` is ``x`` with everything but the ASCII
  letters left out, so which source position comes next depends on the content, not on the
  position alone.

The first three draw ``x`` uniformly from the ``data.vocab_size - 3`` content tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from attnjax.data.text import BYTES, TextCorpus
from attnjax.data.task import Task
from attnjax.registry import TASKS

SPECIAL_TOKENS = ("PAD", "BOS", "EOS")
GOLDEN = 0.6180339887498949
_LENGTH, _TOKENS = 1, 2                  # key folds


class Specials(NamedTuple):
    """The special token ids of a vocabulary; ids below ``pad`` are content."""
    pad: int
    bos: int
    eos: int


def seq2seq_specials(vocab_size: int) -> Specials:
    """``PAD BOS EOS``: the last three ids of ``vocab_size``."""
    return Specials(*range(vocab_size - len(SPECIAL_TOKENS), vocab_size))


def content_lengths(key, batch_size: int, length: int, config) -> jax.Array:
    """``[B]`` content lengths ``n``: ``length - 1``, or with right padding ``n + 1`` uniform in
    ``[min_length, length]``."""
    if config.padding == "none":
        return jnp.full((batch_size,), length - 1, jnp.int32)
    return jax.random.randint(jax.random.fold_in(key, _LENGTH), (batch_size,),
                              config.min_length, length + 1) - 1


def frame(x, n, order, m, specials: Specials) -> dict:
    """The batch of the module docstring from content ``x`` ``[B, L]`` (real at ``j < n``),
    the target's source indices ``order`` ``[B, L]`` (real at ``i < m``) and ``m`` ``[B]``."""
    L = x.shape[1]
    index = jnp.arange(L)[None, :]
    n, m = n[:, None], m[:, None]
    y = jnp.take_along_axis(x, jnp.clip(order, 0, L - 1), axis=1)
    pad = lambda a, end, at_end: jnp.where(index < end, a, jnp.where(index == end, at_end,
                                                                      specials.pad))
    return {
        "source": pad(x, n, specials.eos).astype(jnp.int32),
        "source_mask": index <= n,
        "inputs": jnp.where(index == 0, specials.bos,
                            pad(jnp.roll(y, 1, axis=1), m + 1, specials.pad)).astype(jnp.int32),
        "targets": pad(y, m, specials.eos).astype(jnp.int32),
        "weights": (index <= m).astype(jnp.float32),
        "alignment": jnp.where(index < m, order, jnp.where(index == m, n, -1)).astype(jnp.int32),
    }


def stable_order(keys, real) -> jax.Array:
    """Indices that sort ``keys`` ``[B, L]`` ascending, ties in index order, the positions
    where ``real`` is False last."""
    L = keys.shape[1]
    index = jnp.arange(L)[None, :]
    big = jnp.iinfo(jnp.int32).max // (2 * L)
    return jnp.argsort(jnp.where(real, keys, big) * L + index, axis=1)


def reverse_order(x, n):
    index = jnp.arange(x.shape[1])[None, :]
    return jnp.where(index < n[:, None], n[:, None] - 1 - index, index), n


def sort_order(x, n):
    index = jnp.arange(x.shape[1])[None, :]
    return stable_order(x, index < n[:, None]), n


def permute_order(x, n):
    index = jnp.arange(x.shape[1])[None, :]
    rank = jnp.argsort(jnp.argsort((index * GOLDEN) % 1.0, axis=1), axis=1)  # fixed per index
    return stable_order(jnp.broadcast_to(rank, x.shape), index < n[:, None]), n


def letters_order(x, n):
    index = jnp.arange(x.shape[1])[None, :]
    upper = x & ~jnp.int32(32)                          # ASCII: a letter's upper case
    keep = (index < n[:, None]) & (upper >= ord("A")) & (upper <= ord("Z"))
    return stable_order(jnp.zeros_like(x), keep), keep.sum(1).astype(jnp.int32)


ORDERS = {"reversal": reverse_order, "sorting": sort_order, "permutation": permute_order}


class SyntheticPairs:
    """``reversal``, ``sorting`` or ``permutation`` of uniform content tokens (jittable)."""
    on_device = True

    def __init__(self, config, order):
        self.config, self.order = config, order
        self.vocab_size = config.vocab_size
        self.specials = seq2seq_specials(config.vocab_size)

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        n = content_lengths(key, batch_size, length, self.config)
        x = jax.random.randint(jax.random.fold_in(key, _TOKENS), (batch_size, length), 0,
                               self.specials.pad)
        return frame(x, n, *self.order(x, n), self.specials)


class LetterText:
    """``letters`` on byte-level windows of ``data.path`` (on device, jittable)."""
    on_device = True

    def __init__(self, config):
        self.config = config
        self.corpus = TextCorpus(config.path, config.val_fraction, lengths=config.lengths)
        self.vocab_size = BYTES + len(SPECIAL_TOKENS)
        self.specials = seq2seq_specials(self.vocab_size)

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        x = self.corpus.windows(key, batch_size, length, length, split).astype(jnp.int32)
        n = content_lengths(key, batch_size, length, self.config)
        return frame(x, n, *letters_order(x, n), self.specials)


def _check(config, task: str):
    if config.padding == "left":
        raise ValueError(f"data.padding='left' is not a framing of task={task!r}: its source "
                         "and target are padded on the right (choices: none, right)")
    if config.padding == "right" and config.min_length < 2:
        raise ValueError(f"data.min_length={config.min_length} must be >= 2 for task={task!r} "
                         "(one content token and EOS)")
    if task != "letters" and config.vocab_size < len(SPECIAL_TOKENS) + 2:
        raise ValueError(f"data.vocab_size={config.vocab_size} must be >= 5 for task={task!r} "
                         "(two content tokens and PAD, BOS, EOS)")


PADDING_FIELDS = ("padding", "min_length")
for _name, _order in ORDERS.items():
    TASKS.register(_name, Task(
        lambda config, order=_order: SyntheticPairs(config, order),
        ("vocab_size",) + PADDING_FIELDS, lambda config, name=_name: _check(config, name),
        objective="seq2seq"))
TASKS.register("letters", Task(
    LetterText, ("path",) + PADDING_FIELDS, lambda config: _check(config, "letters"),
    objective="seq2seq", vocab=lambda config: BYTES + len(SPECIAL_TOKENS)))
