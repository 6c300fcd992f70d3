"""IN1: a zero-initialised W_v still trains (slowly), while a zero W_q or W_k fails.

Measure: S-text with separate projections (``model.attention.fused_qkv=false``), seeds 0 and
1, **400 steps** (cut from 600; 400 rather than 300 so that IN2, which shares the default arm,
can see 20% past step 300), validation loss every 20 steps (``train.eval_every=20``): the
default init, and W_v, W_q, W_k initialised to zero (``model.attention.v_init=zeros``...);
baseline: the default with every head of both layers knocked out in training and evaluation
(``model.attention.knockout``: the model without attention). Loss at steps 100, 300 and at
the end (400).

Left open and resolved here: "ends" = the validation loss at the last step; (a) |loss(V=0) -
loss(default)| <= 0.1; (b) loss_100(V=0) - loss_100(default) > 0.05; (c), (d) loss(Q=0),
loss(K=0) >= loss(baseline) - eps; each at every seed. The W_q + W_k = 0 arm of CLAIMS.md's
measure is cut: no part of the criterion reads it (both zero leaves every score 0 with a zero
gradient for both, so attention stays uniform).

Cost: 5 arms x 2 seeds at 400 steps, ~6 units (the default arm is shared with IN2).

    attnjax audit experiments/claims --workdir runs/claims --only IN1
"""

from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import EPS, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "IN1"
SOURCE = "002 §3.1"
CLAIM = "zero-initialised W_v still trains (slowly); zero W_q or W_k fails"
CRITERION = ("(a) V = 0 ends within 0.1 of default; (b) its step-100 loss exceeds default's by "
             "> 0.05; (c) Q = 0, (d) K = 0 end no lower than the baseline - eps")
STEPS = (100, 300, 400)
SEPARATE = {"model.attention.fused_qkv": False, "train.steps": 400, "train.eval_every": 20,
            "train.checkpoint_every": 400}
ALL_HEADS = [[layer, head] for layer in range(2) for head in range(4)]
ARMS = {"default": SEPARATE,
        "V=0": {**SEPARATE, "model.attention.v_init": "zeros"},
        "Q=0": {**SEPARATE, "model.attention.q_init": "zeros"},
        "K=0": {**SEPARATE, "model.attention.k_init": "zeros"},
        "baseline": {**SEPARATE, "model.attention.knockout": ALL_HEADS}}
NEAR, SLOWER = 0.1, 0.05


def get_sweep():
    return with_seeds(list(ARMS.values()))


def loss_at(trained, step: int) -> float:
    """The validation loss logged at ``step``."""
    (record,) = [r for r in trained.dir.metrics() if r["step"] == step]
    return record["val_loss"]


def measure(runs) -> dict:
    out = {}
    for name, arm in ARMS.items():
        for seed, trained in runs.by_seed(arm).items():
            steps = [s for s in STEPS if s < trained.config.train.steps]
            out.setdefault(name, {})[str(seed)] = {
                **{str(s): loss_at(trained, s) for s in steps}, "final": trained.loss()}
    return out


def _part(holding: dict, evidence: str):
    ok, note = over_seeds(holding)
    return holds(ok, "; ".join(filter(None, [evidence, note])))


def verdict(r):
    seeds, early = list(r["default"]), str(STEPS[0])
    final = {arm: {s: r[arm][s]["final"] for s in seeds} for arm in ARMS}
    end = f"final loss (seeds {'/'.join(seeds)}): " + ", ".join(
        f"{arm} " + "/".join(f"{final[arm][s]:.4f}" for s in seeds) for arm in ARMS)
    at_early = f"loss at step {early}: " + ", ".join(
        f"{arm} " + "/".join(f"{r[arm][s][early]:.4f}" for s in seeds)
        for arm in ("default", "V=0"))
    return {
        "a": _part({s: abs(final["V=0"][s] - final["default"][s]) <= NEAR for s in seeds}, end),
        "b": _part({s: r["V=0"][s][early] - r["default"][s][early] > SLOWER for s in seeds},
                   at_early),
        "c": _part({s: final["Q=0"][s] >= final["baseline"][s] - EPS for s in seeds}, end),
        "d": _part({s: final["K=0"][s] >= final["baseline"][s] - EPS for s in seeds}, end),
    }


def _example(v_final, v_100, q_final, k_final):
    run = lambda final, at100: {"100": at100, "300": final + 0.1, "final": final}
    arms = {"default": run(2.0, 2.6), "V=0": run(v_final, v_100), "Q=0": run(q_final, 2.6),
            "K=0": run(k_final, 2.6), "baseline": run(2.8, 3.0)}
    return {arm: dict.fromkeys("01", x) for arm, x in arms.items()}


EXAMPLES = [
    (_example(2.05, 2.8, 2.9, 2.79), dict.fromkeys("abcd", "confirmed")),
    (_example(2.3, 2.62, 2.1, 2.0), dict.fromkeys("abcd", "refuted")),
]
