"""SC2: a near-one-hot softmax passes almost no gradient, so the model barely learns.

Measure:

- (a) op level: 1000 rows of logits c u, u ~ N(0, 1)^64 (``numpy.random.default_rng(0)``),
  c = 0.5, 1, 2, 4, 8, 16, 32, 64, through ``attnjax.ops.dot_product_attention`` (the
  reference kernel; the logits enter as the additive bias, q = k = 0): per c, the mean over
  rows of the max weight and of the Frobenius norm of the softmax Jacobian d p / d s
  (``jax.jacfwd`` through the kernel).
- (b) S-text at 300 steps (SC3's 300-step arm) with ``model.attention.qk_norm=kappa`` (q and k
  at RMS sqrt(kappa), so logits up to kappa sqrt(head_dim)), ``qk_kappa`` = 1, 100, 1000, seeds
  0, 1: ``max_weight`` of the initial parameters (rows i >= 8, mean over layers, heads and 8
  validation windows), the norm of the step-0 gradient of the W_qkv kernels (all layers; the
  initial parameters on training batch 0), and the final validation loss.

Resolved here: (a) compares the row means, and is untestable if no c reaches a mean max weight
of 0.99 (the fraction of single rows with max weight >= 0.99 and their mean Jacobian norm are
reported beside it, deciding nothing); (b) applies to every kappa, kappa 1 included, whose
initial ``max_weight`` is >= 0.9, and is untestable if none is.

    attnjax audit experiments/claims --workdir runs/claims --only SC2

Budget: 3 programs of 2 lanes at 300 steps, ~2.7 units; (a) takes ~1 s.
"""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import holds, load_claim, over_regimes, untestable
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.data import load_dataset
from attnjax.models import build
from attnjax.models.probe import capture
from attnjax.ops import dot_product_attention
from attnjax.train.state import init_params
from attnjax.models.family import scored_sums

SC3 = load_claim(Path(__file__).with_name("SC3.py")).module

ID = "SC2"
SOURCE = "000 §3.2; 002 §3.2"
CLAIM = "a near-one-hot softmax passes almost no gradient, so the model barely learns"
CRITERION = ("(a) Jacobian norm at max weight >= 0.99 is <= 1% of c = 1's; (b) each kappa with "
             "init max_weight >= 0.9 has qkv gradient <= 10% of kappa 1's and loss worse by > 0.1")
SCALES = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
ROWS, KEYS = 1000, 64
KAPPAS = (1.0, 100.0, 1000.0)
SATURATED, JACOBIAN_RATIO, ONE_HOT, GRAD_RATIO, WORSE = 0.99, 0.01, 0.9, 0.1, 0.1
FIRST_ROW, PROBE_EXAMPLES = 8, 8


def kappa_arm(kappa: float) -> dict:
    return {**SC3.STEPS, "model.attention.qk_norm": "kappa", "model.attention.qk_kappa": kappa}


def get_sweep():
    return with_seeds([kappa_arm(k) for k in KAPPAS])


# ------------------------------------------------------------------------ (a): op level

def _weights(logits: jax.Array) -> jax.Array:
    """softmax over one row of logits ``[S]`` by the reference kernel (logits as the bias)."""
    zeros = jnp.zeros((1, logits.shape[0], 1, 1))
    _, p = dot_product_attention(zeros[:, :1], zeros, zeros, bias=logits[None, None, None],
                                 return_weights=True)
    return p[0, 0, 0]


@jax.jit
def _softmax_stats(logits):
    """Per row: max weight and Frobenius norm of the Jacobian d p / d s."""
    jacobian = jax.vmap(jax.jacfwd(_weights))(logits)
    return jax.vmap(_weights)(logits).max(-1), jnp.sqrt((jacobian**2).sum((-2, -1)))


def op_level() -> dict:
    u = np.random.default_rng(0).standard_normal((ROWS, KEYS)).astype(np.float32)
    out = {}
    for c in SCALES:
        weight, jacobian = map(np.asarray, _softmax_stats(jnp.asarray(c * u)))
        sharp = weight >= SATURATED
        out[f"{c:g}"] = {"max_weight": float(weight.mean()), "jacobian": float(jacobian.mean()),
                         "rows_saturated": float(sharp.mean()),
                         "jacobian_saturated": float(jacobian[sharp].mean()) if sharp.any()
                         else None}
    return out


# ------------------------------------------------------------------ (b): qk-norm kappa runs

