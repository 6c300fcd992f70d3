"""Accuracy of the recall tasks by the distance between a query and what it must recall.

In the recall tasks (``induction``, ``mqar``; ``attnjax.data.synthetic``) a scored target
``y_t`` at position t is the token that follows an earlier occurrence of the current token
``x_t``: induction's second copy continues the first copy (``x_t = A[k]``, ``y_t = A[k+1]``,
read after ``A[k]`` in the first copy), an MQAR query key is answered by the value after the
same key in the key-value pairs. The *key* of target t is found from the tokens alone:

    j(t) in { j < t : x_j = x_t and x_{j+1} = y_t }      (none: the target has no key)

an earlier occurrence of the current token that is followed by the answer, and the query-key
distance is ``d(t) = t - j(t) >= 1``. Where several j qualify (a bigram repeated by chance),
the key is the one with the longest matching context ``x_{j-s} = x_{t-s}``, s = 0, 1, ...,
and of those the earliest: a copy's source matches the whole copied prefix, which no earlier
position can, and a chance repeat rarely matches more than one token. So for induction ``d``
is the offset of the second copy (the same for a whole example; only a chance repeat of the
token before the copy can move its first target), for MQAR (distinct keys) the gap between the
query and its key-value pair.

Accuracy by distance buckets ``[e_k, e_{k+1})`` (powers of two, equal widths or explicit
edges, see ``bucket_edges``) is the fraction of scored targets in the bucket whose argmax
prediction is right; every scored target is in exactly one bucket, ``outside`` the edges, or
``unmatched`` (no key), so the counts add up to the number of scored targets.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.analysis.heads import validation_batches
from attnjax.config import Config
from attnjax.models import build
from attnjax.outputs import output_directory
from attnjax.rundir import RunDir

RECALL_TASKS = ("induction", "mqar")


def check_recall_task(config: Config):
    """``ValueError`` unless ``data.task`` is a recall task."""
    if config.data.task not in RECALL_TASKS:
        raise ValueError(f"accuracy by distance needs data.task in {', '.join(RECALL_TASKS)}; "
                         f"this run's is {config.data.task!r}")


def recall_keys(inputs, targets, weights) -> np.ndarray:
    """``j(t)`` ``[B, T]`` (see the module docstring) for the scored targets (``weights > 0``);
    -1 where a position is not scored or its target has no key."""
    x, y = np.asarray(inputs), np.asarray(targets)
    scored = np.asarray(weights) > 0
    if x.ndim != 2 or x.shape != y.shape or x.shape != scored.shape:
        raise ValueError(f"inputs, targets and weights must be [B, T] of one shape, got "
                         f"{x.shape}, {y.shape}, {scored.shape}")
    B, T = x.shape
    same = x[:, :, None] == x[:, None, :]                                      # [B, t, j]
    context = np.zeros((B, T, T), np.int32)     # c(t, j): x_{j-s} = x_{t-s} for s < c
    context[:, 0] = same[:, 0]
    for t in range(1, T):
        context[:, t, 0] = same[:, t, 0]
        context[:, t, 1:] = same[:, t, 1:] * (1 + context[:, t - 1, :-1])
    follows = np.zeros((B, T, T), bool)                                         # x_{j+1} = y_t
    follows[:, :, :-1] = x[:, None, 1:] == y[:, :, None]
    candidate = same & follows & (np.arange(T)[None, :] < np.arange(T)[:, None])[None]
    best = np.argmax(np.where(candidate, context, -1), axis=-1)       # first of the longest
    return np.where(candidate.any(-1) & scored, best, -1)


def recall_distances(batch: dict) -> np.ndarray:
    """``d(t) = t - j(t)`` ``[B, T]`` for the scored targets that have a key, else -1."""
    keys = recall_keys(batch["inputs"], batch["targets"], batch["weights"])
    return np.where(keys >= 0, np.arange(keys.shape[1])[None, :] - keys, -1)


def bucket_edges(spec, max_distance: int) -> np.ndarray:
    """Increasing integer edges ``e_0 < ... < e_K``, buckets ``[e_k, e_{k+1})``, for distances
    ``1 .. max_distance``: ``"pow2"`` (1, 2, 4, ... up to the first power above
    ``max_distance``), ``"N"`` (N buckets of equal width ``ceil(max_distance / N)``), or
    explicit edges (a sequence, or ``"e0,e1,..."``)."""
    if max_distance < 1:
        raise ValueError(f"max_distance must be >= 1, got {max_distance}")
    if isinstance(spec, str) and spec == "pow2":
        return 2 ** np.arange(int(np.floor(np.log2(max_distance))) + 2)
    if isinstance(spec, str) and spec.isdigit():
        count = int(spec)
        if count < 1:
            raise ValueError(f"buckets={spec!r}: the number of buckets must be >= 1")
        width = -(-max_distance // count)
        return 1 + width * np.arange(count + 1)
    try:
        edges = np.asarray([int(e) for e in (spec.split(",") if isinstance(spec, str) else spec)])
    except ValueError:
        raise ValueError(f"buckets={spec!r} is not valid; choices: pow2, a number of "
                         "equal-width buckets (e.g. 8), or increasing edges (e.g. 1,8,32,128)"
                         ) from None
    if edges.size < 2 or edges[0] < 1 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bucket edges must be at least two increasing integers >= 1, "
                         f"got {list(edges)}")
    return edges


def bucket_accuracy(distances, correct, weights, edges) -> dict:
    """Accuracy per bucket of the scored targets (``weights > 0``), all ``[B, T]`` (or any one
    shape): ``{"lo", "hi", "count", "correct", "accuracy"}`` per bucket (accuracy NaN where
    empty), the ``scored``, ``unmatched`` (distance < 1: no key) and ``outside`` (beyond the
    edges) counts, and the ``overall`` accuracy of every scored target."""
    d, hit = np.asarray(distances).ravel(), np.asarray(correct, bool).ravel()
    scored = np.asarray(weights).ravel() > 0
    if not d.shape == hit.shape == scored.shape:
        raise ValueError("distances, correct and weights must have one shape")
    edges = np.asarray(edges)
    matched = scored & (d >= 1)
    bucket = np.searchsorted(edges, d, side="right") - 1                # edges[k] <= d < ...
    inside = matched & (bucket >= 0) & (bucket < edges.size - 1)
    K = edges.size - 1
    count = np.bincount(bucket[inside], minlength=K)
    right = np.bincount(bucket[inside], weights=hit[inside], minlength=K)
    return {"lo": edges[:-1], "hi": edges[1:], "count": count, "correct": right.astype(int),
            "accuracy": np.where(count > 0, right / np.maximum(count, 1), np.nan),
            "scored": int(scored.sum()), "unmatched": int((scored & ~matched).sum()),
            "outside": int((matched & ~inside).sum()),
            "overall": float(hit[scored].mean()) if scored.any() else float("nan")}


@functools.lru_cache(maxsize=8)
def _compiled_predictions(model_config):
    model = build(model_config)
    return jax.jit(lambda p, t: jnp.argmax(model.apply({"params": p}, t)[0], -1))


def accuracy_by_distance(config: Config, params, batches, buckets="pow2") -> dict:
    """``bucket_accuracy`` of the model's argmax predictions on ``batches`` (dicts of
    ``inputs``, ``targets``, ``weights`` of a recall task), buckets from ``bucket_edges``
    for distances up to the batches' length - 1."""
    check_recall_task(config)
    batches = list(batches)
    if not batches:
        raise ValueError("batches must not be empty")
    length = max(np.shape(b["inputs"])[1] for b in batches)
    edges = bucket_edges(buckets, max(length - 1, 1))              # bad specs before compiling
    predict = _compiled_predictions(config.model)
    distances, correct, weights = [], [], []
    for batch in batches:
        predictions = np.asarray(predict(params, jnp.asarray(batch["inputs"])))
        distances.append(recall_distances(batch).ravel())
        correct.append((predictions == np.asarray(batch["targets"])).ravel())
        weights.append(np.asarray(batch["weights"]).ravel())
    return bucket_accuracy(np.concatenate(distances), np.concatenate(correct),
                           np.concatenate(weights), edges)


