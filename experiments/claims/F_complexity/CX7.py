"""CX7: one fused d x d projection, split into heads afterwards, equals per-head projections
(one d x d/h matmul per head) and is faster.

The claim is about the matmuls, so it is measured at op level with ``jax.numpy`` directly:
another engineer is adding a per-head projection layout to attnjax's model (M20), but the
claim needs only the two ways of computing the same projection, not the model.

Measure, 8 heads, x ~ N(0, 1) of [B 16, T 128, d], W ~ N(0, 1/d) of [d, d], fixed seeds:

    fused:     (x W).reshape(B, T, 8, d/8)
    per head:  stack_h(x W_h),  W_h = W[:, h d/8 : (h+1) d/8]  (8 separate weight arrays)

(a) max |fused - per head| / max |fused| of the outputs; (b) median wall time of the jitted
forward + backward (the gradient of sum(out^2) w.r.t. x and the weights; compilation
excluded, one warm-up call, at least 5 calls, more for fast ones, interleaved). Regimes:
d = 64, 128, 256; (b) is judged as t_fused <= 0.9 t_per_head. XLA may merge the eight dots
that share x (its dot-merger pass); what is timed is what XLA makes of each program.

    attnjax audit experiments/claims --workdir runs/claims --only CX7
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import over_regimes
from attnjax.audit.timing import interleaved_medians

TIMED = True            # its criterion is about measured time: measured alone
ID = "CX7"
SOURCE = "000 §4.2, §7.2"
CLAIM = "one fused d x d projection split into heads equals per-head projections and is faster"
CRITERION = "(a) max relative difference <= 1e-6; (b) fused >= 10% faster (forward + backward)"
B, T, HEADS, DIMS, REPEATS = 16, 128, 8, (64, 128, 256), 5


def fused(x, w):
    return (x @ w).reshape(*x.shape[:2], HEADS, -1)


def per_head(x, ws):
    return jnp.stack([x @ w_h for w_h in ws], axis=2)


def _train_step(project):
    return jax.jit(jax.grad(lambda x, w: (project(x, w) ** 2).sum(), argnums=(0, 1)))


def measure() -> dict:
    rng = np.random.default_rng(0)
    out, calls = {}, {}
    for d in DIMS:
        x = rng.standard_normal((B, T, d), np.float32)
        w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
        ws = [w[:, h * d // HEADS:(h + 1) * d // HEADS] for h in range(HEADS)]
        a, b = np.asarray(jax.jit(fused)(x, w)), np.asarray(jax.jit(per_head)(x, ws))
        out[str(d)] = {"max_rel_diff": float(np.abs(a - b).max() / np.abs(a).max())}
        calls[d, "fused"] = (_train_step(fused), (x, w))
        calls[d, "per_head"] = (_train_step(per_head), (x, ws))
    seconds = interleaved_medians({key: functools.partial(fn, *args)
                                   for key, (fn, args) in calls.items()}, repeats=REPEATS)
    for d in DIMS:
        out[str(d)] |= {"fused_s": seconds[d, "fused"], "per_head_s": seconds[d, "per_head"]}
    return out


def verdict(r):
    a = over_regimes({f"d={d}": x["max_rel_diff"] <= 1e-6 for d, x in r.items()},
                     "max relative difference " + ", ".join(
                         f"d={d}: {x['max_rel_diff']:.1e}" for d, x in r.items()))
    b = over_regimes({f"d={d}": x["fused_s"] <= 0.9 * x["per_head_s"] for d, x in r.items()},
                     "forward + backward fused/per-head " + ", ".join(
                         f"d={d}: {x['fused_s'] * 1e3:.2f}/{x['per_head_s'] * 1e3:.2f} ms "
                         f"(x{x['fused_s'] / x['per_head_s']:.2f})" for d, x in r.items())
                     + "; limit x0.90")
    return {"a": a, "b": b}


def _example(diff: float, ratios: tuple) -> dict:
    return {str(d): {"max_rel_diff": diff, "fused_s": ratio, "per_head_s": 1.0}
            for d, ratio in zip(DIMS, ratios)}


EXAMPLES = [
    (_example(1e-7, (0.5, 0.6, 0.7)), {"a": "confirmed", "b": "confirmed"}),
    (_example(1e-7, (0.5, 1.0, 1.0)), {"a": "confirmed", "b": "scale-dependent"}),
    (_example(1e-3, (1.0, 1.0, 1.0)), {"a": "refuted", "b": "refuted"}),
]
