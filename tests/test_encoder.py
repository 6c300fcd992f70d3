"""The encoder family: its data (special tokens, sentence pairs, masked-language-model
masking, the first_repeat classification), its model (bidirectional attention, padding
invariance, segment embeddings, the [CLS] and mean classifiers) and the statistics and
regularisers on bidirectional padded batches."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.data import Dataset
from attnjax.data.encoder import special_tokens
from attnjax.models import build, family
from attnjax.models.encoder import Classifier
from attnjax.models.probe import head_stat_arrays, special_attention
from attnjax.nn.slots import visible_keys
from attnjax.ops.masks import visibility
from attnjax.registry import KERNELS, POSITIONS, REGULARIZERS
from attnjax.train.state import init_params
from attnjax.train.step import make_eval_step
from helpers import TINY_CLASSIFY, TINY_MLM, TINY_TEXT, raises_one_line, tiny_config

SPECIALS = special_tokens(260)     # byte-level text: [PAD] 256, [CLS] 257, [SEP] 258, [MASK] 259


def mlm_batch(batch_size=64, length=32, **overrides) -> dict:
    config = tiny_config(TINY_MLM, **{"model.max_length": length, "data.length": length,
                                      **overrides})
    batch = Dataset(config.data).batch(0, 0, batch_size, length, "train")
    return {name: np.asarray(value) for name, value in batch.items()}


# ------------------------------------------------------------------------------------ data

def test_special_tokens_are_the_last_four_ids():
    assert tuple(SPECIALS) == (256, 257, 258, 259) and SPECIALS.content == 256
    assert tuple(special_tokens(16)) == (12, 13, 14, 15)


def test_sentence_pairs_are_framed_with_cls_sep_and_segments():
    batch = mlm_batch(**{"data.mlm_rate": 1e-9})        # nothing masked: inputs are the text
    chex.assert_trees_all_equal(batch["inputs"], batch["targets"])
    for row in range(len(batch["inputs"])):
        real = batch["token_mask"][row]
        n = int(real.sum())
        assert real[:n].all() and not real[n:].any()                     # right padding
        tokens, segments = batch["inputs"][row], batch["segment_ids"][row]
        assert tokens[0] == SPECIALS.cls and tokens[n - 1] == SPECIALS.sep
        (seps,) = np.nonzero(tokens[:n] == SPECIALS.sep)
        assert len(seps) == 2 and 2 <= seps[0] <= n - 3                   # a and b non-empty
        np.testing.assert_array_equal(segments[:n], np.arange(n) > seps[0])
        assert (tokens[n:] == SPECIALS.pad).all() and (segments[n:] == 0).all()
        np.testing.assert_array_equal(batch["positions"][row][:n], np.arange(n))
        assert (tokens[1:n - 1] < 256).sum() == n - 3                     # bytes between


def test_a_pair_is_one_contiguous_window_of_the_corpus():
    batch = mlm_batch(**{"data.mlm_rate": 1e-9, "data.padding": "none", "data.min_length": 1})
    config = tiny_config(TINY_MLM)
    corpus = bytes(np.asarray(Dataset(config.data)._source.corpus.tokens))
    for tokens in batch["inputs"][:8]:
        text = bytes(int(t) for t in tokens if t < 256)
        assert text in corpus


def test_masking_chooses_the_configured_share_and_replaces_80_10_10():
    batch = mlm_batch(batch_size=512, length=64)
    real = batch["token_mask"] & (batch["targets"] < 256)
    chosen = batch["weights"].astype(bool)
    assert not (chosen & ~real).any()                   # never a special token or a pad
    n, k = real.sum(), chosen.sum()
    # binomial: 5 standard deviations
    assert abs(k / n - 0.15) < 5 * np.sqrt(0.15 * 0.85 / n)
    inputs, targets = batch["inputs"][chosen], batch["targets"][chosen]
    masked = inputs == SPECIALS.mask
    kept = inputs == targets
    random = ~masked & ~kept
    for share, expected in ((masked.mean(), 0.8), (kept.mean(), 0.1 + 0.1 / 256),
                            (random.mean(), 0.1 * 255 / 256)):
        assert abs(share - expected) < 5 * np.sqrt(expected * (1 - expected) / k), share
    assert (inputs[random] < 256).all()                 # random replacements are bytes
    np.testing.assert_array_equal(batch["inputs"][~chosen], batch["targets"][~chosen])


def test_first_repeat_labels_say_whether_the_first_token_occurs_again():
    config = tiny_config(TINY_CLASSIFY)
    batch = Dataset(config.data).batch(0, 0, 256, 12, "train")
    specials = special_tokens(16)
    labels = np.asarray(batch["targets"])
    for tokens, real, label in zip(np.asarray(batch["inputs"]), np.asarray(batch["token_mask"]),
                                   labels, strict=True):
        n = int(real.sum())
        assert tokens[0] == specials.cls and tokens[n - 1] == specials.sep
        content = tokens[1:n - 1]
        assert (content < specials.content).all()
        assert label == (content[0] in content[1:])
    assert 0.4 < labels.mean() < 0.6


@pytest.mark.parametrize("overrides, fragments", [
    ({"data.min_length": 4}, ["data.min_length=4 must be >= 5 for task='mlm'"]),
    ({"data.mlm_mask_share": 0.95}, ["data.mlm_mask_share + mlm_random_share = 1.05"]),
    ({"data.pad_token": 3}, ["data.pad_token=3 means nothing with task='mlm'"]),
    ({"model.vocab_size": 256}, ["model.vocab_size=256 is smaller than the data's vocabulary "
                                 "(260)"]),
    ({"model.classifier": "cls"}, ["data.task='mlm' trains mlm, not the classification",
                                   "tasks: first_repeat"]),
    ({"model.attention.causal": False}, ["model.attention.causal=False means nothing with "
                                         "family='encoder'"]),
    ({"model.family": "decoder"}, ["model.type_vocab_size=2 means nothing with "
                                   "family='decoder'"]),
])
def test_encoder_refusals_name_the_field(overrides, fragments):
    raises_one_line(lambda: tiny_config(TINY_MLM, **overrides), *fragments)


# ----------------------------------------------------------------------------------- model

PADDED_KERNELS = [name for name, spec in KERNELS.items()
                  if spec.exact and spec.available() and {"positions", "segment"} <= spec.supports
                  and spec.runs_as is None]


# every exact kernel that takes a padded batch with RoPE, and every position encoding with
# the reference kernel (the two slots are independent: each kernel receives a position
# encoding only as per-example positions and a bias function)
SLOT_PAIRS = ([(kernel, "rope") for kernel in PADDED_KERNELS]
              + [("reference", position) for position in POSITIONS.names() if position != "rope"])


@pytest.mark.parametrize("kernel, position", SLOT_PAIRS, ids=lambda s: s)
def test_one_example_alone_and_padded_into_a_batch_gives_the_same_outputs(kernel, position):
    """The logits of an example's real tokens padded into a batch are those of the example
    alone, wherever its pads are."""
    config = tiny_config(TINY_MLM, **{"model.attention.kernel": kernel, "model.num_layers": 2,
                                      "model.position.kind": position})
    params = init_params(config)
    model, arguments = build(config.model), family(config.model).arguments
    # op by op: every case runs the same five shapes (the batch, each row alone), whose
    # primitives compile once for all of them, where jit would compile five programs each
    apply = lambda tokens, **kwargs: model.apply({"params": params}, tokens, **kwargs)
    batch = Dataset(config.data).batch(0, 0, 4, 12, "val")
    padded, _ = apply(batch["inputs"], **arguments(batch))
    for row in range(4):
        n = int(batch["token_mask"][row].sum())
        alone, _ = apply(batch["inputs"][row:row + 1, :n],
                         segment_ids=batch["segment_ids"][row:row + 1, :n])
        np.testing.assert_allclose(padded[row, :n], alone[0], atol=2e-5, rtol=2e-5)


def test_attention_is_bidirectional_and_pads_are_never_seen():
    config = tiny_config(TINY_MLM)
    params = init_params(config)
    batch = Dataset(config.data).batch(0, 0, 4, 12, "val")
    (_, aux) = build(config.model).apply({"params": params}, batch["inputs"],
                                         **family(config.model).arguments(batch),
                                         return_weights=True)
    w = np.asarray(aux["attn_weights"][0])                              # [B, N, T, T]
    real = np.asarray(batch["token_mask"])
    pair = real[:, None, :, None] & real[:, None, None, :]
    assert (w[np.broadcast_to(~pair & real[:, None, :, None], w.shape)] == 0).all()
    assert (w[np.broadcast_to(pair, w.shape)] > 0).all()                # the future too
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


def test_segment_embeddings_change_the_output_only_when_there_are_any():
    config = tiny_config(TINY_MLM)
    params = init_params(config)
    model = build(config.model)
    tokens = jnp.asarray([[257, 97, 98, 258, 99, 258]])
    one, _ = model.apply({"params": params}, tokens, segment_ids=jnp.zeros_like(tokens))
    two, _ = model.apply({"params": params}, tokens,
                         segment_ids=jnp.asarray([[0, 0, 0, 0, 1, 1]]))
    assert np.abs(np.asarray(one - two)).max() > 1e-3
    none = tiny_config(TINY_MLM, **{"model.type_vocab_size": 0})
    assert "type_embed" not in init_params(none)


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_classifier_pools_cls_or_the_mean_of_the_real_tokens(pooling, padding):
    config = tiny_config(TINY_CLASSIFY, **{"model.classifier": pooling,
                                           "data.padding": padding})
    batch = Dataset(config.data).batch(0, 0, 4, 12, "val")
    x = jax.random.normal(jax.random.key(1), (4, 12, config.model.d_model))
    head = Classifier(config.model).init(jax.random.key(0), x, batch["positions"],
                                         batch["token_mask"])["params"]   # the head alone
    logits = Classifier(config.model).apply({"params": head}, x, batch["positions"],
                                            batch["token_mask"])
    chex.assert_shape(logits, (4, 2))
    x, real = np.asarray(x, np.float64), np.asarray(batch["token_mask"], np.float64)
    first = np.asarray(batch["positions"]) == 0
    pooled = (x * (real * first)[..., None]).sum(1) if pooling == "cls" else (
        (x * real[..., None]).sum(1) / real.sum(1)[:, None])
    hidden = np.tanh(pooled @ np.asarray(head["pooler"]["kernel"]) + np.asarray(
        head["pooler"]["bias"]))
    expected = hidden @ np.asarray(head["out"]["kernel"]) + np.asarray(head["out"]["bias"])
    np.testing.assert_allclose(logits, expected, atol=1e-5)


def test_an_encoder_does_not_decode():
    config = tiny_config(TINY_MLM)
    message = raises_one_line(lambda: build(config.model).apply(
        {"params": init_params(config)}, jnp.zeros((1, 2), jnp.int32), decode=True),
        "model.family='encoder' is bidirectional")
    assert "\n" not in message


# --------------------------------------------------- statistics on bidirectional padded batches

def test_visible_keys_of_an_encoder_are_bidirectional_and_hide_the_pads():
    config = tiny_config(TINY_MLM).model
    real = np.array([[True, True, True, False]])
    got = np.asarray(visible_keys(config, 4, real))[0, 0]
    expected = np.outer(real[0], real[0])
    np.testing.assert_array_equal(got, expected)
    window = tiny_config(TINY_MLM, **{"model.attention.window": 2}).model
    np.testing.assert_array_equal(np.asarray(visible_keys(window, 4))[0, 0],
                                  np.abs(np.subtract.outer(range(4), range(4))) <= 1)
    assert visible_keys(tiny_config(TINY_TEXT).model, 4) is None     # causal: the default


def test_head_statistics_of_a_padded_batch_are_those_of_its_examples_alone():
    """Entropy normalised by the log of the visible keys, max logit over visible pairs, and the
    rest: the statistics of one example padded into a batch equal those of the example
    alone."""
    config = tiny_config(TINY_MLM, **{"model.num_layers": 2})
    params = init_params(config)
    batch = Dataset(config.data).batch(0, 0, 4, 12, "val")
    row = int(np.argmin(np.asarray(batch["token_mask"]).sum(1)))       # the most padded
    n = int(batch["token_mask"][row].sum())
    assert n < 12
    one = {name: value[row:row + 1] for name, value in batch.items()}
    stats = jax.jit(functools.partial(head_stat_arrays, config.model))   # as training runs it
    padded = stats(params, one["inputs"], family(config.model).arguments(one))
    alone = stats(params, one["inputs"][:, :n], {"segment_ids": one["segment_ids"][:, :n]})
    for name in padded:
        np.testing.assert_allclose(padded[name], alone[name], rtol=2e-5, atol=1e-6,
                                   err_msg=name)


def test_regularisers_of_a_padded_batch_read_only_the_visible_entries():
    """Each regulariser's term on a padded example equals its term on the example alone."""
    w_alone = jax.nn.softmax(jax.random.normal(jax.random.key(0), (1, 2, 3, 3)), -1)
    w_padded = jnp.zeros((1, 2, 5, 5)).at[:, :, :3, :3].set(w_alone)
    w_padded = w_padded.at[:, :, 3:, 3:].set(0.5)                     # pads see pads
    real = np.array([[True, True, True, False, False]])
    for name, reg in REGULARIZERS.items():
        alone = reg.term((w_alone,), visibility(3, 3, causal=False))
        padded = reg.term((w_padded,), visibility(5, 5, causal=False, token_mask=real))
        np.testing.assert_allclose(padded, alone, rtol=1e-6, err_msg=name)


