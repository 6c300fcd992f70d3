"""Tests for the model fields checkpoints need: ``norm_eps``, ``mlp`` (``gelu_exact``),
``mlp_hidden``, ``mlp_bias`` next to ``attention.use_bias``, and that their defaults leave the
model as it was.

Values, not "it runs": the epsilon each norm uses, the hidden width, the activation against
the float64 formula, which biases exist. Models are the tiny ones of ``test_nn``.
"""

import inspect
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.config import AttentionConfig, ModelConfig
from attnjax.models.decoder import DecoderLM
from attnjax.nn import FeedForward
from attnjax.nn.slots import make_norm
from attnjax.nn.transformer import mlp_width
from helpers import raises_one_line
from test_nn import D, LAYERS, MAX_LEN, T_FULL, init_params, logits_of, tiny, tokens_of

NEW_DEFAULTS = dict(norm_eps=1e-6, mlp="gelu", mlp_hidden=None, mlp_bias=True)


def _layer_norm(x, eps):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps)


def _rms_norm(x, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


BY_HAND = {"layer": _layer_norm, "rms": _rms_norm}


# ------------------------------------------------------------------ defaults: today's model


def test_norm_eps_default_is_flax_default():
    """Before ``norm_eps`` every norm was Flax's with its default epsilon."""
    for norm in (nn.LayerNorm, nn.RMSNorm):
        assert inspect.signature(norm).parameters["epsilon"].default == ModelConfig().norm_eps


def test_default_logits_as_before_the_fields_existed():
    """Logits of a fixed tiny model and seed, summed, as computed before these fields."""
    tokens = tokens_of(MAX_LEN, batch=2, seed=0)
    expected = {"default": (tiny("rope"), -22.574548597447574),
                "swiglu_rms": (tiny("rope", model=dict(mlp="swiglu", norm="rms")),
                               8.819251976941814)}
    for name, (config, value) in expected.items():
        logits = np.asarray(logits_of(config, init_params(config, tokens), tokens), np.float64)
        assert logits.sum() == pytest.approx(value, abs=1e-3), name


@pytest.mark.parametrize("mlp, hidden", [("gelu", 4 * D), ("swiglu", 88)])
def test_explicit_defaults_are_bit_identical(mlp, hidden):
    """The new fields at their defaults, and ``mlp_hidden`` at the width ``mlp_ratio`` gives,
    build the same parameters and the same logits, bit for bit."""
    tokens = tokens_of(T_FULL)
    base = tiny("rope", model=dict(mlp=mlp))
    params = init_params(base, tokens)
    logits = logits_of(base, params, tokens)
    for fields in ({**NEW_DEFAULTS, "mlp": mlp}, {"mlp": mlp, "mlp_hidden": hidden}):
        config = tiny("rope", model=fields)
        assert mlp_width(config) == mlp_width(base) == hidden
        other = init_params(config, tokens)
        assert jax.tree.structure(other) == jax.tree.structure(params)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(other),
                                                        jax.tree.leaves(params), strict=True))
        np.testing.assert_array_equal(logits_of(config, other, tokens), logits)


# ------------------------------------------------------------------------------ norm_eps


class _Norm(nn.Module):
    config: ModelConfig
    kind: str

    @nn.compact
    def __call__(self, x):
        return make_norm(self.config, "norm", self.kind)(x)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_eps_is_the_epsilon_used(kind):
    """An input of variance ~1e-8, where the epsilon decides the output's scale: each norm
    equals ``x_centred / sqrt(var + eps)`` (layer) or ``x / sqrt(mean x^2 + eps)`` (rms) at
    the configured epsilon, and the epsilons give different outputs."""
    x = 1e-4 * np.asarray(jax.random.normal(jax.random.key(0), (3, D)), np.float64)
    outputs = {}
    for eps in (1e-12, 1e-5):
        norm = _Norm(ModelConfig(norm_eps=eps), kind)
        params = norm.init(jax.random.key(1), jnp.asarray(x, jnp.float32))
        outputs[eps] = np.asarray(norm.apply(params, jnp.asarray(x, jnp.float32)), np.float64)
        np.testing.assert_allclose(outputs[eps], BY_HAND[kind](x, eps), rtol=1e-4, atol=1e-6)
    # eps 1e-12: unit RMS; eps 1e-5: about sqrt(1e-8 / 1e-5) ~ 0.03
    np.testing.assert_allclose(np.sqrt((outputs[1e-12]**2).mean(-1)), 1.0, rtol=1e-3)
    assert np.sqrt((outputs[1e-5]**2).mean(-1)).max() < 0.05


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_every_norm_of_the_model_uses_norm_eps(kind):
    """In a pre-norm DecoderLM at an epsilon that matters next to the residual stream's
    variance (~4e-4 at the embedding, ~1 after the blocks), every block's ``attention_norm``
    and ``mlp_norm`` and the ``final_norm`` (gain 1, bias 0 at initialisation) map their
    inputs as the formula with that epsilon does."""
    eps = 0.5
    config = tiny("rope", model=dict(norm=kind, norm_eps=eps))
    tokens = tokens_of(T_FULL)
    params = init_params(config, tokens)
    wanted = {"attention_norm", "mlp_norm", "final_norm"}
    _, state = DecoderLM(config).apply(
        {"params": params}, tokens, mutable=["intermediates"],
        capture_intermediates=lambda module, method: (module.name in wanted
                                                      and method == "__call__"))
    seen = jax.tree.map(lambda a: np.asarray(a, np.float64), state["intermediates"])
    pairs = []
    # rope: the token embeddings x 1, nothing added
    x = np.asarray(params["embed"]["embedding"], np.float64)[np.asarray(tokens)]
    for i in range(LAYERS):
        block = seen[f"block_{i}"]
        pairs.append((x, block["attention_norm"]["__call__"][0]))
        pairs.append((x + block["attn_out"][0], block["mlp_norm"]["__call__"][0]))
        x = block["residual"][0]
    pairs.append((x, seen["final_norm"]["__call__"][0]))
    for x, y in pairs:
        np.testing.assert_allclose(y, BY_HAND[kind](x, eps), rtol=1e-5, atol=1e-5)
        assert np.abs(y - BY_HAND[kind](x, 1e-6)).max() > 0.1   # the epsilon matters here


