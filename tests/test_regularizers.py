"""Attention regularisers: each term on hand-computable probabilities, its place in the
objective, and the config's refusal of a kernel without attention weights."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_MQAR, tiny_config

from attnjax.config import Config
from attnjax.data import Dataset
from attnjax.ops.masks import visibility
from attnjax.registry import REGULARIZERS
from attnjax.train.regularizers import sharpening_kl, weight_std
from attnjax.train.state import init_state
from attnjax.train.step import make_train_step

ROWS = jnp.asarray([[[[1.0, 0.0], [0.75, 0.25]]]])           # [B=1, N=1, T=2, S=2]


def test_terms_on_hand_computed_rows():
    # sharpened target of [0.75, 0.25] is [0.9, 0.1]; the one-hot row is its own target
    kl = 0.75 * math.log(0.75 / 0.9) + 0.25 * math.log(0.25 / 0.1)
    np.testing.assert_allclose(sharpening_kl((ROWS,)), kl / 2, rtol=1e-6)
    # allowed entries (j <= i): 1, 0.75, 0.25 -> population std
    np.testing.assert_allclose(weight_std((ROWS,)), np.std([1.0, 0.75, 0.25]), rtol=1e-6)
    uniform = jnp.full((1, 1, 1, 4), 0.25)
    np.testing.assert_allclose(sharpening_kl((uniform,)), 0.0, atol=1e-7)
    entropy = REGULARIZERS.get("entropy").term((ROWS,))
    np.testing.assert_allclose(entropy, -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / 2,
                               rtol=1e-6)


# bidirectional over 3 tokens, token 1 a pad: rows 0 and 2 see keys 0 and 2, the pad's row
# and column hold junk; the visible rows are those of ROWS' second row and of a uniform pair
MIDDLE_PAD = visibility(3, 3, causal=False, token_mask=np.array([[True, False, True]]))
PADDED_ROWS = jnp.asarray([[[[0.75, 0.6, 0.25], [0.3, 0.3, 0.4], [0.5, 0.1, 0.5]]]])


def test_terms_under_a_padding_mask_by_hand():
    kl = 0.75 * math.log(0.75 / 0.9) + 0.25 * math.log(0.25 / 0.1)   # row 2's KL is 0
    np.testing.assert_allclose(sharpening_kl((PADDED_ROWS,), MIDDLE_PAD), kl / 2, rtol=1e-6)
    np.testing.assert_allclose(weight_std((PADDED_ROWS,), MIDDLE_PAD),
                               np.std([0.75, 0.25, 0.5, 0.5]), rtol=1e-6)
    entropy = REGULARIZERS.get("entropy").term((PADDED_ROWS,), MIDDLE_PAD)
    np.testing.assert_allclose(
        entropy, (-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) + math.log(2)) / 2, rtol=1e-6)


@pytest.mark.parametrize("name", REGULARIZERS.names())
@pytest.mark.parametrize("T, S", [(5, 5), (33, 33), (3, 5)])
def test_no_mask_is_the_causal_mask_bit_for_bit(name, T, S):
    causal = visibility(T, S, causal=True, offset=S - T)          # j <= i + (S - T)
    logits = 3 * jax.random.normal(jax.random.key(T + S), (2, 3, 4, T, S))
    weights = tuple(jax.nn.softmax(jnp.where(causal, logits, -jnp.inf), -1))   # two layers
    term = REGULARIZERS.get(name).term
    np.testing.assert_array_equal(term(weights), term(weights, causal))


@pytest.mark.parametrize("name", REGULARIZERS.names())
@pytest.mark.parametrize("visible", [MIDDLE_PAD, visibility(3, 3, causal=True)],
                         ids=["padded", "causal"])
def test_no_gradient_reaches_a_hidden_entry(name, visible):
    # positive junk on every entry, hidden ones included
    weights = jax.random.uniform(jax.random.key(0), (2, 2, 3, 3), minval=0.05, maxval=1.0)
    grad = jax.grad(lambda w: REGULARIZERS.get(name).term((w,), visible))(weights)
    shown = np.broadcast_to(visible, weights.shape)
    np.testing.assert_array_equal(np.asarray(grad)[~shown], 0.0)
    assert np.all(np.isfinite(grad)) and np.abs(np.asarray(grad)[shown]).max() > 1e-3


@pytest.mark.parametrize("name", REGULARIZERS.names())
def test_each_regularizer_enters_the_objective_with_its_coefficient(name):
    field = REGULARIZERS.get(name).coefficient
    config = tiny_config(TINY_MQAR)
    weighted = tiny_config(TINY_MQAR, **{f"train.{field}": 0.5})
    batch = Dataset(config.data).batch(0, 0, config.train.batch_size, config.data.length,
                                       "train")
    _, plain = make_train_step(config)(init_state(config), batch)
    _, metrics = make_train_step(weighted)(init_state(weighted), batch)
    assert f"reg/{name}" in metrics and not any(k.startswith("reg/") for k in plain)
    np.testing.assert_allclose(metrics["ce"], plain["ce"], rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], plain["loss"] + 0.5 * metrics[f"reg/{name}"],
                               rtol=1e-5)
    assert metrics["grad_norm"] != plain["grad_norm"]


def test_a_regularizer_needs_a_kernel_with_attention_weights():
    with pytest.raises(ValueError, match=r"^train\.sharpen_reg needs attention weights, which "
                                         r"model\.attention\.kernel='linear'"):
        tiny_config(TINY_MQAR, **{"train.sharpen_reg": 0.1, "model.attention.kernel": "linear"})
    assert isinstance(tiny_config(TINY_MQAR, **{"train.weight_std_reg": -0.1}), Config)
