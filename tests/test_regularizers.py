"""Attention regularisers: each term on hand-computable probabilities, its place in the
objective, and the config's refusal of a kernel without attention weights."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TINY_MQAR, tiny_config

from attnjax.config import Config
from attnjax.data import Dataset
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
