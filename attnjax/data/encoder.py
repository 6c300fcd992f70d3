"""Tasks of a bidirectional encoder: masked-language modelling on text and a synthetic
sequence classification, with BERT's special tokens and padded variable lengths.

Special tokens are the last four ids of the vocabulary (``special_tokens``): ``[PAD] [CLS]
[SEP] [MASK]``; byte-level text has the 256 bytes below them (vocabulary 260). Text under a
``data.tokenizer`` is its ids, with the ids it gives those four names (``mlm_specials``).
An example of ``n`` real tokens in a row of ``L`` (``n = L`` unpadded; padded, ``n`` uniform
in ``[data.min_length, L]``, right or left as ``data.padding`` says, pads ``[PAD]``)::

    single:  [CLS] a [SEP]               segment ids 0 ... 0
    pair:    [CLS] a [SEP] b [SEP]       segment ids 0 for [CLS] a [SEP], 1 for b [SEP]

with ``a b`` one contiguous window of the corpus cut at a uniform point (both non-empty).
The batch: ``inputs``, ``targets``, ``weights``, ``segment_ids`` ``[B, L]`` and, padded,
``positions`` (real tokens 0..n-1) and ``token_mask`` (True at real tokens).

Masked-language modelling (``mlm``): every real non-special token is chosen with probability
``data.mlm_rate``; a chosen token's input is ``[MASK]`` with probability ``mlm_mask_share``,
a uniform random non-special token with ``mlm_random_share``, else itself; ``targets`` are the
original tokens and ``weights`` are 1 exactly at the chosen positions (the loss and accuracy
read nothing else).

``sentences``: the same examples unmasked, for an encoder that outputs its hidden states
(``model.classifier='hidden'``); nothing is scored.

``first_repeat`` classification: ``[CLS] x_1 ... x_m [SEP]`` with ``x`` uniform non-special
tokens, label 1 iff ``x_1`` occurs again in ``x_2..x_m`` (half the examples, at a uniform
position), so deciding it needs attention across the whole sequence; ``targets`` ``[B]`` is the
label and ``weights`` ``[B]`` ones.

References: Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding" (special tokens, segments, the 15% and 80/10/10 masking).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.data.text import BYTES, TextCorpus, text_vocab
from attnjax.data.tokenizer import load_tokenizer
from attnjax.data.task import Task
from attnjax.registry import TASKS

SPECIAL_TOKENS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")
FRAMED_TASKS = ("mlm", "sentences")             # text framed as [CLS] a [SEP] (b [SEP])
_LENGTH, _CUT, _CHOOSE, _REPLACE, _RANDOM, _LABEL, _WHERE = range(1, 8)  # key folds


class Specials(NamedTuple):
    """The special token ids of a vocabulary; ids below ``content`` are ordinary tokens."""
    pad: int
    cls: int
    sep: int
    mask: int

    @property
    def content(self) -> int:
        return self.pad


def special_tokens(vocab_size: int) -> Specials:
    """``[PAD] [CLS] [SEP] [MASK]``: the last four ids of ``vocab_size``."""
    return Specials(*range(vocab_size - len(SPECIAL_TOKENS), vocab_size))


def mlm_vocab(config) -> int:
    """The vocabulary of masked-language-model text under ``config`` (a ``DataConfig``):
    ``data.tokenizer``'s, or the bytes and the four special tokens."""
    return BYTES + len(SPECIAL_TOKENS) if config.tokenizer is None else text_vocab(config)


def mlm_specials(config) -> Specials:
    """``[PAD] [CLS] [SEP] [MASK]`` of masked-language-model text: the ids ``data.tokenizer``
    gives those names (a one-line refusal if it lacks one), else the last four ids."""
    if config.tokenizer is None:
        return special_tokens(mlm_vocab(config))
    tokenizer = load_tokenizer(config.tokenizer)
    ids = [tokenizer.token_id(name) for name in SPECIAL_TOKENS]
    if None in ids:
        raise ValueError(f"data.tokenizer={config.tokenizer!r} has no "
                         f"{SPECIAL_TOKENS[ids.index(None)]} token; task 'mlm' needs "
                         f"{' '.join(SPECIAL_TOKENS)}")
    return Specials(*ids)


def encoder_specials(config) -> Specials:
    """The special tokens of an encoder task's data (``config`` a ``DataConfig``)."""
    if config.task in FRAMED_TASKS:
        return mlm_specials(config)
    return special_tokens(TASKS.get(config.task).vocab(config))


