"""The PNG figures of a checkpoint comparison. Each function writes one file and returns its
name (relative to the report that links it)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np

from attnjax.analysis.figures import subplots

LN2 = math.log(2.0)


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path).name


def parameter_bars(rows: list[dict], path: Path, label_a: str, label_b: str) -> str:
    """Horizontal bars of relative L2 per parameter, one colour per layer (first path part)."""
    groups = [r["path"].split("/")[0] for r in rows]
    palette = matplotlib.colormaps["tab10"]
    order = list(dict.fromkeys(groups))
    colours = [palette(order.index(g) % 10) for g in groups]
    values = np.array([r["relative_l2"] for r in rows])
    fig, ax = subplots(figsize=(9, 1.4 + 0.24 * len(rows)))
    y = np.arange(len(rows))
    ax.barh(y, values, color=colours)
    ax.set_yticks(y, labels=[r["path"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    for i in range(1, len(rows)):
        if groups[i] != groups[i - 1]:
            ax.axhline(i - 0.5, color="0.75", lw=0.8)
    top = max(float(values.max()), 0.01)                  # identical runs: a readable axis
    for i, v in enumerate(values):
        ax.text(v + 0.01 * top, i, f"{v:.3g}", va="center", fontsize=7)
    ax.set_xlim(0, top * 1.15)
    ax.set_xlabel(f"relative L2  ||a − b|| / ||a||   (a = {label_a})")
    ax.set_title(f"Parameter differences: {label_b} vs {label_a}")
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def js_heatmap(js: np.ndarray, path: Path, label_a: str, label_b: str) -> str:
    """Layer-by-head heatmap of the mean JS divergence, each cell annotated."""
    layers, heads = js.shape
    fig, ax = subplots(figsize=(max(4.5, 2.2 + 1.0 * heads), max(3.0, 1.4 + 0.7 * layers)))
    top = max(float(js.max()), 0.01)                      # identical runs: a readable scale
    image = ax.imshow(js, cmap="viridis", vmin=0.0, vmax=top, aspect="auto")
    for i in range(layers):
        for j in range(heads):
            ax.text(j, i, f"{js[i, j]:.3f}", ha="center", va="center", fontsize=9,
                    color="white" if js[i, j] < 0.6 * top else "black")
    ax.set_xticks(range(heads), labels=[f"head {j}" for j in range(heads)])
    ax.set_yticks(range(layers), labels=[f"layer {i}" for i in range(layers)])
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(f"JS divergence (nats; max ln 2 = {LN2:.3f})")
    ax.set_title(f"Attention JS divergence\n{label_b} vs {label_a}", fontsize=10)
    return _save(fig, path)


def loss_curves(metrics_a: list[dict], metrics_b: list[dict], path: Path, label_a: str,
                label_b: str) -> str:
    """Validation loss (markers) and logged training loss (faint) against step, both runs."""
    fig, ax = subplots(figsize=(7.5, 4.5))
    for metrics, label, colour in ((metrics_a, label_a, "tab:blue"),
                                   (metrics_b, label_b, "tab:orange")):
        train = [(r["step"], r["loss"]) for r in metrics if "loss" in r]
        val = [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r]
        if train:
            ax.plot(*zip(*train), color=colour, alpha=0.35, lw=1, label=f"{label} train")
        if val:
            ax.plot(*zip(*val), color=colour, marker="o", lw=2, label=f"{label} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("Loss curves")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def sweep_overview(names: list[str], js_means: list, val_losses: list, path: Path,
                   base_label: str) -> str:
    """Per run: mean attention JS against the baseline (bars) and validation loss (dots; the
    baseline's as a dashed line). ``val_losses`` holds ``(baseline, run)`` pairs or None."""
    fig, (left, right) = subplots(1, 2, figsize=(11, 2.2 + 0.4 * len(names)), sharey=True)
    y = np.arange(len(names))
    js = [v if v is not None else 0.0 for v in js_means]
    left.barh(y, js, color="tab:purple")
    for i, v in enumerate(js_means):
        left.text(js[i], i, f" {v:.3f}" if v is not None else " skipped", va="center", fontsize=8)
    left.set_yticks(y, labels=names, fontsize=8)
    left.invert_yaxis()
    left.set_xlim(0, max(max(js, default=0.0) * 1.3, 0.01))
    left.set_xlabel(f"mean attention JS vs {base_label} (nats)")
    runs = [v[1] if v is not None else None for v in val_losses]
    base = [v[0] for v in val_losses if v is not None]
    for i, v in enumerate(runs):
        if v is None:
            right.text(0.02, i, "no common evaluation", va="center", fontsize=8,
                       transform=right.get_yaxis_transform())
        else:
            right.plot(v, i, "o", color="tab:green")
            right.annotate(f"{v:.4f}", (v, i), xytext=(6, 0), textcoords="offset points",
                           va="center", fontsize=8)
    if base:
        right.axvline(base[0], color="black", ls="--", lw=1, label=f"{base_label}: {base[0]:.4f}")
        right.legend(fontsize=8, loc="lower right")
        finite = [v for v in runs if v is not None] + base
        spread = max(max(finite) - min(finite), 0.01 * max(finite))
        right.set_xlim(min(finite) - 0.2 * spread, max(finite) + 0.4 * spread)
    right.set_xlabel("validation loss at the training length")
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Sweep against {base_label}")
    return _save(fig, path)
