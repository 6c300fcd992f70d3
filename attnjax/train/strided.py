"""Strided evaluation: sequences longer than the model's context, scored by windows.

A sequence of ``T`` tokens (the evaluation length) is cut into windows of ``W`` tokens (the
model's context, by default the training length) starting every ``N`` tokens::

    s_j = j N,   j = 0 .. J-1,   J = (T - W) / N + 1     (the last window ends at T)

Each window is encoded on its own, at positions ``0 .. W-1``. Window 0 scores all of its ``W``
targets; window ``j >= 1`` scores its last ``K`` targets, ``s_j + W - K .. s_j + W - 1``,
while window ``j - 1`` scored up to ``s_j - N + W - 1``. Every target of the sequence is
therefore scored exactly once iff ``K = N`` (``K < N`` leaves ``N - K`` targets per window
unscored, ``K > N`` scores ``K - N`` of them twice). The whole sequence (``W = T``, one
window: the ordinary evaluation), disjoint segments (``N = K = W``) and half-overlapping ones
(``N = K = W/2``) score the same targets of the same sequences, with the batch's own weights,
and their losses compare directly.

The rule, checked before anything is traced (``windows``): ``1 <= W <= T``, ``1 <= N <= W``,
``K = N`` (``K`` defaults to ``N``) and ``N`` divides ``T - W``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from attnjax.config import Config
from attnjax.train.step import make_eval_step


def strided_options(train_length: int, window: int | None = None, stride: int | None = None,
                    score_last: int | None = None, *,
                    causal: bool = True) -> tuple[int, int, int] | None:
    """``(window, stride, score_last)`` with the defaults filled in (the window: the training
    length; the stride: the window, disjoint segments; ``score_last``: the stride), or
    ``None`` when none is given (the ordinary evaluation). Refused for a bidirectional model
    (``causal=False``): a window's last tokens would see no more context than its first."""
    if (window, stride, score_last) == (None, None, None):
        return None
    if not causal:
        raise ValueError("--window/--stride: strided evaluation slides a causal model's "
                         "context; this model is bidirectional (model.family)")
    window = train_length if window is None else window
    stride = window if stride is None else stride
    return window, stride, stride if score_last is None else score_last


def windows(length: int, window: int, stride: int,
            score_last: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(positions [J, W], scored [J, W])``: the token positions of each window of a sequence
    of ``length`` tokens and which of its targets it scores (see the module docstring).
    Raises a one-line ``ValueError`` naming the option for a combination that would leave a
    target unscored or score one twice."""
    score_last = stride if score_last is None else score_last
    if not 1 <= window <= length:
        raise ValueError(f"--window {window} must be between 1 and the evaluation length "
                         f"{length}")
    if not 1 <= stride <= window:
        raise ValueError(f"--stride {stride} must be between 1 and --window {window}")
    if score_last != stride:
        raise ValueError(f"--score-last {score_last} must equal --stride {stride}: fewer leaves "
                         "targets unscored, more scores targets twice")
    if (length - window) % stride:
        raise ValueError(f"--stride {stride} must divide length - window = {length} - {window}"
                         " (the last window ends at the last token)")
    starts = np.arange(0, length - window + 1, stride)
    positions = starts[:, None] + np.arange(window)[None, :]
    scored = np.ones(positions.shape, bool)
    scored[1:, :window - score_last] = False
    return positions, scored


def window_batch(batch: dict, positions: np.ndarray, scored: np.ndarray) -> dict:
    """The batch of windows: every per-token array ``[B, T, ...]`` gathered to ``[B J, W, ...]``
    (row ``b J + j`` is window ``j`` of sequence ``b``), the weights zero where a window does
    not score. A padded batch's own ``positions`` are counted from each window's first token
    (an unpadded batch has none: the model numbers every window ``0 .. W-1``)."""
    windowed = {name: x[:, positions] for name, x in batch.items()}
    windowed["weights"] = windowed["weights"] * jnp.asarray(scored, windowed["weights"].dtype)
    if "positions" in windowed:
        windowed["positions"] = windowed["positions"] - windowed["positions"][:, :, :1]
    rows = batch["inputs"].shape[0] * len(positions)
    return {name: x.reshape(rows, *x.shape[2:]) for name, x in windowed.items()}


def make_strided_eval_step(config: Config, window: int, stride: int,
                           score_last: int | None = None, train_mode: bool = False) -> Callable:
    """``eval_step(params, batch, index) -> sums`` as ``train.step.make_eval_step``'s, over
    the scored windows of ``batch`` (all windows in one forward pass, shapes static)."""
    eval_step = make_eval_step(config, train_mode=train_mode)

    def strided_step(params, batch, index):
        length = batch["inputs"].shape[1]
        return eval_step(params, window_batch(batch, *windows(length, window, stride,
                                                                 score_last)), index)

    return strided_step
