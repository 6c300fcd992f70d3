"""Probes of issue 10: the attention sub-layer output and residual stream (M11), accuracy by
query-key distance on the recall tasks (M12), pairwise JS between a layer's heads (M16) and
occlusion attribution beside the attention weights (M17), each checked on values against
float64 NumPy, hand-computed numbers or a brute-force loop; then the command line.
"""

import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.analysis import compare, occlusion as O, recall as R
from attnjax.analysis.head_similarity import layer_summary
from attnjax.config import to_dict
from attnjax.data.synthetic import induction
from attnjax.models.decoder import DecoderLM
from attnjax.models.probe import capture_streams
from attnjax.ops import stats as S
from attnjax.rundir import RunDir
from attnjax.train.state import init_state
from helpers import TINY_INDUCTION, TINY_TEXT, run_cli, tiny_config

# two pre-norm layers whose queries are 0: every logit is 0, so attention is uniform over the
# causal keys
UNIFORM = tiny_config(TINY_INDUCTION, **{"model.num_layers": 2,
                                         "model.attention.q_init": "zeros"})
TINY = tiny_config(TINY_INDUCTION)          # 1 layer, 2 heads, d_model 16, vocabulary 16
# the command-line test's evaluation override: the occlusion test shares its program
SCALED = tiny_config(TINY_INDUCTION, **{"model.attention.scale_multiplier": 1e-6})


@functools.cache
def induction_batch() -> dict:
    """32 induction examples of length 64 (block 16, vocabulary 32), as NumPy."""
    batch = jax.jit(induction, static_argnums=(1, 2, 3))(jax.random.key(3), 32, 64, 32)
    return jax.tree_util.tree_map(np.asarray, batch)


@functools.cache
def params_of(config):
    init = jax.jit(DecoderLM(config.model).init)
    return init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]


def tokens_of(config, batch: int = 2, length: int = 12, seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, length), 0,
                              config.model.vocab_size)


def layer_norm(x, scale, bias, eps=1e-6):        # flax.linen.LayerNorm's defaults
    x = np.asarray(x, np.float64)
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * scale + bias


# ------------------------------------------------------------ M11: streams

def test_sow_costs_nothing_when_intermediates_are_not_mutable(monkeypatch):
    params, tokens = params_of(TINY), tokens_of(TINY)
    forward = lambda p, t: DecoderLM(TINY.model).apply({"params": p}, t)
    with_sow = str(jax.make_jaxpr(forward)(params, tokens))
    monkeypatch.setattr(nn.Module, "sow", lambda self, *args, **kwargs: False)
    assert str(jax.make_jaxpr(forward)(params, tokens)) == with_sow


def test_uniform_attention_outputs_the_running_mean_of_the_values():
    params, tokens = params_of(UNIFORM), tokens_of(UNIFORM)
    streams = capture_streams(UNIFORM.model, params, tokens)
    chex.assert_shape([streams["attn_out"], streams["residual"]], (2, 2, 12, 16))
    p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    h = p["embed"]["embedding"][np.asarray(tokens)]                 # rope: no additive position
    counts = np.arange(1, 13)[None, :, None, None]
    for layer in range(2):
        block = p[f"block_{layer}"]
        x = layer_norm(h, block["attention_norm"]["scale"], block["attention_norm"]["bias"])
        v = np.einsum("btd,dnh->btnh", x, block["attention"]["qkv"]["kernel"][:, 4:])  # v: N+K..
        mean_v = np.cumsum(v, axis=1) / counts
        expected = np.einsum("btnh,nhd->btd", mean_v, block["attention"]["out"]["kernel"])
        np.testing.assert_allclose(streams["attn_out"][layer], expected, rtol=1e-5, atol=1e-6)
        h = np.asarray(streams["residual"][layer], np.float64)
    cosines = S.mean_pairwise_cosine(streams["attn_out"])                          # [layers]
    for layer in range(2):
        out = np.asarray(streams["attn_out"][layer])
        by_loop = np.mean([np.mean([S.cosine(out[b, i], out[b, j]) for i in range(12)
                                    for j in range(12) if i != j]) for b in range(2)])
        np.testing.assert_allclose(cosines[layer], by_loop, rtol=1e-5)


