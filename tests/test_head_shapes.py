"""Head shapes of the attention module (issue 10: M6, M7, M8, M20).

- value width independent of the key width (``model.attention.value_head_dim``): every kernel
  against a float64 NumPy oracle, or refused; parameter shapes, KV-cache decoding, training;
- the output projection ``dense`` / ``none`` / ``frozen``: parameter trees, the module against
  an explicit concatenation and the fixed orthogonal matrix, the matrix untouched by training;
- the per-head projection layout: ``convert_projections`` between the layouts, equal logits at
  equal weights for MHA and GQA;
- every refusal of the new fields, one line naming the field.
"""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax  # noqa: F401  (registers the kernels)
from attnjax.config import AttentionConfig, ModelConfig, PositionConfig
from attnjax.data import Dataset
from attnjax.models.decoder import DecoderLM
from attnjax.nn import MultiHeadAttention
from attnjax.nn.attention import frozen_projection
from attnjax.nn.layouts import convert_projections
from attnjax.nn.slots import head_init, projection_init
from attnjax.ops import dot_product_attention
from attnjax.parity import oracle_attention, oracle_grads
from attnjax.registry import KERNELS
from attnjax.train.state import init_state
from attnjax.train.step import make_train_step
from helpers import TINY_INDUCTION, tiny_config

# ------------------------------------------------------------------ kernels: d_v != d_k (S-op)

B, T, N, H = 2, 16, 4, 32      # 16 tokens: four of the triangular kernel's test blocks
CAUSAL = np.tril(np.ones((T, T), bool))
_RNG = np.random.default_rng(0)
Q, K = (_RNG.normal(size=(B, T, N, H)).astype(np.float32) for _ in range(2))
VALUES = {d: _RNG.normal(size=(B, T, N, d)).astype(np.float32) for d in (16, 32, 64)}


def linear_oracle(q, k, v, eps=1e-6):
    """float64 causal linear attention with ``phi = elu + 1`` on the scaled query and the key
    (the ``linear`` kernel's function): ``phi(q_i).sum_{j<=i} phi(k_j) v_j / (phi(q_i).sum_{j<=i}
    phi(k_j) + eps)``."""
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))
    q = phi(np.asarray(q, np.float64) / np.sqrt(q.shape[-1]))
    k, v = phi(np.asarray(k, np.float64)), np.asarray(v, np.float64)
    scores = np.einsum("btnh,bsnh->bnts", q, k) * CAUSAL
    return np.einsum("bnts,bsnd->btnd", scores, v) / (scores.sum(-1)[..., None]
                                                      .transpose(0, 2, 1, 3) + eps)


