"""MK5: the causal mask is ``triu(ones, diagonal=1)`` taken as "masked"; one offset less
peeks at the future, one more leaves the first token without input (garbage generation).

Measure: the unsafe kernel (``implementation="masked_fill"``, default select with the finite
``finfo.min`` fill) masking ``j - i >= o``, i.e. ``triu(ones, diagonal=o)``, for o = 0, 1, 2:
attnjax's ``causal_offset = o - 1`` (key j visible iff ``j <= i + causal_offset``). On S-op
q, k, v: which inputs each output row depends on, from the vector-Jacobian product of every
query row ``i`` (a fixed N(0, 1) cotangent on row i only, the q, k and v gradients at every
position j): row i depends on position j when a gradient there is non-zero. And the number
of keys visible to query 0, read off the weights with ``mask_after_softmax=True`` (the
softmax times the mask, so a weight is non-zero exactly where the key is visible).

Left open: "exactly causal" is read as: every row depends on exactly the positions j <= i;
"sees the future" as: some row depends on a later position; "query 0 keyless" as: no key
visible to query 0. A row that sees no key gets the finite fill on every key, hence uniform
weights over all of them: it then depends on every position, later ones included.

    attnjax audit experiments/claims --workdir runs/claims --only MK5
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds
from attnjax.audit.settings import s_op
from attnjax.ops import dot_product_attention

ID = "MK5"
SOURCE = "002 §3.3"
CLAIM = ("causal mask = triu(ones, diagonal=1) as masked; one offset less peeks at the future, "
         "one more starves the first token")
CRITERION = "o = 1 exactly causal, o = 0 sees the future, o = 2 leaves query 0 keyless"
OFFSETS = (0, 1, 2)


def _attend(q, k, v, *, offset, **options):
    return dot_product_attention(q, k, v, is_causal=True, implementation="masked_fill",
                                 causal_offset=offset - 1, **options)


@functools.partial(jax.jit, static_argnames=("offset",))
def dependence(q, k, v, g, *, offset):
    """``[T_out, T_in]``: whether output row i has a non-zero gradient at input position j."""
    out, vjp = jax.vjp(functools.partial(_attend, offset=offset), q, k, v)
    rows = jnp.arange(q.shape[1])

    def row(i):
        cotangent = jnp.where((jnp.arange(out.shape[1]) == i)[None, :, None, None], g, 0.0)
        return sum(jnp.abs(d).sum(axis=(0, 2, 3)) for d in vjp(cotangent))   # [T_in]

    return jax.lax.map(row, rows) > 0


def measure() -> dict:
    q, k, v = s_op()
    g = np.random.default_rng(1).standard_normal(q.shape).astype(np.float32)
    out = {}
    for o in OFFSETS:
        dep = np.asarray(dependence(q, k, v, g, offset=o))
        _, weights = _attend(q, k, v, offset=o, mask_after_softmax=True, return_weights=True)
        later = np.triu(dep, 1)
        out[str(o)] = {
            "exactly_causal": bool((dep == np.tril(np.ones_like(dep))).all()),
            "rows_seeing_later": np.flatnonzero(later.any(1)).tolist(),
            "later_inputs_per_row": int(later.sum(1).max()),
            "query0_keys": int((np.asarray(weights)[:, :, 0] > 0).sum(-1).max()),
        }
    return out


def _rows(rows: list) -> str:
    if not rows:
        return "none"
    return ", ".join(map(str, rows)) if len(rows) <= 3 else f"{len(rows)} ({rows[0]}..{rows[-1]})"


def verdict(r):
    ok = (r["1"]["exactly_causal"] and bool(r["0"]["rows_seeing_later"])
          and r["2"]["query0_keys"] == 0)
    return holds(ok, "; ".join(
        f"o={o}: {'exactly causal' if x['exactly_causal'] else 'not causal'}, rows depending on "
        f"a later input: {_rows(x['rows_seeing_later'])}"
        + (f" (up to {x['later_inputs_per_row']} later inputs each)"
           if x["rows_seeing_later"] else "")
        + f", keys visible to query 0: {x['query0_keys']}" for o, x in r.items()))


def _offset(causal, later, keys):
    return {"exactly_causal": causal, "rows_seeing_later": later,
            "later_inputs_per_row": len(later) and 1, "query0_keys": keys}


EXAMPLES = [
    ({"0": _offset(False, list(range(127)), 1), "1": _offset(True, [], 1),
      "2": _offset(False, [], 0)}, "confirmed"),
    ({"0": _offset(False, [0], 0), "1": _offset(True, [], 1),
      "2": _offset(False, list(range(127)), 2)}, "refuted"),
]
