"""HD6: the output projection W_o is necessary: concatenating the heads into the residual
stream leaves them unmixed and the model less expressive.

Measure: ``model.attention.output_projection`` dense (a trained W_o), none (the heads'
concatenation goes to the residual as is: N x head_dim = d_model) and frozen (a fixed random
orthogonal W_o, never trained), seeds 0 and 1; validation loss at L = 64. Regimes: S-text (600
steps; dense is the plain S-text arm ``{}``) and S-wide with 8 heads (300 steps, cut for the
budget; dense is HD1's 8-head arm).

Left open and resolved here: the criterion judges removal only (none vs dense), per seed, in
each regime; frozen is reported beside it, and only at S-text (an S-wide frozen arm would cost
~4 more units for a number the criterion does not read).

Cost (unit: one S-text arm, both seeds, 600 steps): S-text none and frozen ~2 units, S-wide
none ~4 units (the dense arms are shared).

    attnjax audit experiments/claims --workdir runs/claims --only HD6
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import EPS, S_WIDE, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD6"
SOURCE = "000 §4.2"
CLAIM = "W_o is necessary: plain concatenation leaves heads unmixed and less expressive"
CRITERION = "removing W_o raises loss by > eps"
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
WIDE8 = {**S_WIDE, "model.attention.num_heads": 8, **STEPS}
NONE = {"model.attention.output_projection": "none"}
FROZEN = {"model.attention.output_projection": "frozen"}
ARMS = {"S-text": {"dense": {}, "none": NONE, "frozen": FROZEN},
        "S-wide": {"dense": WIDE8, "none": {**WIDE8, **NONE}}}


def get_sweep():
    return with_seeds([arm for regime in ARMS.values() for arm in regime.values()])


def measure(runs) -> dict:
    return {regime: {kind: {str(s): {"loss": t.loss(), "failed": t.failed}
                            for s, t in runs.by_seed(overrides).items()}
                     for kind, overrides in arms.items()}
            for regime, arms in ARMS.items()}


def verdict(r):
    holding, text = {}, []
    for regime, kinds in r.items():
        dense, none = kinds["dense"], kinds["none"]
        holding[regime] = {s: none[s]["loss"] - dense[s]["loss"] > EPS for s in dense}
        text.append(f"{regime}: " + ", ".join(
            f"{kind} " + "/".join(f"{x['loss']:.4f}" for x in seeds.values())
            for kind, seeds in kinds.items())
            + " (seeds " + "/".join(dense) + "; none - dense "
            + "/".join(f"{none[s]['loss'] - dense[s]['loss']:+.4f}" for s in dense) + ")")
    return over_regimes(holding, "; ".join(text) + f"; eps {EPS}")


def _example(text_none, wide_none):
    seeds = lambda loss: {s: {"loss": loss, "failed": None} for s in "01"}
    return {"S-text": {"dense": seeds(2.0), "none": seeds(text_none), "frozen": seeds(2.01)},
            "S-wide": {"dense": seeds(1.8), "none": seeds(wide_none)}}


EXAMPLES = [
    (_example(2.05, 1.85), "confirmed"),
    (_example(2.05, 1.81), "scale-dependent"),
    (_example(2.01, 1.79), "refuted"),
]
