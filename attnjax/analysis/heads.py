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
from attnjax.models import build, family, mean_pool
from attnjax.outputs import output_directory
from attnjax.rundir import RunDir

ORDERS = ("importance", "knockout", "random")


def validation_batches(config: Config, dataset: Dataset | None = None,
                       count: int | None = None) -> list[dict]:
    """The fixed batches ``evaluate`` scores at the training length (the first ``count``,
    default ``train.eval_batches``)."""
    dataset = dataset or Dataset(config.data)
    return [dataset.batch(config.seed, i, config.train.eval_batch_size, config.data.length, "val")
            for i in range(config.train.eval_batches if count is None else count)]


def _as_batches(config: Config, params, dataset_or_batches) -> list[dict]:
    if dataset_or_batches is None or isinstance(dataset_or_batches, Dataset):
        return with_references(config, params, validation_batches(config, dataset_or_batches))
    batches = list(dataset_or_batches)
    if not batches:
        raise ValueError("batches must not be empty")
    return with_references(config, params, batches)


def with_references(config: Config, params, batches: list[dict]) -> list[dict]:
    """``batches``; for a model that outputs hidden states, each with ``reference``, its
    sentence embeddings under all heads (``attnjax.models.encoder.mean_pool``): the loss the
    heads are then judged by is the embedding's drift from them, ``1 - cos``, and the
    accuracy the mean cosine."""
    if family(config.model).objective(config.model) != "embedding":
        return batches
    every = _all_gates(config)
    pooled = jax.jit(lambda p, b: mean_pool(_apply(config, p, every, b), b.get("token_mask")))
    return [batch if "reference" in batch else {**batch, "reference": pooled(params, batch)}
            for batch in batches]


SELF = "self"       # the group of the model's own heads (a seq2seq model's decoder self-attention)


def head_groups(config: Config) -> dict[str, tuple[int, int]]:
    """``{group: (layers, heads)}``: ``self``, the model's ``head_gates``, then the family's other
    head groups (``Family.head_groups``: an encoder–decoder's ``cross`` and ``encoder``)."""
    return {SELF: _shape(config), **family(config.model).head_groups(config.model)}


def _shape(config: Config) -> tuple[int, int]:
    return config.model.num_layers, config.model.attention.num_heads


def _check_group(config: Config, group: str) -> tuple[int, int]:
    shapes = head_groups(config)
    if group not in shapes:
        raise ValueError(f"head group {group!r} is not one of model.family="
                         f"{config.model.family!r}'s: {', '.join(shapes)}")
    return shapes[group]


def _check_gates(config: Config, gates, group: str = SELF) -> jax.Array:
    shape = _check_group(config, group)
    gates = jnp.asarray(gates, jnp.float32)
    if gates.shape != shape:
        which = "" if group == SELF else f" of head group {group!r}"
        raise ValueError(f"gates{which} must have shape [num_layers, num_heads] = "
                         f"{list(shape)}, got {list(gates.shape)}")
    return gates


def _all_gates(config: Config, gates=None, group: str = SELF) -> dict[str, jax.Array]:
    """Every group's gates: ones, with ``gates`` (if given) in ``group``."""
    _check_group(config, group)
    out = {name: jnp.ones(shape, jnp.float32) for name, shape in head_groups(config).items()}
    if gates is not None:
        out[group] = _check_gates(config, gates, group)
    return out


def _apply(config: Config, params, gates: dict, batch: dict):
    """The model's logits on ``batch`` with every group's ``gates``."""
    others = {name: g for name, g in gates.items() if name != SELF}
    extra = {"group_gates": others} if others else {}
    logits, _ = build(config.model).apply({"params": params}, batch["inputs"],
                                          **family(config.model).arguments(batch),
                                          head_gates=gates[SELF], **extra)
    return logits


@functools.lru_cache(maxsize=8)
def _compiled_sums(config: Config):
    objective = family(config.model)
    return jax.jit(lambda params, gates, batch: objective.sums(
        _apply(config, params, gates, batch), batch))


def _evaluate(config: Config, params, gates: dict, batches) -> dict[str, float]:
    step = _compiled_sums(config)
    totals = {"ce": 0.0, "correct": 0.0, "weight": 0.0}
    for batch in batches:
        sums = jax.device_get(step(params, gates, batch))
        for key in totals:
            totals[key] += float(sums[key])
    weight = max(totals["weight"], 1.0)
    return {"loss": totals["ce"] / weight, "accuracy": totals["correct"] / weight}


