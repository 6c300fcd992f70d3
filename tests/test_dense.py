"""A dense layer's product (``attnjax.ops.dense``): values and both gradients against float64
NumPy, jitted and not, under ``vmap`` as sweeps batch runs; every product of its backward pass
compiled to YNNPACK on the CPU (XLA's own sends the kernel gradient to Eigen); other products
left to XLA; and every dense layer of every model family built with it."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.models import build
from attnjax.ops.dense import dense_dot_general

from helpers import TINY_CLASSIFY, TINY_MLM, TINY_SEQ2SEQ, TINY_TEXT, tiny_config

# (x shape, kernel shape, contracted axes): an MLP widening and narrowing, fused q/k/v heads
# out of the model width, the output projection over heads x head width, tokens without a batch
SHAPES = {"widen": ((2, 12, 8), (8, 24), 1), "narrow": ((2, 12, 24), (24, 8), 1),
          "heads out": ((2, 12, 8), (8, 3, 4), 1), "heads in": ((2, 12, 3, 4), (3, 4, 8), 2),
          "tokens only": ((12, 8), (8, 6), 1)}


# float32 against float64: each product and gradient sums at most 24 terms, so its rounding
# error is at most 24 u (u = 2^-24: 1.4e-6) of its terms' magnitude; the loss sums 576 terms,
# whose round-to-nearest error grows like sqrt(576) u, the same 24 u; float32 sin and cos add
# about one u. 1e-5 is seven times that bound
TOL = dict(rtol=1e-5, atol=1e-5)


def numbers(x_ndim: int, count: int):
    return ((tuple(range(x_ndim - count, x_ndim)), tuple(range(count))), ((), ()))


def operands(x_shape, w_shape, count=1, seed=0):
    """float64 ``x``, kernel and the loss's weights (of the product's shape)."""
    rng = np.random.default_rng(seed)
    out_shape = x_shape[:len(x_shape) - count] + w_shape[count:]
    return (rng.normal(size=x_shape), rng.normal(size=w_shape), rng.normal(size=out_shape))


def loss(dot, count):
    """``sum(weights * sin(x W))``: every output gets its own cotangent."""
    return lambda x, w, weights: jnp.sum(weights * jnp.sin(dot(x, w, numbers(x.ndim, count))))


def float64_reference(x, w, weights, count):
    """Loss and gradients of ``loss`` in float64: ``dy = weights cos(y)``, ``dx = dy W^T``,
    ``dW = x^T dy`` (over every token axis)."""
    lead = x.ndim - count
    X = x.reshape(int(np.prod(x.shape[:lead])), -1)
    W = w.reshape(X.shape[1], -1)
    Y = X @ W
    dY = weights.reshape(Y.shape) * np.cos(Y)
    return (np.sum(weights.reshape(Y.shape) * np.sin(Y)), (dY @ W.T).reshape(x.shape),
            (X.T @ dY).reshape(w.shape))


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_value_and_gradients_match_float64(shape, jit):
    x_shape, w_shape, count = SHAPES[shape]
    x, w, weights = operands(x_shape, w_shape, count)
    fn = jax.value_and_grad(loss(dense_dot_general, count), argnums=(0, 1))
    fn = jax.jit(fn) if jit else fn
    value, (dx, dw) = fn(*(jnp.asarray(a, jnp.float32) for a in (x, w, weights)))
    chex.assert_shape(dx, x_shape)
    chex.assert_shape(dw, w_shape)
    ref_value, ref_dx, ref_dw = float64_reference(x, w, weights, count)
    np.testing.assert_allclose(value, ref_value, **TOL)
    np.testing.assert_allclose(dx, ref_dx, **TOL)
    np.testing.assert_allclose(dw, ref_dw, **TOL)


def test_vmapped_as_a_sweep_batches_runs_each_member_gets_its_own_gradients():
    x_shape, w_shape, count = SHAPES["narrow"]
    members = [operands(x_shape, w_shape, count, seed) for seed in range(3)]
    stacked = [jnp.asarray(np.stack(a), jnp.float32) for a in zip(*members)]
    grads = jax.jit(jax.vmap(jax.grad(loss(dense_dot_general, count), argnums=(0, 1))))(*stacked)
    for i, member in enumerate(members):
        _, ref_dx, ref_dw = float64_reference(*member, count)
        np.testing.assert_allclose(grads[0][i], ref_dx, **TOL)
        np.testing.assert_allclose(grads[1][i], ref_dw, **TOL)


def compiled_products(dot, shape: str) -> tuple[int, int]:
    """``(products, products in a YNNPACK fusion)`` of the compiled gradient of ``loss``."""
    x_shape, w_shape, count = SHAPES[shape]
    args = [jnp.asarray(a, jnp.float32) for a in operands(x_shape, w_shape, count)]
    text = jax.jit(jax.grad(loss(dot, count), argnums=(0, 1))).lower(*args).compile().as_text()
    return text.count(" dot("), text.count("__ynn_fusion")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's choice of matrix library")
@pytest.mark.parametrize("shape", ["widen", "narrow"])
def test_every_product_of_the_gradient_goes_to_ynnpack_on_the_cpu(shape):
    assert compiled_products(dense_dot_general, shape) == (3, 3)
    # the reason for it: XLA's own gradient gives the kernel's product to Eigen
    assert compiled_products(jax.lax.dot_general, shape) == (3, 2)


@pytest.mark.parametrize("x_shape, w_shape, dimension_numbers, preferred", [
    ((2, 12, 8), (2, 8, 5), (((2,), (1,)), ((0,), (0,))), None),   # a batched product
    ((2, 12, 8), (12, 5), (((1,), (0,)), ((), ())), None),          # a middle axis of x
    ((2, 12, 8), (8, 5), (((2,), (0,)), ((), ())), jnp.float32),    # a chosen result type
], ids=["batched", "middle axis", "result type"])
def test_other_products_are_xlas_own(x_shape, w_shape, dimension_numbers, preferred):
    x, w = (jnp.asarray(a, jnp.float32) for a in operands(x_shape, w_shape)[:2])
    ours = lambda x, w: dense_dot_general(x, w, dimension_numbers,
                                          preferred_element_type=preferred)
    assert "custom_vjp" not in str(jax.make_jaxpr(ours)(x, w))
    np.testing.assert_array_equal(ours(x, w), jax.lax.dot_general(
        x, w, dimension_numbers, preferred_element_type=preferred))


@pytest.mark.parametrize("base, overrides", [
    (TINY_TEXT, {}), (TINY_TEXT, {"model.attention.fused_qkv": False}),
    (TINY_TEXT, {"model.attention.fused_qkv": False, "model.attention.per_head_projections": True,
                 "model.tie_embeddings": False, "model.mlp": "swiglu"}),
    (TINY_TEXT, {"model.attention.int8": "weights_inputs"}),
    (TINY_MLM, {}), (TINY_CLASSIFY, {}), (TINY_SEQ2SEQ, {}),
], ids=["decoder", "separate", "per head untied swiglu", "int8", "mlm", "classify", "seq2seq"])
def test_every_dense_layer_of_every_family_uses_it(base, overrides):
    config = tiny_config(base, **overrides)
    seen = {}

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, (nn.Dense, nn.DenseGeneral)):
            seen["/".join(context.module.scope.path)] = context.module.dot_general
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda: build(config.model).init(
            jax.random.key(0), jnp.zeros((1, config.data.length), jnp.int32)))
    int8 = config.model.attention.int8 != "none"
    assert seen and {name for name, dot in seen.items() if not (
        dot is dense_dot_general or int8 and "attention" in name
        and dot.__qualname__.startswith("int8_dot_general"))} == set()
