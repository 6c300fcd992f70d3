"""The framework tax: attnjax's training loop against a plain JAX/Flax peer of the same model
(``benchmarks/peer_gpt.py``, in the source checkout), measured alternately in one run.

``peer_ratio`` = attnjax tokens/s / peer tokens/s (10 steps per dispatch on both sides, both
scanning on-device batches of the same corpus); above 1 attnjax is faster. Both are compiled
once and then timed in ``ROUNDS`` rounds, each side once per round, the first side
alternating; each round gives a ratio of two neighbouring timings, and ``peer_ratio`` is their
median (``peer_ratio_low``, ``peer_ratio_high``: the lowest and highest), so a noisy stretch
of a shared machine moves one round, not the answer (single paired measurements of the same
setting ranged 0.70x to 1.16x on this host).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

PEER = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_gpt.py"
ROUNDS = 9
WINDOW_S = 2.0      # each round times at least this long on each side (a short step is noisy)


def load_peer():
    """The peer module, or None outside a source checkout."""
    if not PEER.is_file():
        return None
    name = "attnjax_peer_gpt"
    if name not in sys.modules:       # registered first: Flax modules are dataclasses
        spec = importlib.util.spec_from_file_location(name, PEER)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def peer_comparison(config, steps: int, window_s: float = WINDOW_S) -> dict | None:
    """``{"tokens_per_s", "peer_tokens_per_s", "peer_ratio", "peer_ratio_low",
    "peer_ratio_high", "rounds"}`` for ``config`` (an attnjax config with learned positions and
    10 steps per dispatch), or None without the peer: both loops compiled once, then ``ROUNDS``
    rounds that each time ``steps / ROUNDS`` steps of both, and at least ``window_s`` seconds
    (as one dispatch of attnjax's loop takes), in alternating order; the ratio is the median
    of the rounds'."""
    from attnjax.bench import train_loop
    from attnjax.data.text import read_bytes, split_bounds
    peer = load_peer()
    if peer is None:
        return None
    tokens = read_bytes(config.data.path)
    start, end = split_bounds(len(tokens), "train", config.data.val_fraction)
    m, t = config.model, config.train
    ours, steps_per_call = train_loop(config)
    theirs = peer.train_loop(tokens[start:end], d_model=m.d_model, num_layers=m.num_layers,
                             num_heads=m.attention.num_heads, length=config.data.length,
                             batch_size=t.batch_size, steps_per_dispatch=t.steps_per_dispatch,
                             total_steps=t.steps, warmup=t.warmup_steps,
                             learning_rate=t.learning_rate)
    calls = max(steps // (ROUNDS * steps_per_call), math.ceil(window_s / ours(1)), 1)
    per_round = calls * steps_per_call * t.batch_size * config.data.length
    rates = {"ours": [], "theirs": []}
    for round_ in range(ROUNDS):
        order = ("ours", "theirs") if round_ % 2 == 0 else ("theirs", "ours")
        for side in order:
            seconds = ours(calls) if side == "ours" else theirs(calls)[0]
            rates[side].append(per_round / seconds)
    ratios = [a / b for a, b in zip(rates["ours"], rates["theirs"])]
    return {"tokens_per_s": float(np.median(rates["ours"])),
            "peer_tokens_per_s": float(np.median(rates["theirs"])),
            "peer_ratio": float(np.median(ratios)),
            "peer_ratio_low": min(ratios), "peer_ratio_high": max(ratios), "rounds": ROUNDS}
