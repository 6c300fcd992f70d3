"""How alike the heads of one layer attend: pairwise Jensen-Shannon divergence.

For layer l and heads h, g: ``D_l[h, g] = mean_{b, i >= start} JS(p_{lbhi}, p_{lbgi})``, the
divergence (natural log, in ``[0, ln 2]``) between the two heads' distributions over keys for
the same query, averaged over query rows ``i >= start`` (default 1: row 0 is one-hot on key 0
in every head, so it would only pull every pair towards 0) and the probe's examples
(``attnjax.ops.stats.head_divergence``). A layer's summary is the mean of ``D_l[h, g]`` over
its ``N (N - 1) / 2`` pairs ``h < g`` and its closest pair (the smallest ``D_l[h, g]``): a
small divergence means two heads put their weight in the same places, i.e. are redundant.
"""

from __future__ import annotations

import csv

import numpy as np

from attnjax.analysis.capture import attention_weights
from attnjax.analysis.figures import subplots
from attnjax.config import Config
from attnjax.nn.slots import visible_keys
from attnjax.ops.stats import head_divergence


def head_js(config: Config, params, tokens, start: int = 1, arguments=None) -> np.ndarray:
    """``D`` ``[layers, heads, heads]`` (see the module docstring) on ``tokens`` ``[B, T]``
    (``arguments``: the model's of their batch; a padded batch's pads excluded)."""
    arguments = arguments or {}
    visible = visible_keys(config.model, np.shape(tokens)[1], arguments.get("token_mask"))
    return head_divergence(attention_weights(config, params, tokens, arguments), start,
                           None if visible is None else np.asarray(visible))


def layer_summary(js) -> list[dict]:
    """Per layer ``{"layer", "mean", "pair": (h, g), "closest"}``: the mean of ``D_l[h, g]``
    over pairs ``h < g`` and the pair with the smallest divergence (NaN and ``None`` with one
    head)."""
    js = np.asarray(js, np.float64)
    if js.ndim != 3 or js.shape[1] != js.shape[2]:
        raise ValueError(f"js must be [layers, heads, heads], got shape {js.shape}")
    h, g = np.triu_indices(js.shape[1], k=1)
    rows = []
    for layer, matrix in enumerate(js):
        pairs = matrix[h, g]
        if pairs.size == 0:
            rows.append({"layer": layer, "mean": float("nan"), "pair": None,
                         "closest": float("nan")})
            continue
        k = int(np.argmin(pairs))
        rows.append({"layer": layer, "mean": float(pairs.mean()), "pair": (int(h[k]), int(g[k])),
                     "closest": float(pairs[k])})
    return rows


def format_js_table(js) -> str:
    """A Markdown table: one row per layer, the mean pairwise JS and the closest pair."""
    lines = ["| layer | mean pairwise JS (nats) | closest pair | its JS |", "|---|---|---|---|"]
    for row in layer_summary(js):
        pair = "—" if row["pair"] is None else f"H{row['pair'][0]}–H{row['pair'][1]}"
        lines.append(f"| L{row['layer']} | {row['mean']:.4f} | {pair} | {row['closest']:.4f} |")
    return "\n".join(lines)


def write_js_csv(js, path):
    """One row per layer and head pair ``h < g``: ``layer, head_a, head_b, js``."""
    js = np.asarray(js, np.float64)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", "head_a", "head_b", "js"])
        for layer, matrix in enumerate(js):
            for h, g in zip(*np.triu_indices(js.shape[1], k=1), strict=True):
                writer.writerow([layer, int(h), int(g), f"{matrix[h, g]:.6g}"])


def plot_head_js(js, path, title: str):
    """One annotated ``[heads, heads]`` heatmap per layer, side by side, on one colour scale
    from 0 to the largest divergence (dark = alike); the diagonal (a head with itself) blank."""
    js = np.asarray(js, np.float64)
    L, N = js.shape[:2]
    top = max(float(js.max()), 1e-12)
    side = 0.45 * N + 1.2
    fig, axes = subplots(1, L, figsize=(side * L + 1.2, side + 0.9), squeeze=False,
                         layout="constrained")
    for layer in range(L):
        ax = axes[0, layer]
        pairs = np.where(np.eye(N, dtype=bool), np.nan, js[layer])      # NaN: left blank
        image = ax.imshow(pairs, cmap="viridis", vmin=0.0, vmax=top)
        for h in range(N):
            for g in range(N):
                if h != g:
                    dark = js[layer, h, g] < 0.6 * top
                    ax.text(g, h, f"{js[layer, h, g]:.3f}", ha="center", va="center",
                            fontsize=7 if N > 4 else 8, color="white" if dark else "black")
        ax.set_xticks(range(N), [f"H{h}" for h in range(N)], fontsize=8)
        ax.set_yticks(range(N), [f"H{h}" for h in range(N)], fontsize=8)
        ax.set_title(f"layer {layer}", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.8, label="mean JS divergence (nats)")
    fig.savefig(path, dpi=110)
