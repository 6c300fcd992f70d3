"""Per-head attention diagnostics of a checkpoint: one number per (layer, head).

The statistics themselves are pure functions in ``attnjax.ops.stats`` (entropy, normalised
entropy, max weight, sink mass, activation ratio, previous-token and induction scores, max
causal logit, q and k norms), computed on a probe batch by ``attnjax.models.probe``; the training
loop logs the same ones behind ``train.head_metrics``. Here they are joined by ``pos_sim@p``:
how alike the position encoding makes positions 0 and p, from the encoding's ``similarity``
hook (``attnjax.nn.positions``): learned / sinusoidal: cosine similarity of the embedding
vectors ``e_0`` and ``e_p``; rope: ``tr(R_p) / head_dim``, the cosine between a vector rotated
to position 0 and the same vector rotated to p, averaged over directions (``(2 sum_j
cos(p theta_j) + H - d) / H`` with d the rotary width; same for every head); alibi / t5:
``exp(b_h(-p) - b_h(0))``, the factor by which the position bias alone scales the weight of
a key p tokens back relative to the query's own position (per head; the t5 table is per
layer). An encoding without the hook (``none``) gives NaN, and so does any
``p >= model.max_length`` (the model never saw that position).

References: Su et al. 2021 (RoPE); Press et al. 2022 (ALiBi); Raffel et al. 2020 (T5 bias);
see ``attnjax.ops.stats`` for the per-head statistics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config import Config
from attnjax.models.probe import STATS, head_stat_arrays
from attnjax.registry import POSITIONS

POSITION_OFFSETS = (10, 100)


@functools.lru_cache(maxsize=8)
def _compiled_stats(config: Config):
    return jax.jit(functools.partial(head_stat_arrays, config.model))


def position_similarity(config: Config, params, offset: int) -> np.ndarray:
    """``pos_sim@offset`` ``[layers, heads]`` as defined in the module docstring."""
    model = config.model
    hook = POSITIONS.get(model.position.kind).similarity
    if hook is None or offset >= model.max_length:
        return np.full((model.num_layers, model.attention.num_heads), np.nan)
    return hook(model, params, offset)


def head_statistics(config: Config, params, tokens, arguments=None) -> dict[str, np.ndarray]:
    """Every statistic on ``tokens`` ``[B, T]`` (with the model's ``arguments`` of their
    batch: a padded batch's pads excluded): name -> ``[layers, heads]`` float64
    (``attnjax.models.probe.STATS``, then ``pos_sim@10``, ``pos_sim@100``)."""
    arrays = _compiled_stats(config)(params, jnp.asarray(tokens), arguments or {})
    stats = {name: np.asarray(arrays[name], np.float64) for name in STATS}
    for offset in POSITION_OFFSETS:
        stats[f"pos_sim@{offset}"] = position_similarity(config, params, offset)
    return stats


def format_head_table(stats: dict[str, np.ndarray]) -> str:
    """A Markdown table, one row per ``L{layer}.H{head}``, one column per statistic."""
    if not stats:
        raise ValueError("stats must hold at least one statistic")
    names = list(stats)
    L, N = np.shape(stats[names[0]])
    lines = ["| head | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for layer in range(L):
        for head in range(N):
            cells = [f"{float(stats[n][layer, head]):.4g}" for n in names]
            lines.append(f"| L{layer}.H{head} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