def ordinary_tokens(config) -> np.ndarray:
    """``[V]`` bool, True at the ids masking may choose and draw as random replacements:
    every id of the vocabulary but the special ones (bytes: the ids below ``[PAD]``)."""
    special = (load_tokenizer(config.tokenizer).special_ids.values()
               if config.tokenizer is not None else mlm_specials(config))
    ordinary = np.ones(mlm_vocab(config), bool)
    ordinary[list(special)] = False
    return ordinary


def min_tokens(segments: str) -> int:
    """The fewest tokens of an example: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``."""
    return 3 if segments == "single" else 5


def real_lengths(key, batch_size: int, length: int, config) -> jax.Array:
    """``[B]`` real lengths: ``length`` unpadded, else uniform in ``[min_length, length]``."""
    if config.padding == "none":
        return jnp.full((batch_size,), length, jnp.int32)
    return jax.random.randint(jax.random.fold_in(key, _LENGTH), (batch_size,),
                              config.min_length, length + 1)


def place(tokens, segments, lengths, padding: str, specials: Specials) -> dict:
    """Rows written from index 0 (``tokens``, ``segments`` ``[B, L]``, real ``lengths``
    ``[B]``) moved to their padded places: ``inputs``, ``segment_ids`` and, padded,
    ``positions`` and ``token_mask``."""
    B, L = tokens.shape
    index = jnp.arange(L)[None, :]
    if padding == "none":
        return {"inputs": tokens, "segment_ids": segments}
    source = index - (L - lengths[:, None] if padding == "left" else 0 * lengths[:, None])
    real = (source >= 0) & (source < lengths[:, None])
    take = lambda a, fill: jnp.where(real, jnp.take_along_axis(a, jnp.clip(source, 0, L - 1), 1),
                                     fill)
    return {"inputs": take(tokens, specials.pad), "segment_ids": take(segments, 0),
            "positions": jnp.maximum(source, 0).astype(jnp.int32), "token_mask": real}


def frame_segments(key, window, lengths, segments: str, specials: Specials):
    """``[CLS] a [SEP] (b [SEP])`` from index 0 of each row and its segment ids, from corpus
    ``window`` ``[B, L]`` and real ``lengths`` ``[B]`` (what follows them is ignored)."""
    B, L = window.shape
    window = window.astype(jnp.int32)
    index = jnp.arange(L)[None, :]
    n = lengths[:, None]
    if segments == "single":                            # a = window[0 : n - 2]
        tokens = jnp.where(index == 0, specials.cls, jnp.roll(window, 1, axis=1))
        tokens = jnp.where(index == n - 1, specials.sep, tokens)
        return tokens.astype(jnp.int32), jnp.zeros((B, L), jnp.int32)
    content = n - 3                                     # |a| + |b|, |a| uniform in [1, content)
    cut = 1 + jax.random.randint(jax.random.fold_in(key, _CUT), (B, 1), 0, content - 1)
    shifted = jnp.where(index <= cut, jnp.roll(window, 1, axis=1), jnp.roll(window, 2, axis=1))
    tokens = jnp.where(index == 0, specials.cls, shifted)
    tokens = jnp.where((index == cut + 1) | (index == n - 1), specials.sep, tokens)
    return tokens.astype(jnp.int32), (index > cut + 1).astype(jnp.int32)


def mask_tokens(key, batch: dict, rate, mask_share, random_share, specials: Specials,
                ordinary: np.ndarray) -> dict:
    """The masked-language-model batch of the module docstring from a framed ``batch``;
    ``ordinary``: ``[V]`` bool, the ids that may be chosen and drawn (``ordinary_tokens``)."""
    tokens = batch["inputs"]
    real = batch.get("token_mask", jnp.ones(tokens.shape, bool))
    chosen = real & jnp.asarray(ordinary)[tokens] & (
        jax.random.uniform(jax.random.fold_in(key, _CHOOSE), tokens.shape) < rate)
    u = jax.random.uniform(jax.random.fold_in(key, _REPLACE), tokens.shape)
    drawn = np.flatnonzero(ordinary).astype(np.int32)
    random = jnp.asarray(drawn)[jax.random.randint(jax.random.fold_in(key, _RANDOM),
                                                   tokens.shape, 0, drawn.size)]
    replaced = jnp.where(u < mask_share, specials.mask,
                         jnp.where(u < mask_share + random_share, random, tokens))
    return {**batch, "inputs": jnp.where(chosen, replaced, tokens).astype(jnp.int32),
            "targets": tokens, "weights": chosen.astype(jnp.float32)}


