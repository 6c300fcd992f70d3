"""Text (as bytes, or as a tokenizer's ids) and pre-tokenized corpora, sampled as random
windows.

Split: the first ``1 - val_fraction`` of the corpus trains, the rest validates (a contiguous
tail, so no window straddles both). A window of ``L + 1`` tokens gives ``inputs = w[:-1]`` and
``targets = w[1:]``, all scored; with ``data.bos_token`` a window of ``L`` tokens gives
``inputs = [bos] + w[:-1]`` and ``targets = w``; ``data.padding`` pads examples of random
lengths (``attnjax.data.padding``). Window offsets are a pure function of the batch key.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.data.padding import PLAIN, Framing
from attnjax.data.task import Task
from attnjax.data.tokenizer import load_tokenizer
from attnjax.registry import TASKS

SEPARATOR = b"\n\n"
BYTES = 256                      # the vocabulary of byte-level text


def builtin_corpus_files() -> list[Path]:
    """The running interpreter's top-level standard-library sources: a few MB of real text
    that exists wherever Python does (identical for identical Python versions)."""
    stdlib = Path(os.__file__).parent
    return sorted(stdlib.glob("*.py"))


def read_bytes(path: str | None) -> np.ndarray:
    """A UTF-8 file, every file under a directory (sorted, joined by a blank line), or the
    built-in corpus for ``None``, as ``uint8``."""
    if path is None:
        files = builtin_corpus_files()
    else:
        root = Path(path)
        if not root.exists():
            raise FileNotFoundError(f"data.path={path!r} does not exist")
        if not (root.is_dir() or root.is_file()):
            raise ValueError(f"data.path={path!r} is neither a regular file nor a directory "
                             "(a device or a pipe never ends)")
        if root.is_dir() and Path(sys.prefix).resolve().is_relative_to(root.resolve()):
            raise ValueError(f"data.path={path!r} contains this Python environment "
                             f"({sys.prefix}): name the directory of the corpus itself")
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        if not files:
            raise ValueError(f"data.path={path!r} is a directory with no files")
    data = SEPARATOR.join(f.read_bytes() for f in files)
    return np.frombuffer(data, np.uint8)


def split_bounds(size: int, split: str, val_fraction: float) -> tuple[int, int]:
    """``[start, end)`` of ``split`` ('train' or 'val') in a corpus of ``size`` tokens."""
    cut = int(size * (1.0 - val_fraction))
    return (0, cut) if split == "train" else (cut, size)


def check_splits(size: int, lengths, val_fraction: float, path, splits=("train", "val")):
    """Refuse a corpus of ``size`` tokens whose ``splits`` cannot hold a window of each of
    ``lengths`` (``length + 1`` tokens), naming the file: checked when the corpus is opened,
    before a run directory is written."""
    for split in splits:
        start, end = split_bounds(size, split, val_fraction)
        for length in lengths:
            if end - start < length + 1:
                raise ValueError(f"data.path={path!r}: the {split} split has {end - start} "
                                 f"tokens, fewer than data.length + 1 = {length + 1}")


def text_vocab(config) -> int:
    """The vocabulary of text under ``config`` (a ``DataConfig``): 256 bytes, or the ids of
    ``data.tokenizer``."""
    return BYTES if config.tokenizer is None else load_tokenizer(config.tokenizer).vocab_size


class TextCorpus:
    """Text on device, as bytes or (``tokenizer``, a ``tokenizer.json`` path) as its ids
    without special tokens; ``sample`` is jittable, so batches can be generated inside a
    scan."""
    on_device = True

    def __init__(self, path: str | None, val_fraction: float = 0.1,
                 framing: Framing = PLAIN, lengths=(), tokenizer: str | None = None):
        self.tokens = read_bytes(path)
        self.vocab_size = BYTES
        if tokenizer is not None:
            codec = load_tokenizer(tokenizer)
            self.tokens = codec.encode(self.tokens.tobytes().decode("utf-8", "replace"),
                                       special=False)
            self.vocab_size = codec.vocab_size
        self.path, self.val_fraction, self.framing = path, val_fraction, framing
        check_splits(len(self.tokens), lengths, val_fraction, path)
        self._device = jnp.asarray(self.tokens)

    def windows(self, key, batch_size: int, length: int, size: int, split: str) -> jax.Array:
        """``[B, size]`` corpus windows of ``split`` at offsets drawn from ``key`` for examples
        of ``length`` tokens."""
        check_splits(len(self.tokens), [length], self.val_fraction, self.path, [split])
        start, end = split_bounds(len(self.tokens), split, self.val_fraction)
        offsets = jax.random.randint(key, (batch_size,), start, end - length)
        return jax.vmap(lambda o: jax.lax.dynamic_slice(self._device, (o,), (size,)))(offsets)

    def sample(self, key, batch_size: int, length: int, split: str) -> dict:
        windows = self.windows(key, batch_size, length, self.framing.window(length), split)
        return self.framing.device(key, windows, self.vocab_size)


class TokenFile:
    """A flat array of token ids on disk, memory-mapped; windows are read on the host.

    For corpora tokenized by the user's own tokenizer (``np.ndarray.tofile`` of uint16/uint32).
    Every id must be below ``vocab_size`` (checked once, when the file is opened).
    """
    on_device = False

    def __init__(self, path: str, dtype: str, vocab_size: int, val_fraction: float = 0.1,
                 framing: Framing = PLAIN, lengths=()):
        if not Path(path).is_file():
            raise FileNotFoundError(f"data.path={path!r} is not a file")
        size, itemsize = Path(path).stat().st_size, np.dtype(dtype).itemsize
        if not size or size % itemsize:
            raise ValueError(f"data.path={path!r} holds {size} bytes, not a positive multiple "
                             f"of data.token_dtype={dtype!r} ({itemsize} bytes per token)")
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        low, high = int(self.tokens.min()), int(self.tokens.max())
        if high >= vocab_size or low < 0:
            raise ValueError(f"data.path={path!r} holds token ids from {low} to {high}, but "
                             f"data.vocab_size={vocab_size}: ids must be in [0, {vocab_size})")
        check_splits(self.tokens.size, lengths, val_fraction, path)
        self.path, self.vocab_size = path, vocab_size
        self.val_fraction, self.framing = val_fraction, framing

    def sample_host(self, seed_sequence: list[int], batch_size: int, length: int,
                    split: str) -> dict:
        check_splits(len(self.tokens), [length], self.val_fraction, self.path, [split])
        start, end = split_bounds(len(self.tokens), split, self.val_fraction)
        rng = np.random.default_rng(seed_sequence)
        offsets = rng.integers(start, end - length, size=batch_size)
        size = self.framing.window(length)
        windows = np.stack([self.tokens[o:o + size] for o in offsets])
        return self.framing.host(seed_sequence, windows, self.vocab_size)


def _check_text(config):
    if config.tokenizer is None and config.vocab_size != BYTES:
        raise ValueError(f"data.vocab_size is 256 for byte-level text, got {config.vocab_size}")


def _check_tokens(config):
    if config.path is None:
        raise ValueError("data.path is required for task='tokens'")


# the data fields of attnjax.data.padding, read by both corpora
FRAMING_FIELDS = ("bos_token", "padding", "min_length", "pad_token")

TASKS.register("text", Task(
    lambda c: TextCorpus(c.path, c.val_fraction, Framing.of(c), c.lengths, c.tokenizer),
    ("path", "tokenizer") + FRAMING_FIELDS, _check_text, vocab=text_vocab))
TASKS.register("tokens", Task(
    lambda c: TokenFile(c.path, c.token_dtype, c.vocab_size, c.val_fraction, Framing.of(c),
                        c.lengths),
    ("path", "vocab_size", "token_dtype") + FRAMING_FIELDS, _check_tokens))
