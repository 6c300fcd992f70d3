"""PE3: computing the sinusoidal frequencies ("div_term") in the log domain,
w_i = exp(2i * (-ln 10000 / d)), is faster and more stable than the direct power
w_i = 10000^(-2i / d).

Measure, with ``jax.numpy``:

(a) for d = 64, 512, 4096 and dtypes float32, bfloat16, float16, both formulas evaluated in that
dtype (the indices 2i and the constant -ln(10000)/d cast to it, every operation's result
rounded to it with ``lax.reduce_precision``: XLA on CPU computes half precision in float32
inside fused kernels and would otherwise hide the roundings), the max over i of
|w_i - w_i^64| / w_i^64 against float64 NumPy.

(b) median wall time (15 interleaved repeats after compilation, ``block_until_ready``) of a
jitted float32 table build at d = 4096 for positions p < 1024 (PE[p, 2i] = sin(p w_i),
PE[p, 2i+1] = cos(p w_i)), one per formula; positions and indices are arguments, so XLA
cannot fold the table into a constant. The table length is not given by CLAIMS.md; 1024 is
PE2's. The time of the frequencies alone is reported beside it. In both compiled programs the
frequencies are computed once, as a [d/2] vector (checked in the optimised HLO), so the
table's time is that of its 2 x 2M sines and cosines in both and the ratio sits near 1, where
the noise of a shared machine decides the side of 0.9. (attnjax's own
``sinusoidal_embedding`` takes the direct power in float64 NumPy at trace time and casts the
frequencies to float32.)

    attnjax audit experiments/claims --workdir runs/claims --only PE3
"""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds

TIMED = True            # its criterion is about measured time: measured alone
ID = "PE3"
SOURCE = "000 §5.2"
CLAIM = "div_term via exp(2i * (-ln 10000 / d)) is faster and more stable than the direct power"
CRITERION = ("(a) log error <= direct everywhere, lower somewhere; (b) log time <= 0.9x direct "
             "(d 4096, float32)")
DIMS, DTYPES = (64, 512, 4096), ("float32", "bfloat16", "float16")
LENGTH, TIMED_DIM, REPEATS = 1024, 4096, 15


def _rounded(dtype):
    info = jnp.finfo(dtype)
    return lambda x: jax.lax.reduce_precision(x, exponent_bits=info.nexp,
                                              mantissa_bits=info.nmant)


def direct(idx, d: int, dtype):
    """10000^(-2i/d) with every operation rounded to ``dtype``."""
    r = _rounded(dtype)
    return r(jnp.power(r(jnp.float32(10000.0)), r(-r(idx.astype(jnp.float32)) / d)))


def log_domain(idx, d: int, dtype):
    """exp(2i * (-ln 10000 / d)) with every operation rounded to ``dtype``."""
    r = _rounded(dtype)
    return r(jnp.exp(r(r(idx.astype(jnp.float32)) * r(jnp.float32(-math.log(10000.0) / d)))))


def _table(freq):
    def build(positions, idx):
        angles = positions[:, None].astype(jnp.float32) * freq(idx, TIMED_DIM, jnp.float32)
        return jnp.stack([jnp.sin(angles), jnp.cos(angles)], -1).reshape(len(positions), -1)
    return jax.jit(build)


def _median_times(fns: dict, *args) -> dict:
    for fn in fns.values():
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in fns}
    for _ in range(REPEATS):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}


def measure() -> dict:
    errors = {}
    for d in DIMS:
        idx = np.arange(0, d, 2)
        exact = 10000.0 ** (-idx / d)
        for dtype in DTYPES:
            for name, fn in (("direct", direct), ("log", log_domain)):
                got = np.asarray(jax.jit(fn, static_argnums=(1, 2))(idx, d, dtype), np.float64)
                errors[f"{d}/{dtype}/{name}"] = float(np.max(np.abs(got - exact) / exact))
    positions, idx = jnp.arange(LENGTH), jnp.arange(0, TIMED_DIM, 2)
    table = _median_times({"direct": _table(direct), "log": _table(log_domain)}, positions, idx)
    freqs = _median_times({n: jax.jit(lambda i, f=f: f(i, TIMED_DIM, jnp.float32))
                           for n, f in (("direct", direct), ("log", log_domain))}, idx)
    return {"errors": errors, "table_s": table, "freq_s": freqs}


def verdict(r):
    e = r["errors"]
    cells = [(d, t) for d in DIMS for t in DTYPES if f"{d}/{t}/log" in e]
    no_worse = all(e[f"{d}/{t}/log"] <= e[f"{d}/{t}/direct"] for d, t in cells)
    lower = [f"d={d} {t}" for d, t in cells if e[f"{d}/{t}/log"] < e[f"{d}/{t}/direct"]]
    worse = [f"d={d} {t}" for d, t in cells if e[f"{d}/{t}/log"] > e[f"{d}/{t}/direct"]]
    t, f = r["table_s"], r["freq_s"]
    ratio = t["log"] / t["direct"]
    return {
        "a": holds(no_worse and bool(lower),
                   "max relative error log/direct: " + ", ".join(
                       f"d={d} {t_}: {e[f'{d}/{t_}/log']:.1e}/{e[f'{d}/{t_}/direct']:.1e}"
                       for d, t_ in cells)
                   + f"; log lower in {len(lower)}, worse in {len(worse)}"
                   + (f" ({', '.join(worse)})" if worse and len(worse) < len(cells) else "")),
        "b": holds(ratio <= 0.9,
                   f"table [1024, 4096] float32: log {t['log'] * 1e3:.1f} ms, direct "
                   f"{t['direct'] * 1e3:.1f} ms, ratio {ratio:.2f} (limit 0.9); frequencies "
                   f"alone: ratio {f['log'] / f['direct']:.2f}"),
    }


def _example(log_error: float, log_time: float) -> dict:
    errors = {"64/float16/direct": 1e-3, "64/float16/log": log_error,
              "64/float32/direct": 1e-7, "64/float32/log": 1e-7}
    return {"errors": errors, "table_s": {"direct": 1.0, "log": log_time},
            "freq_s": {"direct": 1.0, "log": log_time}}


EXAMPLES = [(_example(5e-4, 0.8), {"a": "confirmed", "b": "confirmed"}),
            (_example(2e-3, 1.0), {"a": "refuted", "b": "refuted"})]
