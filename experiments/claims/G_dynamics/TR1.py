"""TR1: poor warmup plus extreme attention scores made the gradients explode and the loss NaN
after a few hundred steps; warmup (the article: thousands of steps) prevents it.

Measure: S-text with large scores, unscaled (``model.attention.scale=constant``, m = 1:
logits ``q.k`` instead of ``q.k / 4`` at head_dim 16, the same function as m = 4 under the
default scale), no gradient clipping (``train.clip_norm=null``), warmup 1, 100 and 300 steps
(``train.warmup_steps``), seeds 0 and 1, the full 600 steps (the criterion's window), learning
rate 3e-2. Regimes: float32 and float16 compute (``model.dtype``). Per run: the first failing
step, the first logged step (every 10) whose training loss is not finite or whose count of
skipped updates (non-finite loss or gradient) is above 0; CLAIMS.md's divergence (also a
final training loss above the step-0 loss - 0.1) is reported beside it.

Cut from CLAIMS.md's grid (96 runs; 12 kept): the runs at the default scale and with clipping
on, which the criterion does not read (clipping off is the setting in which an exploding
gradient reaches the parameters at all), and, for the budget, the learning-rate regime 1e-2
(the milder of the two: ``LRS = (1e-2, 3e-2)`` restores it, its runs joining the same
vmapped programs, +6 runs, ~+7 units).

Left open and resolved here: per regime and seed, the criterion holds when the warmup-1 run
first fails at a logged step in [100, 600] and neither the warmup-100 nor the warmup-300 run
ever fails.

Cost: 12 runs at 600 steps in 6 vmapped programs (seeds together), ~10 units (SC7 reads
the same runs).

    attnjax audit experiments/claims --workdir runs/claims --only TR1
"""

import math

from attnjax.audit import over_regimes
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.audit.settings import with_seeds

ID = "TR1"
SOURCE = "000 §8.2"
CLAIM = ("poor warmup plus extreme scores make gradients explode and the loss NaN; warmup "
         "prevents it")
CRITERION = ("a large-score run with warmup 1 first fails at steps 100-600, never with warmup "
             "100 or 300")
WARMUPS = (1, 100, 300)
LRS = (3e-2,)
DTYPES = ("float32", "float16")
WINDOW = (100, 600)
LARGE = {"model.attention.scale": "constant", "train.clip_norm": None}


def arm(dtype: str, lr: float, warmup: int) -> dict:
    """One arm's overrides (add ``seed``); float32 is the default dtype, left unspelled."""
    return {**LARGE, "train.learning_rate": lr, "train.warmup_steps": warmup,
            **({} if dtype == "float32" else {"model.dtype": dtype})}


def get_sweep():
    return with_seeds([arm(d, lr, w) for d in DTYPES for w in WARMUPS for lr in LRS])


def first_failure(records: list[dict]) -> int | None:
    """The first logged step with a non-finite training loss or a skipped update."""
    return next((r["step"] for r in records
                 if not math.isfinite(r["loss"]) or r.get("skipped", 0) > 0), None)


def measure(runs) -> dict:
    out = {}
    for dtype in DTYPES:
        for lr in LRS:
            regime = out.setdefault(f"lr {lr:g} {dtype}", {})
            for warmup in WARMUPS:
                for seed, trained in runs.by_seed(arm(dtype, lr, warmup)).items():
                    summary = trained.summary
                    regime.setdefault(str(warmup), {})[str(seed)] = {
                        "first_failure": first_failure(trained.dir.metrics()),
                        "skipped": summary["skipped_updates"],
                        "final_train_loss": summary["train_loss"],
                        "diverged": trained.failed is not None}
    return out


def _holds(regime: dict, seed: str) -> bool:
    fail = regime["1"][seed]["first_failure"]
    return (fail is not None and WINDOW[0] <= fail <= WINDOW[1]
            and all(regime[str(w)][seed]["first_failure"] is None for w in WARMUPS[1:]))


def verdict(r):
    show = lambda x: "never" if x["first_failure"] is None else f"step {x['first_failure']}"
    evidence = "first failing step (warmup: seeds): " + "; ".join(
        f"{name}: " + ", ".join(
            f"w{w} " + "/".join(show(x) for x in regime[str(w)].values()) for w in WARMUPS)
        for name, regime in r.items())
    diverged = sorted(f"{name} w{w} seed {s}" for name, regime in r.items()
                      for w, seeds in regime.items() for s, x in seeds.items()
                      if x["diverged"] and x["first_failure"] is None)
    if diverged:
        evidence += "; diverged by final loss without a non-finite step: " + ", ".join(diverged)
    return over_regimes({name: {s: _holds(regime, s) for s in regime["1"]}
                         for name, regime in r.items()}, evidence)


def _example(fails: dict) -> dict:
    """``fails``: regime -> first failing step per warmup (the same at both seeds)."""
    run = lambda step: {"first_failure": step, "skipped": 0 if step is None else 5,
                        "final_train_loss": 2.5, "diverged": step is not None}
    return {name: {str(w): {s: run(step) for s in "01"} for w, step in zip(WARMUPS, steps)}
            for name, steps in fails.items()}


EXAMPLES = [
    (_example({"lr 0.03 float32": (250, None, None), "lr 0.03 float16": (120, None, None)}),
     "confirmed"),
    (_example({"lr 0.03 float32": (None, None, None), "lr 0.03 float16": (40, 200, None)}),
     "refuted"),
    (_example({"lr 0.03 float32": (None, None, None), "lr 0.03 float16": (300, None, None)}),
     "scale-dependent"),
]