# ------------------------------------------------------------------------------ the MLP


def _identity_mlp(mlp):
    """A FeedForward d -> d -> d with identity kernels and no biases: ``y = act(x)``."""
    config = ModelConfig(d_model=8, mlp=mlp, mlp_hidden=8, mlp_bias=False,
                         attention=AttentionConfig(num_heads=1))
    eye = jnp.eye(8)
    return FeedForward(config), {"up": {"kernel": eye}, "down": {"kernel": eye}}


def test_gelu_exact_is_the_erf_gelu_and_gelu_is_the_tanh_one():
    x64 = np.linspace(-6.0, 6.0, 8 * 31).reshape(31, 8)
    exact = np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))(x64)
    tanh = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
    got = {}
    for mlp in ("gelu_exact", "gelu"):
        module, params = _identity_mlp(mlp)
        got[mlp] = np.asarray(module.apply({"params": params}, jnp.asarray(x64, jnp.float32)),
                              np.float64)
    np.testing.assert_allclose(got["gelu_exact"], exact, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["gelu"], tanh, rtol=0, atol=1e-6)
    assert np.abs(got["gelu_exact"] - got["gelu"]).max() > 4e-4    # ~4.7e-4 near |x| = 2.7


@pytest.mark.parametrize("mlp", ["gelu", "gelu_exact", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_mlp_hidden_width_and_biases(mlp, bias):
    """``mlp_hidden`` = 100 (no ``mlp_ratio`` gives it for SwiGLU: not a multiple of 8) is the
    hidden width, ``mlp_bias`` puts a bias on every projection or on none, and the output is
    the formula's."""
    hidden = 100
    config = ModelConfig(d_model=D, mlp=mlp, mlp_hidden=hidden, mlp_bias=bias,
                         attention=AttentionConfig(num_heads=4))
    x = jax.random.normal(jax.random.key(0), (2, T_FULL, D))
    params = FeedForward(config).init(jax.random.key(1), x)["params"]
    up = "gate_up" if mlp == "swiglu" else "up"
    width = 2 * hidden if mlp == "swiglu" else hidden
    expected = {up: {"kernel": (D, width)}, "down": {"kernel": (hidden, D)}}
    if bias:
        expected[up]["bias"], expected["down"]["bias"] = (width,), (D,)
    assert jax.tree.map(lambda a: a.shape, params) == expected
    first = x @ params[up]["kernel"] + (params[up]["bias"] if bias else 0.0)
    if mlp == "swiglu":
        gate, value = jnp.split(first, 2, -1)
        h = jax.nn.silu(gate) * value
    else:
        h = jax.nn.gelu(first, approximate=mlp == "gelu")
    out = h @ params["down"]["kernel"] + (params["down"]["bias"] if bias else 0.0)
    np.testing.assert_allclose(FeedForward(config).apply({"params": params}, x), out,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mlp_bias, attention_bias", [(True, False), (False, True),
                                                      (False, False), (True, True)])
def test_mlp_and_attention_biases_are_separate(mlp_bias, attention_bias):
    """In every block, the MLP's projections have biases exactly when ``mlp_bias``, the
    attention's (qkv and out) exactly when ``attention.use_bias``; the norms keep theirs."""
    config = tiny("rope", use_bias=attention_bias, model=dict(mlp_bias=mlp_bias))
    params = init_params(config, tokens_of(T_FULL))
    for i in range(LAYERS):
        block = params[f"block_{i}"]
        assert {name: "bias" in p for name, p in block["mlp"].items()} == {
            "up": mlp_bias, "down": mlp_bias}
        assert {name: "bias" in p for name, p in block["attention"].items()} == {
            "qkv": attention_bias, "out": attention_bias}
        assert "bias" in block["attention_norm"] and "bias" in block["mlp_norm"]


def test_mlp_ratio_beside_mlp_hidden_is_refused():
    assert mlp_width(ModelConfig(mlp_hidden=11008, mlp="swiglu")) == 11008
    raises_one_line(lambda: ModelConfig(mlp_hidden=11008, mlp_ratio=2.0),
                    "model.mlp_ratio=2.0 means nothing with mlp_hidden=11008",
                    "mlp_hidden sets the hidden width")
