"""Per-head diagnostics on hand-built weights, head gates and knockout, Michel et al.'s
importance against a finite difference, pruning curves, pictures and the two reports.

One tiny model (2 layers, 2 heads of width 8, d_model 16, length 12, induction data) serves
every model test, so each jitted function compiles once.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.analysis import diagnostics as D
from attnjax.analysis import heads as K
from attnjax.analysis import heatmaps as V
from attnjax.config import Config, DataConfig, apply_overrides, from_json, to_dict, to_json
from attnjax.data import Dataset
from attnjax.models.decoder import DecoderLM
from attnjax.models.probe import STATS
from attnjax.nn.transformer import knockout_gates
from attnjax.ops import stats as S
from attnjax.ops.masks import visibility
from attnjax.rundir import RunDir
from attnjax.train.loop import evaluate
from attnjax.train.state import init_state
from attnjax.train.step import make_diagnostics
from helpers import TINY_INDUCTION, tiny_config

T = 12
# Two layers (knockout and pruning across layers); vocabulary 32, so the loss at
# initialisation is ~ln 32 = 3.5 (the finite-difference tolerance below rests on it); length
# 12, not the model's 16; two evaluation batches, so losses are averaged across batches.
TINY = {**TINY_INDUCTION, "model.num_layers": 2, "model.vocab_size": 32,
        "data.vocab_size": 32, "data.length": T, "train.eval_batches": 2}


def tiny(**overrides) -> Config:
    return tiny_config(TINY, **overrides)


def params_of(config: Config):
    # committed to the device, like parameters restored from a checkpoint, so the report test
    # reuses the programs the other tests compiled (jit keys on committedness)
    return jax.device_put(init_state(config).params, jax.devices()[0])


@functools.cache
def batches_of(config: Config):
    return K.validation_batches(config)


@functools.cache
def _forward(config: Config):
    model = DecoderLM(config.model)
    return jax.jit(lambda p, t, g: model.apply({"params": p}, t, head_gates=g)[0])


def logits_of(config, params, tokens, gates=None):
    return _forward(config)(params, tokens, gates)


def as_weights(rows) -> np.ndarray:
    """A [T, T] matrix as [layers=1, B=1, heads=1, T, T]."""
    return np.asarray(rows, np.float32)[None, None, None]


# ------------------------------------------------------------ 1. statistics on hand-made rows

def uniform_causal(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


def test_uniform_rows_have_entropy_log_n():
    w = as_weights(uniform_causal(T))
    i = np.arange(T)
    np.testing.assert_allclose(S.entropy(w), [[np.mean(np.log(i + 1))]], rtol=1e-6)
    np.testing.assert_allclose(S.normalized_entropy(w), [[1.0]], rtol=1e-6)
    np.testing.assert_allclose(S.max_weight(w), [[np.mean(1 / (i + 1))]], rtol=1e-6)
    np.testing.assert_allclose(S.sink_mass(w), [[np.mean(1 / (i + 1))]], rtol=1e-6)
    # 1/(i+1) > 0.1 for rows 0..8: 1 + 2 + ... + 9 = 45 of the 78 allowed weights
    np.testing.assert_allclose(S.activation_ratio(w), [[45 / 78]], rtol=1e-6)
    # a single row uniform over n keys: the last row of a uniform matrix
    last = S.row_entropy(jnp.asarray(w))[0, 0, 0, -1]
    np.testing.assert_allclose(last, math.log(T), rtol=1e-6)


def test_one_hot_rows_on_the_first_key():
    w = np.zeros((T, T), np.float32)
    w[:, 0] = 1.0
    w = as_weights(w)
    np.testing.assert_allclose(S.entropy(w), [[0.0]], atol=1e-7)
    np.testing.assert_allclose(S.normalized_entropy(w), [[0.0]], atol=1e-7)
    np.testing.assert_allclose(S.max_weight(w), [[1.0]])
    np.testing.assert_allclose(S.sink_mass(w), [[1.0]])
    np.testing.assert_allclose(S.activation_ratio(w), [[T / (T * (T + 1) / 2)]], rtol=1e-6)
    diagonal = as_weights(np.eye(T))               # a one-hot "current token" head
    np.testing.assert_allclose(S.sink_mass(diagonal), [[1 / T]], rtol=1e-6)
    np.testing.assert_allclose(S.max_weight(diagonal), [[1.0]])


def test_activation_ratio_and_entropy_on_a_hand_matrix():
    w = as_weights([[1.0, 0, 0], [0.95, 0.05, 0], [0.2, 0.05, 0.75]])
    np.testing.assert_allclose(S.activation_ratio(w), [[4 / 6]], rtol=1e-6)
    h = lambda p: -sum(x * math.log(x) for x in p)
    expected = (0 + h([0.95, 0.05]) + h([0.2, 0.05, 0.75])) / 3
    np.testing.assert_allclose(S.entropy(w), [[expected]], rtol=1e-5)
    normalised = (h([0.95, 0.05]) / math.log(2) + h([0.2, 0.05, 0.75]) / math.log(3)) / 2
    np.testing.assert_allclose(S.normalized_entropy(w), [[normalised]], rtol=1e-5)
    np.testing.assert_allclose(S.max_weight(w), [[(1 + 0.95 + 0.75) / 3]], rtol=1e-6)


def test_previous_token_and_induction_scores_by_hand():
    shifted = np.eye(T, k=-1)
    shifted[0, 0] = 1.0                            # row i on key i - 1 (row 0 on itself)
    np.testing.assert_allclose(S.previous_token(as_weights(shifted)), [[1.0]])
    np.testing.assert_allclose(S.previous_token(as_weights(np.eye(T))), [[0.0]])
    # tokens 5 7 5 7: row 2 (a 5) may look at key 1 (after the first 5), row 3 (a 7) at key 2
    w = as_weights([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0.1, 0.6, 0.3, 0], [0.25] * 4])
    np.testing.assert_allclose(S.induction_score(w, [[5, 7, 5, 7]]), [[(0.6 + 0.25) / 2]],
                               rtol=1e-6)
    assert np.isnan(S.induction_score(w, [[1, 2, 3, 4]])).all()     # no repeated token
    with pytest.raises(ValueError, match=r"tokens must be \[B, T\]"):
        S.induction_score(w, [[1, 2, 3]])


def test_statistics_keep_layers_and_heads_apart_and_refuse_bad_shapes():
    w = np.stack([np.stack([uniform_causal(4), np.eye(4)])] * 3)[:, None]  # [3, 1, 2, 4, 4]
    stats = S.weight_statistics(w)
    for value in stats.values():
        chex.assert_shape(value, (3, 2))
    np.testing.assert_allclose(stats["max_weight"][:, 1], 1.0)
    np.testing.assert_allclose(stats["norm_entropy"][:, 0], 1.0,
                               rtol=1e-6)
    with pytest.raises(ValueError, match="weights must be"):
        S.entropy(np.ones((2, 4, 4)))


def test_qk_statistics_by_hand():
    q = jnp.asarray([[1.0, 0.0], [0.0, 2.0]])[None, :, None, :]       # [B=1, T=2, N=1, H=2]
    k = jnp.asarray([[1.0, 1.0], [3.0, 0.0]])[None, :, None, :]
    stats = S.qk_statistics(jnp.concatenate([q, 2 * q], 2), k, jnp.asarray([1.0, 0.5]))
    # causal pairs: q0.k0 = 1, q1.k0 = 2, q1.k1 = 0; the future pair q0.k1 = 3 is left out
    np.testing.assert_allclose(stats["max_logit"], [2.0, 2.0])       # 0.5 * (2q).k = q.k
    np.testing.assert_allclose(stats["q_norm"], [math.sqrt(2.5), 2 * math.sqrt(2.5)], rtol=1e-6)
    np.testing.assert_allclose(stats["k_norm"], [math.sqrt(5.5)] * 2, rtol=1e-6)  # one kv head


# bidirectional attention over 3 tokens in two examples; in example 0 token 2 is a pad (a padded
# query and a padded key), example 1 has none. Entries the mask hides hold junk (0.4, 0.3 and
# the pad's row) that every statistic must ignore.
PADDED = np.array([[True, True, False], [True, True, True]])
PADDED_WEIGHTS = np.array([[[0.75, 0.25, 0.4], [0.5, 0.5, 0.3], [0.2, 0.3, 0.5]],
                           [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]]],
                          np.float32)[None, :, None]                        # [L=1, B=2, N=1, 3, 3]


def test_statistics_under_a_padding_mask_by_hand():
    visible = visibility(3, 3, causal=False, token_mask=PADDED)
    h = lambda *p: -sum(x * math.log(x) for x in p if x > 0)
    # the counted rows: example 0's rows 0, 1 (2 keys each), example 1's rows 0, 1, 2 (3 keys)
    rows = [(0.75, 0.25), (0.5, 0.5), (0.2, 0.3, 0.5), (1.0, 0.0, 0.0), (0.25, 0.25, 0.5)]
    stats = S.weight_statistics(PADDED_WEIGHTS, visible)
    np.testing.assert_allclose(stats["entropy"], [[sum(h(*p) for p in rows) / 5]], rtol=1e-6)
    normalised = sum(h(*p) / math.log(len(p)) for p in rows) / 5     # log of #visible keys
    np.testing.assert_allclose(stats["norm_entropy"], [[normalised]], rtol=1e-6)
    np.testing.assert_allclose(stats["max_weight"], [[(0.75 + 0.5 + 0.5 + 1.0 + 0.5) / 5]],
                               rtol=1e-6)
    np.testing.assert_allclose(stats["sink_mass"], [[(0.75 + 0.5 + 0.2 + 1.0 + 0.25) / 5]],
                               rtol=1e-6)
    # 13 visible entries, of which 0.0, 0.0 (example 1, row 1) are not above 0.1
    np.testing.assert_allclose(stats["active_frac"], [[11 / 13]], rtol=1e-6)
    # the rows that see key i - 1: example 0's row 1, example 1's rows 1 and 2
    np.testing.assert_allclose(stats["prev_token"], [[(0.5 + 1.0 + 0.25) / 3]], rtol=1e-6)
    # x_0 = x_2 in both: row 2 may look at key 1, but in example 0 row 2 is a pad
    np.testing.assert_allclose(S.induction_score(PADDED_WEIGHTS, [[7, 8, 7]] * 2, visible),
                               [[0.25]], rtol=1e-6)
    # JS between a head and its copy with example 1's row 1 moved to key 1: the only counted
    # row that differs, one of the 5, at JS(one-hot, one-hot elsewhere) = ln 2
    moved = PADDED_WEIGHTS.copy()
    moved[0, 1, 0, 1] = [0.0, 1.0, 0.0]
    pair = np.concatenate([PADDED_WEIGHTS, moved], axis=2)                  # [1, 2, N=2, 3, 3]
    np.testing.assert_allclose(S.head_divergence(pair, 0, visible)[0, 0, 1], math.log(2) / 5,
                               rtol=1e-12)


def test_max_logit_and_norms_under_a_padding_mask_by_hand():
    visible = visibility(3, 3, causal=False, token_mask=PADDED)
    # example 0: the pad's query and key are huge, so q2.k2 = 10000 and q0.k2 = 100 are the
    # largest logits, both hidden; example 1 sees every pair
    q = jnp.asarray([[[1.0, 0.0], [0.0, 1.0], [50.0, 50.0]],
                     [[0.5, 1.0], [0.0, -1.0], [1.0, 0.0]]])[:, :, None]   # [B=2, T=3, N=1, 2]
    k = jnp.asarray([[[1.0, 0.0], [2.0, 1.0], [100.0, 100.0]],
                     [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])[:, :, None]
    # visible logits: example 0 {1, 2, 0, 1}, example 1 up to q0.k2 = 1.5
    np.testing.assert_allclose(S.masked_max_logit(q, k, 0.5, visible), [0.5 * 2.0])
    assert float(S.masked_max_logit(q, k, 0.5)[0]) == 0.5 * 10000.0      # causal: row 2 sees it
    stats = S.qk_statistics(q, k, 0.5, visible)
    np.testing.assert_allclose(stats["max_logit"], [1.0])
    # queries and keys of the 5 real tokens: |q|^2 = 1, 1, 1.25, 1, 1; |k|^2 = 1, 5, 1, 1, 2
    np.testing.assert_allclose(stats["q_norm"], [math.sqrt(5.25 / 5)], rtol=1e-6)
    np.testing.assert_allclose(stats["k_norm"], [math.sqrt(10 / 5)], rtol=1e-6)


def causal_softmax(seed: int, shape) -> jax.Array:
    """Random attention weights computed under the causal mask: 0 on every hidden entry."""
    logits = 3 * jax.random.normal(jax.random.key(seed), shape)
    return jax.nn.softmax(jnp.where(visibility(*shape[-2:], True), logits, -jnp.inf), -1)


@pytest.mark.parametrize("T", [1, 5, 33])
def test_no_mask_is_the_causal_mask_bit_for_bit(T):
    w = causal_softmax(T, (2, 3, 2, T, T))
    causal = visibility(T, T, causal=True)
    tokens = jax.random.randint(jax.random.key(T), (3, T), 0, 3)
    default, masked = S.weight_statistics(w), S.weight_statistics(w, causal)
    for name in S.WEIGHT_STATS:
        np.testing.assert_array_equal(default[name], masked[name], err_msg=name)
    np.testing.assert_array_equal(S.induction_score(w, tokens),
                                  S.induction_score(w, tokens, causal))
    if T > 1:
        np.testing.assert_array_equal(S.head_divergence(w), S.head_divergence(w, 1, causal))
    q = jax.random.normal(jax.random.key(1), (3, T, 4, 8))
    k = jax.random.normal(jax.random.key(2), (3, T, 2, 8))                  # GQA: 2 kv heads
    default, masked = S.qk_statistics(q, k, 0.5), S.qk_statistics(q, k, 0.5, causal)
    for name in S.QK_STATS:
        np.testing.assert_array_equal(default[name], masked[name], err_msg=name)
    np.testing.assert_array_equal(S.causal_max_logit(q, k, 0.5), default["max_logit"])


def test_position_similarity_per_kind():
    p = 10
    rope = tiny(**{"model.max_length": 64})
    H = rope.model.head_dim                                   # 8
    theta = 10000.0 ** (-np.arange(H // 2) * 2 / H)
    expected = 2 * np.cos(p * theta).sum() / H
    np.testing.assert_allclose(D.position_similarity(rope, None, p), expected, rtol=1e-5)
    sinus = tiny(**{"model.max_length": 64, "model.position.kind": "sinusoidal"})
    omega = 10000.0 ** (-np.arange(8) * 2 / 16)
    np.testing.assert_allclose(D.position_similarity(sinus, None, p), np.cos(p * omega).mean(),
                               rtol=1e-5)
    alibi = tiny(**{"model.max_length": 64, "model.position.kind": "alibi"})
    slopes = np.asarray([2.0 ** -4, 2.0 ** -8])               # two heads: 2^(-8/2 * (h+1))
    np.testing.assert_allclose(D.position_similarity(alibi, None, p),
                               np.exp(-slopes * p)[None].repeat(2, 0), rtol=1e-6)
    assert np.isnan(D.position_similarity(rope, None, 64)).all()     # beyond max_length
    none = tiny(**{"model.position.kind": "none"})
    assert np.isnan(D.position_similarity(none, None, 3)).all()


def test_head_statistics_and_the_jittable_metrics_agree():
    config = tiny()
    params = params_of(config)
    tokens = np.asarray(batches_of(config)[0]["inputs"])
    stats = D.head_statistics(config, params, tokens)
    assert list(stats) == [*STATS, "pos_sim@10", "pos_sim@100"]
    for value in stats.values():
        chex.assert_shape(value, (2, 2))
    assert np.isnan(stats["pos_sim@100"]).all() and np.isfinite(stats["pos_sim@10"]).all()
    diagnostics = make_diagnostics(apply_overrides(config, {"train.head_metrics": True}))
    batch = {"inputs": tokens}
    shapes = jax.eval_shape(jax.jit(diagnostics), params, batch)        # it traces under jit
    shapes.pop("max_attn_logit")
    assert len(shapes) == len(STATS) * 4
    assert all(s.shape == () and s.dtype == jnp.float32 for s in shapes.values())
    metrics = diagnostics(params, batch)
    np.testing.assert_allclose(metrics.pop("max_attn_logit"), stats["max_logit"].max(), rtol=1e-6)
    assert set(metrics) == set(shapes)
    for name in STATS:
        np.testing.assert_allclose(metrics[f"head_{name}/L1H0"], stats[name][1, 0], rtol=1e-6)
    table = D.format_head_table(stats).splitlines()
    assert len(table) == 2 + 4 and table[-1].startswith("| L1.H1 |")


# ------------------------------------------------------------ 2. gates and knockout

def test_gates_of_ones_reproduce_the_ungated_logits_exactly():
    config = tiny()
    params = params_of(config)
    tokens = batches_of(config)[0]["inputs"]
    chex.assert_trees_all_equal(logits_of(config, params, tokens, jnp.ones((2, 2))),
                                logits_of(config, params, tokens))


def test_knocking_out_a_whole_layer_removes_its_attention_sublayer():
    config = tiny()
    params = params_of(config)
    tokens = batches_of(config)[0]["inputs"]
    zeroed = jax.tree_util.tree_map(lambda x: x, params)
    out = dict(zeroed["block_0"]["attention"]["out"])
    out["kernel"] = jnp.zeros_like(out["kernel"])          # no bias: attention.use_bias=False
    zeroed["block_0"] = {**zeroed["block_0"],
                         "attention": {**zeroed["block_0"]["attention"], "out": out}}
    gated = logits_of(config, params, tokens, jnp.asarray([[0.0, 0.0], [1.0, 1.0]]))
    np.testing.assert_allclose(gated, logits_of(config, zeroed, tokens), rtol=1e-6, atol=1e-6)
    assert not np.allclose(gated, logits_of(config, params, tokens), atol=1e-3)


def test_knockout_in_the_config_equals_knockout_by_gates():
    config = tiny()
    knocked = tiny(**{"model.attention.knockout": [[1, 0]]})
    params = params_of(config)
    tokens = batches_of(config)[0]["inputs"]
    gates = jnp.asarray([[1.0, 1.0], [0.0, 1.0]])
    chex.assert_trees_all_equal(knockout_gates(knocked.model), gates)
    chex.assert_trees_all_equal(knockout_gates(knocked.model, 2 * gates), 2 * gates)
    assert knockout_gates(config.model) is None
    chex.assert_trees_all_equal(logits_of(knocked, params, tokens),
                                logits_of(config, params, tokens, gates))


def test_knockout_config_validates_and_round_trips():
    config = tiny(**{"model.attention.knockout": [[0, 1], [1, 0]]})
    assert config.model.attention.knockout == ((0, 1), (1, 0))
    assert from_json(Config, to_json(config)) == config
    for bad in ([[2, 0]], [[0, 2]], [[0]], [[-1, 0]]):
        with pytest.raises(ValueError, match=r"^model\.attention\.knockout entry .*num_layers=2"):
            tiny(**{"model.attention.knockout": bad})
    with pytest.raises(ValueError, match=r"^train\.head_metrics must be bool"):
        tiny(**{"train.head_metrics": 1})
    assert tiny(**{"train.head_metrics": True}).train.head_metrics is True
    with pytest.raises(ValueError, match=r"^train\.head_metrics needs attention weights, which "
                                         r"model\.attention\.kernel='linear'"):
        tiny(**{"train.head_metrics": True, "model.attention.kernel": "linear"})


def test_knockout_losses_use_the_evaluation_batches():
    config = tiny()
    params = params_of(config)
    batches = batches_of(config)
    baseline = K.loss_with_gates(config, params, np.ones((2, 2)), batches)
    expected = evaluate(config, params, Dataset(config.data))[T]["loss"]
    np.testing.assert_allclose(baseline, expected, rtol=1e-6)
    delta = K.knockout_losses(config, params, batches, heads=[(0, 1)])
    gates = np.ones((2, 2))
    gates[0, 1] = 0.0
    np.testing.assert_allclose(delta[0, 1],
                               K.loss_with_gates(config, params, gates, batches) - baseline,
                               rtol=1e-6)
    assert np.isnan(delta[[0, 1, 1], [0, 0, 1]]).all()
    with pytest.raises(ValueError, match="gates must have shape"):
        K.loss_with_gates(config, params, np.ones(4), batches)


# ------------------------------------------------------------ 3. importance and pruning

def test_importance_is_the_gate_derivative_of_the_loss():
    config = tiny()
    params = params_of(config)
    # one example, four times (the shapes of the other tests' batches: no new compilation):
    # E_x |dL(x)/dxi| is then |dL/dxi| of the batch loss, which loss_with_gates measures
    one = [jax.tree_util.tree_map(lambda x: jnp.repeat(x[:1], 4, 0), batches_of(config)[0])]
    importance = K.head_importance(config, params, one, normalize=False)
    chex.assert_shape(importance, (2, 2))
    # central difference in float32: the loss is ~3.5, so rounding error is ~3.5 * 6e-8 / eps
    # = 1e-5 for eps = 0.02 and the truncation error eps^2 / 6 * L''' is smaller still
    eps = 0.02
    for layer, head in ((0, 1), (1, 0)):
        plus, minus = np.ones((2, 2)), np.ones((2, 2))
        plus[layer, head] += eps
        minus[layer, head] -= eps
        fd = (K.loss_with_gates(config, params, plus, one)
              - K.loss_with_gates(config, params, minus, one)) / (2 * eps)
        np.testing.assert_allclose(importance[layer, head], abs(fd), rtol=1e-2, atol=5e-5)
    normalised = K.head_importance(config, params, one)
    np.testing.assert_allclose(np.linalg.norm(normalised, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(normalised, importance / np.linalg.norm(importance, axis=1,
                                                                       keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("order", ["importance", "random"])
def test_pruning_curve_starts_at_the_baseline_and_ends_with_no_heads(order):
    config = tiny()
    params = params_of(config)
    batches = batches_of(config)
    curve = K.pruning_curve(config, params, batches, steps=2, order=order)
    np.testing.assert_allclose(curve["fraction"], [0.0, 0.5, 1.0])
    assert len(curve["loss"]) == len(curve["accuracy"]) == 3
    np.testing.assert_allclose(curve["loss"][0],
                               K.loss_with_gates(config, params, np.ones((2, 2)), batches))
    np.testing.assert_allclose(curve["loss"][-1],
                               K.loss_with_gates(config, params, np.zeros((2, 2)), batches))
    assert sorted(curve["pruned"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(ValueError, match=r"steps must be in \[1, 4\]"):
        K.pruning_curve(config, params, batches, steps=5)
    with pytest.raises(ValueError, match="order='x' is not valid; choices: importance"):
        K.pruning_curve(config, params, batches, order="x")


def test_knockout_order_removes_the_least_harmful_head_first():
    config = tiny()
    params = params_of(config)
    delta = np.asarray([[0.3, -0.1], [0.2, 0.0]])
    curve = K.pruning_curve(config, params, batches_of(config), steps=4, order="knockout",
                            knockout=delta)
    assert curve["pruned"] == [(0, 1), (1, 1), (1, 0), (0, 0)]


# ------------------------------------------------------------ 4. pictures and reports

def test_byte_labels_and_truncation():
    text, ids = DataConfig(task="text"), DataConfig(task="induction", vocab_size=32)
    assert V.token_labels([ord("a"), 32, 10, 9, 0x80], text) == ["a", "␣", "⏎", "⇥", "\\x80"]
    assert V.token_labels([3, 17], ids) == ["3", "17"]
    # an encoder's special tokens by name: the last four ids of its vocabulary
    assert V.token_labels([257, ord("a"), 258, 259, 256], DataConfig(task="mlm")) == [
        "[CLS]", "a", "[SEP]", "[MASK]", "[PAD]"]
    assert V.token_labels([28, 3, 29], DataConfig(task="first_repeat", vocab_size=32)) == [
        "[PAD]", "3", "[CLS]"]
    w = np.zeros((60, 60))
    cut, labels, keys, title = V.truncate(w, [str(i) for i in range(60)], "L0 H1", 48)
    assert cut.shape == (48, 48) and labels[-1] == "47" and keys == labels
    assert title == "L0 H1 (first 48 of 60 tokens)"
    same = V.truncate(w[:10, :10], ["x"] * 10, "t", 48)
    assert same[1:] == (["x"] * 10, ["x"] * 10, "t") and same[0].shape == (10, 10)
    # cross-attention: 60 target queries over 50 source keys, each axis labelled on its own
    cut, labels, keys, title = V.truncate(w[:, :50], ["q"] * 60, "x", 48, ["k"] * 50)
    assert cut.shape == (48, 48) and (labels, keys) == (["q"] * 48, ["k"] * 48)
    assert title == "x (first 48 of 60 x 50 tokens)"
    assert V.token_labels([9, 10, 3, 11], DataConfig(task="reversal", vocab_size=12)) == [
        "PAD", "BOS", "3", "EOS"]


def test_pictures_are_pngs(tmp_path, assert_png):
    V.plot_attention(uniform_causal(50), [chr(97 + i % 26) for i in range(50)], "uniform",
                     tmp_path / "a.png")
    V.plot_head_grid(np.stack([np.stack([uniform_causal(8), np.eye(8)])] * 2), tmp_path / "g.png",
                     "grid")
    K.plot_knockout_heatmap(np.asarray([[0.5, -0.1], [0.0, np.nan]]), tmp_path / "k.png")
    curve = {"order": "random", "fraction": np.asarray([0, 1.0]), "loss": np.asarray([1, 2.0]),
             "accuracy": np.asarray([0.9, 0.1])}
    K.plot_pruning_curve([curve], tmp_path / "p.png")
    # pixels = figsize x dpi: (side + 1, side) at 110 with side = 0.16 * 48 + 1.6 (48 of 50
    # tokens shown); (1.9 * heads + 0.9, 1.9 * layers + 0.5) at 100; (heads + 2.2,
    # 0.7 * layers + 1.6) at 110; (10, 4) at 110
    assert_png(tmp_path / "a.png", (1130, 1020))
    assert_png(tmp_path / "g.png", (470, 430))
    assert_png(tmp_path / "k.png", (462, 330))
    assert_png(tmp_path / "p.png", (1100, 440))


def test_reports_of_a_run(tmp_path, assert_png):
    config = tiny()
    run = tmp_path / "run"                               # a run directory with one checkpoint
    RunDir(run).prepare(config)
    checkpoints = RunDir(run).checkpoints()
    checkpoints.save(0, init_state(config), to_dict(config), 1.0)
    checkpoints.wait()
    checkpoints.close()
    table = V.write_attention_report(run, tmp_path / "attn", batch=4)
    files = {p.name for p in (tmp_path / "attn").iterdir()}
    assert files == {"L0H0.png", "L0H1.png", "L1H0.png", "L1H1.png", "grid.png",
                     "head_stats.md", "head_stats.csv"}
    for name in ("L0H0", "L0H1", "L1H0", "L1H1"):         # 12 tokens: side = 4 (its minimum)
        assert_png(tmp_path / "attn" / f"{name}.png", (550, 440))
    assert_png(tmp_path / "attn" / "grid.png", (470, 430))      # 2 x 2 heads, as above
    assert table.splitlines()[-1].startswith("| L1.H1 |")
    assert len((tmp_path / "attn" / "head_stats.csv").read_text().splitlines()) == 1 + 4
    with pytest.raises(ValueError, match="--text needs a text model"):
        V.write_attention_report(run, tmp_path / "x", text="hello")
    longer = config.model.max_length                     # past the training length (12)
    V.write_attention_report(run, tmp_path / "long", batch=2, length=longer)
    assert f"T={longer}" in (tmp_path / "long" / "head_stats.md").read_text().splitlines()[0]
    with pytest.raises(ValueError, match="length must be >= 2"):
        V.write_attention_report(run, tmp_path / "x", length=1)
    report = K.write_head_report(run, tmp_path / "heads", steps=2)
    for name, size in (("knockout", (462, 330)), ("importance", (462, 330)),
                       ("pruning", (1100, 440))):
        assert_png(tmp_path / "heads" / f"{name}.png", size)
    assert "| L0.H0 |" in report and "Baseline validation loss" in report
    assert len((tmp_path / "heads" / "knockout.csv").read_text().splitlines()) == 1 + 4