def test_the_last_residual_stream_gives_the_logits():
    params, tokens = params_of(UNIFORM), tokens_of(UNIFORM)
    residual = np.asarray(capture_streams(UNIFORM.model, params, tokens)["residual"][-1])
    p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), params)
    final = layer_norm(residual, p["final_norm"]["scale"], p["final_norm"]["bias"])
    logits, _ = DecoderLM(UNIFORM.model).apply({"params": params}, tokens)
    np.testing.assert_allclose(logits, final @ p["embed"]["embedding"].T, rtol=1e-5, atol=1e-5)


def test_mean_pairwise_cosine_by_hand():
    x = np.asarray([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],             # pairs 0, 1/√2, 1/√2
                    [[2.0, 2.0], [1.0, 1.0], [3.0, 3.0]]])            # all alike
    value = S.mean_pairwise_cosine(x)                                   # [B, T, D] -> []
    chex.assert_shape(value, ())
    np.testing.assert_allclose(value, (2 * math.sqrt(0.5) / 3 + 1) / 2, rtol=1e-6)
    zeros = np.zeros((1, 2, 2))
    assert float(S.mean_pairwise_cosine(zeros)) == 1.0                 # cosine's conventions
    assert np.isnan(S.mean_pairwise_cosine(np.asarray([[[0.0, 0.0], [1.0, 0.0]]])))
    assert np.isnan(S.mean_pairwise_cosine(np.ones((1, 1, 4))))                   # T = 1
    with pytest.raises(ValueError, match=r"x must be \[..., B, T, D\]"):
        S.mean_pairwise_cosine(np.ones((3, 4)))


# ------------------------------------------------------------ M16: heads alike

def test_js_is_defined_once_and_matches_a_hand_value():
    assert compare.js_divergence is S.js_divergence
    # M = (0.75, 0.25): KL(P||M) = ln(4/3), KL(Q||M) = ln(4/3) / 2, so JS = 0.75 ln(4/3)
    assert S.js_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(0.75 * math.log(4 / 3),
                                                                    abs=1e-12)


def causal_softmax(logits):
    T = logits.shape[-1]
    logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_head_divergence_identical_symmetric_bounded_and_by_hand():
    rng = np.random.default_rng(0)
    w = causal_softmax(rng.normal(size=(2, 3, 3, 6, 6)) * 3)               # [L, B, N, T, T]
    w[:, :, 2] = w[:, :, 0]                                                # heads 0 and 2 alike
    js = S.head_divergence(w)
    chex.assert_shape(js, (2, 3, 3))
    np.testing.assert_array_equal(js[:, 0, 2], 0.0)
    np.testing.assert_array_equal(np.diagonal(js, axis1=1, axis2=2), 0.0)
    np.testing.assert_array_equal(js, js.transpose(0, 2, 1))
    assert (js <= math.log(2)).all() and (js[:, 0, 1] > 0).all()
    by_loop = np.mean([S.js_divergence(w[1, b, 0, i], w[1, b, 1, i])
                       for b in range(3) for i in range(1, 6)])
    assert js[1, 0, 1] == pytest.approx(by_loop, rel=1e-12)
    T = 5                                 # head 0 on key 0, head 1 on the query's own key
    hand = np.stack([np.eye(T)[[0] * T], np.eye(T)])[None, None]             # [1, 1, 2, T, T]
    assert S.head_divergence(hand)[0, 0, 1] == pytest.approx(math.log(2))   # rows 1..4 disjoint
    assert S.head_divergence(hand, start=0)[0, 0, 1] == pytest.approx(math.log(2) * (T - 1) / T)
    with pytest.raises(ValueError, match="start must be in"):
        S.head_divergence(hand, start=T)


