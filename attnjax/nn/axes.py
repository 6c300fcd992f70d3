"""Logical axes: every parameter names its axes where it is made, and activations name theirs
where the model constrains them; ``attnjax.sharding``'s one rules table maps the names to mesh
axes.

Parameter axes: ``with_axes(init, "embed", "mlp")`` is ``init`` whose values carry those
names (Flax's ``LogicallyPartitioned`` boxes) while ``declaring()`` is entered, and plain
arrays otherwise, so every other reader of a model's parameters (training, checkpoints, the
import, the analysis) sees the same tree as before. The names, in one place:

- ``vocab``, ``embed`` (the model width of a matrix), ``mlp`` (the MLP's hidden width),
  ``heads`` and ``kv_heads`` (query and key/value heads of a projection), ``head_dim``,
  ``qkv`` (the stacked query, key and value heads of the fused projection), ``norm`` (a norm's
  scale and bias, and biases of width d), ``position`` (a learned table's rows), ``buckets``
  (relative-position buckets), ``types`` (token types), ``classes``, ``embed_out`` (a square
  matrix's second model-width axis).

Activation axes (``constrain``): ``batch``, ``length``, ``act_embed``, ``act_heads``,
``act_kv_heads``, ``act_mlp``, ``act_vocab``. ``constrain`` is the identity unless a training
program is traced under ``laid_out`` (a mesh with a model axis).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable

import flax.linen as nn
import jax

_declaring = contextvars.ContextVar("attnjax_declaring_axes", default=False)
_layout: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "attnjax_activation_layout", default=None)


@contextlib.contextmanager
def declaring():
    """Within it, parameters are initialised in boxes naming their logical axes
    (``flax.linen.get_partition_spec`` reads them)."""
    token = _declaring.set(True)
    try:
        yield
    finally:
        _declaring.reset(token)


def with_axes(init: Callable, *names: str | None) -> Callable:
    """``init`` whose parameter has the logical axes ``names`` (one per dimension; ``None``:
    never sharded). The values drawn, and the random numbers they use, are ``init``'s (a
    ``DenseGeneral`` draws its kernel flat and reshapes the box to the names' rank)."""
    def initializer(key, shape, dtype=jax.numpy.float32):
        value = init(key, shape, dtype)
        return nn.LogicallyPartitioned(value, names) if _declaring.get() else value
    return initializer


def dense(kernel: tuple, bias: tuple, kernel_init: Callable | None = None) -> dict:
    """``kernel_init`` and ``bias_init`` of a Flax ``Dense`` / ``DenseGeneral`` whose kernel
    has the axes ``kernel`` and bias ``bias`` (Flax's defaults: LeCun normal, zeros)."""
    return {"kernel_init": with_axes(kernel_init or nn.initializers.lecun_normal(), *kernel),
            "bias_init": with_axes(nn.initializers.zeros_init(), *bias)}


@contextlib.contextmanager
def laid_out(sharding_of: Callable):
    """Within it, ``constrain(x, *names)`` pins ``x`` to ``sharding_of(names, x.shape)``."""
    token = _layout.set(sharding_of)
    try:
        yield
    finally:
        _layout.reset(token)


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
    """``x`` with the sharding its logical axes ``names`` have under the current layout
    (``laid_out``); ``x`` itself outside one."""
    sharding_of = _layout.get()
    if sharding_of is None:
        return x
    return jax.lax.with_sharding_constraint(x, sharding_of(names, x.shape))