def evaluate_gates(config: Config, params, gates, batches, groups=None) -> dict[str, float]:
    """``{"loss", "accuracy"}`` over ``batches`` with head gates ``[layers, heads]`` (and with
    ``groups`` ``{group: gates}`` those of the family's other head groups, ``head_groups``;
    the groups not given at 1)."""
    every = _all_gates(config, gates)
    for group, group_gates in (groups or {}).items():
        every[group] = _check_gates(config, group_gates, group)
    return _evaluate(config, params, every, batches)


def loss_with_gates(config: Config, params, gates, batches) -> float:
    """Validation loss over ``batches`` with head gates ``[layers, heads]``."""
    return evaluate_gates(config, params, gates, batches)["loss"]


def knockout_losses(config: Config, params, dataset_or_batches=None, heads=None, *,
                    group: str = SELF) -> np.ndarray:
    """``[layers, heads]`` of head group ``group``: loss with head (l, h) alone knocked out
    minus the loss with all heads. ``dataset_or_batches``: a ``Dataset``, a list of batches,
    or ``None`` (the run's validation batches); ``heads``: the (layer, head) pairs to measure
    (others are NaN)."""
    batches = _as_batches(config, params, dataset_or_batches)
    L, N = _check_group(config, group)
    pairs = [(l, h) for l in range(L) for h in range(N)] if heads is None else list(heads)
    for layer, head in pairs:
        if not (0 <= layer < L and 0 <= head < N):
            raise ValueError(f"heads entry {(layer, head)} is outside [0, {L}) x [0, {N})")
    loss = lambda gates: _evaluate(config, params, _all_gates(config, gates, group),
                                   batches)["loss"]
    baseline = loss(np.ones((L, N)))
    delta = np.full((L, N), np.nan)
    for layer, head in pairs:
        gates = np.ones((L, N))
        gates[layer, head] = 0.0
        delta[layer, head] = loss(gates) - baseline
    return delta


@functools.lru_cache(maxsize=8)
def _compiled_gate_grads(config: Config, group: str):
    objective = family(config.model)

    def example_loss(gates, params, example):
        example = jax.tree_util.tree_map(lambda x: x[None], example)      # a batch of one
        sums = objective.sums(_apply(config, params, gates, example), example)
        return sums["ce"] / jnp.where(sums["weight"] > 0, sums["weight"], 1.0)

    def gate_grads(params, gates, batch):
        per_example = jax.vmap(jax.grad(example_loss), in_axes=(None, None, 0))
        return per_example(gates, params, batch)[group]

    return jax.jit(gate_grads)


def head_importance(config: Config, params, batches=None, *, gates=None,
                    normalize: bool = True, group: str = SELF) -> np.ndarray:
    """Michel et al.'s ``I_h = E_x |dL(x)/dxi_h|`` of head group ``group`` at ``gates`` (its
    gates, default all ones; the other groups' at 1), ``[layers, heads]``; with ``normalize``
    each layer's scores are divided by their L2 norm over the heads whose gate is nonzero
    (gated-off heads score 0)."""
    batches = _as_batches(config, params, batches)
    every = _all_gates(config, gates, group)
    grads = _compiled_gate_grads(config, group)
    total, count = np.zeros(every[group].shape), 0
    for batch in batches:
        g = np.asarray(grads(params, every, batch), np.float64)          # [B, L, N]
        total += np.abs(g).sum(0)
        count += g.shape[0]
    importance = total / count
    if normalize:
        importance = np.where(np.asarray(every[group]) != 0, importance, 0.0)
        norm = np.linalg.norm(importance, axis=1, keepdims=True)
        importance = importance / np.where(norm > 0, norm, 1.0)
    return importance


def _prune_counts(total: int, steps: int) -> np.ndarray:
    if not 1 <= steps <= total:
        raise ValueError(f"steps must be in [1, {total}] (the number of heads), got {steps}")
    return np.round(np.linspace(0, total, steps + 1)).astype(int)


