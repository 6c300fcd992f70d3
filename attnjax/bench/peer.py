"""The framework tax: attnjax's training loop against a plain JAX/Flax peer of the same model
(``attnjax.bench.peer_gpt``), measured alternately in one run.

``peer_ratio`` = attnjax tokens/s / peer tokens/s (10 steps per dispatch on both sides, both
scanning on-device batches of the same corpus); above 1 attnjax is faster. Both are compiled
once and then timed in ``ROUNDS`` rounds, each side once per round, the first side
alternating; each round gives a ratio of two neighbouring timings, and ``peer_ratio`` is their
median (``peer_ratio_low``, ``peer_ratio_high``: the lowest and highest), so a noisy stretch
of a shared machine moves one round, not the answer. The measured ratios are in
docs/PERFORMANCE.md (``benchmarks/results/train.json``).
"""

from __future__ import annotations

import math

import numpy as np

from attnjax.bench import peer_gpt
from attnjax.bench.throughput import train_loop
from attnjax.data.text import read_bytes, split_bounds

ROUNDS = 9
WINDOW_S = 2.0      # each round times at least this long on each side (a short step is noisy)


def peer_comparison(config, steps: int, window_s: float = WINDOW_S) -> dict:
    """``{"tokens_per_s", "peer_tokens_per_s", "peer_ratio", "peer_ratio_low",
    "peer_ratio_high", "rounds"}`` for ``config`` (an attnjax config with learned positions and
    10 steps per dispatch): both loops compiled once, then ``ROUNDS`` rounds that each time
    ``steps / ROUNDS`` steps of both, and at least ``window_s`` seconds (as one dispatch of
    attnjax's loop takes), in alternating order; the ratio is the median of the rounds'."""
    tokens = read_bytes(config.data.path)
    start, end = split_bounds(len(tokens), "train", config.data.val_fraction)
    m, t = config.model, config.train
    ours, steps_per_call = train_loop(config)
    theirs = peer_gpt.train_loop(tokens[start:end], d_model=m.d_model, num_layers=m.num_layers,
                                 num_heads=m.attention.num_heads, length=config.data.length,
                                 batch_size=t.batch_size,
                                 steps_per_dispatch=t.dispatch_steps(), total_steps=t.steps,
                                 warmup=t.warmup_steps, learning_rate=t.learning_rate)
    calls = max(steps // (ROUNDS * steps_per_call), math.ceil(window_s / ours(1)), 1)
    per_round = calls * steps_per_call * t.batch_size * config.data.length
    return alternating(lambda: ours(calls), lambda: theirs(calls)[0], per_round)


def alternating(ours, theirs, per_round: float, rounds: int = ROUNDS) -> dict:
    """``rounds`` rounds of ``ours()`` and ``theirs()`` (each: seconds of one round's work,
    ``per_round`` tokens), the first side alternating; rates per second, the median of each
    round's ratio ``ours / theirs`` and the lowest and highest of them."""
    rates = {"ours": [], "theirs": []}
    for round_ in range(rounds):
        order = ("ours", "theirs") if round_ % 2 == 0 else ("theirs", "ours")
        for side in order:
            seconds = ours() if side == "ours" else theirs()
            rates[side].append(per_round / seconds)
    ratios = [a / b for a, b in zip(rates["ours"], rates["theirs"])]
    return {"tokens_per_s": float(np.median(rates["ours"])),
            "peer_tokens_per_s": float(np.median(rates["theirs"])),
            "peer_ratio": float(np.median(ratios)),
            "peer_ratio_low": min(ratios), "peer_ratio_high": max(ratios), "rounds": rounds}
