"""SC6: logits 100 and 101 overflow float32 (e^100 = e^101 = inf), so softmax([100, 101]) is
[0, 1] and passes zero gradient.

Measure, all float32: (a) ``exp(100)``, ``exp(101)``; (b) softmax of the logits [100, 101] and
its Jacobian ``dp_i / ds_j`` in three implementations: the naive ``exp(s) / sum(exp(s))``,
``jax.nn.softmax``, and attnjax's reference kernel, where the logits are the scores of one
query ``q = [1]`` against keys ``k = [[100], [101]]`` at ``scale=1`` (the weights come back
with ``return_weights``, the Jacobian is taken with respect to ``k``, which here *is* ``s``).

Left open: "the gradient" of a softmax is read as its Jacobian; part (b) is judged on the
max-subtracted implementations (jax.nn and the reference kernel) as the criterion says; the
naive one is reported.

    attnjax audit experiments/claims --workdir runs/claims --only SC6
"""

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds
from attnjax.ops import dot_product_attention

ID = "SC6"
SOURCE = "002 §3.2"
CLAIM = "float32 e^100 and e^101 overflow, so softmax([100, 101]) = [0, 1] with zero gradient"
CRITERION = ("(a) exp(100), exp(101) both inf; (b) output exactly [0, 1] and gradient exactly 0 "
             "in the max-subtracted implementations")
LOGITS = np.array([100.0, 101.0], np.float32)


def _naive(s):
    e = jnp.exp(s)
    return e / e.sum()


def _kernel(s):
    """The reference kernel's weights for one query whose scores against two keys are ``s``."""
    one = jnp.ones((1, 1, 1, 1), jnp.float32)
    _, weights = dot_product_attention(one, s.reshape(1, 2, 1, 1), jnp.ones((1, 2, 1, 1)),
                                       scale=1.0, return_weights=True)
    return weights.reshape(2)


IMPLEMENTATIONS = {"naive": _naive, "jax.nn.softmax": jax.nn.softmax, "reference": _kernel}
MAX_SUBTRACTED = ("jax.nn.softmax", "reference")


def measure() -> dict:
    s = jnp.asarray(LOGITS)
    out = {"exp": [float(jnp.exp(jnp.float32(x))) for x in LOGITS]}
    for name, fn in IMPLEMENTATIONS.items():
        out[name] = {"softmax": np.asarray(jax.jit(fn)(s)).tolist(),
                     "jacobian": np.asarray(jax.jit(jax.jacobian(fn))(s)).tolist()}
    return out


def _exact(r) -> bool:
    return r["softmax"] == [0.0, 1.0] and not np.any(np.asarray(r["jacobian"]))


def _show(r) -> str:
    jac = np.asarray(r["jacobian"], float)
    return (f"[{r['softmax'][0]:.4g}, {r['softmax'][1]:.4g}], "
            f"max |J| {np.max(np.abs(jac)):.4g}")


def verdict(r):
    naive = r["naive"]
    naive_jacobian = "NaN" if np.isnan(np.asarray(naive["jacobian"], float)).any() else "finite"
    return {
        "a": holds(all(np.isinf(x) and x > 0 for x in r["exp"]),
                   f"float32 exp(100) = {r['exp'][0]}, exp(101) = {r['exp'][1]}"),
        "b": holds(all(_exact(r[name]) for name in MAX_SUBTRACTED),
                   "; ".join(f"{name}: {_show(r[name])}" for name in MAX_SUBTRACTED)
                   + f" (naive exp/sum: {naive['softmax']}, Jacobian {naive_jacobian})"),
    }


_J = [[0.1966, -0.1966], [-0.1966, 0.1966]]
_HEALTHY = {"softmax": [0.2689, 0.7311], "jacobian": _J}
_SATURATED = {"softmax": [0.0, 1.0], "jacobian": [[0.0, 0.0], [0.0, 0.0]]}
_NAN = {"softmax": [float("nan")] * 2, "jacobian": [[float("nan")] * 2] * 2}
EXAMPLES = [
    ({"exp": [float("inf")] * 2, "naive": _NAN, "jax.nn.softmax": _SATURATED,
      "reference": _SATURATED}, {"a": "confirmed", "b": "confirmed"}),
    ({"exp": [2.7e43, float("inf")], "naive": _NAN, "jax.nn.softmax": _HEALTHY,
      "reference": _SATURATED}, {"a": "refuted", "b": "refuted"}),
]
