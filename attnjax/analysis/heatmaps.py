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

from attnjax.analysis.capture import (attention_weights, check_probe_length, layer_cosines,
                                      model_arguments, probe_examples, stream_attention)
from attnjax.analysis.diagnostics import format_head_table, head_statistics
from attnjax.analysis.figures import subplots
from attnjax.analysis.occlusion import (embedding_occlusion, head_mean_weights,
                                        occlusion_agreement, plot_embedding_occlusion,
                                        plot_occlusion)
from attnjax.config import Config, apply_overrides
from attnjax.data.encoder import SPECIAL_TOKENS, encoder_specials
from attnjax.data.seq2seq import SPECIAL_TOKENS as SEQ2SEQ_TOKENS
from attnjax.data.seq2seq import seq2seq_specials
from attnjax.data.tokenizer import load_tokenizer
from attnjax.models import check_same_parameters, family
from attnjax.ops import stats as stats_ops
from attnjax.outputs import output_directory
from attnjax.registry import TASKS
from attnjax.rundir import RunDir
from attnjax.train.footprint import check_inference, forward_bytes, weights_bytes

VISIBLE = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}


def byte_label(byte: int) -> str:
    """A printable label for one byte token: the character, ``␣ ⏎ ⇥ ␍`` for white
    space, else ``\\xNN``."""
    char = chr(byte)
    if char in VISIBLE:
        return VISIBLE[char]
    return char if 32 < byte < 127 else f"\\x{byte:02x}"


BYTE_TASKS = ("text", "mlm", "sentences", "letters")          # byte-level data: tokens are bytes


def token_labels(tokens, data) -> list[str]:
    """Axis labels for token ids of ``data`` (a ``DataConfig``): the strings of
    ``data.tokenizer``'s ids; bytes made visible (``byte_label``) for byte-level text, else
    the ids as text; the special tokens by name (an encoder's ``[CLS]``, ``[SEP]``, ...; an
    encoder–decoder's ``PAD``, ``BOS``, ``EOS``)."""
    if data.tokenizer is not None:
        return load_tokenizer(data.tokenizer).labels(tokens)
    byte_level = data.task in BYTE_TASKS
    task = TASKS.get(data.task)
    names = {}
    if task.objective == "seq2seq":
        names = dict(zip(seq2seq_specials(task.vocab(data)), SEQ2SEQ_TOKENS, strict=True))
    elif task.objective != "next_token":
        names = dict(zip(encoder_specials(data), SPECIAL_TOKENS, strict=True))
    return [names.get(int(t)) or (byte_label(int(t)) if byte_level else str(int(t)))
            for t in np.asarray(tokens)]