def format_recall_table(result: dict) -> str:
    """A Markdown table, one row per bucket, then the overall, unmatched and outside counts."""
    lines = ["| distance | targets | correct | accuracy |", "|---|---|---|---|"]
    for lo, hi, n, right, acc in zip(result["lo"], result["hi"], result["count"],
                                     result["correct"], result["accuracy"], strict=True):
        label = f"{lo}" if hi == lo + 1 else f"{lo}–{hi - 1}"
        lines.append(f"| {label} | {n} | {right} | {'—' if n == 0 else f'{acc:.4f}'} |")
    lines += ["", f"Overall accuracy {result['overall']:.4f} over {result['scored']} scored "
              f"targets; {result['unmatched']} without a key, {result['outside']} outside the "
              "buckets."]
    return "\n".join(lines)


def plot_recall(result: dict, path, title: str):
    """Accuracy per distance bucket as bars (each bucket's number of targets under its
    label); the overall accuracy as a dashed line (its value in the title)."""
    labels = [f"{lo}" if hi == lo + 1 else f"{lo}–{hi - 1}"
              for lo, hi in zip(result["lo"], result["hi"], strict=True)]
    K = len(labels)
    fig, ax = subplots(figsize=(max(5.0, 0.7 * K + 2.0), 4.0))
    accuracy = np.nan_to_num(result["accuracy"], nan=0.0)
    ax.bar(range(K), accuracy, color="tab:blue", width=0.7)
    labels = [f"{label}\nn={n}" for label, n in zip(labels, result["count"], strict=True)]
    ax.axhline(result["overall"], color="0.3", linestyle="--", linewidth=1)
    ax.set_xticks(range(K), labels, rotation=45 if K > 8 else 0, fontsize=8)
    ax.set_ylim(0.0, 1.05)
    ax.set_xlabel("query-key distance t - j (tokens)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title}\n(dashed: overall accuracy {result['overall']:.3f})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_recall_report(run_dir, out_dir, *, which: str = "best", buckets="pow2",
                        batches: int | None = None) -> str:
    """Accuracy by query-key distance of a recall run's checkpoint on ``batches`` validation
    batches (default ``train.eval_batches``) at the training length: ``recall.md``,
    ``recall.csv``, ``recall.png``. Returns the Markdown table."""
    if which not in ("best", "latest"):
        raise ValueError(f"which={which!r} is not valid; choices: best, latest")
    if batches is not None and batches < 1:
        raise ValueError(f"batches must be >= 1, got {batches}")
    run = RunDir(run_dir)
    check_recall_task(run.config())                 # bad input before the checkpoint is read
    bucket_edges(buckets, max(run.config().data.length - 1, 1))
    config, params, step = run.params(which)
    result = accuracy_by_distance(config, params, validation_batches(config, count=batches),
                                  buckets)
    table = format_recall_table(result)
    out = Path(out_dir)
    output_directory(out, "--out")
    name = f"{Path(run_dir).name} step {step}"
    (out / "recall.md").write_text(f"# Accuracy by query-key distance: {name}, "
                                   f"{config.data.task}, T={config.data.length}\n\n{table}\n")
    with open(out / "recall.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lo", "hi", "count", "correct", "accuracy"])
        for row in zip(result["lo"], result["hi"], result["count"], result["correct"],
                       result["accuracy"], strict=True):
            writer.writerow([*map(int, row[:4]), f"{row[4]:.6g}"])
    plot_recall(result, out / "recall.png", f"{name}: {config.data.task} accuracy by distance")
    return table
