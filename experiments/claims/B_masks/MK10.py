"""MK10: building the block mask with the vectorised expression is 17x faster than a
hand-written loop.

Measure, block 128, at T = 1024, 4096, 16384 (regimes): the median wall time of
- the expression in NumPy, ``block_id[:, None] <= block_id[None, :]`` with ``block_id =
  arange(T) // 128``, as 002 writes it;
- the jitted jnp expression: attnjax's ``block_causal_mask`` (the same comparison with rows
  and columns exchanged, ``jax.jit``, compile excluded, ``block_until_ready``);
- a Python loop over block pairs filling the mask the expression gives, one 128 x 128
  tile per pair (``(T / 128)^2`` iterations; 16384 at T = 16384), checked equal to it (and
  the jnp mask, transposed, at the smallest T).
Calls of the three are interleaved (``REPEATS`` rounds) so machine load hits them alike.
Speedup = loop time / expression time.

Left open: a regime holds when both vectorised forms (NumPy and jitted jnp) are >= 17x faster
than the loop.

    attnjax audit experiments/claims --workdir runs/claims --only MK10
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import over_regimes
from attnjax.audit.timing import interleaved_medians
from attnjax.ops import block_causal_mask

TIMED = True            # its criterion is about measured time: measured alone
ID = "MK10"
SOURCE = "002 §3.3"
CLAIM = "the vectorised block-mask expression is 17x faster than a hand-written loop"
CRITERION = "speedup >= 17"
LENGTHS = (1024, 4096, 16384)
BLOCK = 128
SPEEDUP = 17
REPEATS = 3
TEST_SIZE = {"LENGTHS": (1024,), "REPEATS": 1}   # the suite: the shortest, once


def expression(T: int) -> np.ndarray:
    block_id = np.arange(T) // BLOCK
    return block_id[:, None] <= block_id[None, :]


def loop(T: int) -> np.ndarray:
    mask = np.empty((T, T), bool)
    blocks = T // BLOCK
    for a in range(blocks):
        for b in range(blocks):
            mask[a * BLOCK:(a + 1) * BLOCK, b * BLOCK:(b + 1) * BLOCK] = a <= b
    return mask


def _jitted(T: int):
    positions = jnp.arange(T)[None, :]
    fn = jax.jit(lambda p: block_causal_mask(p, p, BLOCK)).lower(positions).compile()
    return lambda: jax.block_until_ready(fn(positions))


def measure() -> dict:
    out = {}
    for T in LENGTHS:
        forms = {"numpy": functools.partial(expression, T), "jnp": _jitted(T),
                 "loop": functools.partial(loop, T)}
        same = bool((loop(T) == expression(T)).all())
        if T == LENGTHS[0]:     # the jnp form is the same comparison at every T
            same &= bool((np.asarray(forms["jnp"]())[0, 0].T == expression(T)).all())
        seconds = interleaved_medians(forms, repeats=REPEATS, most=REPEATS)
        out[str(T)] = {"seconds": seconds, "same_mask": same,
                       "speedup": {name: seconds["loop"] / seconds[name]
                                   for name in ("numpy", "jnp")}}
    return out


def verdict(r):
    return over_regimes(
        {f"T {t}": min(x["speedup"].values()) >= SPEEDUP for t, x in r.items()},
        "speedup (loop / expression), numpy / jitted jnp: " + "; ".join(
            f"T {t} {x['speedup']['numpy']:.3g} / {x['speedup']['jnp']:.3g} "
            f"(loop {x['seconds']['loop'] * 1e3:.3g} ms)" for t, x in r.items()))


def _example(numpy_speedup, jnp_speedup):
    return {str(t): {"seconds": {"numpy": 1e-3, "jnp": 1e-3, "loop": 2e-2}, "same_mask": True,
                     "speedup": {"numpy": s, "jnp": j}}
            for t, s, j in zip(LENGTHS, numpy_speedup, jnp_speedup)}


EXAMPLES = [
    (_example([20, 30, 40], [18, 25, 60]), "confirmed"),
    (_example([20, 30, 5], [18, 25, 60]), "scale-dependent"),
    (_example([1.2, 1.0, 0.9], [3, 2, 1]), "refuted"),
]
