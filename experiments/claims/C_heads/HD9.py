"""HD9: one dropout mask shared by all heads couples them and, at high rates on little data,
starves some of them; dropout drawn per head keeps them balanced.

Measure: S-small (``data.val_fraction=0.995``, ~23 kB of training text), attention-probability
dropout ``model.attention.dropout`` = ``probs_shared`` (one mask per example for every head)
or ``probs_per_head`` at ``dropout_rate`` 0.1, 0.3, 0.5, seeds 0 and 1, **300 steps** (cut for
the budget), best checkpoints. Per head, the knockout loss change (``analysis.heads.
knockout_losses``: validation loss with the head's output gated to 0, dropout off, minus the
loss with all heads; the run's validation batches); starved: change < 0.005. Within a layer
the CV of the 4 heads' changes, std / |mean| (population std); a run's CV is the mean over its
2 layers.

Left open and resolved here: "its starved count grows with rate" is read as shared's starved
count non-decreasing over 0.1, 0.3, 0.5 and larger at 0.5 than at 0.1. Per seed: some rate
where shared has >= 1 more starved head than per-head and a higher CV, and the growth; every
seed must agree.

Cost: 12 S-small runs at 300 steps in 2 vmapped programs (rate and seed vary inside one
program), ~3 units (unit: one S-text arm, both seeds, 600 steps).

    attnjax audit experiments/claims --workdir runs/claims --only HD9
"""

import numpy as np
from matplotlib.ticker import MaxNLocator

from attnjax.analysis.figures import subplots
from attnjax.analysis.heads import knockout_losses
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import S_SMALL, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD9"
SOURCE = "002 §2.3, §5.3"
CLAIM = ("one dropout shared by all heads couples them and, at high rates on little data, "
         "starves some; per-head dropout balances them")
CRITERION = ("at some rate shared has >= 1 more starved head and a higher CV; its starved "
             "count grows with rate")
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
PLACEMENTS, RATES = ("probs_shared", "probs_per_head"), (0.1, 0.3, 0.5)
STARVED = 0.005


def arm(placement: str, rate: float) -> dict:
    return {**S_SMALL, "model.attention.dropout": placement,
            "model.attention.dropout_rate": rate, **STEPS}


def get_sweep():
    return with_seeds([arm(p, r) for p in PLACEMENTS for r in RATES])


def layer_cv(delta) -> float:
    """Mean over layers of std / |mean| of the heads' knockout changes."""
    delta = np.asarray(delta, np.float64)
    return float(np.mean(delta.std(axis=1) / np.abs(delta.mean(axis=1))))


def measure(runs) -> dict:
    out = {}
    for placement in PLACEMENTS:
        for rate in RATES:
            for seed, trained in runs.by_seed(arm(placement, rate)).items():
                config, params, _ = trained.dir.params("best")
                delta = knockout_losses(config, params)
                out.setdefault(placement, {}).setdefault(str(rate), {})[str(seed)] = {
                    "knockout": delta.tolist(), "starved": int((delta < STARVED).sum()),
                    "cv": layer_cv(delta), "loss": trained.loss(), "failed": trained.failed}
    return out


def _holds(shared: dict, per_head: dict) -> bool:
    """The criterion for one seed: ``{rate: {"starved", "cv"}}`` of each placement."""
    some_rate = any(shared[r]["starved"] >= per_head[r]["starved"] + 1
                    and shared[r]["cv"] > per_head[r]["cv"] for r in shared)
    counts = [shared[r]["starved"] for r in sorted(shared, key=float)]
    grows = all(a <= b for a, b in zip(counts, counts[1:])) and counts[-1] > counts[0]
    return some_rate and grows


def verdict(r):
    shared, per_head = r["probs_shared"], r["probs_per_head"]
    seeds = list(next(iter(shared.values())))
    pick = lambda table, s: {rate: table[rate][s] for rate in table}
    ok, note = over_seeds({s: _holds(pick(shared, s), pick(per_head, s)) for s in seeds})
    text = "; ".join(
        f"seed {s}: starved heads (of 8) shared/per-head at rate " + ", ".join(
            f"{rate}: {shared[rate][s]['starved']}/{per_head[rate][s]['starved']}"
            for rate in shared) + "; CV " + ", ".join(
            f"{rate}: {shared[rate][s]['cv']:.2f}/{per_head[rate][s]['cv']:.2f}"
            for rate in shared) for s in seeds)
    return holds(ok, "; ".join(filter(None, [text, note])))


def plot(results, out_dir):
    fig, (left, right) = subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for placement, colour in zip(PLACEMENTS, ("tab:red", "tab:blue")):
        for seed in next(iter(results[placement].values())):
            rows = [results[placement][str(rate)][seed] for rate in RATES]
            style = dict(color=colour, marker="o", linestyle="-" if seed == "0" else "--",
                         label=f"{placement}, seed {seed}")
            left.plot(RATES, [x["starved"] for x in rows], **style)
            right.plot(RATES, [x["cv"] for x in rows], **style)
    left.set_ylabel(f"starved heads (knockout change < {STARVED})")
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("within-layer CV of knockout changes")
    for ax in (left, right):
        ax.set_xlabel("dropout rate")
        ax.set_xticks(RATES)
        ax.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle("HD9: S-small, shared vs per-head attention dropout (300 steps)", fontsize=10)
    path = out_dir / "HD9-starved.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(shared_starved, per_head_starved, shared_cv, per_head_cv):
    row = lambda starved, cv: {"knockout": [], "starved": starved, "cv": cv, "loss": 2.5,
                               "failed": None}
    table = lambda starved, cv: {str(rate): {s: row(n, c) for s in "01"}
                                 for rate, n, c in zip(RATES, starved, cv)}
    return {"probs_shared": table(shared_starved, shared_cv),
            "probs_per_head": table(per_head_starved, per_head_cv)}


EXAMPLES = [
    (_example([0, 1, 3], [0, 0, 1], [0.5, 0.8, 1.5], [0.5, 0.6, 0.7]), "confirmed"),
    (_example([0, 1, 1], [0, 0, 0], [0.5, 0.8, 1.5], [0.5, 0.6, 0.7]), "confirmed"),
    (_example([1, 1, 1], [0, 0, 0], [0.5, 0.8, 1.5], [0.5, 0.6, 0.7]), "refuted"),
    (_example([0, 1, 3], [0, 1, 3], [0.5, 0.8, 1.5], [0.5, 0.6, 0.7]), "refuted"),
]
