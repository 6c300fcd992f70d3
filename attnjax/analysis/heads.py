"""Which heads matter: single-head knockout, gradient importance, iterative pruning.

Every head h of every layer has a gate ``xi_h`` on its output (the model's ``head_gates``,
``[layers, heads]``, 1 = untouched, 0 = knocked out; with ``attention.use_bias`` the output
projection's bias stays, as it belongs to no head). All losses are the validation loss of
``attnjax.train.loop.evaluate`` (``sum CE / sum weight`` over the same ``train.eval_batches``
fixed batches) with the gates applied on top of any ``model.attention.knockout``.

- knockout: ``delta_h = L(xi = 1 - e_h) - L(xi = 1)``, the loss increase without head h.
- importance (Michel et al. 2019): ``I_h = E_x |dL(x)/dxi_h|`` at the current gates,
  where ``L(x)`` is example x's mean token loss and the expectation runs over the validation
  examples. Because ``xi_h`` multiplies head h's output ``A_h``, ``dL/dxi_h = A_h . dL/dA_h``
  (summed over positions and features), a first-order estimate of the knockout loss change.
  Scores are divided by their layer's L2 norm over the heads still present.
- pruning: remove heads in steps, recording loss and accuracy against the fraction removed;
  ``importance`` order recomputes the importance under the current gates after every step (as
  the paper does), ``knockout`` removes by ascending single-knockout delta, ``random`` by a
  seeded permutation.
- similarity: the pairwise JS divergence between a layer's heads
  (``attnjax.analysis.head_similarity``), the redundancy that knockout cannot show.

References: Michel, Levy, Neubig 2019, "Are Sixteen Heads Really Better than One?";
Molchanov et al. 2017, "Pruning Convolutional Neural Networks for Resource Efficient
Inference" (Taylor importance, per-layer L2 normalisation).
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.analysis.head_similarity import format_js_table, head_js, plot_head_js, write_js_csv
from attnjax.analysis.heatmaps import plot_head_matrix
from attnjax.config import Config
from attnjax.data import Dataset
from attnjax.models import build, family
from attnjax.rundir import RunDir

ORDERS = ("importance", "knockout", "random")


def validation_batches(config: Config, dataset: Dataset | None = None,
                       count: int | None = None) -> list[dict]:
    """The fixed batches ``evaluate`` scores at the training length (the first ``count``,
    default ``train.eval_batches``)."""
    dataset = dataset or Dataset(config.data)
    return [dataset.batch(config.seed, i, config.train.eval_batch_size, config.data.length, "val")
            for i in range(config.train.eval_batches if count is None else count)]


def _as_batches(config: Config, dataset_or_batches) -> list[dict]:
    if dataset_or_batches is None or isinstance(dataset_or_batches, Dataset):
        return validation_batches(config, dataset_or_batches)
    batches = list(dataset_or_batches)
    if not batches:
        raise ValueError("batches must not be empty")
    return batches


def _shape(config: Config) -> tuple[int, int]:
    return config.model.num_layers, config.model.attention.num_heads


def _check_gates(config: Config, gates) -> jax.Array:
    gates = jnp.asarray(gates, jnp.float32)
    if gates.shape != _shape(config):
        raise ValueError(f"gates must have shape [num_layers, num_heads] = "
                         f"{list(_shape(config))}, got {list(gates.shape)}")
    return gates


@functools.lru_cache(maxsize=8)
def _compiled_sums(config: Config, grouped: bool = False):
    model, objective = build(config.model), family(config.model)

    def sums(params, gates, batch, groups):
        extra = {"group_gates": groups} if grouped else {}
        logits, _ = model.apply({"params": params}, batch["inputs"], **objective.arguments(batch),
                                head_gates=gates, **extra)
        return objective.sums(logits, batch)

    return jax.jit(sums)


def evaluate_gates(config: Config, params, gates, batches, groups=None) -> dict[str, float]:
    """``{"loss", "accuracy"}`` over ``batches`` with head gates ``[layers, heads]`` (and with
    ``groups`` ``{group: gates}`` those of the family's other head groups, ``Family.head_groups``:
    an encoder–decoder's ``cross``)."""
    gates, step = _check_gates(config, gates), _compiled_sums(config, bool(groups))
    totals = {"ce": 0.0, "correct": 0.0, "weight": 0.0}
    for batch in batches:
        sums = jax.device_get(step(params, gates, batch, groups or {}))
        for key in totals:
            totals[key] += float(sums[key])
    weight = max(totals["weight"], 1.0)
    return {"loss": totals["ce"] / weight, "accuracy": totals["correct"] / weight}


def loss_with_gates(config: Config, params, gates, batches) -> float:
    """Validation loss over ``batches`` with head gates ``[layers, heads]``."""
    return evaluate_gates(config, params, gates, batches)["loss"]


def knockout_losses(config: Config, params, dataset_or_batches=None, heads=None) -> np.ndarray:
    """``[layers, heads]``: loss with head (l, h) alone knocked out minus the loss with all
    heads. ``dataset_or_batches``: a ``Dataset``, a list of batches, or ``None`` (the run's
    validation batches); ``heads``: the (layer, head) pairs to measure (others are NaN)."""
    batches = _as_batches(config, dataset_or_batches)
    L, N = _shape(config)
    pairs = [(l, h) for l in range(L) for h in range(N)] if heads is None else list(heads)
    for layer, head in pairs:
        if not (0 <= layer < L and 0 <= head < N):
            raise ValueError(f"heads entry {(layer, head)} is outside [0, {L}) x [0, {N})")
    baseline = loss_with_gates(config, params, np.ones((L, N)), batches)
    delta = np.full((L, N), np.nan)
    for layer, head in pairs:
        gates = np.ones((L, N))
        gates[layer, head] = 0.0
        delta[layer, head] = loss_with_gates(config, params, gates, batches) - baseline
    return delta


def group_knockout_losses(config: Config, params, batches, group: str) -> np.ndarray:
    """``[layers, heads]`` of head group ``group`` (``Family.head_groups``, e.g. an
    encoder–decoder's ``cross``): the loss with that head alone knocked out minus the loss with
    all heads."""
    shapes = family(config.model).head_groups(config.model)
    if group not in shapes:
        raise ValueError(f"head group {group!r} is not one of model.family="
                         f"{config.model.family!r}'s: {', '.join(shapes) or 'none'}")
    L, N = shapes[group]
    ones = np.ones(_shape(config))
    loss = lambda gates: evaluate_gates(config, params, ones, batches, {group: gates})["loss"]
    baseline = loss(np.ones((L, N), np.float32))
    delta = np.zeros((L, N))
    for layer in range(L):
        for head in range(N):
            gates = np.ones((L, N), np.float32)
            gates[layer, head] = 0.0
            delta[layer, head] = loss(gates) - baseline
    return delta


@functools.lru_cache(maxsize=8)
def _compiled_gate_grads(config: Config):
    model, objective = build(config.model), family(config.model)

    def example_loss(gates, params, example):
        example = jax.tree_util.tree_map(lambda x: x[None], example)      # a batch of one
        logits, _ = model.apply({"params": params}, example["inputs"],
                                **objective.arguments(example), head_gates=gates)
        sums = objective.sums(logits, example)
        return sums["ce"] / jnp.where(sums["weight"] > 0, sums["weight"], 1.0)

    def gate_grads(params, gates, batch):
        return jax.vmap(jax.grad(example_loss), in_axes=(None, None, 0))(gates, params, batch)

    return jax.jit(gate_grads)


def head_importance(config: Config, params, batches=None, *, gates=None,
                    normalize: bool = True) -> np.ndarray:
    """Michel et al.'s ``I_h = E_x |dL(x)/dxi_h|`` at ``gates`` (default all ones), ``[layers,
    heads]``; with ``normalize`` each layer's scores are divided by their L2 norm over the
    heads whose gate is nonzero (gated-off heads score 0)."""
    batches = _as_batches(config, batches)
    L, N = _shape(config)
    gates = _check_gates(config, np.ones((L, N)) if gates is None else gates)
    grads = _compiled_gate_grads(config)
    total, count = np.zeros((L, N)), 0
    for batch in batches:
        g = np.asarray(grads(params, gates, batch), np.float64)          # [B, L, N]
        total += np.abs(g).sum(0)
        count += g.shape[0]
    importance = total / count
    if normalize:
        importance = np.where(np.asarray(gates) != 0, importance, 0.0)
        norm = np.linalg.norm(importance, axis=1, keepdims=True)
        importance = importance / np.where(norm > 0, norm, 1.0)
    return importance


def _prune_counts(total: int, steps: int) -> np.ndarray:
    if not 1 <= steps <= total:
        raise ValueError(f"steps must be in [1, {total}] (the number of heads), got {steps}")
    return np.round(np.linspace(0, total, steps + 1)).astype(int)


def pruning_curve(config: Config, params, batches=None, steps: int | None = None, *,
                  order: str = "importance", seed: int = 0, knockout=None) -> dict:
    """Loss and accuracy as heads are removed: ``{"order", "fraction" [steps + 1], "loss",
    "accuracy", "pruned": [(layer, head), ...] in removal order}``, starting from all heads at
    fraction 0. ``steps`` (default: one head per step, at most 10 steps) is the number of removals;
    ``order`` is one of ``importance``, ``knockout`` (uses ``knockout`` deltas if given),
    ``random``."""
    if order not in ORDERS:
        raise ValueError(f"order={order!r} is not valid; choices: {', '.join(ORDERS)}")
    batches = _as_batches(config, batches)
    L, N = _shape(config)
    counts = _prune_counts(L * N, min(L * N, 10) if steps is None else steps)
    if order == "knockout":
        delta = knockout_losses(config, params, batches) if knockout is None else knockout
        ranking = [divmod(int(i), N) for i in np.argsort(np.asarray(delta).ravel(), kind="stable")]
    elif order == "random":
        ranking = [divmod(int(i), N) for i in np.random.default_rng(seed).permutation(L * N)]
    gates = np.ones((L, N))
    pruned: list[tuple[int, int]] = []
    result = {"order": order, "fraction": counts / (L * N), "loss": [], "accuracy": []}
    for k, count in enumerate(counts):
        if k:
            need = count - len(pruned)
            if order == "importance":
                scores = head_importance(config, params, batches, gates=gates)
                scores = np.where(gates != 0, scores, np.inf).ravel()
                chosen = [divmod(int(i), N) for i in np.argsort(scores, kind="stable")[:need]]
            else:
                chosen = ranking[len(pruned):count]
            for layer, head in chosen:
                gates[layer, head] = 0.0
            pruned += chosen
        metrics = evaluate_gates(config, params, gates, batches)
        result["loss"].append(metrics["loss"])
        result["accuracy"].append(metrics["accuracy"])
    result["loss"], result["accuracy"] = np.asarray(result["loss"]), np.asarray(result["accuracy"])
    result["pruned"] = pruned
    return result


def plot_knockout_heatmap(delta, path, title: str = "loss increase when the head is knocked out"):
    """``delta`` ``[layers, heads]`` annotated, red-blue centred at 0 (red = loss goes up)."""
    plot_head_matrix(delta, path, title, diverging=True, label="delta val loss")


def plot_pruning_curve(curves, path, title: str = "pruning heads"):
    """Loss and accuracy against the fraction of heads removed, one line per curve (a
    ``pruning_curve`` result, or a list of them)."""
    curves = [curves] if isinstance(curves, dict) else list(curves)
    fig, (left, right) = subplots(1, 2, figsize=(10, 4))
    for curve in curves:
        for ax, key in ((left, "loss"), (right, "accuracy")):
            ax.plot(curve["fraction"], curve[key], marker="o", markersize=3, label=curve["order"])
    for ax, key in ((left, "validation loss"), (right, "validation accuracy")):
        ax.set_xlabel("fraction of heads removed")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(title="removal order")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_head_report(run_dir, out_dir, which: str = "best", steps: int | None = None) -> str:
    """Knockout, importance and pruning of a run's checkpoint on its validation batches:
    ``knockout.csv`` / ``knockout.md``, ``knockout.png``, ``importance.png``, ``pruning.png``;
    and the pairwise JS divergence of each layer's heads on the first validation batch
    (``attnjax.analysis.head_similarity``): ``head_js.csv``, ``head_js.png`` and a table in
    ``knockout.md``; for a family with other head groups (an encoder–decoder's
    cross-attention) their knockout too, a table in ``knockout.md`` and
    ``<group>_knockout.png``. Returns the Markdown of ``knockout.md``."""
    if which not in ("best", "latest"):
        raise ValueError(f"which={which!r} is not valid; choices: best, latest")
    config, params, step = RunDir(run_dir).params(which)
    batches = validation_batches(config)
    L, N = _shape(config)
    base = evaluate_gates(config, params, np.ones((L, N)), batches)
    delta = knockout_losses(config, params, batches)
    importance = head_importance(config, params, batches)
    probe = jax.device_get(batches[0])
    js = head_js(config, params, probe["inputs"], arguments=family(config.model).arguments(probe))
    curves = [pruning_curve(config, params, batches, steps, order="importance"),
              pruning_curve(config, params, batches, steps, order="knockout", knockout=delta),
              pruning_curve(config, params, batches, steps, order="random", seed=config.seed)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{Path(run_dir).name} step {step}"
    with open(out / "knockout.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", "head", "knockout_delta", "importance"])
        for layer in range(L):
            for head in range(N):
                writer.writerow([layer, head, f"{delta[layer, head]:.6g}",
                                 f"{importance[layer, head]:.6g}"])
    lines = [f"# Heads of {name}", "",
             f"Baseline validation loss {base['loss']:.4f}, accuracy {base['accuracy']:.4f} "
             f"({len(batches)} batches).", "",
             "| head | knockout delta loss | importance (layer-normalised) |", "|---|---|---|"]
    lines += [f"| L{l}.H{h} | {delta[l, h]:+.4f} | {importance[l, h]:.3f} |"
              for l in range(L) for h in range(N)]
    lines += ["", "| fraction removed | " + " | ".join(f"{c['order']} loss / acc" for c in curves)
              + " |", "|---" * (len(curves) + 1) + "|"]
    for k, fraction in enumerate(curves[0]["fraction"]):
        cells = [f"{c['loss'][k]:.4f} / {c['accuracy'][k]:.3f}" for c in curves]
        lines.append(f"| {fraction:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "Importance order removed: " + ", ".join(
        f"L{l}H{h}" for l, h in curves[0]["pruned"])]
    lines += ["", "Same-layer head similarity: Jensen-Shannon divergence between two heads' "
              f"rows (query rows >= 1, {len(batches[0]['inputs'])} examples of the first "
              "validation batch; 0 = identical, ln 2 = 0.693 = disjoint):", "",
              format_js_table(js)]
    for group in family(config.model).head_groups(config.model):
        knocked = group_knockout_losses(config, params, batches, group)
        lines += ["", f"Knockout of the {group}-attention heads (delta loss):", "",
                  f"| head | {group} knockout delta loss |", "|---|---|"]
        lines += [f"| L{l}.H{h} | {knocked[l, h]:+.4f} |"
                  for l in range(knocked.shape[0]) for h in range(knocked.shape[1])]
        plot_knockout_heatmap(knocked, out / f"{group}_knockout.png",
                              f"{name}: val loss increase when one {group}-attention head "
                              f"is knocked out (baseline {base['loss']:.3f})")
    text = "\n".join(lines) + "\n"
    (out / "knockout.md").write_text(text)
    plot_knockout_heatmap(delta, out / "knockout.png",
                          f"{name}: val loss increase when one head is knocked out "
                          f"(baseline {base['loss']:.3f})")
    plot_head_matrix(importance, out / "importance.png",
                     f"{name}: head importance E|dL/d gate| (L2-normalised per layer)",
                     label="importance")
    plot_pruning_curve(curves, out / "pruning.png", f"{name}: iterative head pruning")
    write_js_csv(js, out / "head_js.csv")
    plot_head_js(js, out / "head_js.png", f"{name}: JS divergence between a layer's heads")
    return text
