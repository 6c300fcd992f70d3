"""HD1: at equal width, 8 heads converge visibly better than 1 head, redundancy among the heads
notwithstanding.

Measure: S-wide (``model.d_model=128``, ``model.num_layers=4``) with 1 head (head_dim 128) and
with 8 heads (head_dim 16), seeds 0 and 1, **300 steps** (cut from 600 for the budget, as
CLAIMS.md allows; evaluated and checkpointed at step 300): the training loss at steps 100 and
300 (metrics.jsonl, ``train.log_every=10``; each seed sees the same batch at a step in both
arms, batches being a function of (seed, step)) and the validation loss at L = 64.

Left open and resolved here: step 600 is not reached at 300 steps; the criterion reads step
300. "S-ind reported" is not run: an S-wide S-ind arm (2000 steps) would cost more than this
group's whole budget. Per seed: loss(1) - loss(8) > eps and train loss at step 300 of 8 heads
< that of 1 head; every seed must agree.

Cost (unit: one S-text arm, both seeds in one vmapped program, 600 steps; an S-wide arm at
300 steps measured 4.3 units): the 8-head arm (shared with HD4, HD6, HD7, CX6) ~4 units, the
1-head arm ~4 units.

    attnjax audit experiments/claims --workdir runs/claims --only HD1
"""

from attnjax.analysis.figures import subplots
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import EPS, S_WIDE, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD1"
SOURCE = "000 §9, §4.3"
CLAIM = "at equal width 8 heads converge visibly better than 1, redundancy notwithstanding"
CRITERION = "on text, 8 heads lower loss by > eps and lower training loss at step 300"
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
ARMS = {1: {**S_WIDE, "model.attention.num_heads": 1, **STEPS},
        8: {**S_WIDE, "model.attention.num_heads": 8, **STEPS}}
AT = (100, 300)


def get_sweep():
    return with_seeds(list(ARMS.values()))


def train_curve(trained) -> dict:
    """``{step: training loss}`` of every logged step."""
    return {r["step"]: r["loss"] for r in trained.dir.metrics()}


def measure(runs) -> dict:
    out = {}
    for heads, overrides in ARMS.items():
        for seed, trained in runs.by_seed(overrides).items():
            curve = train_curve(trained)
            out.setdefault(str(heads), {})[str(seed)] = {
                "loss": trained.loss(), "failed": trained.failed,
                "train_loss": {str(s): curve.get(s) for s in AT},
                "curve": [[s, v] for s, v in sorted(curve.items())]}
    return out


def verdict(r):
    one, eight = r["1"], r["8"]
    last = str(AT[-1])
    better = {s: one[s]["loss"] - eight[s]["loss"] > EPS
              and eight[s]["train_loss"][last] < one[s]["train_loss"][last] for s in eight}
    ok, note = over_seeds(better)
    text = "; ".join(
        f"seed {s}: loss 1 head {one[s]['loss']:.4f} vs 8 heads {eight[s]['loss']:.4f} "
        f"(diff {one[s]['loss'] - eight[s]['loss']:+.4f}, eps {EPS}); train loss at steps "
        + ", ".join(f"{t}: {one[s]['train_loss'][t]:.3f} vs {eight[s]['train_loss'][t]:.3f}"
                    for t in one[s]["train_loss"]) for s in eight)
    return holds(ok, "; ".join(filter(None, [text, note])))


def plot(results, out_dir):
    fig, ax = subplots(figsize=(6.5, 4))
    for heads, colour in (("1", "tab:orange"), ("8", "tab:blue")):
        for seed, row in results[heads].items():
            steps, losses = zip(*row["curve"])
            ax.plot(steps, losses, color=colour, linestyle="-" if seed == "0" else "--",
                    label=f"{heads} head{'s' if heads != '1' else ''}, seed {seed}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte)")
    ax.set_ylim(top=3.5)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("HD1: S-wide, 1 vs 8 heads at width 128", fontsize=10)
    fig.tight_layout()
    path = out_dir / "HD1-curves.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(loss_1, loss_8, train_1, train_8):
    row = lambda loss, tr: {"loss": loss, "failed": None,
                            "train_loss": {"100": tr + 0.3, "300": tr},
                            "curve": [[10, 5.0], [300, tr]]}
    return {"1": {s: row(loss_1, train_1) for s in "01"},
            "8": {s: row(loss_8, train_8) for s in "01"}}


EXAMPLES = [
    (_example(2.10, 2.00, 2.2, 2.1), "confirmed"),
    (_example(2.01, 2.00, 2.2, 2.1), "refuted"),
    (_example(2.10, 2.00, 2.0, 2.1), "refuted"),
]
