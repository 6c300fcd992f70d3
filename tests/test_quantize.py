"""Simulated int8 (``attnjax.ops.quantize``, ``model.attention.int8``, ``model.cross_int8``):
the rounding against a float64 NumPy version and hand-computed values, the projections it
applies to in every layout, and the layer kinds a seq2seq model quantises."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

from attnjax.config import AttentionConfig, ModelConfig
from attnjax.models import build
from attnjax.nn import MultiHeadAttention
from attnjax.ops.quantize import fake_int8, int8_dot_general
from attnjax.parity import oracle_attention
from attnjax.train.state import init_params

from helpers import TINY_SEQ2SEQ, tiny_config


def q_ref(x, reduce_axes=None):
    """float64: symmetric int8, scale max|x| / 127 over ``reduce_axes`` (1 where all zero)."""
    x = np.asarray(x, np.float64)
    peak = np.abs(x).max(axis=reduce_axes, keepdims=True)
    scale = np.where(peak > 0, peak / 127, 1.0)
    return np.clip(np.round(x / scale), -127, 127) * scale


def test_hand_computed_levels():
    # s = 1.27 / 127 = 0.01: 0.5 and -0.333 land on 50 and -33 levels; 0.004 rounds to 0
    x = np.array([0.0, 0.5, -0.333, 1.27, -1.27, 0.004], np.float32)
    np.testing.assert_allclose(fake_int8(jnp.asarray(x)),
                               [0.0, 0.5, -0.33, 1.27, -1.27, 0.0], atol=1e-7)
    np.testing.assert_array_equal(fake_int8(jnp.zeros(4)), np.zeros(4))   # no 0 / 0


@pytest.mark.parametrize("axes", [None, (0,), (0, 1)])
def test_matches_the_float64_version_with_255_levels_and_half_a_step_of_error(axes):
    x = np.random.default_rng(0).normal(size=(16, 3, 5)).astype(np.float32)
    got = np.asarray(fake_int8(jnp.asarray(x), axes), np.float64)
    np.testing.assert_allclose(got, q_ref(x, axes), rtol=1e-6, atol=1e-7)
    scale = np.abs(x).max(axis=axes, keepdims=True) / 127
    levels = np.round(got / scale)
    assert np.abs(levels).max() == 127 and len(np.unique(levels)) <= 255
    assert (np.abs(got - x) <= scale / 2 * (1 + 1e-5)).all()


def test_the_gradient_passes_straight_through():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(4, 6)), jnp.float32)
    np.testing.assert_array_equal(jax.grad(lambda x: (fake_int8(x, (0,)) * 3.0).sum())(x),
                                  np.full((4, 6), 3.0))


@pytest.mark.parametrize("inputs", [False, True])
def test_the_product_rounds_each_output_channel_of_the_kernel(inputs):
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(4, 5, 6))     # contract (4, 5)
    numbers = (((2, 3), (0, 1)), ((), ()))
    got = int8_dot_general(inputs)(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32),
                                   numbers)
    want = np.einsum("btne,ned->btd", q_ref(x, (1, 2, 3)) if inputs else x, q_ref(w, (0, 1)))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


def rounded_kernels(params, where=lambda path: True):
    """The parameter tree with every kernel under a path ``where`` accepts rounded per output
    channel: the output projection ``out`` [N, D, d] over its first two axes, the others
    (``qkv``, ``query``, ``key_j`` ...) over their input axis."""
    def rounded(path, value):
        if path[-1] != "kernel" or not where(path):
            return value
        axes = (0, 1) if path[-2] == "out" else (0,)
        return jnp.asarray(q_ref(value, axes), value.dtype)
    return unflatten_dict({path: rounded(path, value)
                           for path, value in flatten_dict(params).items()})


LAYOUTS = {"fused": {}, "separate": {"fused_qkv": False},
           "per_head": {"fused_qkv": False, "per_head_projections": True},
           "gqa": {"num_kv_heads": 2, "fused_qkv": False}}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_weights_is_the_float_module_on_rounded_kernels(layout):
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 9, 32)), jnp.float32)
    configs = {mode: ModelConfig(d_model=32, num_layers=1, max_length=16, attention=(
        AttentionConfig(num_heads=4, int8=mode, **LAYOUTS[layout])))
        for mode in ("none", "weights")}
    modules = {mode: MultiHeadAttention(c) for mode, c in configs.items()}
    params = modules["none"].init(jax.random.key(0), x, jnp.arange(9)[None])["params"]
    run = lambda mode, p: modules[mode].apply({"params": p}, x, jnp.arange(9)[None])[0]
    np.testing.assert_allclose(run("weights", params), run("none", rounded_kernels(params)),
                               rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(run("weights", params) - run("none", params))).max() > 1e-4


def test_int8_inputs_in_cross_attention_against_a_float64_oracle():
    rng = np.random.default_rng(4)
    x, source = rng.normal(size=(2, 5, 32)), rng.normal(size=(2, 7, 32))
    source_mask = np.arange(7)[None, :] < np.array([[7], [4]])
    source[~source_mask] = 0.0
    cfg = ModelConfig(d_model=32, num_layers=1, max_length=16,
                      attention=AttentionConfig(num_heads=4, int8="weights_inputs"))
    module = MultiHeadAttention(cfg, cross=True)
    args = dict(source=jnp.asarray(source, jnp.float32), source_mask=source_mask)
    params = module.init(jax.random.key(0), jnp.asarray(x, jnp.float32), None, **args)["params"]
    got = module.apply({"params": params}, jnp.asarray(x, jnp.float32), None, **args)[0]
    w = {name: q_ref(params[name]["kernel"], (0, 1) if name == "out" else (0,))
         for name in ("query", "key", "value", "out")}
    per_example = lambda a: q_ref(a, tuple(range(1, a.ndim)))
    q = np.einsum("btd,dnh->btnh", per_example(x), w["query"])
    k = np.einsum("bsd,dkh->bskh", per_example(source), w["key"])
    v = np.einsum("bsd,dkh->bskh", per_example(source), w["value"])
    heads = oracle_attention(q, k, v, mask=source_mask[:, None, None, :])
    want = np.einsum("btnh,nhd->btd", per_example(heads), w["out"])
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kinds", [("self", "weights", "none"), ("cross", "none", "weights"),
                                   ("all", "weights", None)])
def test_a_seq2seq_model_rounds_the_layer_kinds_its_config_names(kinds):
    kind, self_mode, cross_mode = kinds
    plain = tiny_config(TINY_SEQ2SEQ, **{"model.num_layers": 2})
    quantised = tiny_config(TINY_SEQ2SEQ, **{"model.num_layers": 2,
                                             "model.attention.int8": self_mode,
                                             "model.cross_int8": cross_mode})
    params = init_params(plain)
    is_cross = lambda path: "cross_attention" in path
    is_self = lambda path: "attention" in path                 # encoder's and decoder's
    where = {"self": is_self, "cross": is_cross,
             "all": lambda p: is_self(p) or is_cross(p)}[kind]
    rng = np.random.default_rng(5)
    source = rng.integers(0, 9, (2, 12))
    inputs = rng.integers(0, 9, (2, 12))
    logits = lambda config, p: build(config.model).apply({"params": p}, inputs, source=source)[0]
    np.testing.assert_allclose(logits(quantised, params),
                               logits(plain, rounded_kernels(params, where)),
                               rtol=1e-5, atol=1e-5)


def test_bad_int8_settings_are_one_line_refusals():
    with pytest.raises(ValueError, match=r"^model.attention.int8='int4' is not valid; "
                                         r"choices: none, weights, weights_inputs$"):
        tiny_config(TINY_SEQ2SEQ, **{"model.attention.int8": "int4"})
    with pytest.raises(ValueError, match="model.cross_int8") as refusal:
        tiny_config({}, **{"model.cross_int8": "weights"})
    assert "\n" not in str(refusal.value)