def pruning_curve(config: Config, params, batches=None, steps: int | None = None, *,
                  order: str = "importance", seed: int = 0, knockout=None,
                  group: str = SELF) -> dict:
    """Loss and accuracy as heads of ``group`` are removed (the other groups' kept): ``{"order",
    "fraction" [steps + 1], "loss", "accuracy", "pruned": [(layer, head), ...] in removal
    order}``, starting from all heads at fraction 0. ``steps`` (default: one head per step, at
    most 10 steps) is the number of removals; ``order`` is one of ``importance``,
    ``knockout`` (uses ``knockout`` deltas if given), ``random``."""
    if order not in ORDERS:
        raise ValueError(f"order={order!r} is not valid; choices: {', '.join(ORDERS)}")
    batches = _as_batches(config, params, batches)
    L, N = _check_group(config, group)
    counts = _prune_counts(L * N, min(L * N, 10) if steps is None else steps)
    if order == "knockout":
        delta = (knockout_losses(config, params, batches, group=group) if knockout is None
                 else knockout)
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
                scores = head_importance(config, params, batches, gates=gates, group=group)
                scores = np.where(gates != 0, scores, np.inf).ravel()
                chosen = [divmod(int(i), N) for i in np.argsort(scores, kind="stable")[:need]]
            else:
                chosen = ranking[len(pruned):count]
            for layer, head in chosen:
                gates[layer, head] = 0.0
            pruned += chosen
        metrics = _evaluate(config, params, _all_gates(config, gates, group), batches)
        result["loss"].append(metrics["loss"])
        result["accuracy"].append(metrics["accuracy"])
    result["loss"], result["accuracy"] = np.asarray(result["loss"]), np.asarray(result["accuracy"])
    result["pruned"] = pruned
    return result


LOSS, DRIFT = ("validation loss", "validation accuracy"), ("embedding drift 1 - cos",
                                                             "mean cosine to the model's own")


def plot_knockout_heatmap(delta, path, title: str = "loss increase when the head is knocked out",
                          metrics=LOSS):
    """``delta`` ``[layers, heads]`` annotated, red-blue centred at 0 (red = loss goes up);
    ``metrics``: the names of the loss and accuracy (``LOSS``, or a head-less encoder's
    ``DRIFT``)."""
    plot_head_matrix(delta, path, title, diverging=True, label=f"delta {metrics[0]}")


def plot_pruning_curve(curves, path, title: str = "pruning heads", metrics=LOSS):
    """Loss and accuracy (named by ``metrics``) against the fraction of heads removed, one
    line per curve (a ``pruning_curve`` result, or a list of them)."""
    curves = [curves] if isinstance(curves, dict) else list(curves)
    fig, (left, right) = subplots(1, 2, figsize=(10, 4))
    for curve in curves:
        for ax, key in ((left, "loss"), (right, "accuracy")):
            ax.plot(curve["fraction"], curve[key], marker="o", markersize=3, label=curve["order"])
    for ax, key in zip((left, right), metrics):
        ax.set_xlabel("fraction of heads removed")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(title="removal order")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _drift(config: Config) -> bool:
    """Whether heads are judged by the sentence embedding's drift (``with_references``), whose
    gradient is zero at the model itself: gradient importance means nothing there."""
    return family(config.model).objective(config.model) == "embedding"


def _pruning_curves(config: Config, params, batches, steps, delta, group: str) -> list[dict]:
    """The removal orders of ``group``'s heads (knockout order from ``delta``): importance
    (but for a drift), knockout, random."""
    importance = ([] if _drift(config) else
                  [pruning_curve(config, params, batches, steps, order="importance",
                                 group=group)])
    return importance + [
        pruning_curve(config, params, batches, steps, order="knockout", knockout=delta,
                      group=group),
        pruning_curve(config, params, batches, steps, order="random", seed=config.seed,
                      group=group)]


def _group_markdown(delta, importance, curves, label: str) -> list[str]:
    """A group's per-head table (knockout, importance) and its pruning table."""
    L, N = delta.shape
    lines = [f"| {label}head | knockout delta loss | importance (layer-normalised) |",
             "|---|---|---|"]
    lines += [f"| L{l}.H{h} | {delta[l, h]:+.4f} | {importance[l, h]:.3f} |"
              if np.isfinite(importance[l, h]) else f"| L{l}.H{h} | {delta[l, h]:+.4f} | — |"
              for l in range(L) for h in range(N)]
    lines += ["", "| fraction removed | " + " | ".join(f"{c['order']} loss / acc" for c in curves)
              + " |", "|---" * (len(curves) + 1) + "|"]
    for k, fraction in enumerate(curves[0]["fraction"]):
        cells = [f"{c['loss'][k]:.4f} / {c['accuracy'][k]:.3f}" for c in curves]
        lines.append(f"| {fraction:.3f} | " + " | ".join(cells) + " |")
    return lines + ["", f"{curves[0]['order'].capitalize()} order removed: " + ", ".join(
        f"L{l}H{h}" for l, h in curves[0]["pruned"])]


