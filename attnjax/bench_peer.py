"""The framework tax: attnjax's training loop against a plain JAX/Flax peer of the same model
(``benchmarks/peer_gpt.py``, in the source checkout), measured alternately in one run.

``peer_ratio`` = attnjax tokens/s / peer tokens/s (10 steps per dispatch on both sides, both
scanning on-device batches of the same corpus); above 1 attnjax is faster. Each side is
measured ``ROUNDS`` times, alternating, and its best kept, so a noisy moment of a shared
machine does not land on one side only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PEER = Path(__file__).resolve().parents[1] / "benchmarks" / "peer_gpt.py"
ROUNDS = 2


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


def peer_comparison(config, steps: int, attnjax_throughput) -> dict | None:
    """``{"tokens_per_s", "peer_tokens_per_s", "peer_ratio"}`` for ``config`` (an attnjax
    config with learned positions and 10 steps per dispatch), or None without the peer."""
    from attnjax.data.text import read_bytes, split_bounds
    peer = load_peer()
    if peer is None:
        return None
    tokens = read_bytes(config.data.path)
    start, end = split_bounds(len(tokens), "train", config.data.val_fraction)
    m, t = config.model, config.train
    shape = dict(d_model=m.d_model, num_layers=m.num_layers, num_heads=m.attention.num_heads,
                 length=config.data.length, batch_size=t.batch_size,
                 steps_per_dispatch=t.steps_per_dispatch, total_steps=t.steps,
                 warmup=t.warmup_steps, learning_rate=t.learning_rate)
    ours, theirs = 0.0, 0.0
    for _ in range(ROUNDS):
        ours = max(ours, attnjax_throughput(config, steps)["tokens_per_s"])
        theirs = max(theirs, peer.throughput(tokens[start:end], steps=steps,
                                             **shape)["tokens_per_s"])
    return {"tokens_per_s": ours, "peer_tokens_per_s": theirs, "peer_ratio": ours / theirs}
