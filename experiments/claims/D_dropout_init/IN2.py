"""IN2: (a) attention weights need an extra init factor (0.1 or sqrt(0.1)); (b) a large W_o
init slows convergence; (c) W_q xavier_uniform with W_k normal unbalances the heads; (d)
xavier_uniform with gain 1/sqrt(2) fixes that.

Measure: S-text with separate projections (``model.attention.fused_qkv=false``), seeds 0 and
1, **400 steps** (cut from 600; 20% past step 300 stays visible), validation loss every 20
steps: the default init (IN1's default arm; lecun normal, std 1/sqrt(64) = 0.125 for every
projection, fan-in 64) and per-projection inits (``model.attention.<p>_init``,
``<p>_init_scale``): (a) W_q, W_k, W_v, W_o all ``normal`` with std 0.125 x sqrt(0.1) and
0.125 x 0.1; (b) W_o ``normal`` with std 0.125 x 10; (c) W_q ``xavier_uniform`` (gain 1),
W_k ``normal`` N(0, 1); (d) W_q, W_k, W_v ``xavier_uniform`` with gain 1/sqrt(2). Per run:
the final validation loss; the first logged step at which the validation loss reaches the
default run's step-300 loss (same seed); and, on the last checkpoint, the CV (population
std / mean) over the 8 heads of the single-head knockout loss change
(``attnjax.analysis.heads.knockout_losses``, the run's validation batches).

Left open and resolved here: "x 1" is the default init (the factor multiplies it; lecun
normal is a truncated normal of the same std, which ``normal`` with the scaled std follows);
the W_o x 3 arm is cut (the criterion reads x 10 only). (a) some factor gives a loss lower
than the default's by > eps at every seed; (b) W_o x 10 takes >= 1.2 x the steps the default
takes to reach the default's step-300 loss (not reached by 400: more than 400 steps,
counted as holding); (c) CV >= 1.5 x the default's; (d) CV <= 1.1 x the default's; each at
every seed. The CV is std / mean as computed: should a run's mean knockout change be <= 0
(removing heads helps on average) its CV is negative and the evidence shows it.

Cost: 5 arms x 2 seeds at 400 steps, ~6 units (the default arm is IN1's).

    attnjax audit experiments/claims --workdir runs/claims --only IN2
"""

import math


from attnjax.analysis.heads import knockout_losses
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import EPS, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "IN2"
SOURCE = "000 §7.3; 002 §5.3"
CLAIM = ("attention weights need an init factor 0.1 or sqrt(0.1); a large W_o init slows "
         "convergence; xavier W_q with normal W_k unbalances heads, gain 1/sqrt(2) fixes it")
CRITERION = ("(a) a factor < 1 lowers loss by > eps; (b) x10 needs >= 20% more steps; (c) CV "
             ">= 1.5x default; (d) CV <= 1.1x default")
SEPARATE = {"model.attention.fused_qkv": False, "train.steps": 400, "train.eval_every": 20,
            "train.checkpoint_every": 400}          # IN1's default arm
STD = 1 / math.sqrt(64)                              # lecun normal at fan-in d_model = 64
TARGET_STEP, MORE, UNBALANCED, BALANCED = 300, 1.2, 1.5, 1.1


def _init(parts: str, scheme: str, scale: float) -> dict:
    """``<p>_init=scheme``, ``<p>_init_scale=scale`` for each projection p in ``parts``."""
    return {**{f"model.attention.{p}_init": scheme for p in parts},
            **{f"model.attention.{p}_init_scale": scale for p in parts}}


ARMS = {
    "default": SEPARATE,
    "all x sqrt(0.1)": {**SEPARATE, **_init("qkvo", "normal", STD * math.sqrt(0.1))},
    "all x 0.1": {**SEPARATE, **_init("qkvo", "normal", STD * 0.1)},
    "W_o x 10": {**SEPARATE, **_init("o", "normal", STD * 10)},
    "xavier W_q, N(0,1) W_k": {**SEPARATE, **_init("q", "xavier_uniform", 1.0),
                               **_init("k", "normal", 1.0)},
    "xavier gain 1/sqrt(2)": {**SEPARATE, **_init("qkv", "xavier_uniform", 1 / math.sqrt(2))},
}
FACTORS = ("all x sqrt(0.1)", "all x 0.1")
CV_ARMS = ("default", "xavier W_q, N(0,1) W_k", "xavier gain 1/sqrt(2)")


