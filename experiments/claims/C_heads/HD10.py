"""HD10: queries and keys must share a width (their dot product needs it); the values may have
another width, equal widths being only a convention.

Measure: (a) op level: S-op q, k [2, 128, 4, 32] (seed 0) and v [2, 128, 4, d_v] ~ N(0, 1)
(numpy seed 1), d_v = 16, 32, 64, causal, through ``attnjax.ops.dot_product_attention`` with
every exact kernel that runs here (reference, chunked, xla), against attnjax.parity's float64
oracle: the largest relative error ``max |a - b| / max |b|`` of the output and of the q, k, v
gradients of ``sum(out * g)`` (g ~ N(0, 1), numpy seed 2). (b) S-text with
``model.attention.value_head_dim`` = d_k / 2 = 8 and 2 d_k = 32 (d_k = 16), seeds 0 and 1,
**300 steps** (cut for the budget: the criterion asks only that training does not diverge).

Diverged (the conventions): the run failed, skipped an update, or its final training loss is
above the step-0 loss - 0.1, the step-0 loss taken as ln 256 (attnjax's initial
predictions are near uniform; no metrics record is written at step 0). d_v = d_k (32 at op
level) is reported as the control; the criterion reads d_v != d_k.

Cost: 2 S-text arms at 300 steps, ~1 unit (one S-text arm, both seeds, 600 steps).

    attnjax audit experiments/claims --workdir runs/claims --only HD10
"""

import math

import jax
import numpy as np

from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import s_op, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.ops import dot_product_attention
from attnjax.parity import oracle_attention, oracle_grads
from attnjax.registry import KERNELS

ID = "HD10"
SOURCE = "000 §2.2"
CLAIM = "Q and K must share a width; V may differ, equal widths being convention"
CRITERION = "d_v != d_k matches the oracle within 1e-5 and trains without divergence"
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
OP_WIDTHS, KEY_WIDTH, TOLERANCE = (16, 32, 64), 32, 1e-5
ARMS = {str(d): {"model.attention.value_head_dim": d, **STEPS} for d in (8, 32)}


def get_sweep():
    return with_seeds(list(ARMS.values()))


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def oracle_errors() -> dict:
    """``{kernel: {d_v: worst relative error of output and gradients}}``."""
    q, k, _ = s_op(0)
    T = q.shape[1]
    mask = np.tril(np.ones((T, T), bool))
    out = {}
    for width in OP_WIDTHS:
        v = np.random.default_rng(1).standard_normal((*q.shape[:3], width)).astype(np.float32)
        g = np.random.default_rng(2).standard_normal(v.shape)
        exact = [oracle_attention(q, k, v, mask=mask), *oracle_grads(q, k, v, g, mask=mask)]
        for name, spec in KERNELS.items():
            if not spec.exact or not spec.available():
                continue
            attend = lambda q, k, v, name=name: dot_product_attention(
                q, k, v, is_causal=True, implementation=name)
            result, vjp = jax.vjp(attend, q, k, v)
            got = [result, *vjp(g.astype(np.float32))]
            out.setdefault(name, {})[str(width)] = max(_relative(a, b)
                                                       for a, b in zip(got, exact))
    return out


def diverged(trained) -> bool:
    summary, vocab = trained.dir.summary(), trained.config.model.vocab_size
    final = summary.get("train_loss")
    return bool(trained.failed or summary["skipped_updates"]
                or final is None or not final <= math.log(vocab) - 0.1)


def measure(runs) -> dict:
    training = {}
    for width, overrides in ARMS.items():
        for seed, trained in runs.by_seed(overrides).items():
            training.setdefault(width, {})[str(seed)] = {
                "diverged": diverged(trained), "loss": trained.loss(),
                "train_loss": trained.dir.summary().get("train_loss")}
    return {"oracle": oracle_errors(), "training": training}


def verdict(r):
    errors = {(kernel, d): e for kernel, by_width in r["oracle"].items()
              for d, e in by_width.items()}
    differ = [e for (_, d), e in errors.items() if int(d) != KEY_WIDTH]
    a = holds(max(differ) <= TOLERANCE, "worst relative error vs float64 oracle (output and "
              "grads), d_k = 32: " + "; ".join(
                  f"{kernel} " + ", ".join(f"d_v {d}: {e:.1e}" for d, e in by_width.items())
                  for kernel, by_width in r["oracle"].items()) + f" (limit {TOLERANCE:g})")
    train = r["training"]
    seeds = list(next(iter(train.values())))
    ok, note = over_seeds({s: not any(train[d][s]["diverged"] for d in train) for s in seeds})
    b = holds(ok, "; ".join(filter(None, ["; ".join(
        f"d_v {d}: loss " + "/".join(f"{x['loss']:.4f}" for x in by_seed.values())
        + " (seeds " + "/".join(by_seed) + "), diverged " + "/".join(
            str(x["diverged"]).lower() for x in by_seed.values())
        for d, by_seed in train.items()), note])))
    return {"a": a, "b": b}


def _example(error, diverged_seed1):
    train = lambda: {"0": {"diverged": False, "loss": 1.9, "train_loss": 1.8},
                     "1": {"diverged": diverged_seed1, "loss": 1.9, "train_loss": 1.8}}
    return {"oracle": {"reference": {"16": error, "32": 2e-7, "64": error}},
            "training": {"8": train(), "32": train()}}


EXAMPLES = [
    (_example(3e-7, False), {"a": "confirmed", "b": "confirmed"}),
    (_example(3e-4, True), {"a": "refuted", "b": "refuted"}),
]