@pytest.mark.parametrize("d_v", sorted(VALUES))
@pytest.mark.parametrize("name", [n for n, s in KERNELS.items() if s.runs_as is None])
def test_every_kernel_computes_a_value_width_of_its_own_or_refuses_it(name, d_v):
    """q, k ~ N(0, 1) [2, 16, 4, 32], v [2, 16, 4, d_v]: output [2, 16, 4, d_v] equal to the
    float64 oracle within 1e-5 (exact kernels also in their gradients), or a one-line refusal
    naming the option when the kernel does not declare ``value_head_dim``."""
    spec, v = KERNELS.get(name), VALUES[d_v]
    if d_v != H and "value_head_dim" not in spec.supports:
        with pytest.raises(ValueError, match=f"implementation={name!r} does not support: "
                                             "value_head_dim;"):
            dot_product_attention(Q, K, v, is_causal=True, implementation=name)
        return
    if not spec.available():
        pytest.skip(f"{name} does not run on {jax.default_backend()}")
    attend = lambda q, k, v: dot_product_attention(q, k, v, is_causal=True, implementation=name,
                                                   **dict(spec.test_options))
    cot = np.random.default_rng(1).normal(size=(B, T, N, d_v)).astype(np.float32)
    with_grads = spec.exact and d_v != H     # d_v = d_k: the parity tests of test_attention.py
    out, grads = jax.jit(lambda *a: (lambda o, vjp: (o, vjp(cot) if with_grads else ()))(
        *jax.vjp(attend, *a)))(Q, K, v)
    chex.assert_shape(out, (B, T, N, d_v))
    if name == "linear":                         # another function: its own oracle
        np.testing.assert_allclose(np.asarray(out), linear_oracle(Q, K, v), rtol=1e-5,
                                   atol=1e-5)
        return
    np.testing.assert_allclose(np.asarray(out), oracle_attention(Q, K, v, mask=CAUSAL),
                               rtol=1e-5, atol=1e-5)
    if with_grads:
        for got, want in zip(grads, oracle_grads(Q, K, v, cot, mask=CAUSAL)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_oracle_grads_with_a_value_width_of_its_own_match_finite_differences():
    """The hand-derived oracle gradients hold for d_v != d_k (central differences, float64)."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(1, 3, 2, 2)), rng.normal(size=(1, 4, 1, 2)), rng.normal(
        size=(1, 4, 1, 3))
    mask = np.tril(np.ones((3, 4), bool), 1)
    cot = rng.normal(size=(1, 3, 2, 3))
    loss = lambda q, k, v: float((oracle_attention(q, k, v, mask=mask) * cot).sum())
    for which, grad in enumerate(oracle_grads(q, k, v, cot, mask=mask)):
        arrays = [q, k, v]
        numeric = np.zeros_like(arrays[which])
        for index in np.ndindex(numeric.shape):
            step = np.zeros_like(numeric)
            step[index] = 1e-5
            plus = [a + step if i == which else a for i, a in enumerate(arrays)]
            minus = [a - step if i == which else a for i, a in enumerate(arrays)]
            numeric[index] = (loss(*plus) - loss(*minus)) / 2e-5
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6)


def test_a_kernel_without_value_head_dim_is_refused(monkeypatch):
    """A kernel that does not declare ``value_head_dim`` is refused by the front door and the
    config (one line naming the field and the kernels that can), and runs with equal widths."""
    reference = KERNELS.get("reference")
    monkeypatch.setitem(KERNELS._entries, "equal_widths", reference._replace(
        supports=reference.supports - {"value_head_dim"}))
    able = ", ".join(n for n, s in KERNELS.items() if "value_head_dim" in s.supports)
    with pytest.raises(ValueError) as error:
        dot_product_attention(Q, K, VALUES[16], implementation="equal_widths")
    assert str(error.value) == ("implementation='equal_widths' does not support: "
                                f"value_head_dim; kernels that do: {able}")
    with pytest.raises(ValueError) as error:
        ModelConfig(attention=AttentionConfig(kernel="equal_widths", value_head_dim=16))
    assert str(error.value).startswith("model.attention.kernel='equal_widths' does not support: "
                                       "value_head_dim;") and "\n" not in str(error.value)
    ModelConfig(attention=AttentionConfig(kernel="equal_widths", value_head_dim=32))  # = d/N
    chex.assert_shape(dot_product_attention(Q, K, VALUES[32], implementation="equal_widths"),
                      (B, T, N, H))


# --------------------------------------------------------- the module: shapes and the oracle

WIDE = dict(vocab_size=64, d_model=64, num_layers=1, max_length=16,
            position=PositionConfig(kind="none"))


def wide(**attention) -> ModelConfig:
    """d_model 64, 4 heads of head_dim 32 (M6), separate projections, no position encoding."""
    return ModelConfig(**WIDE, attention=AttentionConfig(
        **{"num_heads": 4, "head_dim": 32, "fused_qkv": False, **attention}))


MODULE_CASES = {  # id -> (value_head_dim, output_projection); d_v = d_k: tests/test_nn.py
    "d_v=16": (16, "dense"), "d_v=64": (64, "dense"), "none": (16, "none"),
    "frozen": (64, "frozen")}


@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_has_its_shapes_and_matches_the_oracle(case):
    """head_dim 32 at d_model 64 with 4 heads (the M6 case, extended): q, k ``[64, 4, 32]``,
    v ``[64, 4, d_v]``, ``out`` ``[4, d_v, 64]`` for ``dense`` and absent otherwise; the
    output equals the float64 oracle's heads times W_o, their concatenation (``none``) or
    the concatenation times the frozen orthogonal matrix (``frozen``)."""
    d_v, projection = MODULE_CASES[case]
    config = wide(value_head_dim=d_v, output_projection=projection)
    D = config.value_head_dim
    assert D == (d_v or 32)
    x = jax.random.normal(jax.random.key(0), (2, 8, 64))
    positions = jnp.arange(8)[None]
    module = MultiHeadAttention(config)
    params = jax.jit(module.init)(jax.random.key(1), x, positions)["params"]
    shapes = {"query": (64, 4, 32), "key": (64, 4, 32), "value": (64, 4, D)}
    if projection == "dense":
        shapes["out"] = (4, D, 64)
    assert set(params) == set(shapes)
    chex.assert_trees_all_equal_shapes(params, {n: {"kernel": jnp.zeros(s)} for n, s in
                                                shapes.items()})
    out, _ = jax.jit(module.apply)({"params": params}, x, positions)
    chex.assert_shape(out, (2, 8, 64))
    project = lambda name: np.einsum("btd,dnh->btnh", np.asarray(x, np.float64),
                                     np.asarray(params[name]["kernel"], np.float64))
    heads = oracle_attention(project("query"), project("key"), project("value"),
                             mask=np.tril(np.ones((8, 8), bool)))
    concat = heads.reshape(2, 8, 4 * D)
    expected = {"dense": lambda: np.einsum("btnh,nhd->btd", heads,
                                           np.asarray(params["out"]["kernel"], np.float64)),
                "none": lambda: concat,
                "frozen": lambda: concat @ frozen_projection("", 4 * D, 64)}[projection]()
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------- tiny DecoderLMs: cache, layouts, training

SMALL = dict(vocab_size=64, d_model=32, num_layers=1, max_length=16)   # 4 heads of width 8


def small(**attention) -> ModelConfig:
    return ModelConfig(**SMALL, attention=AttentionConfig(**{"num_heads": 4, **attention}))


def tokens_of(length, batch=2):
    return jax.random.randint(jax.random.key(0), (batch, length), 0, 64)


LAYOUTS = {"fused": dict(), "separate": dict(fused_qkv=False),
           "per_head": dict(fused_qkv=False, per_head_projections=True)}


def expected_attention_shapes(layout, N, K, H, D, d=32):
    """Kernel shapes of one attention module's q, k, v projections in ``layout``."""
    if layout == "fused":
        return {"qkv": (d, N + 2 * K, H) if D == H else (d, (N + K) * H + K * D)}
    if layout == "separate":
        return {"query": (d, N, H), "key": (d, K, H), "value": (d, K, D)}
    return {**{f"query_{i}": (d, H) for i in range(N)}, **{f"key_{j}": (d, H) for j in range(K)},
            **{f"value_{j}": (d, D) for j in range(K)}}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("d_v", [None, 4, 16], ids=["d_v=d_k", "d_v=d_k/2", "d_v=2d_k"])
def test_attention_parameter_shapes(d_v, layout):
    """Every layout at d_v = d_k (the default: today's shapes, ``qkv`` ``[32, 12, 8]``),
    d_k / 2 and 2 d_k, GQA with 2 kv heads; ``out`` ``[4, d_v, 32]``."""
    config = small(value_head_dim=d_v, num_kv_heads=2, **LAYOUTS[layout])
    shapes = jax.eval_shape(MultiHeadAttention(config).init, jax.random.key(0),
                            jnp.zeros((1, 4, 32)), jnp.arange(4)[None])["params"]
    attention = {name: p["kernel"].shape for name, p in shapes.items()}
    D = d_v or 8
    assert attention == {**expected_attention_shapes(layout, 4, 2, 8, D), "out": (4, D, 32)}


def decode_logits(config, params, tokens):
    """Logits of decoding ``tokens`` one at a time from an empty KV cache."""
    model = DecoderLM(config)
    cache = jax.jit(lambda t: model.init(jax.random.key(2), t, decode=True)["cache"])(
        tokens[:, :1])
    step = jax.jit(lambda cache, token: model.apply({"params": params, "cache": cache}, token,
                                                    decode=True, mutable=["cache"]))
    outputs = []
    for t in range(tokens.shape[1]):
        (logits, _), updated = step(cache, tokens[:, t:t + 1])
        outputs.append(logits)
        cache = updated["cache"]
    return jnp.concatenate(outputs, axis=1), cache


@pytest.mark.parametrize("d_v, layout", [(4, "fused"), (16, "fused"), (16, "separate"),
                                         (16, "per_head")],
                         ids=["d_v=d_k/2", "d_v=2d_k", "d_v=2d_k-separate", "d_v=2d_k-per_head"])
def test_value_head_dim_decodes_like_the_full_forward(d_v, layout):
    """The value cache is ``[B, K, max_length, d_v]`` (head-major) and decoding token by token
    gives the full forward's logits (GQA, RoPE), in every projection layout (the separate
    layout's ``key`` and ``value`` projections beside the cache's entries)."""
    config = small(value_head_dim=d_v, num_kv_heads=2, **LAYOUTS[layout])
    tokens = tokens_of(6)
    params = jax.jit(DecoderLM(config).init)(jax.random.key(1), tokens)["params"]
    full, _ = jax.jit(DecoderLM(config).apply)({"params": params}, tokens)
    decoded, cache = decode_logits(config, params, tokens)
    attention = cache["block_0"]["attention"]
    chex.assert_shape([attention["cached_key"], attention["cached_value"]],
                      [(2, 2, 16, 8), (2, 2, 16, d_v)])
    np.testing.assert_allclose(np.asarray(decoded), np.asarray(full), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads", [dict(), dict(num_kv_heads=2)], ids=["mha", "gqa"])
def test_per_head_layout_equals_the_separate_one_at_equal_weights(heads):
    """``convert_projections`` moves a separate model's weights into the per-head layout (and
    the fused one): the logits agree within 1e-6 (float32), and converting back returns the
    weights bit for bit. d_v = 2 d_k, so the fused layout is the flat one."""
    configs = {name: small(value_head_dim=16, use_bias=True, **heads, **layout)
               for name, layout in LAYOUTS.items()}
    tokens = tokens_of(8)
    separate = jax.jit(DecoderLM(configs["separate"]).init)(jax.random.key(1), tokens)["params"]
    logits = {}
    for name, config in configs.items():
        params = convert_projections(separate, config)
        kernels = {n: p["kernel"].shape for n, p in params["block_0"]["attention"].items()}
        assert kernels == {**expected_attention_shapes(name, 4, heads.get("num_kv_heads", 4),
                                                       8, 16), "out": (4, 16, 32)}
        logits[name] = jax.jit(DecoderLM(config).apply)({"params": params}, tokens)[0]
        chex.assert_trees_all_equal(convert_projections(params, configs["separate"]), separate)
    np.testing.assert_allclose(logits["per_head"], logits["separate"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(logits["fused"], logits["separate"], rtol=0, atol=1e-6)


def test_per_head_kernels_are_drawn_as_columns_of_the_whole_projection():
    """A head's kernel is its columns of the separate kernel drawn with the same key, so
    xavier's fan-out is the projection's N H, not the head's H."""
    att = AttentionConfig(num_heads=4, fused_qkv=False, q_init="xavier_uniform")
    key = jax.random.key(0)
    whole = projection_init(att, [("q", 32)])(key, (32, 32))
    for i in range(4):
        np.testing.assert_array_equal(head_init(att, "q", 4, 8, i)(key, (32, 8)),
                                      whole[:, 8 * i:8 * (i + 1)])
    assert float(jnp.abs(whole).max()) <= np.sqrt(6 / (32 + 32))   # not sqrt(6 / (32 + 8))


# ------------------------------------------------------------------------ output projection


@pytest.mark.parametrize("rows, cols", [(64, 32), (32, 64), (32, 32)])
def test_frozen_projection_is_a_fixed_orthogonal_matrix_per_layer(rows, cols):
    w = np.asarray(frozen_projection("block_0/attention", rows, cols), np.float64)
    chex.assert_shape(w, (rows, cols))
    gram = w.T @ w if rows >= cols else w @ w.T
    np.testing.assert_allclose(gram, np.eye(min(rows, cols)), atol=1e-6)
    frozen_projection.cache_clear()              # recomputed from scratch: the same bits
    np.testing.assert_array_equal(frozen_projection("block_0/attention", rows, cols), w)
    assert np.abs(frozen_projection("block_1/attention", rows, cols) - w).max() > 0.1


def test_output_projection_parameter_trees():
    """``dense``: today's tree (``out`` ``[N, d_v, d_model]``); ``none`` and ``frozen``: the
    same tree without ``out``; nothing else changes."""
    trees = {p: jax.eval_shape(DecoderLM(small(output_projection=p)).init, jax.random.key(0),
                               tokens_of(4))["params"] for p in ("dense", "none", "frozen")}
    chex.assert_shape(trees["dense"]["block_0"]["attention"]["out"]["kernel"], (4, 8, 32))
    without_out = lambda tree: {layer: ({k: v for k, v in sub.items() if k != "attention"}
                                        | {"attention": {k: v for k, v in sub["attention"].items()
                                                         if k != "out"}})
                                if layer.startswith("block_") else sub
                                for layer, sub in tree.items()}
    for projection in ("none", "frozen"):
        assert "out" not in trees[projection]["block_0"]["attention"]
        chex.assert_trees_all_equal_shapes(trees[projection], without_out(trees["dense"]))


@functools.cache
def first_batch(data, size: int) -> dict:
    return Dataset(data).batch(0, 0, size, data.length, "train")


def train_steps(config, steps: int):
    """``steps`` updates on the step-0 batch: the state after them, and the losses."""
    step = jax.jit(make_train_step(config))
    batch = first_batch(config.data, config.train.batch_size)
    state, losses = init_state(config), []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return state, losses


TRAIN_CASES = {"d_v=d_k/2": {"model.attention.value_head_dim": 4},
               "d_v=2d_k,frozen": {"model.attention.value_head_dim": 16,
                                   "model.attention.output_projection": "frozen"}}


@pytest.mark.trains
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_training_lowers_the_loss_and_never_touches_the_frozen_projection(case):
    """A few AdamW steps (weight decay on) on one batch lower the loss at d_v = d_k / 2 and at
    d_v = 2 d_k with the frozen projection. The frozen matrix has no parameter and no
    optimizer state, and the trained module still applies the very same matrix."""
    config = tiny_config(TINY_INDUCTION, **{"model.attention.fused_qkv": False,
                                            "train.weight_decay": 0.5, **TRAIN_CASES[case]})
    model = config.model
    N, D, d = model.attention.num_heads, model.value_head_dim, model.d_model
    frozen_before = np.array(frozen_projection("block_0/attention", N * D, d))
    after, losses = train_steps(config, 8)
    assert losses[-1] < losses[0] - 0.05, losses
    chex.assert_tree_all_finite(after.params)
    attention = after.params["block_0"]["attention"]
    chex.assert_shape(attention["value"]["kernel"], (d, N, D))
    if model.attention.output_projection != "frozen":
        return
    assert "out" not in attention
    assert not any(leaf.shape in ((N, D, d), (N * D, d)) for leaf in
                   jax.tree.leaves((after.params, after.opt_state)))
    frozen_projection.cache_clear()
    np.testing.assert_array_equal(frozen_projection("block_0/attention", N * D, d),
                                  frozen_before)
    dense = dataclasses.replace(model, attention=dataclasses.replace(
        model.attention, output_projection="dense"))        # W_o = the frozen matrix
    with_out = {**after.params, "block_0": {**after.params["block_0"], "attention": {
        **attention, "out": {"kernel": frozen_before.reshape(N, D, d)}}}}
    tokens = jnp.arange(12)[None] % model.vocab_size
    logits = lambda m, params: jax.jit(DecoderLM(m).apply)({"params": params}, tokens)[0]
    np.testing.assert_allclose(logits(model, after.params), logits(dense, with_out),
                               atol=1e-5, rtol=1e-5)


def test_model_flops_count_the_value_width_and_the_frozen_projection():
    """``bench.model_flops_per_token``: ``6 N + 12 L d T`` by default; with d_v = 2 d_k and a
    frozen W_o the attention term is ``6 L h (d_k + d_v) T`` and the frozen matmul adds
    ``4 L h d_v d`` (N counts the trained matrices only)."""
    from attnjax.bench import model_flops_per_token
    from attnjax.train.state import init_params
    for overrides, attention in (({}, lambda m: 12 * m.d_model),
                                 (TRAIN_CASES["d_v=2d_k,frozen"], lambda m: 6 * 2 * (8 + 16))):
        config = tiny_config(TINY_INDUCTION, **{"model.attention.fused_qkv": False,
                                                "train.weight_decay": 0.5, **overrides})
        m = config.model
        matrices = sum(p.size for p in jax.tree.leaves(init_params(config)) if p.ndim >= 2)
        frozen = 4 * 2 * 16 * m.d_model if m.attention.output_projection == "frozen" else 0
        assert model_flops_per_token(config) == 6 * matrices + m.num_layers * (
            attention(m) * config.data.length + frozen)


# ------------------------------------------------------------------------------- refusals

REFUSALS = {
    "value_head_dim=0": (dict(value_head_dim=0), {},
                         "model.attention.value_head_dim must be in [1, 2147483647], got 0"),
    "output_projection choice": (dict(output_projection="identity"), {},
                                 "model.attention.output_projection='identity' is not valid; "
                                 "choices: dense, none, frozen"),
    "none needs N d_v = d_model": (dict(output_projection="none", value_head_dim=4), {},
                                   "model.attention.output_projection='none' needs num_heads * "
                                   "value_head_dim = d_model, got 4 * 4 != 32; choices: dense, "
                                   "none, frozen"),
    "o_init without W_o": (dict(output_projection="frozen", o_init="zeros"), {},
                           "model.attention.o_init='zeros' means nothing with "
                           "output_projection='frozen'; it is read by output_projection='dense'"),
    "per_head needs separate": (dict(per_head_projections=True), {},
                                "model.attention.per_head_projections=True needs "
                                "fused_qkv=False (it splits the separate q, k, v projections "
                                "into one matmul per head)"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_and_name_the_field(case):
    attention, model, message = REFUSALS[case]
    with pytest.raises(ValueError) as error:
        ModelConfig(**{**SMALL, **model}, attention=AttentionConfig(num_heads=4, **attention))
    assert str(error.value) == message


def test_old_configs_load_with_the_defaults():
    """A saved config without the new fields loads with today's shapes."""
    from attnjax.config import from_dict, to_dict
    saved = to_dict(small())
    for name in ("value_head_dim", "output_projection", "per_head_projections"):
        del saved["attention"][name]
    config = from_dict(ModelConfig, saved)
    assert config == small() and config.value_head_dim == config.head_dim == 8
