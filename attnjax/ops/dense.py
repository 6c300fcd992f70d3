"""A dense layer's product ``y = x W`` (``x``'s trailing axes against ``W``'s leading ones),
whose kernel gradient XLA:CPU computes at the rate of its fast matrix product.

The kernel's gradient ``dW = x^T dy`` contracts the token axes, which lead both ``x`` and
``dy``. XLA:CPU gives YNNPACK only products whose left operand is contracted over its minor
axes, and sends this one to Eigen, slower for the same FLOPs (tests/test_dense.py checks
where each product goes; docs/PERFORMANCE.md has the training rates). So on the CPU the
backward pass here first transposes the narrower of ``x`` and ``dy`` (tokens x its feature
width), behind an optimisation barrier that keeps XLA's simplifier from folding the transpose
back into the product::

    dW = (x^T) dy            when x is the narrower (its transpose a copy, then YNNPACK)
    dW = ((dy^T) x)^T        otherwise (the small [width_out, width_in] result transposed)

The forward product and the input gradient ``dx = dy W^T`` are XLA's own, unchanged; on other
backends (whose matrix libraries take transposed operands as they are), and for products of
another shape, this is ``jax.lax.dot_general`` itself.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None,
                      preferred_element_type=None):
    """``jax.lax.dot_general`` for the ``dot_general`` of a Flax ``Dense`` / ``DenseGeneral``:
    on the CPU, a product of ``lhs``'s trailing axes with ``rhs``'s leading ones (no batch
    axes) gets the backward pass of the module docstring."""
    count = len(dimension_numbers[0][0])
    given = tuple(tuple(tuple(axes) for axes in pair) for pair in dimension_numbers)
    if (given != _numbers(lhs, count) or preferred_element_type is not None
            or jax.default_backend() != "cpu"):
        return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
    return _dense_product(lhs, rhs, count, precision)


def _numbers(x, count: int):
    """``x``'s trailing ``count`` axes against the kernel's leading ones."""
    return ((tuple(range(x.ndim - count, x.ndim)), tuple(range(count))), ((), ()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dense_product(x, w, count: int, precision):
    return lax.dot_general(x, w, _numbers(x, count), precision=precision)


def _forward(x, w, count, precision):
    return _dense_product(x, w, count, precision), (x, w)


def _backward(count, precision, residuals, dy):
    x, w = residuals
    lead = x.ndim - count                                    # the token axes of x and dy
    tokens = tuple(range(lead))
    dx = lax.dot_general(dy, w, ((tuple(range(lead, dy.ndim)), tuple(range(count, w.ndim))),
                                 ((), ())), precision=precision)
    width_in, width_out = math.prod(x.shape[lead:]), math.prod(dy.shape[lead:])
    if width_in <= width_out:
        xt = lax.optimization_barrier(jnp.transpose(x, (*range(lead, x.ndim), *tokens)))
        dw = lax.dot_general(xt, dy, ((tuple(range(count, x.ndim)), tokens), ((), ())),
                             precision=precision)
    else:
        outs = dy.ndim - lead
        dyt = lax.optimization_barrier(jnp.transpose(dy, (*range(lead, dy.ndim), *tokens)))
        dwt = lax.optimization_barrier(lax.dot_general(
            dyt, x, ((tuple(range(outs, dy.ndim)), tokens), ((), ())), precision=precision))
        dw = jnp.transpose(dwt, (*range(outs, outs + count), *range(outs)))
    return dx, dw.astype(w.dtype)


_dense_product.defvjp(_forward, _backward)
