"""Simulated ("fake") symmetric int8 quantisation: values rounded to one of 255 levels and
computed in floating point, so a trained model can be evaluated as if stored in int8.

    q(x) = clip(round(x / s), -127, 127) * s,   s = max |x| / 127

over a whole tensor (activations: one scale per example, so an example's result does not
depend on the others in its batch) or separately for each output channel of a weight
(per-channel: the max over the contracted axes). Round-to-nearest, so ``|q(x) - x|
<= s / 2``; a block of zeros keeps ``s = 1`` and stays zero. The gradient passes straight
through the rounding (``x + stop_gradient(q(x) - x)``), so a model can also be trained with
it (quantisation-aware training) instead of learning nothing through ``round``.

References: Jacob et al. 2018, "Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference"; Bengio et al. 2013 (the straight-through estimator).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.ops.dense import dense_dot_general

LEVEL = 127                                      # int8 symmetric: -127 .. 127, 255 levels
# what a model quantises (model.attention.int8): nothing, the weights, the weights and inputs
INT8_MODES = ("none", "weights", "weights_inputs")


def fake_int8(x, reduce_axes=None):
    """``q(x)`` with scale ``max |x| / 127`` over ``reduce_axes`` (kept, so it broadcasts;
    None: the whole tensor), in ``x``'s dtype, gradient straight through."""
    peak = jnp.max(jnp.abs(x), axis=reduce_axes, keepdims=True)
    scale = jnp.where(peak > 0, peak / LEVEL, 1.0).astype(x.dtype)
    rounded = jnp.clip(jnp.round(x / scale), -LEVEL, LEVEL) * scale
    return x + jax.lax.stop_gradient(rounded - x)


def int8_dot_general(inputs: bool):
    """A ``jax.lax.dot_general`` whose right operand (a projection's kernel) is fake-int8 per
    output channel (the scale's max over the contracted axes) and, with ``inputs``, whose left
    operand (the layer's input activations, batch first) is fake-int8 per example (the
    scale's max over every other axis); for the ``dot_general`` of a Flax ``Dense``."""
    def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
        (_, contracted), _ = dimension_numbers
        rhs = fake_int8(rhs, tuple(contracted))
        lhs = fake_int8(lhs, tuple(range(1, lhs.ndim))) if inputs else lhs
        return dense_dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                 preferred_element_type=preferred_element_type)
    return dot_general
