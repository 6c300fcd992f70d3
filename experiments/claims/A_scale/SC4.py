"""SC4: the divisor of the scores is a temperature: a larger one spreads attention, a smaller
one concentrates it.

Measure: the S-text checkpoints (``{}``, 600 steps, seeds 0, 1; the shared default arm). On 8
validation windows, every layer's queries and keys as they meet in the scores (after RoPE,
sown by the attention module with its scale s) are held fixed, and the causal attention is
recomputed by ``attnjax.ops.dot_product_attention`` at logit scale m * s for m = 0.25, 0.5, 1,
2, 4 (a larger m is a smaller divisor). Per head: ``norm_entropy`` and ``max_weight`` over rows
i >= 8.

    attnjax audit experiments/claims --workdir runs/claims --only SC4

Budget: no runs of its own (the shared default arm, 1.4 units).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.models.probe import capture
from attnjax.ops import dot_product_attention, stats

ID = "SC4"
SOURCE = "000 §3.3"
CLAIM = "the divisor is a temperature: a larger one spreads attention, a smaller concentrates it"
CRITERION = ("at fixed q, k, norm_entropy strictly falls and max_weight strictly rises with m in "
             "every head")
MULTIPLIERS = (0.25, 0.5, 1.0, 2.0, 4.0)
FIRST_ROW, PROBE_EXAMPLES = 8, 8


def get_sweep():
    return with_seeds([{}])


@functools.lru_cache(maxsize=4)
def _recompute_fn(model):
    """``(params, tokens, m) -> weights [layers, B, heads, T, T]`` at logit scale m * s."""
    def recompute(params, tokens, m):
        _, sown = capture(model, params, tokens)
        return jnp.stack([dot_product_attention(
            layer["queries"], layer["keys"], layer["keys"], scale=m * layer["scale"],
            is_causal=True, return_weights=True)[1] for layer in sown])
    return jax.jit(recompute)


def recomputed_weights(trained, multipliers=MULTIPLIERS) -> dict[float, np.ndarray]:
    """m -> the attention of the run's final checkpoint recomputed at m (fixed q, k)."""
    config, params, _ = trained.dir.params("latest")
    tokens = probe_batch(config, batch_size=PROBE_EXAMPLES)
    fn = _recompute_fn(config.model)
    return {m: np.asarray(fn(params, tokens, m), np.float64) for m in multipliers}


def head_stats(weights: np.ndarray) -> dict[str, list]:
    """``norm_entropy`` and ``max_weight`` ``[layers][heads]`` over rows i >= 8."""
    rows = weights[..., FIRST_ROW:, :]
    i = np.arange(FIRST_ROW, weights.shape[-1])
    entropy = np.asarray(stats.row_entropy(rows)) / np.log(i + 1)
    return {"norm_entropy": entropy.mean(axis=(1, 3)).tolist(),
            "max_weight": rows.max(-1).mean(axis=(1, 3)).tolist()}


def measure(runs):
    out = {}
    for seed, t in runs.by_seed({}).items():
        per_m = {m: head_stats(w) for m, w in recomputed_weights(t).items()}
        out[str(seed)] = {name: [per_m[m][name] for m in MULTIPLIERS]
                          for name in ("norm_entropy", "max_weight")}
    return {"multipliers": list(MULTIPLIERS), "checkpoints": out}


def _strict(series: np.ndarray, sign: int) -> np.ndarray:
    """``[layers, heads]``: whether the series over m (axis 0) strictly moves in ``sign``."""
    return np.all(sign * np.diff(series, axis=0) > 0, axis=0)


def verdict(results):
    holding, evidence = {}, []
    for seed, r in results["checkpoints"].items():
        entropy, weight = np.asarray(r["norm_entropy"]), np.asarray(r["max_weight"])
        ok = _strict(entropy, -1) & _strict(weight, +1)
        holding[int(seed)] = bool(ok.all())
        evidence.append(f"seed {seed}: {int(ok.sum())}/{ok.size} heads monotone; mean "
                        f"norm_entropy {np.round(entropy.mean((1, 2)), 3).tolist()}, max_weight "
                        f"{np.round(weight.mean((1, 2)), 3).tolist()}")
    return over_regimes({"S-text": holding},
                        f"m = {results['multipliers']}: " + "; ".join(evidence))


def _example(monotone: bool) -> dict:
    entropy = [[[0.9 - 0.1 * i] * 4] * 2 for i in range(5)]
    weight = [[[0.2 + 0.1 * i] * 4] * 2 for i in range(5)]
    if not monotone:
        weight[4][1][2] = 0.1
    r = {"norm_entropy": entropy, "max_weight": weight}
    return {"multipliers": list(MULTIPLIERS), "checkpoints": {"0": r, "1": r}}


EXAMPLES = [(_example(True), "confirmed"), (_example(False), "refuted")]


def plot(results, out_dir):
    """``norm_entropy`` and ``max_weight`` against m, one line per head of each checkpoint."""
    from attnjax.analysis.figures import subplots
    fig, axes = subplots(1, 2, figsize=(9, 3.6), layout="constrained")
    m = results["multipliers"]
    for seed, r in results["checkpoints"].items():
        for ax, name in zip(axes, ("norm_entropy", "max_weight")):
            series = np.asarray(r[name])                     # [m, layers, heads]
            for layer in range(series.shape[1]):
                for head in range(series.shape[2]):
                    ax.plot(m, series[:, layer, head], color=f"C{layer}", alpha=0.6,
                            linestyle="-" if seed == "0" else "--", marker=".",
                            label=f"layer {layer}" if seed == "0" and head == 0 else None)
            ax.set(xscale="log", xlabel="m (logit scale x m)", ylabel=name)
            ax.set_xticks(m, [f"{x:g}" for x in m])
            ax.minorticks_off()
    axes[0].legend(title="seed 0 solid, 1 dashed", fontsize=8)
    fig.suptitle("SC4: attention of fixed q, k recomputed at m x the scale (rows i >= 8)")
    path = out_dir / "SC4-temperature.png"
    fig.savefig(path, dpi=120)
    return [path]
