"""Pictures of attention: one head's weights with token labels, every head in a grid, a
layer-by-head matrix of numbers, and the attention report of a run directory.

    write_attention_report("runs/base", "out/", text="def main(")  # L{l}H{h}.png, grid.png,
                                                                   # head_stats.md / .csv
"""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.colors import TwoSlopeNorm

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.analysis.diagnostics import format_head_table, head_statistics
from attnjax.analysis.figures import subplots
from attnjax.rundir import RunDir

VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}


def byte_label(byte: int) -> str:
    """A printable label for one byte token: the character, ``␣ ⏎ ⇥ ␍`` for white
    space, else ``\\xNN``."""
    char = chr(byte)
    if char in VISIBLE:
        return VISIBLE[char]
    return char if 32 < byte < 127 else f"\\x{byte:02x}"


def token_labels(tokens, byte_level: bool) -> list[str]:
    """Axis labels for token ids: bytes made visible (``byte_label``) or the ids as text."""
    return [byte_label(int(t)) if byte_level else str(int(t)) for t in np.asarray(tokens)]


def truncate(weights, labels: list[str], title: str, max_tokens: int):
    """``(weights, labels, title)`` cut to the first ``max_tokens`` queries and keys, the cut
    stated in the title; unchanged when ``T <= max_tokens``."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    T = np.shape(weights)[-1]
    if len(labels) != T:
        raise ValueError(f"labels has {len(labels)} entries but the weights have T={T}")
    if T <= max_tokens:
        return weights, labels, title
    return (weights[..., :max_tokens, :max_tokens], labels[:max_tokens],
            f"{title} (first {max_tokens} of {T} tokens)")


def plot_attention(weights, token_labels: list[str], title: str, path, max_tokens: int = 48):
    """Heatmap of one head's weights ``[T, T]`` (rows: queries, columns: keys), viridis on
    [0, 1], labelled with the tokens; inputs longer than ``max_tokens`` are truncated."""
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 2 or weights.shape[0] != weights.shape[1]:
        raise ValueError(f"weights must be [T, T], got shape {weights.shape}")
    weights, labels, title = truncate(weights, list(token_labels), title, max_tokens)
    T = len(labels)
    side = max(4.0, 0.16 * T + 1.6)
    fig, ax = subplots(figsize=(side + 1.0, side))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    fontsize = 8 if T <= 32 else 7
    ax.set_xticks(range(T), labels, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(T), labels, fontsize=fontsize)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="attention weight")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_head_grid(weights, path, title: str, max_tokens: int = 128):
    """Every head's weights ``[layers, heads, T, T]``: rows are layers, columns heads, each panel
    titled ``L{l} H{h}``, one colour scale [0, 1]."""
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be [layers, heads, T, T], got shape {weights.shape}")
    T = weights.shape[-1]
    weights, _, title = truncate(weights, [""] * T, title, max_tokens)
    L, N = weights.shape[:2]
    fig, axes = subplots(L, N, figsize=(1.9 * N + 0.9, 1.9 * L + 0.5), squeeze=False,
                         layout="constrained")
    for layer in range(L):
        for head in range(N):
            ax = axes[layer, head]
            image = ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0,
                              interpolation="nearest")
            ax.set_title(f"L{layer} H{head}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.colorbar(image, ax=axes, shrink=min(1.0, 0.3 + 0.2 * L), label="attention weight")
    fig.savefig(path, dpi=100)


def plot_head_matrix(values, path, title: str, *, diverging: bool = False,
                     label: str = "", fmt: str = "{:.3f}"):
    """A ``[layers, heads]`` matrix as an annotated heatmap: a sequential colour map, or with
    ``diverging`` a red-blue one centred at 0 (red = positive)."""
    values = np.asarray(values, np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be [layers, heads], got shape {values.shape}")
    L, N = values.shape
    finite = values[np.isfinite(values)]
    fig, ax = subplots(figsize=(1.0 * N + 2.2, 0.7 * L + 1.6))
    if diverging:
        span = max(float(np.abs(finite).max()) if finite.size else 0.0, 1e-12)
        norm, cmap = TwoSlopeNorm(0.0, -span, span), "RdBu_r"
    else:
        norm, cmap = None, "viridis"
    image = ax.imshow(values, cmap=cmap, norm=norm, aspect="auto")
    for layer in range(L):
        for head in range(N):
            value = values[layer, head]
            shade = image.cmap(image.norm(value)) if np.isfinite(value) else (1, 1, 1, 1)
            dark = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5
            ax.text(head, layer, fmt.format(value), ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
    ax.set_xticks(range(N), [f"H{h}" for h in range(N)])
    ax.set_yticks(range(L), [f"L{layer}" for layer in range(L)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(textwrap.fill(title, max(30, int(11 * fig.get_figwidth()))), fontsize=10)
    fig.colorbar(image, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_stats_csv(stats: dict[str, np.ndarray], path):
    """One row per (layer, head), one column per statistic."""
    names = list(stats)
    L, N = np.shape(stats[names[0]])
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", "head", *names])
        for layer in range(L):
            for head in range(N):
                writer.writerow([layer, head, *(f"{float(stats[n][layer, head]):.6g}"
                                                for n in names)])


def write_attention_report(run_dir, out_dir, *, text: str | None = None, batch: int | None = None,
                           which: str = "best", max_tokens: int = 64,
                           length: int | None = None) -> str:
    """Attention pictures and per-head statistics of a run's checkpoint (``which``: best or
    latest) on a probe (``text`` for byte-level runs, else the first ``batch`` validation
    examples, default 4): ``L{l}H{h}.png`` per head and ``grid.png`` for example 0,
    ``head_stats.md`` / ``head_stats.csv`` over the whole probe. ``length``: the probe's length
    (default the training length; longer probes show the heads beyond it). Returns the
    Markdown table."""
    if which not in ("best", "latest"):
        raise ValueError(f"which={which!r} is not valid; choices: best, latest")
    if text is not None and batch is not None:
        raise ValueError("give text or batch, not both")
    if batch is not None and batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if length is not None and length < 2:
        raise ValueError(f"length must be >= 2, got {length}")
    config, params, step = RunDir(run_dir).params(which)
    if length is not None:
        config.model.check_lengths((length,))       # e.g. a learned table has max_length rows
    tokens = probe_batch(config, text=text, batch_size=batch or 4, length=length)
    weights = attention_weights(config, params, tokens)[:, 0]          # [layers, heads, T, T]
    labels = token_labels(tokens[0], byte_level=config.data.task == "text")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{Path(run_dir).name} step {step}"
    for layer in range(weights.shape[0]):
        for head in range(weights.shape[1]):
            plot_attention(weights[layer, head], labels, f"{name}: L{layer} H{head}",
                           out / f"L{layer}H{head}.png", max_tokens=max_tokens)
    plot_head_grid(weights, out / "grid.png", f"{name}: attention, example 0")
    stats = head_statistics(config, params, tokens)
    table = format_head_table(stats)
    probe = "text probe" if text is not None else f"{tokens.shape[0]} validation examples"
    (out / "head_stats.md").write_text(f"# Per-head statistics: {name}, {probe}, "
                                       f"T={tokens.shape[1]}\n\n{table}\n")
    write_stats_csv(stats, out / "head_stats.csv")
    return table
