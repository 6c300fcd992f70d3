"""SC13: overly sharp attention can confine the model to local information.

Measure: as SC4 (the S-text checkpoints ``{}``, seeds 0, 1; queries and keys held fixed, causal
attention recomputed at m = 0.25, 0.5, 1, 2, 4 times the model's scale, 8 validation windows):
per head, the weighted mean distance ``D = mean_i sum_j p_ij (i - j) / i`` over rows i >= 8 and
the examples (0: every query on itself; 1: every query on the first token).

Resolved here: "falls monotonically" is read strictly, D(m) > D(m') for every consecutive pair
m < m' of the grid.

    attnjax audit experiments/claims --workdir runs/claims --only SC13

Budget: no runs of its own (the shared default arm, 1.4 units).
"""

from pathlib import Path

import numpy as np

from attnjax.audit import load_claim, over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)

SC4 = load_claim(Path(__file__).with_name("SC4.py")).module

ID = "SC13"
SOURCE = "000 §3.3"
CLAIM = "overly sharp attention can confine the model to local information"
CRITERION = ("the weighted mean distance sum_j p_ij (i - j)/i falls monotonically with m in >= 75% "
             "of heads of both checkpoints")
FRACTION = 0.75


def get_sweep():
    return with_seeds([{}])


def mean_distance(weights: np.ndarray) -> list:
    """``[layers][heads]``: mean over rows i >= 8 and examples of sum_j p_ij (i - j) / i."""
    T = weights.shape[-1]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    relative = np.where(j <= i, (i - j) / np.maximum(i, 1), 0.0)
    distance = (weights * relative).sum(-1)[..., SC4.FIRST_ROW:]
    return distance.mean(axis=(1, 3)).tolist()


def measure(runs):
    out = {str(seed): [mean_distance(w) for w in SC4.recomputed_weights(t).values()]
           for seed, t in runs.by_seed({}).items()}
    return {"multipliers": list(SC4.MULTIPLIERS), "distance": out}


def verdict(results):
    fractions, evidence = {}, []
    for seed, series in results["distance"].items():
        d = np.asarray(series)                                   # [m, layers, heads]
        falling = np.all(np.diff(d, axis=0) < 0, axis=0)
        fractions[seed] = float(falling.mean())
        evidence.append(f"seed {seed}: {int(falling.sum())}/{falling.size} heads falling, mean "
                        f"distance {np.round(d.mean((1, 2)), 3).tolist()}")
    return over_regimes({"S-text": {int(s): f >= FRACTION for s, f in fractions.items()}},
                        f"m = {results['multipliers']}: " + "; ".join(evidence))


def _example(falling_heads: int) -> dict:
    series = np.tile(np.linspace(0.5, 0.1, 5)[:, None, None], (1, 2, 4))
    series[:, 0, :8 - falling_heads] = np.linspace(0.1, 0.5, 5)[:, None]
    return {"multipliers": list(SC4.MULTIPLIERS),
            "distance": {"0": series.tolist(), "1": series.tolist()}}


EXAMPLES = [(_example(7), "confirmed"), (_example(4), "refuted")]


def plot(results, out_dir):
    """The weighted mean distance against m, one line per head of each checkpoint."""
    from attnjax.analysis.figures import subplots
    fig, ax = subplots(figsize=(5.5, 3.8), layout="constrained")
    m = results["multipliers"]
    for seed, series in results["distance"].items():
        d = np.asarray(series)                                   # [m, layers, heads]
        for layer in range(d.shape[1]):
            for head in range(d.shape[2]):
                ax.plot(m, d[:, layer, head], color=f"C{layer}", alpha=0.6, marker=".",
                        linestyle="-" if seed == "0" else "--",
                        label=f"layer {layer}" if seed == "0" and head == 0 else None)
    ax.set(xscale="log", xlabel="m (logit scale x m)", ylabel="mean sum_j p_ij (i - j) / i",
           title="SC13: attention distance vs sharpness (rows i >= 8)")
    ax.set_xticks(m, [f"{x:g}" for x in m])
    ax.minorticks_off()
    ax.legend(title="seed 0 solid, 1 dashed", fontsize=8)
    path = out_dir / "SC13-distance.png"
    fig.savefig(path, dpi=120)
    return [path]
