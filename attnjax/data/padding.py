"""How a corpus window becomes a training example: an optional BOS token, optional padding.

For a window ``c`` of corpus tokens and an example of ``n <= L`` real tokens in a row of
``L``::

    no BOS:  x = c[0:n],               y = c[1:n+1]      (n + 1 corpus tokens)
    BOS:     x = [bos] + c[0:n-1],     y = c[0:n]        (n corpus tokens; BOS is input only)

Unpadded (``data.padding='none'``), ``n = L`` and the batch is ``inputs = x``, ``targets = y``,
``weights = 1``. Padded, ``n`` is drawn uniformly in ``[data.min_length, L]`` per example and
the example occupies row index ``i`` with source index ``j = i - s``, ``s = L - n`` for left
padding and ``s = 0`` for right padding::

    real_i      = 0 <= j < n
    inputs_i    = x_j if real_i else pad_i,     targets_i = y_j if real_i else pad_i
    weights_i   = real_i                        (no loss on pads)
    positions_i = max(j, 0)                     (real tokens 0..n-1 on either side)
    token_mask_i = real_i

``pad`` is ``data.pad_token`` everywhere, or with ``pad_token=None`` i.i.d. uniform tokens of
the data's vocabulary. The corpus offsets are the unpadded ones (the same key), and the real
lengths and random pads come from their own keys, so a padded batch holds the prefixes of the
unpadded batch's windows and changing the pad content changes nothing else.
``model_arguments`` passes ``positions`` and ``token_mask`` on to the model (the decoder
family's ``arguments``, ``attnjax.models``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PADDED_KEYS = ("positions", "token_mask")   # what a padded batch adds for the model
_LENGTH_STREAM, _PAD_STREAM = 1, 2          # folded into a batch key for the draws below


def model_arguments(batch: dict) -> dict:
    """The model's keyword arguments of a batch: ``positions`` and ``token_mask`` of a padded
    batch, nothing for an unpadded one."""
    return {key: batch[key] for key in PADDED_KEYS if key in batch}


def frame(corpus, lengths, pads, *, bos_token: int | None, padding: str, xp=jnp) -> dict:
    """The batch of the module docstring from ``corpus`` ``[B, L + 1]`` (``[B, L]`` with BOS),
    real ``lengths`` ``[B]`` and ``pads`` (``[B, L]`` or a scalar); ``lengths`` and ``pads``
    are unused unpadded. ``xp``: ``jax.numpy`` (jittable) or ``numpy`` (host data)."""
    corpus = corpus.astype(xp.int32)
    if bos_token is None:
        x, y = corpus[:, :-1], corpus[:, 1:]
    else:
        bos = xp.full((corpus.shape[0], 1), bos_token, xp.int32)
        x, y = xp.concatenate([bos, corpus[:, :-1]], axis=1), corpus
    B, L = x.shape
    if padding == "none":
        return {"inputs": x, "targets": y, "weights": xp.ones((B, L), xp.float32)}
    lengths = lengths[:, None]
    source = xp.arange(L)[None, :] - (L - lengths if padding == "left" else 0 * lengths)
    real = (source >= 0) & (source < lengths)
    index = xp.clip(source, 0, L - 1)
    place = lambda a: xp.where(real, xp.take_along_axis(a, index, axis=1), pads).astype(xp.int32)
    return {"inputs": place(x), "targets": place(y), "weights": real.astype(xp.float32),
            "positions": xp.maximum(source, 0).astype(xp.int32), "token_mask": real}


class Framing(NamedTuple):
    """The ``data`` fields of the module docstring, and the draws they need."""
    bos_token: int | None = None
    padding: str = "none"
    min_length: int = 1
    pad_token: int | None = 0

    @classmethod
    def of(cls, config) -> Framing:
        return cls(config.bos_token, config.padding, config.min_length, config.pad_token)

    def window(self, length: int) -> int:
        """Corpus tokens per example of ``length`` tokens."""
        return length + (self.bos_token is None)

    def device(self, key, corpus, vocab_size: int) -> dict:
        """``frame`` on device: lengths and random pads drawn from folds of the batch ``key``."""
        B, L = corpus.shape[0], corpus.shape[1] - (self.bos_token is None)
        lengths = pads = None
        if self.padding != "none":
            lengths = jax.random.randint(jax.random.fold_in(key, _LENGTH_STREAM), (B,),
                                         self.min_length, L + 1)
            pads = (self.pad_token if self.pad_token is not None else jax.random.randint(
                jax.random.fold_in(key, _PAD_STREAM), (B, L), 0, vocab_size))
        return frame(corpus, lengths, pads, bos_token=self.bos_token, padding=self.padding)

    def host(self, seed_sequence: list[int], corpus: np.ndarray, vocab_size: int) -> dict:
        """``frame`` on the host: lengths and random pads from their own NumPy streams of the
        batch's ``seed_sequence``."""
        B, L = corpus.shape[0], corpus.shape[1] - (self.bos_token is None)
        lengths = pads = None
        if self.padding != "none":
            stream = lambda n: np.random.default_rng([*seed_sequence, n])
            lengths = stream(_LENGTH_STREAM).integers(self.min_length, L + 1, size=B)
            pads = (self.pad_token if self.pad_token is not None else
                    stream(_PAD_STREAM).integers(0, vocab_size, size=(B, L)))
        return frame(corpus, lengths, pads, bos_token=self.bos_token, padding=self.padding,
                     xp=np)


PLAIN = Framing()       # no BOS, no padding: the windows as they are
