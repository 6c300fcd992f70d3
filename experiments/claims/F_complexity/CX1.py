"""CX1: self-attention time is O(n^2 d).

Measure: the forward of attnjax's ``reference`` kernel (causal, float32, batch 1), jitted,
timed as ``attnjax bench attention`` does (compilation excluded, one warm-up call, median of
3 calls, ``block_until_ready``; fast sizes get more calls, up to 25, and the calls of all
sizes are interleaved, against the noise of a shared machine): lengths n = 256, 512, 1024,
2048, 4096 at head_dim 32, and head_dim 16, 32, 64, 128 at n = 2048. Deviations from
``attnjax bench attention --kernels reference --head-dim 32``, for the 2-core budget: one
head instead of 4 (the exponents do not depend on the head count) and the forward only
(``bench.attention.measure`` always also compiles and times the gradient, ~60 s at n = 4096
with 4 heads here). Slopes are least-squares slopes of log time on log n (log head_dim).

Regimes for the n slope: n <= 512 (256 -> 512) and the top two lengths (2048 -> 4096); the
d slope (all four head dims) is part of the criterion in both, so a d slope out of range
fails both regimes.

    attnjax audit experiments/claims --workdir runs/claims --only CX1
"""

import functools

import jax
import numpy as np

from attnjax.audit import over_regimes
from attnjax.audit.timing import interleaved_medians
from attnjax.ops import dot_product_attention

TIMED = True            # its criterion is about measured time: measured alone
ID = "CX1"
SOURCE = "000 §6.2"
CLAIM = "self-attention time is O(n^2 d)"
CRITERION = "n slope in [1.7, 2.3]; d slope in [0.7, 1.3]"
LENGTHS, HEAD_DIMS, D_LENGTH = (256, 512, 1024, 2048, 4096), (16, 32, 64, 128), 2048
HEADS, REPEATS = 1, 3
REGIMES = {"n <= 512": (256, 512), "top two lengths": (2048, 4096)}
TEST_SIZE = {"LENGTHS": (256, 512, 1024), "D_LENGTH": 512,      # the suite: shorter
             "REGIMES": {"n <= 512": (256, 512), "top two lengths": (512, 1024)}}


def _forward(length: int, head_dim: int):
    """The compiled causal forward of the reference kernel and its inputs."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, length, HEADS, head_dim), np.float32) for _ in "qkv")
    attend = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, is_causal=True,
                                                           implementation="reference"))
    return attend.lower(q, k, v).compile(), (q, k, v)


def slope(x, y) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def measure() -> dict:
    calls = {(n, 32): _forward(n, 32) for n in LENGTHS}
    calls |= {(D_LENGTH, d): _forward(D_LENGTH, d) for d in HEAD_DIMS if d != 32}
    seconds = interleaved_medians({key: functools.partial(fn, *args)
                                   for key, (fn, args) in calls.items()}, repeats=REPEATS)
    return {"seconds_by_length": {str(n): seconds[n, 32] for n in LENGTHS},
            "seconds_by_head_dim": {str(d): seconds[D_LENGTH, d] for d in HEAD_DIMS}}


def verdict(r):
    t, td = r["seconds_by_length"], r["seconds_by_head_dim"]
    n_slopes = {name: slope(ns, [t[str(n)] for n in ns]) for name, ns in REGIMES.items()}
    d_slope = slope([int(d) for d in td], list(td.values()))
    d_ok = 0.7 <= d_slope <= 1.3
    return over_regimes(
        {name: 1.7 <= s <= 2.3 and d_ok for name, s in n_slopes.items()},
        ", ".join(f"n slope {name}: {s:.2f}" for name, s in n_slopes.items())
        + f"; d slope (16-128 at n 2048): {d_slope:.2f}; times by n "
        + ", ".join(f"{n}: {s * 1e3:.1f}" for n, s in t.items()) + " ms; by head_dim "
        + ", ".join(f"{d}: {s * 1e3:.0f}" for d, s in td.items()) + " ms")


def _example(small: float, big: float, d_exp: float) -> dict:
    return {"seconds_by_length": {str(n): (n / 256) ** (small if n <= 512 else big) * 1e-3
                                  for n in (256, 512)} | {"2048": 1.0, "4096": 2.0 ** big},
            "seconds_by_head_dim": {str(d): (d / 16) ** d_exp for d in HEAD_DIMS}}


EXAMPLES = [
    (_example(2.0, 2.0, 1.0), "confirmed"),
    (_example(1.2, 2.0, 1.0), "scale-dependent"),
    (_example(2.0, 2.0, 0.4), "refuted"),
]
