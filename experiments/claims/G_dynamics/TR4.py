"""TR4: in self-attention any two tokens are one step apart, so information does not decay
with distance.

Measure: S-ind (``data.task=induction``, vocabulary 32, 2000 steps at a constant learning
rate) at L = 64 (S-text's length) and L = 128 (S-128: ``data.length=128``, batch 8), seeds 0
and 1, last checkpoint: second-copy accuracy by query-source distance
(``attnjax.analysis.recall.accuracy_by_distance``) over 16 validation batches of 32 examples.
In the induction task the second copy of a block of m = L/4 tokens starts s positions after
the first, s uniform in [m, L + 1 - m], and every scored target's source is s back, so the
distances span [16, 49] at L = 64 and [32, 97] at L = 128; the buckets are 4 of about equal
width over that span (edges 16, 24, 33, 41, 50 and 32, 48, 65, 81, 98). Runs below 0.9
overall accuracy are excluded.

Left open and resolved here: "within 0.05" is ``|acc(farthest) - acc(nearest)| <= 0.05``,
the farthest and nearest non-empty buckets; a regime is judged when both of its seeds reach
0.9 overall (>= 2 seeds), else it is "not reached"; untestable when no regime is judged.

Cost: 4 runs of 2000 steps in 2 vmapped programs, ~8 units (the S-128 runs cost about as much
as S-text's: the same tokens per step). TR6 reads the same runs.

    attnjax audit experiments/claims --workdir runs/claims --only TR4
"""

import numpy as np

from attnjax.analysis.heads import validation_batches
from attnjax.analysis.recall import accuracy_by_distance
from attnjax.audit import Verdict, over_regimes, untestable
from attnjax.audit.settings import S_128, S_IND, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "TR4"
SOURCE = "000 §1.2; 002 §2.1"
CLAIM = "any two tokens are one step apart, so information does not decay with distance"
CRITERION = "farthest bucket within 0.05 of the nearest"
LENGTHS = {64: dict(S_IND), 128: {**S_IND, **S_128}}
BUCKETS, BATCHES = 4, 16
LEARNED, WITHIN = 0.9, 0.05


def get_sweep():
    return with_seeds(list(LENGTHS.values()))


def edges(length: int) -> list[int]:
    """4 buckets of about equal width over the induction distances [L/4, L + 1 - L/4]."""
    m = length // 4
    return np.linspace(m, length + 2 - m, BUCKETS + 1).astype(int).tolist()


def by_distance(trained) -> dict:
    config, params, _ = trained.dir.params("latest")
    result = accuracy_by_distance(config, params, validation_batches(config, count=BATCHES),
                                  edges(config.data.length))
    return {key: np.asarray(result[key]).tolist()
            for key in ("lo", "hi", "count", "accuracy", "overall", "scored", "outside",
                        "unmatched")}


def measure(runs) -> dict:
    return {str(length): {str(seed): by_distance(trained)
                          for seed, trained in runs.by_seed(arm).items()}
            for length, arm in LENGTHS.items()}


def ends(x: dict) -> tuple[float, float]:
    """Accuracy of the nearest and the farthest non-empty bucket."""
    filled = [a for a, n in zip(x["accuracy"], x["count"]) if n > 0]
    return filled[0], filled[-1]


def describe(r) -> str:
    return "; ".join(
        f"L={length} seed {s}: overall {x['overall']:.3f}, buckets " + ", ".join(
            f"{lo}-{hi - 1} {a:.3f}" for lo, hi, a in zip(x["lo"], x["hi"], x["accuracy"]))
        for length, seeds in r.items() for s, x in seeds.items())


def verdict(r) -> Verdict:
    reached = {length: seeds for length, seeds in r.items()
               if all(x["overall"] >= LEARNED for x in seeds.values())}
    missing = [f"L={length}" for length in r if length not in reached]
    note = (f"; not reached (a seed below {LEARNED} overall): {', '.join(missing)}"
            if missing else "")
    if not reached:
        return untestable(f"no regime reached {LEARNED} overall accuracy: {describe(r)}")
    holding = {f"L={length}": {s: abs(ends(x)[1] - ends(x)[0]) <= WITHIN for s, x in seeds.items()}
               for length, seeds in reached.items()}
    return over_regimes(holding, describe(r) + note)


def plot(r, out_dir):
    from attnjax.analysis.figures import subplots
    fig, axes = subplots(1, len(r), figsize=(4.4 * len(r), 3.4), layout="constrained",
                         squeeze=False)
    for ax, (length, seeds) in zip(axes[0], r.items()):
        for s, x in seeds.items():
            middle = [(lo + hi - 1) / 2 for lo, hi in zip(x["lo"], x["hi"])]
            ax.plot(middle, x["accuracy"], "o-", label=f"seed {s} (overall {x['overall']:.2f})")
        ax.set(xlabel="query-source distance (bucket middle)", ylabel="second-copy accuracy",
               title=f"L = {length}", ylim=(0, 1.02))
        ax.legend(fontsize=8)
    fig.suptitle("TR4: induction accuracy by distance", fontsize=10)
    path = out_dir / "TR4-accuracy-by-distance.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(overall: float, near: float, far: float, far_128: float | None = None) -> dict:
    def run(length, far):
        lo = edges(length)
        return {"lo": lo[:-1], "hi": lo[1:], "count": [400] * BUCKETS,
                "accuracy": [near, near, far, far], "overall": overall, "scored": 1600,
                "outside": 0, "unmatched": 0}
    return {str(length): {s: run(length, far if length == 64 or far_128 is None else far_128)
                          for s in "01"} for length in LENGTHS}


EXAMPLES = [
    (_example(0.97, 0.98, 0.96), "confirmed"),
    (_example(0.95, 0.99, 0.90), "refuted"),
    (_example(0.95, 0.99, 0.97, far_128=0.9), "scale-dependent"),
    (_example(0.6, 0.7, 0.5), "untestable"),
]