def test_layer_summary_by_hand():
    js = np.asarray([[[0, 0.3, 0.02], [0.3, 0, 0.1], [0.02, 0.1, 0]],
                     [[0, 0.5, 0.6], [0.5, 0, 0.4], [0.6, 0.4, 0]]])
    rows = layer_summary(js)
    assert rows[0]["pair"] == (0, 2) and rows[0]["closest"] == 0.02
    assert rows[0]["mean"] == pytest.approx(0.14) and rows[1]["pair"] == (1, 2)
    assert np.isnan(layer_summary(np.zeros((1, 1, 1)))[0]["mean"])             # one head


# ------------------------------------------------------------ M12: recall by distance

def test_recall_keys_on_hand_made_sequences():
    # induction: block 3 4 5, a gap 3 4 holding a chance repeat of the bigram (3, 4), then
    # the copy 3 4 5 scored at t = 5, 6 (inputs 3, 4 -> targets 4, 5). At t = 5 the keys
    # j = 0 and j = 3 both match one token of context: the earliest wins, d = 5; at t = 6
    # j = 1 matches two tokens (x_0 x_1 = x_5 x_6), d = 5 again.
    inputs = np.asarray([[3, 4, 5, 3, 4, 3, 4, 5]])
    targets = np.asarray([[4, 5, 3, 4, 3, 4, 5, 0]])
    weights = np.asarray([[0, 0, 0, 0, 0, 1, 1, 0]])
    keys = R.recall_keys(inputs, targets, weights)
    np.testing.assert_array_equal(keys, [[-1, -1, -1, -1, -1, 0, 1, -1]])
    # mqar: pairs (10, 40) (11, 41), then the queries 11 at t = 5 and 10 at t = 7; a scored
    # query 12 at t = 6 has no pair (no key)
    mqar = {"inputs": np.asarray([[10, 40, 11, 41, 0, 11, 12, 10]]),
            "targets": np.asarray([[0, 0, 0, 0, 0, 41, 42, 40]]),
            "weights": np.asarray([[0, 0, 0, 0, 0, 1, 1, 1]])}
    np.testing.assert_array_equal(R.recall_distances(mqar), [[-1, -1, -1, -1, -1, 3, -1, 7]])
    batch = induction_batch()
    scored = batch["weights"] > 0          # the generator's copies: d = the copy's offset
    offset = scored.argmax(1)[:, None]
    np.testing.assert_array_equal(np.where(scored, R.recall_distances(batch), 0),
                                  np.where(scored, offset, 0))


def test_bucket_edges_and_bad_specs():
    np.testing.assert_array_equal(R.bucket_edges("pow2", 63), [1, 2, 4, 8, 16, 32, 64])
    np.testing.assert_array_equal(R.bucket_edges("pow2", 64), [1, 2, 4, 8, 16, 32, 64, 128])
    np.testing.assert_array_equal(R.bucket_edges("4", 63), [1, 17, 33, 49, 65])
    np.testing.assert_array_equal(R.bucket_edges("1,8,32", 63), [1, 8, 32])
    np.testing.assert_array_equal(R.bucket_edges([2, 3], 63), [2, 3])
    with pytest.raises(ValueError, match="buckets='near' is not valid; choices: pow2"):
        R.bucket_edges("near", 63)
    with pytest.raises(ValueError, match="increasing integers >= 1"):
        R.bucket_edges("8,4", 63)
    with pytest.raises(ValueError, match="must be >= 1"):
        R.bucket_edges("0", 63)


