"""DR2: (a) inverted dropout (keep with probability 1 - r, scale kept weights by 1/(1 - r))
keeps the expectation of the attention weights and outputs; (b) every attention weight lies in
[0, 1].

Measure: fixed probabilities P, the causal S-op weights (``dot_product_attention(...,
return_weights=True)``, seed 0) of example 0, all 4 heads, queries and keys 0-15 (causal rows
i < 16 put all their mass on keys < 16, so these rows are complete), with that example's v.
For r = 0.1, 0.3, 0.5 and 10^4 dropout rngs (``jax.random.split(key(0), 10^4)``, vmapped in
chunks) the reference kernel runs with ``dropout_rate=r`` on the value ``[v | I]``: its first
32 output features are the dropped outputs O~, the last 16 are the weights as applied to V,
P~ = keep * P / (1 - r) (the kernel's own ``dropout_keep`` mask, not a re-implementation).

Left open and resolved here: "mean within 1% relative" is taken over everything the mean runs
over, the 10^4 rngs and every entry: |sum(E P~ - P)| / sum|P| and |sum(E O~ - O)| / sum|O|
(the systematic bias; per entry, 10^4 rngs leave a Monte Carlo error of
sqrt(r / ((1 - r) 10^4)), 1% at r = 0.5, so a per-entry 1% test would measure the noise; the
per-entry relative error ||E X~ - X|| / ||X|| is reported beside it). (b1) the softmax
weights before dropout, (b2) the weights as applied to V, each judged by its min and max
over all rngs and rates.

    attnjax audit experiments/claims --workdir runs/claims --only DR2
"""

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds
from attnjax.audit.settings import s_op
from attnjax.ops import dot_product_attention

ID = "DR2"
SOURCE = "000 §8.6; 002 §1"
CLAIM = "inverted dropout keeps the expectation; every attention weight lies in [0, 1]"
CRITERION = ("(a) mean dropped weights and outputs within 1% relative; (b) softmax weights, "
             "weights as applied, each in [0, 1]")
RATES = (0.1, 0.3, 0.5)
RNGS, CHUNK, T = 10_000, 5_000, 16
TOLERANCE = 0.01


@jax.jit
def _inputs(q, k, v):
    """q, k, the value [v | I], the softmax weights P and the output P v without dropout."""
    eye = jnp.broadcast_to(jnp.eye(T)[None, :, None, :], (1, T, q.shape[2], T))
    value = jnp.concatenate([v, eye], axis=-1)
    out, probs = dot_product_attention(q, k, value, is_causal=True, return_weights=True)
    return value, probs, out[..., :-T]


def measure() -> dict:
    q, k, v = (a[:1, :T] for a in s_op(0))
    value, probs, clean = _inputs(q, k, v)

    @jax.jit
    def chunk(rngs, rate):
        """Sum, min and max over the rngs of [O~ | P~] ([1, T, N, 32 + T])."""
        out = jax.vmap(lambda rng: dot_product_attention(
            q, k, value, is_causal=True, dropout_rate=rate, dropout_rng=rng))(rngs)
        return out.sum(0), out.min(0), out.max(0)

    rngs = jax.random.split(jax.random.key(0), RNGS).reshape(RNGS // CHUNK, CHUNK)
    p = np.asarray(probs.transpose(0, 2, 1, 3), np.float64)     # [1, T(q), N, T(k)]
    o = np.asarray(clean, np.float64)
    results = {"softmax_min": float(probs.min()), "softmax_max": float(probs.max()),
               "rates": {}}
    for rate in RATES:
        total, low, high = 0.0, np.inf, -np.inf
        for part in rngs:
            s, lo, hi = chunk(part, rate)
            total = total + np.asarray(s, np.float64)
            low, high = min(low, float(lo[..., -T:].min())), max(high, float(hi[..., -T:].max()))
        mean = total / RNGS
        mo, mp = mean[..., :-T], mean[..., -T:]
        results["rates"][str(rate)] = {
            "weights_bias": float(abs((mp - p).sum()) / np.abs(p).sum()),
            "outputs_bias": float(abs((mo - o).sum()) / np.abs(o).sum()),
            "weights_rel": float(np.linalg.norm(mp - p) / np.linalg.norm(p)),
            "outputs_rel": float(np.linalg.norm(mo - o) / np.linalg.norm(o)),
            "mc_floor": float(np.sqrt(rate / ((1 - rate) * RNGS))),
            "applied_min": low, "applied_max": high}
    return results


def verdict(r):
    rates = r["rates"]
    a_ok = all(x["weights_bias"] <= TOLERANCE and x["outputs_bias"] <= TOLERANCE
               for x in rates.values())
    low = min(x["applied_min"] for x in rates.values())
    high = max(x["applied_max"] for x in rates.values())
    return {
        "a": holds(a_ok, "; ".join(
            f"r={rate}: mean weights off {x['weights_bias']:.1e}, outputs "
            f"{x['outputs_bias']:.1e} (per entry {x['weights_rel']:.2%} / {x['outputs_rel']:.2%}"
            f", MC floor {x['mc_floor']:.2%})" for rate, x in rates.items())),
        "b1": holds(0 <= r["softmax_min"] and r["softmax_max"] <= 1,
                    f"softmax weights in [{r['softmax_min']:.3g}, {r['softmax_max']:.3g}]"),
        "b2": holds(0 <= low and high <= 1,
                    f"weights as applied to V in [{low:.3g}, {high:.3g}] ("
                    + ", ".join(f"r={rate}: max {x['applied_max']:.3g}"
                                for rate, x in rates.items()) + ")"),
    }


def _example(bias: float, applied_max: float) -> dict:
    rate = {"weights_bias": bias, "outputs_bias": bias, "weights_rel": 0.01,
            "outputs_rel": 0.01, "mc_floor": 0.01, "applied_min": 0.0,
            "applied_max": applied_max}
    return {"softmax_min": 0.0 if applied_max <= 1 else -0.1, "softmax_max": 1.0,
            "rates": {"0.1": rate, "0.5": rate}}


EXAMPLES = [
    (_example(1e-4, 1.0), {"a": "confirmed", "b1": "confirmed", "b2": "confirmed"}),
    (_example(0.1, 2.0), {"a": "refuted", "b1": "refuted", "b2": "refuted"}),
]
