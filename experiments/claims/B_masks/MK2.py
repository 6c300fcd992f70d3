"""MK2: e^-10000 is exactly 0 in float32, so a -10000 fill is clean everywhere, while -5000
still leaks a little gradient (002: on some GPUs).

Measure: (a) float32 ``exp(-10000)``; (b) S-op q, k, v (causal mask) through the unsafe
kernel (``implementation="masked_fill"``), ``mask_mode`` add and select, fills -5000 and
-10000, logits in float32 (float32 inputs) or in the inputs' dtype bfloat16 or float16
(``logits_dtype="input"``), q rescaled so that the largest ``|s|`` is 10, 100, 1000. Per
setting, with loss ``sum(out * g)`` (``g`` a fixed N(0, 1) cotangent): the largest weight on
a masked key and the largest ``|dL/ds|`` on a masked score (``s`` reached as a zero
``bias``).

Left open: a fill "leaks" in a setting when a masked weight or a masked score's gradient is
not exactly 0. This runs on CPU; the GPU half of the claim is out of reach here.

    attnjax audit experiments/claims --workdir runs/claims --only MK2
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds
from attnjax.audit.settings import s_op
from attnjax.ops import dot_product_attention

ID = "MK2"
SOURCE = "002 §3.2"
CLAIM = "e^-10000 = 0 in float32, so -10000 is clean everywhere while -5000 leaks gradient"
CRITERION = ("(a) float32 exp(-10000) is 0; (b) on CPU, -5000 leaks in some setting and -10000 "
             "in none")
FILLS = (-5000.0, -10000.0)
MODES = ("add", "select")
DTYPES = ("float32", "bfloat16", "float16")
MAX_SCORES = (10, 100, 1000)


@functools.partial(jax.jit, static_argnames=("mode",))
def _masked(q, k, v, g, fill, *, mode):
    """Weights and dL/ds (float32) of ``sum(out * g)``, causal, unsafe kernel."""
    logits = "float32" if q.dtype == jnp.float32 else "input"
    bias = jnp.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), jnp.float32)

    def loss(bias):
        out, weights = dot_product_attention(
            q, k, v, bias, is_causal=True, return_weights=True, implementation="masked_fill",
            mask_fill=fill, mask_mode=mode, logits_dtype=logits)
        return (out.astype(jnp.float32) * g).sum(), weights

    d_s, weights = jax.grad(loss, has_aux=True)(bias)
    return weights, d_s


def measure() -> dict:
    q, k, v = s_op()
    g = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    raw = np.abs(np.einsum("btnh,bsnh->bnts", q, k)).max() / np.sqrt(q.shape[-1])
    T = q.shape[1]
    future = np.triu(np.ones((T, T), bool), 1)
    out = {"exp": float(jnp.exp(jnp.float32(-10000.0))), "settings": {}}
    for dtype in DTYPES:
        for top in MAX_SCORES:
            scaled = [jnp.asarray(x, dtype) for x in (q * np.float32(top / raw), k, v)]
            for mode in MODES:
                for fill in FILLS:
                    weights, d_s = (np.asarray(x) for x in _masked(*scaled, g, fill, mode=mode))
                    out["settings"][f"{fill:g} {mode} {dtype} max|s| {top}"] = {
                        "masked_weight": float(weights[..., future].max()),
                        "masked_grad": float(np.abs(d_s[..., future]).max())}
    return out


def leaks(results: dict, fill: float) -> list[str]:
    """The settings (named without the fill) where ``fill`` leaks."""
    prefix = f"{fill:g} "
    return [name.removeprefix(prefix) for name, r in results["settings"].items()
            if name.startswith(prefix) and (r["masked_weight"] != 0 or r["masked_grad"] != 0)]


def verdict(r):
    counts = {fill: sum(n.startswith(f"{fill:g} ") for n in r["settings"]) for fill in FILLS}
    leaky = {fill: leaks(r, fill) for fill in FILLS}
    worst = {fill: max(max(x.values()) for n, x in r["settings"].items()
                       if n.startswith(f"{fill:g} ")) for fill in FILLS}
    return {
        "a": holds(r["exp"] == 0.0, f"float32 exp(-10000) = {r['exp']}"),
        "b": holds(bool(leaky[-5000.0]) and not leaky[-10000.0],
                   "; ".join(f"{fill:g} leaks in {len(leaky[fill])}/{counts[fill]} settings"
                             + (f" ({', '.join(leaky[fill][:3])}...)" if leaky[fill] else "")
                             + f", largest masked weight or |dL/ds| {worst[fill]:.3g}"
                             for fill in FILLS)),
    }


def _example(leaky_fills):
    settings = {f"{fill:g} add float32 max|s| 10": {
        "masked_weight": 1e-9 if fill in leaky_fills else 0.0, "masked_grad": 0.0}
        for fill in FILLS}
    return {"exp": 0.0, "settings": settings}


EXAMPLES = [
    (_example({-5000.0}), {"a": "confirmed", "b": "confirmed"}),
    ({**_example(set()), "exp": 1e-38}, {"a": "refuted", "b": "refuted"}),
    (_example({-5000.0, -10000.0}), {"a": "confirmed", "b": "refuted"}),
]
