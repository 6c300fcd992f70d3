"""Named points (``attnjax.nn.points``) and ``attnjax.analysis.patching``: every family names
its points; a captured value is what the model computes there (the probabilities the model
returns, the residual stream it sows, each head's output recomputed from them); with nothing
selected or patched the lowered program is the ordinary one; patching a point with its own
value changes nothing, bit for bit; patching every head's output from a clean run into a
corrupted one gives the clean logits wherever the tokens agree; zero-ablating a head is the
head knockout; W worlds in one pass equal W single passes; a kernel without softmax scores is
refused in one line."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.analysis.capture import attention_weights
from attnjax.analysis.patching import (ablation, default_group, heads_where, lower, match_points,
                                       patch, point_names, run, run_worlds, stack)
from attnjax.data import Dataset
from attnjax.models import build, family
from attnjax.models.probe import capture_streams, stream_weights
from attnjax.train.state import init_params
from helpers import TINY_INDUCTION, TINY_MLM, TINY_SEQ2SEQ, raises_one_line, tiny_config

DECODER = tiny_config(TINY_INDUCTION, **{"model.num_layers": 2})
HEADS = DECODER.model.attention.num_heads


@pytest.fixture(scope="module")
def decoder():
    batch = jax.device_get(Dataset(DECODER.data).batch(0, 0, 2, 16, "val"))
    return DECODER, init_params(DECODER), batch


def test_every_family_names_its_points_in_forward_order():
    names = point_names(DECODER, {"inputs": np.zeros((1, 4), np.int32)})
    assert names[:3] == ["block_0.resid_pre", "block_0.attention.q", "block_0.attention.k"]
    assert names[-1] == "block_1.resid_post" and len(names) == 2 * (7 + 3)
    seq2seq = tiny_config(TINY_SEQ2SEQ)
    batch = jax.device_get(Dataset(seq2seq.data).batch(0, 0, 1, 12, "val"))
    names = point_names(seq2seq, batch)
    assert "encoder.block_0.attention.probs" in names and "block_0.cross_attention.z" in names
    assert names.index("encoder.block_0.resid_post") < names.index("block_0.resid_pre")
    encoder = tiny_config(TINY_MLM)
    batch = jax.device_get(Dataset(encoder.data).batch(0, 0, 1, 12, "val"))
    assert "block_0.attention.masked_scores" in point_names(encoder, batch)
    assert match_points(names, ["*.cross_attention.z"]) == ["block_0.cross_attention.z"]
    raises_one_line(lambda: match_points(names, ["block_9.*"]),
                    "point pattern 'block_9.*' matches no point of this model")


def test_captured_values_are_what_the_model_computes(decoder):
    config, params, batch = decoder
    names = point_names(config, batch)
    _, got = run(config, params, batch, capture=names)
    weights = attention_weights(config, params, batch["inputs"])       # [L, B, N, T, T]
    streams = capture_streams(config.model, params, jnp.asarray(batch["inputs"]))
    for layer in range(config.model.num_layers):
        block = f"block_{layer}"
        np.testing.assert_allclose(got[f"{block}.attention.probs"], weights[layer], atol=1e-6)
        np.testing.assert_allclose(got[f"{block}.resid_post"], streams["residual"][layer],
                                   atol=1e-5)
        z = np.einsum("bnts,bsnh->btnh", got[f"{block}.attention.probs"],
                      got[f"{block}.attention.v"])          # no GQA in the tiny model
        np.testing.assert_allclose(got[f"{block}.attention.z"], z, atol=1e-5)
        masked = got[f"{block}.attention.masked_scores"]
        causal = np.tril(np.ones(masked.shape[-2:], bool))
        np.testing.assert_array_equal(masked[..., causal], got[f"{block}.attention.scores"][
            ..., causal])
        assert (masked[..., ~causal] < -1e30).all()


def test_with_nothing_selected_the_program_is_the_ordinary_one(decoder):
    config, params, batch = decoder
    model = build(config.model)
    inputs = jnp.asarray(batch["inputs"])
    plain = jax.jit(lambda p, t: model.apply({"params": p}, t)[0]).lower(params, inputs)
    ours = lower(config, params, batch)
    captured = lower(config, params, batch, capture=["block_0.attention.z"])
    text = lambda lowered: re.sub(r'jit_\w+|jax.result_info = "[^"]*"', "", lowered.as_text())
    assert text(ours) == text(plain)
    assert text(captured) != text(plain)            # the comparison sees a capture


def test_a_point_patched_with_its_own_value_changes_nothing(decoder):
    config, params, batch = decoder
    clean, got = run(config, params, batch, capture=["block_1.attention.z",
                                                     "block_0.attention.probs"])
    patched, _ = run(config, params, batch, patches={
        "block_1.attention.z": patch(got["block_1.attention.z"],
                                     where=heads_where("block_1.attention.z", [1], HEADS)),
        "block_0.attention.probs": patch(got["block_0.attention.probs"])})
    np.testing.assert_array_equal(patched, clean)


def test_every_heads_clean_output_recovers_the_clean_logits_where_the_tokens_agree(decoder):
    config, params, batch = decoder
    heads = [f"block_{l}.attention.z" for l in range(config.model.num_layers)]
    clean_logits, clean = run(config, params, batch, capture=heads)
    corrupted = {**batch, "inputs": batch["inputs"].copy()}
    corrupted["inputs"][:, 3] = (corrupted["inputs"][:, 3] + 1) % config.model.vocab_size
    broken, _ = run(config, params, corrupted)
    assert np.abs(broken[:, 4:] - clean_logits[:, 4:]).max() > 1e-3
    restored, _ = run(config, params, corrupted,
                      patches={name: patch(clean[name]) for name in heads})
    np.testing.assert_allclose(restored[:, 4:], clean_logits[:, 4:], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(restored[:, :3], clean_logits[:, :3])    # before it: same


def test_zero_ablating_a_heads_output_is_the_head_knockout(decoder):
    config, params, batch = decoder
    gates = np.ones((2, HEADS), np.float32)
    gates[1, 1] = 0.0
    knocked, _ = build(config.model).apply({"params": params}, batch["inputs"],
                                           head_gates=jnp.asarray(gates))
    zeroed, _ = run(config, params, batch, patches={"block_1.attention.z": patch(
        0.0, where=heads_where("block_1.attention.z", [1], HEADS))})
    np.testing.assert_allclose(zeroed, knocked, rtol=0, atol=1e-6)


@pytest.mark.parametrize("group", [None, 3])
def test_worlds_in_one_pass_equal_one_pass_each(decoder, group):
    """All worlds in one vmapped pass, or mapped over groups of 3 (the last group short)."""
    config, params, batch = decoder
    names = ["block_0.attention.z", "block_1.attention.z"]
    worlds = [{name: patch(0.0, where=heads_where(name, [h] if name == names[l] else [], HEADS))
               for name in names} for l in range(2) for h in range(HEADS)]   # one head each
    assert len(worlds) % 3
    assert default_group(batch) == 32 // len(batch["inputs"])       # 32 sequences on a CPU
    raises_one_line(lambda: run_worlds(config, params, batch, stack(worlds), group=0),
                    "group must be >= 1 worlds (or None: all in one pass), got 0")
    together, captured = run_worlds(config, params, batch, stack(worlds),
                                    capture=["block_1.resid_mid"], group=group)
    assert together.shape == (2 * HEADS, *np.shape(batch["inputs"]), config.model.vocab_size)
    for w, world in enumerate(worlds):
        alone, single = run(config, params, batch, patches=world,
                            capture=["block_1.resid_mid"])
        np.testing.assert_allclose(together[w], alone, rtol=0, atol=1e-6)
        np.testing.assert_allclose(captured["block_1.resid_mid"][w],
                                   single["block_1.resid_mid"], rtol=0, atol=1e-6)


def test_other_kernels_give_the_same_points_and_one_without_softmax_is_refused(decoder):
    _, params, batch = decoder
    chunked = tiny_config(TINY_INDUCTION, **{"model.num_layers": 2,
                                             "model.attention.kernel": "chunked"})
    reference, _ = run(DECODER, params, batch, capture=["block_1.attention.probs"])
    logits, got = run(chunked, params, batch, capture=["block_1.attention.probs"])
    np.testing.assert_allclose(logits, reference, rtol=0, atol=1e-5)
    linear = tiny_config(TINY_INDUCTION, **{"model.num_layers": 2,
                                            "model.attention.kernel": "linear"})
    raises_one_line(lambda: run(linear, params, batch, capture=["block_0.attention.probs"]),
                    "model.attention.kernel='linear' computes no softmax scores or "
                    "probabilities")
    run(linear, params, batch, capture=["block_0.attention.z"])       # its outputs are there


def test_an_encoder_decoders_cross_attention_points_are_its_cross_weights():
    config = tiny_config(TINY_SEQ2SEQ)
    params = init_params(config)
    batch = jax.device_get(Dataset(config.data).batch(0, 0, 2, 12, "val"))
    _, got = run(config, params, batch, capture=["block_0.cross_attention.probs",
                                                 "encoder.block_0.attention.probs"])
    weights = stream_weights(config.model, params, jnp.asarray(batch["inputs"]),
                             family(config.model).arguments(batch))
    np.testing.assert_allclose(got["block_0.cross_attention.probs"], weights["cross"][0],
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["encoder.block_0.attention.probs"], weights["encoder"][0],
                               rtol=0, atol=1e-6)


def test_mean_and_resample_ablations_put_the_batch_mean_and_another_examples_value(decoder):
    config, params, batch = decoder
    name = "block_0.attention.z"
    _, got = run(config, params, batch, capture=[name])
    where = heads_where(name, [0], HEADS)
    for kind, expected in (("mean", np.broadcast_to(got[name].mean(0), got[name].shape)),
                           ("resample", got[name][::-1])):       # two examples: swapped
        _, ablated = run(config, params, batch, capture=[name],
                         patches={name: ablation(kind, got[name], where)})
        np.testing.assert_allclose(ablated[name][:, :, 0], expected[:, :, 0], rtol=0,
                                   atol=1e-6)
        np.testing.assert_array_equal(ablated[name][:, :, 1:], got[name][:, :, 1:])
    raises_one_line(lambda: ablation("median", got[name]), "ablation 'median' is not one of: "
                    "zero, mean, resample")