def test_accuracy_is_bucketed_by_distance_and_the_counts_add_up():
    batch = induction_batch()
    distances = R.recall_distances(batch)
    # a fake model whose logits are right only where the key is fewer than 16 tokens back
    right = np.where(distances < 16, batch["targets"], (batch["targets"] + 1) % 32)
    logits = np.eye(32)[right]
    correct = logits.argmax(-1) == batch["targets"]
    result = R.bucket_accuracy(distances, correct, batch["weights"], R.bucket_edges("pow2", 63))
    assert result["count"].sum() + result["unmatched"] + result["outside"] == result["scored"]
    assert result["scored"] == batch["weights"].sum() and result["unmatched"] == 0
    near, far = result["lo"] < 16, result["lo"] >= 16
    filled = result["count"] > 0
    np.testing.assert_array_equal(result["accuracy"][near & filled], 1.0)
    np.testing.assert_array_equal(result["accuracy"][far & filled], 0.0)
    assert np.isnan(result["accuracy"][~filled]).all()
    assert result["overall"] == pytest.approx(
        (result["correct"].sum()) / result["scored"])
    narrow = R.bucket_accuracy(distances, correct, batch["weights"], [1, 8])    # 8+ outside
    assert narrow["outside"] == (batch["weights"] * (distances >= 8)).sum()
    with pytest.raises(ValueError, match="needs data.task in induction, mqar; this run's is "
                                         "'text'"):
        R.accuracy_by_distance(tiny_config(TINY_TEXT), None, [batch])


# ------------------------------------------------------------ M17: occlusion