@functools.lru_cache(maxsize=8)
def _init_fns(model):
    """``(max weights [layers, B, heads, T], W_qkv gradient norm)`` programs of a model."""
    weights = jax.jit(lambda params, tokens: capture(model, params, tokens)[0].max(-1))

    def loss(params, batch):
        logits, _ = build(model).apply({"params": params}, batch["inputs"])
        sums = scored_sums(logits, batch)
        return sums["ce"] / sums["weight"]

    def qkv_norm(params, batch):
        grads = jax.grad(loss)(params, batch)
        squares = [jnp.sum(g["attention"]["qkv"]["kernel"] ** 2) for name, g in grads.items()
                   if name.startswith("block_")]
        return jnp.sqrt(sum(squares))
    return weights, jax.jit(qkv_norm)


def at_init(trained) -> dict:
    config = trained.config
    params = init_params(config)
    weights, qkv_norm = _init_fns(config.model)
    max_weight = np.asarray(weights(params, probe_batch(config, batch_size=PROBE_EXAMPLES)))
    batch = load_dataset(config.data).batch(config.seed, 0, config.train.batch_size,
                                            config.data.length, "train")
    return {"init_max_weight": float(max_weight[..., FIRST_ROW:].mean()),
            "qkv_grad": float(qkv_norm(params, batch)), "loss": trained.loss()}


def measure(runs):
    return {"op": op_level(),
            "kappa": {f"{k:g}": {str(s): at_init(t) for s, t in runs.by_seed(kappa_arm(k)).items()}
                      for k in KAPPAS}}


def _verdict_a(op: dict):
    base = op["1"]["jacobian"]
    sharp = {c: r for c, r in op.items() if r["max_weight"] >= SATURATED}
    cells = ", ".join(f"c={c}: max {r['max_weight']:.3f}, |J| {r['jacobian']:.2e}"
                      for c, r in op.items())
    rows = ", ".join(f"c={c} {r['rows_saturated']:.0%} (|J| {r['jacobian_saturated']:.1e})"
                     for c, r in op.items() if r.get("jacobian_saturated") is not None)
    if not sharp:
        return untestable(f"not reached here: no c has mean max weight >= {SATURATED}; {cells}"
                          f"; (not deciding) rows with max weight >= {SATURATED}: {rows}")
    return holds(all(r["jacobian"] <= JACOBIAN_RATIO * base for r in sharp.values()),
                 f"|J| at c=1 {base:.3f}; c with max weight >= {SATURATED}: "
                 f"{', '.join(sharp)}; {cells}")


def _verdict_b(kappa: dict):
    seeds = list(kappa["1"])
    premise = {s: [k for k, r in kappa.items() if r[s]["init_max_weight"] >= ONE_HOT]
               for s in seeds}
    cells = "; ".join(f"kappa {k}: init max_weight {_cell(r, 'init_max_weight', '.3f')}, qkv "
                      f"grad {_cell(r, 'qkv_grad', '.3g')}, loss {_cell(r, 'loss', '.3f')}"
                      for k, r in kappa.items())
    if not any(premise.values()):
        return untestable(f"not reached here: no kappa has init max_weight >= {ONE_HOT}; {cells}")
    ref = kappa["1"]
    ok = {int(s): all(kappa[k][s]["qkv_grad"] <= GRAD_RATIO * ref[s]["qkv_grad"]
                      and kappa[k][s]["loss"] > ref[s]["loss"] + WORSE for k in premise[s])
          for s in seeds}
    return over_regimes({"S-text": ok}, f"(seed 0/1) {cells}")


def _cell(by_seed: dict, key: str, spec: str) -> str:
    return "/".join(format(r[key], spec) for r in by_seed.values())


def verdict(results):
    return {"a": _verdict_a(results["op"]), "b": _verdict_b(results["kappa"])}


def _example(jacobian_64: float, grad_100: float, saturated: bool = True) -> dict:
    op = {f"{c:g}": {"max_weight": 0.2, "jacobian": 0.5} for c in SCALES}
    op["64"] = {"max_weight": 0.995 if saturated else 0.9, "jacobian": jacobian_64}
    run = lambda w, g, loss: {"0": {"init_max_weight": w, "qkv_grad": g, "loss": loss},
                              "1": {"init_max_weight": w, "qkv_grad": g, "loss": loss}}
    kappa = {"1": run(0.2, 1.0, 1.6),
             "100": run(0.95 if saturated else 0.5, grad_100, 2.0),
             "1000": run(0.99 if saturated else 0.6, 0.01, 2.2)}
    return {"op": op, "kappa": kappa}


EXAMPLES = [
    (_example(1e-3, 0.05), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.1, 0.5), {"a": "refuted", "b": "refuted"}),
    (_example(1e-3, 0.05, saturated=False), {"a": "untestable", "b": "untestable"}),
]