class FramedText:
    """Text (bytes, or ``data.tokenizer``'s ids) framed as encoder examples (on device,
    jittable): masked (task ``mlm``) or as they are (task ``sentences``: for a model that
    outputs hidden states; ``targets`` are the inputs and nothing is scored)."""
    on_device = True

    def __init__(self, config, masked: bool = True):
        self.config, self.masked = config, masked
        self.corpus = TextCorpus(config.path, config.val_fraction, lengths=config.lengths,
                                 tokenizer=config.tokenizer)
        self.vocab_size = mlm_vocab(config)
        self.specials, self.ordinary = mlm_specials(config), ordinary_tokens(config)

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        cfg = self.config
        window = self.corpus.windows(key, batch_size, length, length, split)
        lengths = real_lengths(key, batch_size, length, cfg)
        framed, segments = frame_segments(key, window, lengths, cfg.segments, self.specials)
        batch = place(framed, segments, lengths, cfg.padding, self.specials)
        if not self.masked:
            return {**batch, "targets": batch["inputs"],
                    "weights": jnp.zeros(batch["inputs"].shape, jnp.float32)}
        return mask_tokens(key, batch, cfg.mlm_rate, cfg.mlm_mask_share, cfg.mlm_random_share,
                           self.specials, self.ordinary)


class FirstRepeat:
    """The ``first_repeat`` classification task (on device, jittable)."""
    on_device = True

    def __init__(self, config):
        self.config, self.vocab_size = config, config.vocab_size
        self.specials = special_tokens(config.vocab_size)

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        cfg, sp = self.config, self.specials
        index = jnp.arange(length)[None, :]
        lengths = real_lengths(key, batch_size, length, cfg)
        n = lengths[:, None]
        first = jax.random.randint(key, (batch_size, 1), 0, sp.content)
        # the others: uniform over the content tokens other than the first
        others = jax.random.randint(jax.random.fold_in(key, _RANDOM), (batch_size, length), 0,
                                    sp.content - 1)
        others = others + (others >= first)
        label = jax.random.bernoulli(jax.random.fold_in(key, _LABEL), 0.5, (batch_size, 1))
        repeat_at = 2 + jax.random.randint(jax.random.fold_in(key, _WHERE), (batch_size, 1), 0,
                                           n - 3)              # a content slot 2..n-2
        tokens = jnp.where(index == 1, first, others)
        tokens = jnp.where(label & (index == repeat_at), first, tokens)
        tokens = jnp.where(index == 0, sp.cls, jnp.where(index == n - 1, sp.sep, tokens))
        batch = place(tokens.astype(jnp.int32), jnp.zeros_like(tokens, jnp.int32), lengths,
                      cfg.padding, sp)
        return {**batch, "targets": label[:, 0].astype(jnp.int32),
                "weights": jnp.ones((batch_size,), jnp.float32)}


def _check(config, fewest: int, task: str):
    if config.padding != "none" and config.min_length < fewest:
        raise ValueError(f"data.min_length={config.min_length} must be >= {fewest} for "
                         f"task={task!r} (its shortest example)")
    for n in config.lengths:
        if n < fewest:
            raise ValueError(f"data.length={n} must be >= {fewest} for task={task!r} (its "
                             "shortest example)")


def _check_mlm(config):
    _check(config, min_tokens(config.segments), "mlm")
    if config.mlm_mask_share + config.mlm_random_share > 1:
        raise ValueError(f"data.mlm_mask_share + mlm_random_share = "
                         f"{config.mlm_mask_share + config.mlm_random_share} must be <= 1 (the "
                         "rest of the chosen tokens stay unchanged)")


def _check_first_repeat(config):
    _check(config, 4, "first_repeat")
    if config.vocab_size < len(SPECIAL_TOKENS) + 2:
        raise ValueError(f"data.vocab_size={config.vocab_size} must be >= 6 for task="
                         "'first_repeat' (two ordinary tokens and the four special ones)")


PADDING_FIELDS = ("padding", "min_length")
TEXT_FIELDS = ("path", "tokenizer", "segments") + PADDING_FIELDS
TASKS.register("mlm", Task(
    FramedText, TEXT_FIELDS + ("mlm_rate", "mlm_mask_share", "mlm_random_share"), _check_mlm,
    objective="mlm", vocab=mlm_vocab))
TASKS.register("sentences", Task(
    lambda config: FramedText(config, masked=False), TEXT_FIELDS,
    lambda config: _check(config, min_tokens(config.segments), "sentences"),
    objective="embedding", vocab=mlm_vocab))
TASKS.register("first_repeat", Task(
    FirstRepeat, ("vocab_size",) + PADDING_FIELDS, _check_first_repeat,
    objective="classification"))