def test_spearman_and_average_ranks_by_hand():
    np.testing.assert_array_equal(S.average_ranks([3.0, 1.0, 3.0, 2.0]), [3.5, 1, 3.5, 2])
    assert S.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)   # 1 - 6*2/60
    # ties: ranks (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): 4.5 / sqrt(4.5 * 5)
    assert S.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert S.spearman([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    assert math.isnan(S.spearman([1, 1, 1], [1, 2, 3])) and math.isnan(S.spearman([1], [2]))
    rows = O.rank_agreement(np.asarray([[[1, 0, 0], [1, 2, 0], [3, 2, 1]]], float),
                            np.asarray([[[1, 0, 0], [0.4, 0.6, 0], [0.5, 0.2, 0.3]]]))
    np.testing.assert_allclose(rows, [[np.nan, 1.0, 0.5]])          # row 2: ranks 3 2 1 vs 3 1 2


def test_replacement_tokens_change_every_token_and_follow_the_seed():
    x = jnp.asarray(np.random.default_rng(0).integers(0, 5, (8, 50)))
    r = np.asarray(O.replacement_tokens(x, 5, seed=3, draw=1))
    assert (r != np.asarray(x)).all() and r.min() >= 0 and r.max() < 5
    np.testing.assert_array_equal(r, O.replacement_tokens(x, 5, seed=3, draw=1))
    assert (r != np.asarray(O.replacement_tokens(x, 5, seed=4, draw=1))).any()


def test_occlusion_matches_a_brute_force_loop_and_is_causal():
    # one example of 16 tokens and 2 draws, as in the command-line test below
    params, T, draws = params_of(SCALED), 16, 2
    inputs, targets = tokens_of(SCALED, 1, T, seed=5), tokens_of(SCALED, 1, T, seed=6)
    importance = O.occlusion_importance(SCALED, params, inputs, targets, draws=draws, seed=7)
    chex.assert_shape(importance, (1, T, T))
    after = np.triu(np.ones((T, T), bool), 1)
    assert (importance[:, after] == 0).all()               # a key after the query: exactly 0
    assert np.abs(importance[:, ~after]).max() > 1e-3
    model = DecoderLM(SCALED.model)
    losses = jax.jit(lambda x: O.token_losses(model, params, x, targets))
    base = np.asarray(losses(inputs), np.float64)
    by_loop = np.zeros((1, T, T))
    for d in range(draws):
        r = np.asarray(O.replacement_tokens(inputs, SCALED.model.vocab_size, 7, d))
        for j in range(T):
            x = np.asarray(inputs).copy()
            x[:, j] = r[:, j]
            by_loop[:, :, j] += (np.asarray(losses(jnp.asarray(x))) - base) / draws
    np.testing.assert_allclose(importance, by_loop, atol=2e-6)
    np.testing.assert_array_equal(importance, O.occlusion_importance(
        SCALED, params, inputs, targets, draws=draws, seed=7))               # deterministic


# ------------------------------------------------------------ the command line

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny induction run with one checkpoint (its initialisation)."""
    run = tmp_path_factory.mktemp("probes") / "run"
    RunDir(run).prepare(TINY)
    checkpoints = RunDir(run).checkpoints()
    checkpoints.save(0, init_state(TINY), to_dict(TINY), 1.0)
    checkpoints.wait()
    checkpoints.close()
    return run


def test_cli_attention_with_occlusion_and_an_override(run_dir, tmp_path, capsys, assert_png,
                                                      monkeypatch):
    from attnjax.analysis import heatmaps as V          # its heatmaps: tests/test_analysis.py
    monkeypatch.setattr(V, "plot_attention", lambda *a, **k: None)
    monkeypatch.setattr(V, "plot_head_grid", lambda *a, **k: None)
    code, out, err = run_cli(capsys, "attention", str(run_dir), "--out", str(tmp_path / "a"),
                             "--batch", "1", "--occlusion", "--draws", "2",
                             "model.attention.scale_multiplier=1e-6")
    assert code == 0, err
    assert "| L0 |" in out and "attention-output cosine" in out
    assert "median Spearman rho" in out and out.rstrip().splitlines()[-1].startswith("wrote")
    assert_png(tmp_path / "a" / "occlusion.png", min_side=300)
    rows = (tmp_path / "a" / "occlusion.csv").read_text().splitlines()
    assert rows[0] == "example,query,spearman_rho" and len(rows) > 1
    code, _, err = run_cli(capsys, "attention", str(run_dir), "--out", str(tmp_path / "b"),
                           "--occlusion", "--draws", "0")
    assert code == 2 and err.strip() == "attnjax: error: draws must be >= 1, got 0"
    code, _, err = run_cli(capsys, "attention", str(run_dir), "--out", str(tmp_path / "c"),
                           "--draws", "2")
    assert code == 2 and err.strip() == "attnjax: error: --draws is read only with --occlusion"


def test_cli_recall_and_the_js_table_of_heads(run_dir, tmp_path, capsys, assert_png,
                                             monkeypatch):
    code, out, err = run_cli(capsys, "recall", str(run_dir), "--out", str(tmp_path / "r"),
                             "--buckets", "1,4,8,16")
    assert code == 0, err
    assert "| 1–3 |" in out and "| 8–15 |" in out
    # one batch of 4 examples of length 16: a block of 4, scored on its last 3 tokens
    assert "over 12 scored targets; 0 without a key, 0 outside the buckets" in out
    rows = (tmp_path / "r" / "recall.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 and sum(int(row.split(",")[2]) for row in rows[1:]) == 12
    assert_png(tmp_path / "r" / "recall.png", min_side=300)
    code, _, err = run_cli(capsys, "recall", str(run_dir), "--out", str(tmp_path / "x"),
                           "--buckets", "far")
    assert code == 2 and err.startswith("attnjax: error: buckets='far' is not valid")
    # the heads report without its knockout, importance and pruning parts (and their
    # pictures; all in tests/test_analysis.py): the JS table
    from attnjax.analysis import heads as K
    for name in ("plot_knockout_heatmap", "plot_head_matrix", "plot_pruning_curve"):
        monkeypatch.setattr(K, name, lambda *a, **k: None)
    monkeypatch.setattr(K, "knockout_losses", lambda *a, **k: np.zeros((1, 2)))
    monkeypatch.setattr(K, "head_importance", lambda *a, **k: np.ones((1, 2)))
    monkeypatch.setattr(K, "pruning_curve", lambda *a, order, **k: {
        "order": order, "fraction": np.asarray([0.0]), "loss": np.asarray([1.0]),
        "accuracy": np.asarray([0.5]), "pruned": []})
    code, out, err = run_cli(capsys, "heads", str(run_dir), "--out", str(tmp_path / "h"))
    assert code == 0, err
    assert "mean pairwise JS" in out and "| L0 | " in out and "H0–H1" in out
    rows = (tmp_path / "h" / "head_js.csv").read_text().splitlines()
    assert rows[0] == "layer,head_a,head_b,js" and len(rows) == 2
    assert_png(tmp_path / "h" / "head_js.png", min_side=200)
