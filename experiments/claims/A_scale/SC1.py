"""SC1: for i.i.d. unit-variance q and k entries, var(q.k) = d_k; dividing by sqrt(d_k)
restores a variance of about 1.

Measure: 10^5 pairs of q, k ~ N(0, I) at d_k = 16, 64, 128, 512 (float32 draws, float64
sums): var(q.k) and var(q.k / sqrt(d_k)).

    attnjax audit experiments/claims --workdir runs/claims --only SC1
"""

import numpy as np

from attnjax.audit import holds

ID = "SC1"
SOURCE = "000 §3.2; 002 §3.2"
CLAIM = "i.i.d. unit-variance q, k: var(q.k) = d_k, and 1/sqrt(d_k) restores ~1"
CRITERION = "|var/d_k - 1| <= 0.03 and |var_scaled - 1| <= 0.03 at every d_k"
DIMS = (16, 64, 128, 512)
PAIRS = 100_000
TEST_SIZE = {"PAIRS": 20_000}           # the suite: fewer pairs
TOLERANCE = 0.03


def measure() -> dict:
    rng = np.random.default_rng(0)
    out = {}
    for d in DIMS:
        q, k = (rng.standard_normal((PAIRS, d), dtype=np.float32) for _ in range(2))
        dots = np.einsum("nd,nd->n", q, k, dtype=np.float64)
        out[str(d)] = {"var": float(dots.var()), "var_scaled": float((dots / np.sqrt(d)).var())}
    return out


def verdict(results):
    ok = all(abs(r["var"] / int(d) - 1) <= TOLERANCE and abs(r["var_scaled"] - 1) <= TOLERANCE
             for d, r in results.items())
    return holds(ok, "; ".join(f"d_k={d}: var {r['var']:.1f}, scaled {r['var_scaled']:.3f}"
                               for d, r in results.items()))


EXAMPLES = [
    ({"16": {"var": 16.2, "var_scaled": 1.01}, "64": {"var": 63.5, "var_scaled": 0.99}},
     "confirmed"),
    ({"16": {"var": 16.2, "var_scaled": 1.01}, "64": {"var": 70.0, "var_scaled": 1.09}},
     "refuted"),
]