def truncate(weights, labels: list[str], title: str, max_tokens: int, key_labels=None):
    """``(weights, labels, key_labels, title)`` cut to the first ``max_tokens`` queries and
    keys, the cut stated in the title; unchanged when neither axis is longer. ``key_labels``
    (default ``labels``): the keys' when they are another sequence's."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    key_labels = labels if key_labels is None else key_labels
    T, S = np.shape(weights)[-2:]
    if len(labels) != T or len(key_labels) != S:
        raise ValueError(f"labels have {len(labels)} and {len(key_labels)} entries but the "
                         f"weights have T={T} queries and S={S} keys")
    if max(T, S) <= max_tokens:
        return weights, labels, key_labels, title
    size = f"{T}" if T == S else f"{T} x {S}"
    return (weights[..., :max_tokens, :max_tokens], labels[:max_tokens], key_labels[:max_tokens],
            f"{title} (first {max_tokens} of {size} tokens)")


def plot_attention(weights, token_labels: list[str], title: str, path, max_tokens: int = 48,
                   key_labels: list[str] | None = None):
    """Heatmap of one head's weights ``[T, S]`` (rows: queries, columns: keys; ``key_labels``
    when the keys are another sequence's, as in cross-attention, else ``S = T``), viridis on
    [0, 1], labelled with the tokens; inputs longer than ``max_tokens`` are truncated."""
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 2 or (key_labels is None and weights.shape[0] != weights.shape[1]):
        raise ValueError(f"weights must be [T, T] (or [T, S] with key_labels), got shape "
                         f"{weights.shape}")
    weights, labels, keys, title = truncate(weights, list(token_labels), title, max_tokens,
                                            None if key_labels is None else list(key_labels))
    T, S = len(labels), len(keys)
    fig, ax = subplots(figsize=(max(4.0, 0.16 * S + 1.6) + 1.0, max(4.0, 0.16 * T + 1.6)))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
    fontsize = 8 if max(T, S) <= 32 else 7
    ax.set_xticks(range(S), keys, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(T), labels, fontsize=fontsize)
    ax.set_xlabel("key (attended to)" if key_labels is None else "source token (key)")
    ax.set_ylabel("query" if key_labels is None else "target token (query)")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="attention weight")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_head_grid(weights, path, title: str, max_tokens: int = 128):
    """Every head's weights ``[layers, heads, T, S]``: rows are layers, columns heads, each
    panel titled ``L{l} H{h}``, one colour scale [0, 1]."""
    weights = np.asarray(weights, np.float32)
    if weights.ndim != 4:
        raise ValueError(f"weights must be [layers, heads, T, S], got shape {weights.shape}")
    T, S = weights.shape[-2:]
    weights, _, _, title = truncate(weights, [""] * T, title, max_tokens, [""] * S)
    L, N = weights.shape[:2]
    fig, axes = subplots(L, N, figsize=(max(1.9 * N + 0.9, 4.5), max(1.9 * L + 0.5, 3.2)),
                         squeeze=False, layout="constrained")
    for layer in range(L):
        for head in range(N):
            ax = axes[layer, head]
            image = ax.imshow(weights[layer, head], cmap="viridis", vmin=0.0, vmax=1.0,
                              interpolation="nearest")
            ax.set_title(f"L{layer} H{head}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    # a deep model's bar spans its tall figure: kept about as wide as a few layers' one
    fig.colorbar(image, ax=axes, shrink=min(1.0, 0.3 + 0.2 * L), aspect=20 * max(1.0, L / 6),
                 label="attention weight")
    fig.savefig(path, dpi=100)


def plot_head_matrix(values, path, title: str, *, diverging: bool = False,
                     label: str = "", fmt: str = "{:.3f}", rows=None, columns=None,
                     axes=("head", "layer"), cell_width: float = 1.0):
    """A ``[layers, heads]`` matrix as an annotated heatmap: a sequential colour map, or with
    ``diverging`` a red-blue one centred at 0 (red = positive); ``rows`` / ``columns`` and
    ``axes`` (x, y) label another matrix's axes (default ``L{l}``, ``H{h}``), ``cell_width``
    inches each column (narrow ones get smaller numbers)."""
    values = np.asarray(values, np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be [layers, heads], got shape {values.shape}")
    L, N = values.shape
    rows = rows or [f"L{layer}" for layer in range(L)]
    columns = columns or [f"H{h}" for h in range(N)]
    finite = values[np.isfinite(values)]
    fig, ax = subplots(figsize=(cell_width * N + 2.2, 0.7 * L + 1.6))
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
            ax.text(head, layer, fmt.format(value), ha="center", va="center",
                    fontsize=8 if cell_width >= 0.6 else 5, color="white" if dark else "black")
    ax.set_xticks(range(N), columns, rotation=60 if max(map(len, columns)) > 3 else 0)
    ax.set_yticks(range(L), rows)
    ax.set_xlabel(axes[0])
    ax.set_ylabel(axes[1])
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


def format_layer_table(cosines: dict[str, np.ndarray], norm_entropy) -> str:
    """A Markdown table, one row per layer: the mean pairwise cosine across positions of the
    attention outputs and of the residual stream (``capture.layer_cosines``), and the layer's
    head-mean normalised entropy."""
    lines = ["| layer | attention-output cosine | residual cosine | norm_entropy (head mean) |",
             "|---|---|---|---|"]
    for layer, (attn, resid) in enumerate(zip(cosines["attn_out"], cosines["residual"],
                                              strict=True)):
        lines.append(f"| L{layer} | {attn:.4f} | {resid:.4f} | "
                     f"{float(np.mean(norm_entropy[layer])):.4f} |")
    return "\n".join(lines)


def _objective(config) -> str:
    return family(config.model).objective(config.model)


def _embedding_occlusion_part(config, params, probe: dict, out: Path, name: str) -> str:
    """For a model that outputs hidden states, on example 0's tokens other than the special
    ones: ``occlusion.png`` (the [CLS] query's last-layer head-mean attention beside the
    sentence embedding's drift when the token is masked) and ``occlusion.csv``; returns the
    rho line."""
    specials = encoder_specials(config.data)
    tokens = np.asarray(probe["inputs"][:1])
    content = np.flatnonzero(~np.isin(tokens[0], [specials.pad, specials.cls, specials.sep]))
    drift = embedding_occlusion(config, params, tokens, specials.mask)[0, content]
    attention = head_mean_weights(config, params, tokens)[0, 0, content]
    labels = token_labels(tokens[0], config.data)
    with open(out / "occlusion.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["position", "token", "cls_attention", "embedding_drift"])
        for j, a, d in zip(content, attention, drift, strict=True):
            writer.writerow([int(j), labels[j], f"{a:.6g}", f"{d:.6g}"])
    plot_embedding_occlusion([labels[j] for j in content], attention, drift,
                             out / "occlusion.png", f"{name}: attention vs occlusion, example 0")
    return (f"Occlusion: Spearman rho between the [CLS] query's last-layer head-mean attention "
            f"and the sentence embedding's drift when the token is masked: "
            f"{stats_ops.spearman(attention, drift):.4f} over {content.size} tokens of example 0.")


def _occlusion_part(config, params, probe: dict, out: Path, name: str, draws: int) -> str:
    """``occlusion.png`` (weights beside occlusion importance for four queries of example 0)
    and ``occlusion.csv`` (one row per scored query); returns the median-rho line. A model
    that outputs hidden states: ``_embedding_occlusion_part``."""
    if _objective(config) == "embedding":
        return _embedding_occlusion_part(config, params, probe, out, name)
    result = occlusion_agreement(config, params, probe, draws=draws, seed=config.seed)
    with open(out / "occlusion.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["example", "query", "spearman_rho"])
        for b, i in zip(*np.nonzero(result["queries"]), strict=True):
            writer.writerow([int(b), int(i), f"{result['rho'][b, i]:.6g}"])
    shown = np.flatnonzero(result["queries"][0])
    if shown.size:
        shown = shown[np.unique(np.linspace(0, shown.size - 1, min(4, shown.size)).round()
                                .astype(int))]
        labels = token_labels(probe["inputs"][0], config.data)
        plot_occlusion(result, 0, shown, labels, out / "occlusion.png",
                       f"{name}: last-layer attention (head mean) vs occlusion importance "
                       f"({draws} random replacements per key), example 0")
    count = int(result["queries"].sum())
    return (f"Occlusion: median Spearman rho between the last layer's head-mean weights and the "
            f"loss rise when a key is replaced: {result['median']:.4f} over {count} queries "
            f"({draws} draws per key).")


def stream_statistics(probe: dict, streams: dict[str, np.ndarray]) -> dict[str, dict]:
    """An encoder–decoder's per-head statistics over the whole probe, from its ``streams``
    (``capture.stream_attention``): ``cross``, over the real target queries and source keys,
    ``alignment`` (``ops.stats.argmax_hits``: the share of target tokens whose largest weight
    is on the gold source position, where the data has one), ``norm_entropy`` and
    ``max_weight``; ``encoder``, the weight statistics (``ops.stats.weight_statistics``) over
    the real source tokens. Group -> name -> ``[layers, heads]`` float64."""
    real = probe["source_mask"].astype(bool)
    cross = streams["cross"]
    visible = (probe["weights"] > 0)[:, None, :, None] & real[:, None, None, :]
    stats = {"norm_entropy": stats_ops.normalized_entropy(cross, visible),
             "max_weight": stats_ops.max_weight(cross, visible)}
    if "alignment" in probe:
        hits, count = stats_ops.argmax_hits(cross, probe["alignment"], probe["weights"] > 0)
        stats = {"alignment": hits / max(float(count), 1.0), **stats}
    encoder = stats_ops.weight_statistics(streams["encoder"],
                                          real[:, None, :, None] & real[:, None, None, :])
    return {name: {k: np.asarray(v, np.float64) for k, v in group.items()}
            for name, group in (("cross", stats), ("encoder", encoder))}


def _stream_pictures(config, params, probe: dict, out: Path, name: str,
                     max_tokens: int) -> str | None:
    """An encoder–decoder's other attention, example 0 cut to its real tokens:
    ``cross_L{l}H{h}.png`` (target tokens over source tokens) and ``cross_grid.png``, and the
    encoder's self-attention ``encoder_L{l}H{h}.png`` and ``encoder_grid.png``; and
    ``cross_heads.md``, the tables it returns: ``stream_statistics`` over the whole probe.
    None for the other families."""
    streams = stream_attention(config, params, probe["inputs"], model_arguments(config, probe))
    if not streams:
        return None
    target = int((probe["weights"][0] > 0).sum())          # BOS and the target tokens
    source = int(probe["source_mask"][0].sum())
    queries = token_labels(probe["inputs"][0][:target], config.data)
    keys = token_labels(probe["source"][0][:source], config.data)
    shown = {"cross": (queries, keys, "cross-attention"),
             "encoder": (keys, keys, "encoder self-attention")}
    for stream, weights in streams.items():
        rows, cols, what = shown[stream]
        weights = weights[:, 0, :, :len(rows), :len(cols)]
        for layer in range(weights.shape[0]):
            for head in range(weights.shape[1]):
                plot_attention(weights[layer, head], rows, f"{name}: {what} L{layer} H{head}",
                               out / f"{stream}_L{layer}H{head}.png", max_tokens=max_tokens,
                               key_labels=cols)
        plot_head_grid(weights, out / f"{stream}_grid.png", f"{name}: {what}, example 0")
    tables = [format_head_table(group) for group in stream_statistics(probe, streams).values()]
    text = (f"## Cross-attention heads\n\n{tables[0]}\n\n"
            f"## Encoder self-attention heads\n\n{tables[1]}")
    (out / "cross_heads.md").write_text(f"# Encoder-decoder heads: {name}\n\n{text}\n")
    return text


def check_probe_arguments(*, text: str | None = None, batch: int | None = None,
                          length: int | None = None, which: str = "best") -> None:
    """Refuse, in one line, probe arguments no run takes (before the run is read)."""
    if which not in ("best", "latest"):
        raise ValueError(f"which={which!r} is not valid; choices: best, latest")
    if text is not None and batch is not None:
        raise ValueError("give text or batch, not both")
    if batch is not None and batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if length is not None and length < 2:
        raise ValueError(f"length must be >= 2, got {length}")


def probe_config(run_dir, overrides=()) -> tuple[RunDir, Config]:
    """The run directory and its config with dotted ``overrides`` for this evaluation (refused
    in one line where they change a parameter's shape)."""
    run = RunDir(run_dir)
    stored = run.config()
    config = apply_overrides(stored, overrides) if overrides else stored
    check_same_parameters(stored.model, config.model, overrides)
    return run, config


def checked_probe(run: RunDir, config: Config, *, text: str | None = None,
                  batch: int | None = None, length: int | None = None,
                  which: str = "best") -> tuple[dict, dict, int]:
    """``(probe, params, step)``: the probe (``text``, else the first ``batch`` validation
    examples, default 4, of ``length`` tokens, default the training length; its arguments
    checked by ``check_probe_arguments``) and checkpoint ``which`` of ``run``, refused in one
    line before anything is built where the length is past what the model takes or the
    forward pass and every layer's weights would not fit in memory
    (``train.footprint.check_inference``)."""
    if length is not None:
        check_probe_length(config, length)          # e.g. a learned table has max_length rows
    if text is not None:                            # tokenised first: its length is known
        probe = probe_examples(config, text=text, length=length)
        rows, T = probe["inputs"].shape
    else:                                           # checked first: built only if it fits
        rows, T = batch or 4, length or config.data.length
    asked = [f"--{name} {value}" for name, value in (("batch", batch), ("length", length))
             if value is not None]
    check_inference(config, {"activations": forward_bytes(config, rows, T),
                             "every layer's weights": weights_bytes(config, rows, T)},
                    f"{' '.join(asked or ['the probe'])}: attention on {rows} x {T} tokens",
                    "probe fewer (--batch) or shorter (--length, --text) sequences")
    if text is None:
        probe = probe_examples(config, batch_size=rows, length=length)
    _, params, step = run.params(which)
    return probe, params, step


def write_attention_report(run_dir, out_dir, *, text: str | None = None, batch: int | None = None,
                           which: str = "best", max_tokens: int = 64,
                           length: int | None = None, overrides=(),
                           occlusion: bool = False, draws: int = 8) -> str:
    """Attention pictures and per-head statistics of a run's checkpoint (``which``: best or
    latest) on a probe (``text`` for byte-level runs, else the first ``batch`` validation
    examples, default 4): ``L{l}H{h}.png`` per head and ``grid.png`` for example 0 (and an
    encoder–decoder's cross-attention and encoder pictures, ``_stream_pictures``),
    ``head_stats.md`` / ``head_stats.csv`` over the whole probe, ``head_stats.md`` led by a
    per-layer table (``format_layer_table``). ``length``: the probe's length (default the
    training length; longer probes show the heads beyond it); ``overrides``: dotted
    ``KEY=VALUE`` config overrides for this evaluation (e.g.
    ``model.attention.scale_multiplier=1e-6``). With ``occlusion``, also the occlusion
    attribution of ``attnjax.analysis.occlusion`` with ``draws`` replacements per key:
    ``occlusion.png``, ``occlusion.csv``. Returns the Markdown tables (the per-head one last)."""
    check_probe_arguments(text=text, batch=batch, length=length, which=which)
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    run, config = probe_config(run_dir, overrides)
    if occlusion and _objective(config) not in ("next_token", "embedding"):
        raise ValueError(f"--occlusion needs a next-token model or one that outputs hidden "
                         f"states (model.classifier='hidden'); this run trains "
                         f"{_objective(config)!r}")
    probe, params, step = checked_probe(run, config, text=text, batch=batch, length=length,
                                        which=which)
    tokens, arguments = probe["inputs"], model_arguments(config, probe)
    weights = attention_weights(config, params, tokens, arguments)[:, 0]   # [layers, heads, T, T]
    labels = token_labels(tokens[0], config.data)
    out = Path(out_dir)
    output_directory(out, "--out")
    name = f"{Path(run_dir).name} step {step}"
    for layer in range(weights.shape[0]):
        for head in range(weights.shape[1]):
            plot_attention(weights[layer, head], labels, f"{name}: L{layer} H{head}",
                           out / f"L{layer}H{head}.png", max_tokens=max_tokens)
    plot_head_grid(weights, out / "grid.png", f"{name}: attention, example 0")
    cross = _stream_pictures(config, params, probe, out, name, max_tokens)
    stats = head_statistics(config, params, tokens, arguments)
    layers = format_layer_table(layer_cosines(config, params, tokens, arguments),
                                stats["norm_entropy"])
    table = format_head_table(stats)
    source = "text probe" if text is not None else f"{tokens.shape[0]} validation examples"
    (out / "head_stats.md").write_text(f"# Per-head statistics: {name}, {source}, "
                                       f"T={tokens.shape[1]}\n\n## Per layer\n\n{layers}\n\n"
                                       f"## Per head\n\n{table}\n")
    write_stats_csv(stats, out / "head_stats.csv")
    parts = [layers] + ([cross] if cross else [])
    if occlusion:
        parts.append(_occlusion_part(config, params, probe, out, name, draws))
    return "\n\n".join([*parts, table])
