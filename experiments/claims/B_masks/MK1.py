"""MK1: filling masked scores with a large finite negative number (000: -1e9; 002: -1e4) gives
the masked keys (near) zero weight and, per 002, zero gradient.

Measure: S-op q, k, v through the unsafe kernel (``implementation="masked_fill"``) with
``mask_mode`` select (``where(mask, s, fill)``) and add (``s + (1 - mask) fill``), fills -1e4
and -1e9, a causal mask and a random mask (each key visible with probability 1/2, the
diagonal always, so no row is empty), both passed as the boolean ``mask``; the reference
kernel with the same masks is the control. Loss ``sum(out * g)``, ``g`` a fixed N(0, 1)
cotangent. Per setting: the largest weight on a masked key, the largest ``|dL/ds|`` on a
masked score (``s`` reached as a zero ``bias``, so ``dL/ds = dL/dbias``), and the relative
difference ``max |a - b| / max |b|`` (attnjax.parity's measure) of the q, k, v gradients
from the reference kernel's. Regimes: q rescaled so that the largest ``|s|`` over all scores
is 1, 10, 100.

Left open: each article's criterion is judged on its own fill, (a) 000's on -1e9, (b) 002's
on -1e4, each over both modes and both masks; the other fill is reported.

    attnjax audit experiments/claims --workdir runs/claims --only MK1
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import over_regimes
from attnjax.audit.settings import s_op
from attnjax.ops import dot_product_attention

ID = "MK1"
SOURCE = "000 §6.1; 002 §3.2"
CLAIM = "a -1e9 (000) or -1e4 (002) fill gives masked keys ~zero weight and (002) zero gradient"
CRITERION = ("000: masked weight <= 1e-30; 002: masked weights and gradients exactly 0, q/k/v "
             "gradients within 1e-6 relative")
MAX_SCORES = (1, 10, 100)
FILLS = {"000": -1e9, "002": -1e4}
MODES = ("select", "add")
TINY = 1e-30
RELATIVE = 1e-6


def masks(T: int) -> dict[str, np.ndarray]:
    """Boolean ``[1, 1, T, T]`` masks (True = may attend): causal, and random with the
    diagonal kept."""
    random = np.random.default_rng(2).random((T, T)) < 0.5
    np.fill_diagonal(random, True)
    return {"causal": np.tril(np.ones((T, T), bool))[None, None], "random": random[None, None]}


@functools.partial(jax.jit, static_argnames=("implementation", "mode"))
def _run(q, k, v, mask, g, fill, *, implementation, mode=None):
    """Weights, dL/ds and the q, k, v gradients of ``sum(out * g)``."""
    options = ({} if implementation == "reference"
               else {"mask_fill": fill, "mask_mode": mode})
    bias = jnp.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]), jnp.float32)

    def loss(q, k, v, bias):
        out, weights = dot_product_attention(q, k, v, bias, mask, return_weights=True,
                                             implementation=implementation, **options)
        return (out * g).sum(), weights

    grads, weights = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, bias)
    return weights, grads[3], grads[:3]


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def measure() -> dict:
    q, k, v = s_op()
    g = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    raw = np.abs(np.einsum("btnh,bsnh->bnts", q, k)).max() / np.sqrt(q.shape[-1])
    out = {}
    for top in MAX_SCORES:
        qs = q * np.float32(top / raw)
        regime = out[str(top)] = {}
        for name, mask in masks(q.shape[1]).items():
            hidden = ~np.broadcast_to(mask, (q.shape[0], q.shape[2], *mask.shape[2:]))
            _, _, reference = _run(qs, k, v, mask, g, 0.0, implementation="reference")
            for mode in MODES:
                for fill in FILLS.values():
                    weights, d_s, grads = _run(qs, k, v, mask, g, fill,
                                               implementation="masked_fill", mode=mode)
                    regime[f"{mode} {fill:g} {name}"] = {
                        "masked_weight": float(np.asarray(weights)[hidden].max()),
                        "masked_grad": float(np.abs(np.asarray(d_s))[hidden].max()),
                        "qkv_grad_relative": max(_relative(a, b)
                                                 for a, b in zip(grads, reference))}
    return out


def _settings(regime: dict, fill: float) -> dict:
    return {name: r for name, r in regime.items() if name.split()[1] == f"{fill:g}"}


def _worst(regime: dict, fill: float, key: str) -> float:
    return max(r[key] for r in _settings(regime, fill).values())


def verdict(r):
    a = over_regimes(
        {f"max|s| {top}": _worst(regime, FILLS["000"], "masked_weight") <= TINY
         for top, regime in r.items()},
        "fill -1e9, max masked weight: " + ", ".join(
            f"max|s| {top} {_worst(regime, FILLS['000'], 'masked_weight'):.3g}"
            for top, regime in r.items()))
    b = over_regimes(
        {f"max|s| {top}": all(x["masked_weight"] == 0 and x["masked_grad"] == 0
                              and x["qkv_grad_relative"] <= RELATIVE
                              for x in _settings(regime, FILLS["002"]).values())
         for top, regime in r.items()},
        "fill -1e4, max masked weight / masked |dL/ds| / q,k,v gradient relative difference: "
        + ", ".join(f"max|s| {top} " + " / ".join(
            f"{_worst(regime, FILLS['002'], key):.3g}"
            for key in ("masked_weight", "masked_grad", "qkv_grad_relative"))
            for top, regime in r.items())
        + "; fill -1e9 gradient relative difference: " + ", ".join(
            f"{_worst(regime, FILLS['000'], 'qkv_grad_relative'):.3g}" for regime in r.values()))
    return {"a": a, "b": b}


def _example(weight, grad, relative, leaky_top=None):
    row = lambda top: {"masked_weight": weight if top == leaky_top else 0.0,
                       "masked_grad": grad if top == leaky_top else 0.0,
                       "qkv_grad_relative": relative if top == leaky_top else 1e-7}
    return {str(top): {f"{mode} {fill:g} {mask}": row(top) for mode in MODES
                       for fill in FILLS.values() for mask in ("causal", "random")}
            for top in MAX_SCORES}


EXAMPLES = [
    (_example(0.0, 0.0, 1e-7), {"a": "confirmed", "b": "confirmed"}),
    (_example(1e-3, 1e-4, 1e-3, leaky_top=100), {"a": "scale-dependent", "b": "scale-dependent"}),
    ({str(top): _example(1e-3, 1e-4, 1e-3, leaky_top=1)["1"] for top in MAX_SCORES},
     {"a": "refuted", "b": "refuted"}),
]
