"""CX2: training keeps the n x n scores (probabilities) for the backward pass, a second copy,
so the gradient needs about twice the forward's n^2 memory.

Measure: XLA's temporary buffer size (``memory_analysis().temp_size_in_bytes``, MB) of the
compiled causal forward of attnjax's ``reference`` kernel and of the compiled gradient of
``sum(attention(q, k, v)^2)`` w.r.t. q, k, v — the two programs ``attnjax bench attention``
measures (``bench.attention.measure``: batch 1, 4 heads, head_dim 32, float32) — at n =
1024, 2048, 4096. Only compiled (``attnjax.bench.memory.buffer_memory``: machine code
unoptimised, the same buffers), not run: ``bench.attention.measure`` would also time both
programs (~60 s at n = 4096 here), and memory needs no run. Least-squares fit of a n^2 + b n
to each memory series; the criterion is on a_grad / a_forward.

    attnjax audit experiments/claims --workdir runs/claims --only CX2
"""

import jax
import numpy as np

from attnjax.audit import holds
from attnjax.bench.memory import buffer_memory
from attnjax.ops import dot_product_attention

ID = "CX2"
SOURCE = "000 §8.3"
CLAIM = "keeping the n x n scores for backward stores another copy, doubling that memory"
CRITERION = "gradient/forward ratio of the n^2 coefficients in [1.7, 2.3]"
LENGTHS, HEADS, HEAD_DIM = (1024, 2048, 4096), 4, 32


def temp_mb(kernel: str, length: int) -> dict:
    """Temporary MB of the compiled forward and gradient (``bench.attention.measure``'s
    programs)."""
    x = jax.ShapeDtypeStruct((1, length, HEADS, HEAD_DIM), np.float32)
    attend = lambda q, k, v: dot_product_attention(q, k, v, is_causal=True,
                                                   implementation=kernel)
    grad = jax.grad(lambda *a: (attend(*a) ** 2).sum(), argnums=(0, 1, 2))
    return {label: buffer_memory(jax.jit(fn).lower(x, x, x)).temp_size_in_bytes / 2**20
            for label, fn in (("forward", attend), ("grad", grad))}


def n2_coefficient(lengths, mb) -> float:
    """a of the least-squares fit mb ~ a n^2 + b n."""
    n = np.asarray(lengths, np.float64)
    return float(np.linalg.lstsq(np.stack([n**2, n], 1), np.asarray(mb), rcond=None)[0][0])


def measure() -> dict:
    rows = {str(n): temp_mb("reference", n) for n in LENGTHS}
    coef = {label: n2_coefficient(LENGTHS, [rows[str(n)][label] for n in LENGTHS])
            for label in ("forward", "grad")}
    return {"temp_mb": rows, "n2_coefficient": coef}


def verdict(r):
    a = r["n2_coefficient"]
    ratio = a["grad"] / a["forward"]
    return holds(1.7 <= ratio <= 2.3,
                 f"n^2 coefficients (MB per n^2) grad/forward = {a['grad']:.3g}/"
                 f"{a['forward']:.3g} = {ratio:.2f}"
                 "; temp MB forward/grad " + ", ".join(
                     f"n={n}: {x['forward']:.0f}/{x['grad']:.0f}"
                     for n, x in r["temp_mb"].items()))


EXAMPLES = [
    ({"temp_mb": {"1024": {"forward": 32, "grad": 64}},
      "n2_coefficient": {"forward": 3.0e-5, "grad": 6.1e-5}}, "confirmed"),
    ({"temp_mb": {"1024": {"forward": 32, "grad": 40}},
      "n2_coefficient": {"forward": 3.0e-5, "grad": 3.9e-5}}, "refuted"),
]