def _group_report(config: Config, params, batches, steps, group: str, out: Path, name: str,
                  base: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Knockout, importance and pruning of ``group``'s heads: ``(delta, importance, Markdown
    lines)``, and their pictures (``knockout.png``, ``importance.png``, ``pruning.png``,
    prefixed ``<group>_`` for a group other than the model's own heads)."""
    delta = knockout_losses(config, params, batches, group=group)
    importance = (np.full(delta.shape, np.nan) if _drift(config) else
                  head_importance(config, params, batches, group=group))
    curves = _pruning_curves(config, params, batches, steps, delta, group)
    prefix, what = ("", "head") if group == SELF else (f"{group}_", f"{group}-attention head")
    metrics = DRIFT if _drift(config) else LOSS
    plot_knockout_heatmap(delta, out / f"{prefix}knockout.png",
                          f"{name}: {metrics[0]} increase when one {what} is knocked out "
                          f"(baseline {base['loss']:.3f})", metrics)
    if not _drift(config):
        plot_head_matrix(importance, out / f"{prefix}importance.png",
                         f"{name}: {what} importance E|dL/d gate| (L2-normalised per layer)",
                         label="importance")
    plot_pruning_curve(curves, out / f"{prefix}pruning.png",
                       f"{name}: iterative pruning of the {what}s", metrics)
    label = "" if group == SELF else f"{group} "
    return delta, importance, _group_markdown(delta, importance, curves, label)


def write_head_report(run_dir, out_dir, which: str = "best", steps: int | None = None) -> str:
    """Knockout, importance and pruning of a run's checkpoint on its validation batches:
    ``knockout.csv`` / ``knockout.md``, ``knockout.png``, ``importance.png``, ``pruning.png``;
    and the pairwise JS divergence of each layer's heads on the first validation batch
    (``attnjax.analysis.head_similarity``): ``head_js.csv``, ``head_js.png`` and a table in
    ``knockout.md``; for a family with other head groups (an encoder–decoder's cross-attention
    and encoder heads) the same three for each, pruned with the other groups kept: a section of
    ``knockout.md`` and ``<group>_knockout.png``, ``<group>_importance.png``,
    ``<group>_pruning.png``. A model that outputs hidden states is judged by its sentence
    embeddings' drift (``with_references``), without gradient importance. Returns the Markdown
    of ``knockout.md``."""
    if which not in ("best", "latest"):
        raise ValueError(f"which={which!r} is not valid; choices: best, latest")
    config, params, step = RunDir(run_dir).params(which)
    batches = with_references(config, params, validation_batches(config))
    base = evaluate_gates(config, params, np.ones(_shape(config)), batches)
    out = Path(out_dir)
    output_directory(out, "--out")
    name = f"{Path(run_dir).name} step {step}"
    delta, importance, own = _group_report(config, params, batches, steps, SELF, out, name, base)
    with open(out / "knockout.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["layer", "head", "knockout_delta", "importance"])
        for (layer, head), value in np.ndenumerate(delta):
            writer.writerow([layer, head, f"{value:.6g}", f"{importance[layer, head]:.6g}"])
    probe = jax.device_get(batches[0])
    js = head_js(config, params, probe["inputs"], arguments=family(config.model).arguments(probe))
    drift = ("The loss is the drift of each sentence embedding (the mean-pooled last hidden "
             "states) from the model's own, 1 - cos; the accuracy the mean cosine; gradient "
             "importance is not defined (the drift's gradient is zero at the model itself). "
             if _drift(config) else "")
    lines = [f"# Heads of {name}", "",
             f"{drift}Baseline validation loss {base['loss']:.4f}, accuracy "
             f"{base['accuracy']:.4f} ({len(batches)} batches).", "", *own, "",
             "Same-layer head similarity: Jensen-Shannon divergence between two heads' "
             f"rows (query rows >= 1, {len(batches[0]['inputs'])} examples of the first "
             "validation batch; 0 = identical, ln 2 = 0.693 = disjoint):", "",
             format_js_table(js)]
    for group in head_groups(config):
        if group != SELF:
            section = _group_report(config, params, batches, steps, group, out, name, base)[2]
            lines += ["", f"## The {group}-attention heads", "",
                      f"Knockout, importance and pruning of the {group}-attention heads (the "
                      "other heads kept):", "", *section]
    text = "\n".join(lines) + "\n"
    (out / "knockout.md").write_text(text)
    write_js_csv(js, out / "head_js.csv")
    plot_head_js(js, out / "head_js.png", f"{name}: JS divergence between a layer's heads")
    return text