def test_attention_on_special_tokens_per_layer():
    """``special_attention``: by hand on a one-layer model with a uniform attention."""
    config = tiny_config(TINY_MLM, **{"model.attention.scale_multiplier": 1e-9})
    params = init_params(config)
    tokens = jnp.asarray([[257, 97, 98, 258, 99, 258, 256, 256]])
    real = tokens != 256
    arguments = {"token_mask": real, "positions": jnp.arange(8)[None]}
    mass = special_attention(config.model, params, tokens, arguments, {"cls": 257, "sep": 258})
    # 6 real tokens, nearly uniform attention: [CLS] gets 1/6, the two [SEP] 2/6
    np.testing.assert_allclose(mass["cls"], [1 / 6], rtol=1e-4)
    np.testing.assert_allclose(mass["sep"], [2 / 6], rtol=1e-4)


def test_mlm_loss_and_accuracy_read_only_the_masked_positions():
    config = tiny_config(TINY_MLM)
    params = init_params(config)
    batch = Dataset(config.data).batch(0, 0, 4, 12, "val")
    sums = make_eval_step(config)(params, batch, 0)
    logits, _ = build(config.model).apply({"params": params}, batch["inputs"],
                                          **family(config.model).arguments(batch))
    chosen = np.asarray(batch["weights"]).astype(bool)
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64))
    ce = -np.take_along_axis(logp, np.asarray(batch["targets"])[..., None], -1)[..., 0]
    np.testing.assert_allclose(sums["ce"], ce[chosen].sum(), rtol=1e-5)
    assert float(sums["weight"]) == chosen.sum()