def get_sweep():
    return with_seeds(list(ARMS.values()))


def curve(trained) -> dict[int, float]:
    """``{step: validation loss}`` of every logged evaluation."""
    return {r["step"]: r["val_loss"] for r in trained.dir.metrics() if "val_loss" in r}


def steps_to(losses: dict[int, float], target: float) -> int | None:
    """The first logged step whose validation loss is <= ``target`` (None: never)."""
    return next((step for step, loss in sorted(losses.items()) if loss <= target), None)


def knockout_cv(trained) -> dict:
    config, params, _ = trained.dir.params("latest")
    delta = knockout_losses(config, params).ravel()
    return {"cv": float(delta.std() / delta.mean()), "mean": float(delta.mean()),
            "deltas": delta.tolist()}


def measure(runs) -> dict:
    default = runs.by_seed(ARMS["default"])
    target = {s: curve(t)[min(TARGET_STEP, t.config.train.steps)] for s, t in default.items()}
    out = {}
    for name, arm in ARMS.items():
        for seed, trained in runs.by_seed(arm).items():
            out.setdefault(name, {})[str(seed)] = {
                "loss": trained.loss(), "target": target[seed],
                "steps": steps_to(curve(trained), target[seed]),
                "last_step": trained.config.train.steps,
                **({"knockout": knockout_cv(trained)} if name in CV_ARMS else {})}
    return out


def _part(holding: dict, evidence: str):
    ok, note = over_seeds(holding)
    return holds(ok, "; ".join(filter(None, [evidence, note])))


def verdict(r):
    seeds = list(r["default"])
    loss = lambda arm, s: r[arm][s]["loss"]
    lower = {f: {s: loss("default", s) - loss(f, s) > EPS for s in seeds} for f in FACTORS}
    best = max(FACTORS, key=lambda f: sum(lower[f].values()))
    losses = "final loss: " + ", ".join(
        f"{arm} " + "/".join(f"{loss(arm, s):.4f}" for s in seeds) for arm in ("default", *FACTORS))
    steps = lambda arm, s: r[arm][s]["steps"]
    shown = lambda arm, s: (f"{steps(arm, s)}" if steps(arm, s) is not None
                            else f"> {r[arm][s]['last_step']}")
    slower = {s: steps("W_o x 10", s) is None
              or steps("W_o x 10", s) >= MORE * steps("default", s) for s in seeds}
    cv = lambda arm, s: r[arm][s]["knockout"]["cv"]
    cvs = "knockout-change CV: " + ", ".join(
        f"{arm} " + "/".join(f"{cv(arm, s):.3f}" for s in seeds) for arm in CV_ARMS)
    return {
        "a": _part(lower[best], losses),
        "b": _part(slower, "steps to the default's step-300 loss (" + "/".join(
            f"{r['default'][s]['target']:.4f}" for s in seeds) + "): " + ", ".join(
            f"{arm} " + "/".join(shown(arm, s) for s in seeds) for arm in ("default", "W_o x 10"))),
        "c": _part({s: cv(CV_ARMS[1], s) >= UNBALANCED * cv("default", s) for s in seeds}, cvs),
        "d": _part({s: cv(CV_ARMS[2], s) <= BALANCED * cv("default", s) for s in seeds}, cvs),
    }


def _example(factor_loss, o_steps, cv_c, cv_d):
    def run(loss, steps, cv=None):
        x = {"loss": loss, "target": 2.1, "steps": steps, "last_step": 400}
        return {**x, "knockout": {"cv": cv, "mean": 0.05, "deltas": []}} if cv else x
    arms = {"default": run(2.0, 300, 0.5), "all x sqrt(0.1)": run(factor_loss, 280),
            "all x 0.1": run(factor_loss + 0.01, 280), "W_o x 10": run(2.1, o_steps),
            CV_ARMS[1]: run(2.2, None, cv_c), CV_ARMS[2]: run(2.0, 300, cv_d)}
    return {arm: dict.fromkeys("01", x) for arm, x in arms.items()}


EXAMPLES = [
    (_example(1.95, None, 0.9, 0.5), dict.fromkeys("abcd", "confirmed")),
    (_example(1.99, 340, 0.6, 0.6), dict.fromkeys("abcd", "refuted")),
    (_example(1.95, 360, 0.9, 0.5), dict.fromkeys("abcd", "confirmed")),
]
