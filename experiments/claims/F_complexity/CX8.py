"""CX8: cross-attention costs O(n m) (n decoder queries, m encoder keys), far below
self-attention when n << m.

Measure: ``attnjax.ops.dot_product_attention`` with query length n != key length m (no mask,
reference kernel, batch 1, one head of width 32, float32), jitted: XLA's temporary memory of
the compiled forward (``memory_analysis``) and its median wall time (compilation excluded, one
warm-up call, at least 3 calls, more for fast ones, interleaved across sizes). n = 64-1024 at
m = 1024 and m = 256-4096 at n = 256 (powers of two); exponents are least-squares slopes of
log cost on log n (log m). Regimes: the lower half of each range (n 64-256, m 256-1024) and
the upper half (n 256-1024, m 1024-4096). Left open and fixed here: "both exponents" are
checked for time and for memory alike (the claim is about cost), so a regime holds if all four
lie in [0.8, 1.2].

    attnjax audit experiments/claims --workdir runs/claims --only CX8
"""

import functools

import jax
import numpy as np

from attnjax.audit import over_regimes
from attnjax.audit.timing import interleaved_medians
from attnjax.ops import dot_product_attention

TIMED = True            # its criterion is about measured time: measured alone
ID = "CX8"
SOURCE = "002 §2.2"
CLAIM = "cross-attention costs O(n m), far below self-attention when decoder n << encoder m"
CRITERION = "both exponents (in n and in m) in [0.8, 1.2]"
N_FIXED, M_FIXED = 256, 1024
NS, MS = (64, 128, 256, 512, 1024), (256, 512, 1024, 2048, 4096)
REGIMES = {"lower half": {"n": NS[:3], "m": MS[:3]}, "upper half": {"n": NS[2:], "m": MS[2:]}}
HEAD_DIM, REPEATS = 32, 3


def _forward(n: int, m: int):
    """The compiled cross-attention forward, its inputs and its temporary MB."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, n, 1, HEAD_DIM), np.float32)
    k, v = (rng.standard_normal((1, m, 1, HEAD_DIM), np.float32) for _ in "kv")
    compiled = jax.jit(dot_product_attention).lower(q, k, v).compile()
    return compiled, (q, k, v), compiled.memory_analysis().temp_size_in_bytes / 2**20


def measure() -> dict:
    sizes = sorted({(n, M_FIXED) for n in NS} | {(N_FIXED, m) for m in MS})
    built = {size: _forward(*size) for size in sizes}
    seconds = interleaved_medians({size: functools.partial(b[0], *b[1])
                                   for size, b in built.items()}, repeats=REPEATS)
    return {f"{n}x{m}": {"n": n, "m": m, "seconds": seconds[n, m], "temp_mb": built[n, m][2]}
            for n, m in sizes}


def exponents(r) -> dict:
    """``{regime: {"time"|"memory": {"n": slope, "m": slope}}}``."""
    out = {}
    for regime, ranges in REGIMES.items():
        out[regime] = {}
        for cost, key in (("time", "seconds"), ("memory", "temp_mb")):
            out[regime][cost] = {}
            for axis, values in ranges.items():
                rows = [r[f"{v}x{M_FIXED}" if axis == "n" else f"{N_FIXED}x{v}"] for v in values]
                out[regime][cost][axis] = float(np.polyfit(
                    np.log(values), np.log([row[key] for row in rows]), 1)[0])
    return out


def verdict(r):
    e = exponents(r)
    return over_regimes(
        {regime: all(0.8 <= s <= 1.2 for c in x.values() for s in c.values())
         for regime, x in e.items()},
        "; ".join(f"{regime}: time exponents n {x['time']['n']:.2f}, m {x['time']['m']:.2f}, "
                  f"memory n {x['memory']['n']:.2f}, m {x['memory']['m']:.2f}"
                  for regime, x in e.items()))


def _example(cost) -> dict:
    sizes = {(n, M_FIXED) for n in NS} | {(N_FIXED, m) for m in MS}
    return {f"{n}x{m}": {"n": n, "m": m, "seconds": cost(n, m), "temp_mb": float(n * m)}
            for n, m in sizes}


EXAMPLES = [
    (_example(lambda n, m: n * m * 1e-8), "confirmed"),
    (_example(lambda n, m: max(n * m, N_FIXED * M_FIXED) * 1e-8), "scale-dependent"),
    (_example(lambda n, m: (n * m * 1e-5) ** 2), "refuted"),
]
