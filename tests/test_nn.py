"""Tests for attnjax.nn: MultiHeadAttention, Block, DecoderLM and the position-encoding hooks.

Registry-wide tests parametrize over ``KERNELS.names()`` and ``POSITIONS.names()``, so a new
kernel or encoding is covered with no edits here. Models are tiny (d_model 32, 2 layers,
4 heads of width 8, max_length 16, vocab 64) and called without ``jax.jit`` (JAX compiles each
of its jitted library functions and loops once per shape, shared by these same-shape models);
``DecoderVariantsTest`` covers the model jitted and fully op by op.
"""

import dataclasses
import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attnjax  # noqa: F401  (registers the kernels and position encodings)
from attnjax.config import AttentionConfig, ModelConfig, PositionConfig
from attnjax.models.decoder import DecoderLM
from attnjax.nn import Block, FeedForward
from attnjax.ops import positions as P
from attnjax.registry import DROPOUTS, KERNELS, POSITIONS, QK_NORMS, SCALES, SINKS

VOCAB, D, LAYERS, HEADS, MAX_LEN = 64, 32, 2, 4, 16
HEAD_DIM = D // HEADS
TOL = dict(atol=1e-5, rtol=1e-5)

# (a kernel that runs another's program on one device, ``runs_as``, is that one here)
KERNEL_NAMES = [k for k in KERNELS.names()
                if KERNELS.get(k).available() and KERNELS.get(k).runs_as is None]
POSITION_NAMES = list(POSITIONS.names())
# Kernels the module can decode with: it passes query/key positions to the kernel.
DECODE_KERNELS = [k for k in KERNEL_NAMES if "positions" in KERNELS.get(k).supports]
EXACT_KERNELS = [k for k in KERNEL_NAMES if KERNELS.get(k).exact]


def tiny(kind="rope", kernel="reference", *, model=None, position=None, **attention):
    """A tiny ModelConfig; ``model`` / ``position`` / ``attention`` override its fields."""
    model = {"vocab_size": VOCAB, "d_model": D, "num_layers": LAYERS, "max_length": MAX_LEN,
             **(model or {})}
    return ModelConfig(attention=AttentionConfig(**{"num_heads": HEADS, "kernel": kernel,
                                                    **attention}),
                       position=PositionConfig(kind=kind, **(position or {})), **model)


def tokens_of(length, batch=2, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, VOCAB)


def init_params(config, tokens, seed=1):
    return DecoderLM(config).init(jax.random.key(seed), tokens)["params"]


def logits_of(config, params, tokens, **kwargs):
    logits, _ = DecoderLM(config).apply({"params": params}, tokens, **kwargs)
    return logits


def accepts(config_fn):
    try:
        config_fn()
    except ValueError:
        return False
    return True


def max_abs_diff(a, b):
    return float(jnp.max(jnp.abs(jnp.asarray(a) - jnp.asarray(b))))


def strip(params, name):
    """``params`` without any leaf collection called ``name`` (e.g. 'log_scale')."""
    if not isinstance(params, dict):
        return params
    return {k: strip(v, name) for k, v in params.items() if k != name}


# ------------------------------------------------------------------ 1-2. every kind x kernel

T_FULL = 8          # sequence length of the registry-wide forward / grad / causality check
CUT = 3             # tokens at positions >= CUT are changed in the second example
T_DECODE = 4        # decoded prefix: token by token, and a 3-token prompt then single tokens
PROMPT_CHUNKS = (3, 1)


def params_for(config, tokens):
    params = init_params(config, tokens)
    # Kernels own no parameters: the tree is the reference kernel's.
    reference = dataclasses.replace(
        config, attention=dataclasses.replace(config.attention, kernel="reference"))
    chex.assert_trees_all_equal_shapes(
        params, jax.eval_shape(DecoderLM(reference).init, jax.random.key(1), tokens)["params"])
    return params


def decode(config, params, tokens, chunks, step=None):
    """Logits of decoding ``tokens`` in consecutive pieces of the given sizes, starting from
    the cache that ``init(..., decode=True)`` creates; ``step(cache, piece)`` (default: the
    model's apply, op by op) gives each piece's logits and the updated cache."""
    model = DecoderLM(config)
    cache = model.init(jax.random.key(2), tokens[:, :1], decode=True)["cache"]
    step = step or decode_step(config, params)

    outputs, start = [], 0
    for size in chunks:
        logits, cache = step(cache, tokens[:, start:start + size])
        chex.assert_shape(logits, (tokens.shape[0], size, VOCAB))
        outputs.append(logits)
        start += size
    assert start == tokens.shape[1]
    assert int(cache["position"]) == start
    assert int(cache["block_0"]["attention"]["index"]) == start
    return jnp.concatenate(outputs, axis=1)


def decode_step(config, params):
    model = DecoderLM(config)

    def step(cache, piece):
        (logits, _), updated = model.apply({"params": params, "cache": cache}, piece,
                                           decode=True, mutable=["cache"])
        return logits, updated["cache"]
    return step


def check_decode_matches(config, params, tokens, full, chunks):
    decoded = decode(config, params, tokens, chunks)
    chex.assert_tree_all_finite(decoded)
    diff = max_abs_diff(decoded, full)
    assert diff <= 1e-5, (chunks, diff)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("kind", POSITION_NAMES)
def test_every_position_and_kernel(kind, kernel):
    """Shape, finite logits and grads, causality, and KV-cache decoding == full forward."""
    needed = {"bias"} if POSITIONS.get(kind).bias is not None else set()
    missing = needed - KERNELS.get(kernel).supports
    try:
        config = tiny(kind, kernel)
    except ValueError as error:
        # Rejected exactly when the kernel lacks an option the encoding needs.
        assert missing, f"{kind} x {kernel} rejected but the kernel supports {needed}: {error}"
        message = str(error)
        assert "model.attention.kernel" in message and "\n" not in message
        for option in missing:
            assert option in message
        return
    assert not missing, f"{kind} x {kernel} accepted though {kernel} lacks {missing}"

    # Example 1 is example 0 with every token at positions >= CUT changed.
    tokens = tokens_of(T_FULL, batch=1)
    changed = tokens.at[:, CUT:].set(
        (tokens[:, CUT:] + 1 + tokens_of(T_FULL - CUT, batch=1, seed=5)) % VOCAB)
    both = jnp.concatenate([tokens, changed])
    params = params_for(config, both)
    model = DecoderLM(config)

    def loss(p):
        logits, _ = model.apply({"params": p}, both)
        targets = jnp.roll(both, -1, axis=1)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1)), logits

    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    chex.assert_shape(logits, (2, T_FULL, VOCAB))
    chex.assert_tree_all_finite((value, logits, grads))
    chex.assert_trees_all_equal_shapes(grads, params)
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads))
    # Causality: changing tokens at positions >= CUT leaves logits before CUT unchanged ...
    chex.assert_trees_all_close(logits[1, :CUT], logits[0, :CUT], **TOL)
    # ... and the check is sensitive: the logits at the changed positions do change.
    assert max_abs_diff(logits[1, CUT:], logits[0, CUT:]) > 1e-4

    # KV-cache decoding of the first T_DECODE tokens equals the full forward pass (by
    # causality, the full pass on T_FULL tokens gives the same logits for that prefix).
    prefix, full = both[:, :T_DECODE], logits[:, :T_DECODE]
    if "positions" not in KERNELS.get(kernel).supports:
        # The module passes query/key positions when decoding; such a kernel must refuse.
        with pytest.raises(ValueError, match=kernel):
            decode(config, params, prefix, [1] * T_DECODE)
        return
    check_decode_matches(config, params, prefix, full, [1] * T_DECODE)


DECODE_VARIANTS = {
    "plain": dict(),
    "gqa": dict(num_kv_heads=2),
    "window3": dict(window=3),
    "sink_learned": dict(sink="learned"),
    "qk_norm_rms": dict(qk_norm="rms"),
    "all": dict(num_kv_heads=2, window=3, sink="learned", qk_norm="layer"),
}
DECODE_KERNELS = [k for k in KERNEL_NAMES if "positions" in KERNELS.get(k).supports]
# A 3-token prompt then single tokens for every position kind (reference kernel); each
# variant token by token (reference kernel); all variants at once, both ways, with every
# decode kernel that accepts them (xla refuses sinks, so it gets the rest).
VARIANT_CASES = ([(kind, "plain", "reference") for kind in POSITION_NAMES]
                 + [("rope", name, "reference") for name in DECODE_VARIANTS
                    if name not in ("plain", "all")]
                 + [("rope", "all", k) for k in DECODE_KERNELS])


def variant_config(kind, name, kernel):
    options = dict(DECODE_VARIANTS[name])
    try:
        return tiny(kind, kernel, **options)
    except ValueError:
        options.pop("sink")
        return tiny(kind, kernel, **options)


@pytest.mark.parametrize("kind, variant, kernel", VARIANT_CASES)
def test_decode_prompt_and_variants_match_full(kind, variant, kernel):
    config = variant_config(kind, variant, kernel)
    tokens = tokens_of(T_FULL)
    params = params_for(config, tokens)
    full = logits_of(config, params, tokens)[:, :T_DECODE]
    prefix = tokens[:, :T_DECODE]
    if variant in ("plain", "all"):
        check_decode_matches(config, params, prefix, full, PROMPT_CHUNKS)
    if variant != "plain":  # plain token by token is in test_every_position_and_kernel
        check_decode_matches(config, params, prefix, full, [1] * T_DECODE)


def test_window_changes_logits():
    """The window variant above is not vacuous: window=3 differs from full attention once a
    query has more than 3 keys, and not before."""
    tokens = tokens_of(T_FULL)
    params = init_params(tiny("rope"), tokens)
    full = logits_of(tiny("rope"), params, tokens)
    windowed = logits_of(tiny("rope", window=3), params, tokens)
    chex.assert_trees_all_close(windowed[:, :3], full[:, :3], **TOL)
    assert max_abs_diff(windowed[:, 3:], full[:, 3:]) > 1e-4


# ------------------------------------------------------------------ 3-4. kernel swap, weights

T_SWAP = 10  # blocks of 4 do not divide 10


@pytest.fixture(scope="module")
def swap_params():
    return init_params(tiny("rope"), tokens_of(T_SWAP))


@pytest.fixture(scope="module")
def swap_reference(swap_params):
    """``kind -> (logits, aux with the weights)`` of the reference kernel, once per kind."""
    @functools.cache
    def run(kind):
        reference = tiny(kind, "reference")
        tokens = tokens_of(T_SWAP)
        _, aux = DecoderLM(reference).apply({"params": swap_params}, tokens, return_weights=True)
        return logits_of(reference, swap_params, tokens), aux
    return run


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_kernel_swap_and_weights(kind, kernel, swap_params, swap_reference):
    """Same params, same logits with every exact kernel (chunked with its small test blocks on
    T=10); return_weights=True falls back to reference for kernels that cannot return weights and
    must compute the same function (or refuse), never silently change the logits."""
    tokens = tokens_of(T_SWAP)
    params = swap_params
    expected, ref_aux = swap_reference(kind)
    try:
        config = tiny(kind, kernel, **dict(KERNELS.get(kernel).test_options))
    except ValueError:
        assert "bias" not in KERNELS.get(kernel).supports   # checked in the matrix above
        return
    plain = logits_of(config, params, tokens)
    chex.assert_shape(plain, (2, T_SWAP, VOCAB))
    chex.assert_tree_all_finite(plain)
    if KERNELS.get(kernel).exact:
        chex.assert_trees_all_close(plain, expected, **TOL)
    try:
        logits, aux = DecoderLM(config).apply({"params": params}, tokens, return_weights=True)
    except ValueError:
        assert not KERNELS.get(kernel).exact, "an exact kernel must be able to fall back"
        return
    assert len(aux["attn_weights"]) == LAYERS
    for w in aux["attn_weights"]:
        chex.assert_shape(w, (2, HEADS, T_SWAP, T_SWAP))
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(logits, plain, **TOL)
    if KERNELS.get(kernel).exact:
        chex.assert_trees_all_close(aux["attn_weights"], ref_aux["attn_weights"], **TOL)


def test_return_weights():
    T = T_FULL
    tokens = tokens_of(T)
    config = tiny("alibi")
    params = init_params(config, tokens)
    (logits, aux), state = DecoderLM(config).apply(
        {"params": params}, tokens, return_weights=True, mutable=["intermediates"])
    weights = aux["attn_weights"]
    assert isinstance(weights, tuple) and len(weights) == LAYERS
    upper = np.triu(np.ones((T, T), bool), k=1)
    for i, w in enumerate(weights):
        chex.assert_shape(w, (2, HEADS, T, T))
        chex.assert_tree_all_finite(w)
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5, atol=1e-6)
        assert np.all(np.asarray(w)[..., upper] == 0.0)
        assert np.all(np.asarray(w) >= 0.0)
        sown = state["intermediates"][f"block_{i}"]["attention"]["attn_weights"]
        assert len(sown) == 1
        chex.assert_trees_all_equal(sown[0], w)
    # The first query sees only itself.
    np.testing.assert_allclose(np.asarray(weights[0])[:, :, 0, 0], 1.0, rtol=1e-6)
    # Asking for the weights does not change the logits.
    chex.assert_trees_all_close(logits, logits_of(config, params, tokens), **TOL)
    # Without return_weights, aux is empty and no weights are sown (only the max-logit
    # diagnostic, one scalar per layer).
    (_, aux), state = DecoderLM(config).apply({"params": params}, tokens,
                                              mutable=["intermediates"])
    assert aux == {}
    for i in range(config.num_layers):
        assert set(state["intermediates"][f"block_{i}"]["attention"]) == {"max_logit"}


# ------------------------------------------------------------------ 5. dropout placements

PLACEMENTS = ["probs_shared", "probs_per_head", "output"]


@pytest.fixture(scope="module")
def rope_setup():
    tokens = tokens_of(T_FULL)
    base = tiny("rope")
    params = init_params(base, tokens)
    return tokens, params, logits_of(base, params, tokens)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_dropout_deterministic_is_identity(rope_setup, placement):
    tokens, params, base_logits = rope_setup
    config = tiny("rope", dropout=placement, dropout_rate=0.25)
    chex.assert_trees_all_equal(logits_of(config, params, tokens, deterministic=True),
                                base_logits)


def test_dropout_placements_stochastic(rope_setup):
    tokens, params, base_logits = rope_setup
    rng, other = jax.random.key(11), jax.random.key(12)
    results = {}
    for placement in PLACEMENTS:
        config = tiny("rope", dropout=placement, dropout_rate=0.25)
        run = lambda key, config=config: logits_of(config, params, tokens, deterministic=False,
                                                   rngs={"dropout": key})
        first, again, different = run(rng), run(rng), run(other)
        chex.assert_tree_all_finite(first)
        assert max_abs_diff(first, base_logits) > 1e-4, placement     # dropout acts
        chex.assert_trees_all_equal(first, again)                      # reproducible
        assert max_abs_diff(first, different) > 1e-4, placement        # rng matters
        results[placement] = first
    assert max_abs_diff(results["probs_shared"], results["probs_per_head"]) > 1e-4
    assert max_abs_diff(results["probs_shared"], results["output"]) > 1e-4
    # Dropout 'none' with deterministic=False (and no residual dropout) is deterministic.
    chex.assert_trees_all_equal(
        logits_of(tiny("rope"), params, tokens, deterministic=False, rngs={"dropout": rng}),
        base_logits)


# ------------------------------------------------------------------ 6. scale policies




def test_scale_inv_d_equals_constant(rope_setup):
    tokens, params, _ = rope_setup
    inv_d = logits_of(tiny("rope", scale="inv_d"), params, tokens)
    constant = logits_of(tiny("rope", scale="constant", scale_multiplier=1.0 / HEAD_DIM),
                         params, tokens)
    chex.assert_trees_all_close(inv_d, constant, **TOL)
    inv_d_half = logits_of(tiny("rope", scale="inv_d", scale_multiplier=0.5), params, tokens)
    constant_half = logits_of(tiny("rope", scale="constant", scale_multiplier=0.5 / HEAD_DIM),
                              params, tokens)
    chex.assert_trees_all_close(inv_d_half, constant_half, **TOL)
    assert max_abs_diff(inv_d, inv_d_half) > 1e-5


def test_scale_learned_initialises_to_inv_sqrt_d(rope_setup):
    tokens, params, base_logits = rope_setup
    config = tiny("rope", scale="learned")
    learned_params = init_params(config, tokens)
    for i in range(LAYERS):
        log_scale = learned_params[f"block_{i}"]["attention"]["log_scale"]
        chex.assert_shape(log_scale, (HEADS,))
        np.testing.assert_allclose(log_scale, np.full(HEADS, math.log(1 / math.sqrt(HEAD_DIM))),
                                   rtol=1e-6)
        np.testing.assert_allclose(jnp.exp(log_scale), 1 / math.sqrt(HEAD_DIM), rtol=1e-6)
    # Apart from log_scale, the parameters are those of the fixed policy.
    chex.assert_trees_all_equal(strip(learned_params, "log_scale"), params)
    with_learned = dict(params)
    for i in range(LAYERS):
        block = dict(with_learned[f"block_{i}"])
        block["attention"] = dict(block["attention"],
                                  log_scale=learned_params[f"block_{i}"]["attention"]["log_scale"])
        with_learned[f"block_{i}"] = block
    chex.assert_trees_all_close(logits_of(config, with_learned, tokens), base_logits, **TOL)


def test_scale_multiplier(rope_setup):
    tokens, params, base_logits = rope_setup
    doubled = logits_of(tiny("rope", scale_multiplier=2.0), params, tokens)
    assert max_abs_diff(doubled, base_logits) > 1e-4
    constant = logits_of(tiny("rope", scale="constant",
                              scale_multiplier=2.0 / math.sqrt(HEAD_DIM)), params, tokens)
    chex.assert_trees_all_close(doubled, constant, **TOL)


def test_scale_multiplier_equals_doubling_query():
    """At module level: multiplier 2 equals the default scale with the query projection
    weights doubled (fused_qkv=False so the query has its own kernel)."""
    x = jax.random.normal(jax.random.key(3), (2, T_FULL, D))
    positions = jnp.arange(T_FULL)[None]
    base = tiny("none", fused_qkv=False)
    from attnjax.nn import MultiHeadAttention
    params = MultiHeadAttention(base).init(jax.random.key(4), x, positions)["params"]
    doubled_q = dict(params, query={"kernel": params["query"]["kernel"] * 2.0})
    expected, _ = MultiHeadAttention(base).apply({"params": doubled_q}, x, positions)
    got, _ = MultiHeadAttention(tiny("none", fused_qkv=False, scale_multiplier=2.0)).apply(
        {"params": params}, x, positions)
    chex.assert_trees_all_close(got, expected, **TOL)


# ------------------------------------------------------------------ 7. slots


@pytest.mark.parametrize("eps", [1e-6, 1e-2])      # model.norm_eps: its default, and one that
@pytest.mark.parametrize("norm", ["rms", "layer"])  # moves the output ~0.5% at unit variance
def test_qk_norm_normalises_each_head(norm, eps):
    tokens = tokens_of(T_FULL)
    config = tiny("rope", qk_norm=norm, num_kv_heads=2, model=dict(norm_eps=eps))
    params = init_params(config, tokens)
    for i in range(LAYERS):
        for name in ("query_norm", "key_norm"):
            leaves = params[f"block_{i}"]["attention"][name]
            assert all(leaf.shape == (HEAD_DIM,) for leaf in jax.tree.leaves(leaves))
    wanted = {"qkv", "query_norm", "key_norm"}
    _, state = DecoderLM(config).apply(
        {"params": params}, tokens, mutable=["intermediates"],
        capture_intermediates=lambda module, method: module.name in wanted)
    for i in range(LAYERS):
        captured = state["intermediates"][f"block_{i}"]["attention"]
        qkv = np.asarray(captured["qkv"]["__call__"][0], np.float64)
        chex.assert_shape(qkv, (2, T_FULL, HEADS + 2 * 2, HEAD_DIM))
        raw = {"query_norm": qkv[:, :, :HEADS], "key_norm": qkv[:, :, HEADS:HEADS + 2]}
        for name, x in raw.items():
            y = np.asarray(captured[name]["__call__"][0], np.float64)
            chex.assert_shape(y, x.shape)
            if norm == "rms":
                expected = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps)
            else:
                centred = x - x.mean(-1, keepdims=True)
                expected = centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + eps)
                np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
            np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    logits = logits_of(config, params, tokens)
    chex.assert_tree_all_finite(logits)


@pytest.mark.parametrize("mlp, d_model, ratio, hidden", [
    ("gelu", 32, 4.0, 128),
    ("swiglu", 32, 4.0, 88),    # 2/3 * 4 * 32 = 85.3 -> 88
    ("swiglu", 32, 3.0, 64),    # 2/3 * 3 * 32 = 64 exactly
])
def test_feed_forward_shapes_and_params(mlp, d_model, ratio, hidden):
    if mlp == "swiglu":
        assert hidden == math.ceil(2 / 3 * ratio * d_model / 8) * 8
    config = ModelConfig(d_model=d_model, mlp=mlp, mlp_ratio=ratio,
                         attention=AttentionConfig(num_heads=4))
    x = jax.random.normal(jax.random.key(0), (2, T_FULL, d_model))
    params = FeedForward(config).init(jax.random.key(1), x)["params"]
    y = FeedForward(config).apply({"params": params}, x)
    chex.assert_shape(y, (2, T_FULL, d_model))
    chex.assert_tree_all_finite(y)
    if mlp == "gelu":
        expected = {"up": {"kernel": (d_model, hidden), "bias": (hidden,)},
                    "down": {"kernel": (hidden, d_model), "bias": (d_model,)}}
        count = 2 * d_model * hidden + hidden + d_model
    else:
        expected = {"gate_up": {"kernel": (d_model, 2 * hidden), "bias": (2 * hidden,)},
                    "down": {"kernel": (hidden, d_model), "bias": (d_model,)}}
        count = 3 * d_model * hidden + 2 * hidden + d_model
    assert jax.tree.map(lambda a: a.shape, params) == expected
    assert sum(a.size for a in jax.tree.leaves(params)) == count
    # Value check against the formula.
    if mlp == "gelu":
        h = jax.nn.gelu(x @ params["up"]["kernel"] + params["up"]["bias"])
    else:
        gate, up = jnp.split(x @ params["gate_up"]["kernel"] + params["gate_up"]["bias"], 2, -1)
        h = jax.nn.silu(gate) * up
    chex.assert_trees_all_close(y, h @ params["down"]["kernel"] + params["down"]["bias"],
                                **TOL)


def test_pre_norm_vs_post_norm():
    tokens = tokens_of(T_FULL)
    pre = tiny("rope", model=dict(norm_position="pre"))
    post = tiny("rope", model=dict(norm_position="post"))
    pre_params = init_params(pre, tokens)
    post_params = init_params(post, tokens)
    assert "final_norm" in pre_params and "final_norm" not in post_params
    shared = {k: v for k, v in pre_params.items() if k != "final_norm"}
    chex.assert_trees_all_equal_structs(shared, post_params)
    pre_logits = logits_of(pre, pre_params, tokens)
    post_logits = logits_of(post, shared, tokens)
    chex.assert_tree_all_finite((pre_logits, post_logits))
    assert max_abs_diff(pre_logits, post_logits) > 1e-4


def test_post_norm_block_formula():
    config = tiny("none", model=dict(norm_position="post", norm="rms"))
    x = jax.random.normal(jax.random.key(0), (2, T_FULL, D))
    positions = jnp.arange(T_FULL)[None]
    params = Block(config).init(jax.random.key(1), x, positions)["params"]
    out, _ = Block(config).apply({"params": params}, x, positions)
    from attnjax.nn import MultiHeadAttention
    y, _ = MultiHeadAttention(config).apply({"params": params["attention"]}, x, positions)
    rms = nn.RMSNorm()
    h = rms.apply({"params": params["attention_norm"]}, x + y)
    h = rms.apply({"params": params["mlp_norm"]},
                  h + FeedForward(config).apply({"params": params["mlp"]}, h))
    chex.assert_trees_all_close(out, h, **TOL)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_vs_untied_embeddings(tied):
    tokens = tokens_of(T_FULL)
    config = tiny("rope", model=dict(tie_embeddings=tied))
    params = init_params(config, tokens)
    assert ("unembed" in params) is (not tied)
    if not tied:
        chex.assert_shape(params["unembed"]["kernel"], (D, VOCAB))
    (logits, _), state = DecoderLM(config).apply(
        {"params": params}, tokens, mutable=["intermediates"],
        capture_intermediates=lambda module, method: module.name == "final_norm")
    chex.assert_shape(logits, (2, T_FULL, VOCAB))
    final = state["intermediates"]["final_norm"]["__call__"][0]
    unembed = params["embed"]["embedding"].T if tied else params["unembed"]["kernel"]
    chex.assert_trees_all_close(logits, final @ unembed, **TOL)


# ------------------------------------------------------------------ 8. learned positions


class _EmbedHost(nn.Module):
    """Calls a position encoding's embed hook directly, owning its parameters."""
    config: ModelConfig

    @nn.compact
    def __call__(self, positions):
        return POSITIONS.get(self.config.position.kind).embed(self, positions, self.config)


# These use max_length 8 so that the lengths involved (8 and 10) are the ones other tests use.
SHORT = dict(max_length=T_FULL)


def test_learned_positions_too_long_raises():
    config = tiny("learned", model=SHORT)
    params = init_params(config, tokens_of(T_FULL))
    with pytest.raises(ValueError, match="learned_interpolate"):
        logits_of(config, params, tokens_of(T_SWAP))
    with pytest.raises(ValueError, match="learned_interpolate"):
        init_params(config, tokens_of(T_SWAP))


def test_learned_positions_interpolate():
    config = tiny("learned", model=SHORT)
    stretched = tiny("learned", model=SHORT, position=dict(learned_interpolate=True))
    tokens = tokens_of(T_SWAP)
    params = init_params(config, tokens[:, :T_FULL])
    long_logits = logits_of(stretched, params, tokens)
    chex.assert_shape(long_logits, (2, T_SWAP, VOCAB))
    chex.assert_tree_all_finite(long_logits)
    # At length == max_length interpolation is the identity.
    chex.assert_trees_all_equal(logits_of(stretched, params, tokens[:, :T_FULL]),
                                logits_of(config, params, tokens[:, :T_FULL]))


def test_learned_hook_interpolation_rows():
    config = tiny("learned", position=dict(learned_interpolate=True))
    host = _EmbedHost(config)
    L = MAX_LEN
    params = host.init(jax.random.key(0), jnp.arange(L)[None])["params"]
    table = np.asarray(params["position_embedding"])
    chex.assert_shape(table, (L, D))
    # Within the table: plain lookup.
    np.testing.assert_array_equal(host.apply({"params": params}, jnp.arange(L)[None])[0], table)
    # Length 2L - 1: position 2p reads row p exactly; 2p + 1 is the midpoint of p and p + 1.
    out = np.asarray(host.apply({"params": params}, jnp.arange(2 * L - 1)[None])[0])
    chex.assert_shape(out, (2 * L - 1, D))
    np.testing.assert_array_equal(out[0::2], table)
    np.testing.assert_allclose(out[1::2], (table[:-1] + table[1:]) / 2, rtol=1e-5, atol=1e-7)
    # Without the flag the same input is refused.
    with pytest.raises(ValueError, match="learned_interpolate"):
        _EmbedHost(tiny("learned")).apply({"params": params}, jnp.arange(L + 1)[None])


# ------------------------------------------------------------------ 9. embedding input


def first_layer_input(config, params, tokens):
    seen = []

    def interceptor(next_fun, args, kwargs, context):
        if (isinstance(context.module, Block) and context.module.name == "block_0"
                and context.method_name == "__call__"):
            seen.append(args[0])
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        DecoderLM(config).apply({"params": params}, tokens)
    assert len(seen) == 1
    return seen[0]


def test_sinusoidal_added_at_embedding():
    T = T_FULL
    tokens = tokens_of(T)
    config = tiny("sinusoidal")
    params = init_params(config, tokens)
    x = first_layer_input(config, params, tokens)
    pe = P.sinusoidal_embedding(jnp.arange(T)[None], D)
    # tokens scaled by sqrt(d_model) by default, as Vaswani et al. do; embed_scale overrides
    expected = params["embed"]["embedding"][tokens] * np.sqrt(D) + pe
    chex.assert_trees_all_close(x, expected, **TOL)
    unscaled = tiny("sinusoidal", model={"embed_scale": 1.0})
    chex.assert_trees_all_close(first_layer_input(unscaled, params, tokens),
                                params["embed"]["embedding"][tokens] + pe, **TOL)
    # The hook itself, against the closed form PE[p, 2i] = sin(p / 1e4^(2i/D)), 2i+1: cos.
    hook = POSITIONS.get("sinusoidal").embed(None, jnp.arange(T)[None], config)
    chex.assert_trees_all_equal(hook, pe)
    p = np.arange(T)[:, None]
    angle = p / 10000.0 ** (np.arange(0, D, 2) / D)
    closed = np.stack([np.sin(angle), np.cos(angle)], -1).reshape(T, D)
    np.testing.assert_allclose(np.asarray(hook[0]), closed, rtol=1e-5, atol=1e-6)


def test_learned_added_at_embedding():
    tokens = tokens_of(T_FULL)
    config = tiny("learned")
    params = init_params(config, tokens)
    x = first_layer_input(config, params, tokens)
    expected = params["embed"]["embedding"][tokens] + params["position_embedding"][:T_FULL][None]
    chex.assert_trees_all_close(x, expected, **TOL)
    halved = tiny("learned", position={"added_scale": 0.5})
    expected = (params["embed"]["embedding"][tokens]
                + 0.5 * params["position_embedding"][:T_FULL][None])
    chex.assert_trees_all_close(first_layer_input(halved, params, tokens), expected, **TOL)
    with pytest.raises(ValueError, match=r"^model\.position\.added_scale=0\.5 means nothing "
                                         r"with kind='rope'"):
        tiny("rope", position={"added_scale": 0.5})


def token_part(config, params, tokens):
    """The token half of the first block's input: embedding times the token scale."""
    from attnjax.nn.transformer import token_scale
    return params["embed"]["embedding"][tokens] * token_scale(config)


def test_added_position_embedding_normalised():
    """``added_norm``: ``unit`` gives every position's added vector norm ``added_scale``;
    ``layer`` is a LayerNorm of each position's vector (at its initial gain 1 and bias 0) at
    ``model.norm_eps`` (0.1 here: next to a sinusoid's variance 1/2, it matters)."""
    tokens = tokens_of(T_FULL)
    for kind in ("sinusoidal", "learned"):
        base = tiny(kind)
        params = init_params(base, tokens)
        pe = first_layer_input(base, params, tokens) - token_part(base, params, tokens)
        unit = tiny(kind, position={"added_norm": "unit", "added_scale": 2.0})
        added = first_layer_input(unit, params, tokens) - token_part(unit, params, tokens)
        np.testing.assert_allclose(np.asarray(added), 2.0 * np.asarray(pe) / np.linalg.norm(
            np.asarray(pe), axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)
        layer = tiny(kind, model={"norm_eps": 0.1}, position={"added_norm": "layer"})
        lparams = init_params(layer, tokens)
        assert "position_norm" in lparams
        added = first_layer_input(layer, lparams, tokens) - token_part(layer, lparams, tokens)
        plain = {k: v for k, v in lparams.items() if k != "position_norm"}
        raw = np.asarray(first_layer_input(base, plain, tokens) - token_part(base, plain, tokens),
                         np.float64)
        centred = raw - raw.mean(-1, keepdims=True)
        expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 0.1)
        np.testing.assert_allclose(np.asarray(added), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"^model\.position\.added_norm='unit' means nothing "
                                         r"with kind='alibi'"):
        tiny("alibi", position={"added_norm": "unit"})


def test_embedding_scale_and_init_std():
    tokens = tokens_of(T_FULL)
    config = tiny("rope", model={"embed_scale": 3.0, "embed_init_std": 0.5})
    params = init_params(config, tokens)
    table = np.asarray(params["embed"]["embedding"])
    assert abs(table.std() - 0.5) < 0.05                      # VOCAB x D = 2048 draws
    chex.assert_trees_all_close(first_layer_input(config, params, tokens),
                                3.0 * params["embed"]["embedding"][tokens], **TOL)


@pytest.mark.parametrize("kind", [k for k in POSITION_NAMES if POSITIONS.get(k).embed is None])
def test_no_embed_hook_adds_nothing(kind):
    tokens = tokens_of(T_FULL)
    config = tiny(kind)
    params = init_params(config, tokens)
    x = first_layer_input(config, params, tokens)
    chex.assert_trees_all_equal(x, params["embed"]["embedding"][tokens])


# ------------------------------------------------------------------ 10. jit / no jit


@functools.cache
def op_by_op_reference(tokens_length):
    """Parameters (kernels own none: the reference kernel's tree) and the reference kernel's
    logits, computed op by op; shared by both variants below."""
    tokens = tokens_of(tokens_length)
    with jax.disable_jit():
        params = init_params(tiny("alibi"), tokens)
        return params, logits_of(tiny("alibi"), params, tokens)


class DecoderVariantsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_apply(self):
        """DecoderLM apply, jitted and not, with the chunked kernel (blocks of 4 on T=10, so
        its lax.map / lax.scan run compiled) equals the reference kernel run op by op."""
        tokens = tokens_of(T_SWAP)
        config = tiny("alibi", "chunked", block_q=4, block_k=4)
        params, expected = op_by_op_reference(T_SWAP)

        @self.variant
        def forward(params, tokens):
            return DecoderLM(config).apply({"params": params}, tokens)[0]

        logits = forward(params, tokens)
        chex.assert_shape(logits, (2, T_SWAP, VOCAB))
        chex.assert_tree_all_finite(logits)
        chex.assert_trees_all_close(logits, expected, **TOL)


# ------------------------------------------------------------ slot tables and the KV cache

SLOT_CHOICES = [(field, name) for field, registry in
                (("qk_norm", QK_NORMS), ("scale", SCALES), ("sink", SINKS), ("dropout", DROPOUTS))
                for name in registry.names()]


@pytest.mark.parametrize("field, name", SLOT_CHOICES, ids=[f"{f}={n}" for f, n in SLOT_CHOICES])
def test_every_slot_choice_trains_and_decodes_like_the_full_forward(field, name):
    """Every registered choice of every attention slot: finite logits and gradients, and
    KV-cache decoding equal to the full forward (dropout is off in both)."""
    settings = {field: name}
    if field == "dropout" and name != "none":
        settings["dropout_rate"] = 0.25
    config = tiny("rope", **settings)
    tokens = tokens_of(T_FULL)
    params = params_for(config, tokens)
    model = DecoderLM(config)
    grads = jax.grad(lambda p: model.apply({"params": p}, tokens, deterministic=False,
                                           rngs={"dropout": jax.random.key(3)})[0].sum())(params)
    chex.assert_tree_all_finite(grads)
    full = logits_of(config, params, tokens)[:, :T_DECODE]
    check_decode_matches(config, params, tokens[:, :T_DECODE], full, PROMPT_CHUNKS)


def test_decoding_past_the_cache_gives_nan_and_a_longer_call_is_refused(rope_setup):
    config = tiny("rope")
    tokens = tokens_of(MAX_LEN + 2)
    _, params, _ = rope_setup
    # Jitted: pieces of 15, 16 and 18 tokens are shapes no other test runs op by op, and the
    # refusal comes from the shapes, while tracing.
    step = jax.jit(decode_step(config, params))
    inside = decode(config, params, tokens[:, :MAX_LEN], [MAX_LEN - 1, 1], step)
    chex.assert_tree_all_finite(inside)                     # the last slot still fits
    cache = DecoderLM(config).init(jax.random.key(2), tokens[:, :1], decode=True)["cache"]
    _, full = step(cache, tokens[:, :MAX_LEN])
    past, _ = step(full, tokens[:, MAX_LEN:MAX_LEN + 1])
    assert np.isnan(np.asarray(past)).all()                 # never a silently wrong answer
    with pytest.raises(ValueError, match=rf"exceeds the KV cache \(model.max_length={MAX_LEN}\)"):
        step(cache, tokens)


def test_dynamic_ntk_and_linear_attention_refuse_the_cache_before_tracing(rope_setup):
    from attnjax.config.kernel import kernel_request
    dynamic = tiny("rope", position={"rope_scaling": "dynamic_ntk"})
    with pytest.raises(ValueError, match=r"rope_scaling='dynamic_ntk' cannot decode"):
        kernel_request(dynamic, decode=True)
    tokens, params, _ = rope_setup                          # RoPE has no parameters
    with pytest.raises(ValueError, match="dynamic_ntk"):
        decode(dynamic, params, tokens[:, :T_DECODE], [1] * T_DECODE)
    linear = tiny("rope", "linear")
    kernel_request(linear)                                  # it trains ...
    with pytest.raises(ValueError, match=r"^decoding with the KV cache: model\.attention\."
                                         r"kernel='linear' does not support"):
        kernel_request(linear, decode=True)                 # ... but cannot decode


# ------------------------------------------------------------ initialisation per projection

@pytest.mark.parametrize("fused", [True, False], ids=["fused_qkv", "separate"])
def test_zero_initialised_queries_and_keys_attend_exactly_uniformly(fused):
    config = tiny("none", fused_qkv=fused, q_init="zeros", k_init="zeros")
    tokens = tokens_of(T_FULL)
    params = init_params(config, tokens)
    _, aux = DecoderLM(config).apply({"params": params}, tokens, return_weights=True)
    causal = np.tril(np.ones((T_FULL, T_FULL), np.float32))
    uniform = causal / causal.sum(-1, keepdims=True)          # 1 / (i + 1), rounded to float32
    for weights in aux["attn_weights"]:
        np.testing.assert_array_equal(np.asarray(weights), np.broadcast_to(uniform, weights.shape))


def test_each_projection_draws_with_its_own_scheme_and_scale():
    config = tiny("rope", q_init="normal", q_init_scale=0.5, v_init="xavier_uniform",
                  v_init_scale=2.0, o_init="zeros")
    params = init_params(config, tokens_of(T_FULL))
    attention = params["block_0"]["attention"]
    qkv = np.asarray(attention["qkv"]["kernel"])             # [D, N + 2K, H]
    q, k, v = qkv[:, :HEADS], qkv[:, HEADS:2 * HEADS], qkv[:, 2 * HEADS:]
    assert abs(q.std() - 0.5) < 0.05
    assert abs(k.std() - 1 / np.sqrt(D)) < 0.02              # default: lecun normal, fan_in D
    xavier = 2.0 * np.sqrt(2.0 / (D + HEADS * HEAD_DIM))      # gain * sqrt(2 / (in + out))
    assert abs(v.std() - xavier) < 0.1 * xavier
    assert np.abs(v).max() <= xavier * np.sqrt(3) + 1e-6      # uniform on [-a, a], a = std sqrt 3
    np.testing.assert_array_equal(np.asarray(attention["out"]["kernel"]), 0.0)


def test_head_dim_independent_of_d_model_has_its_shapes_and_matches_the_oracle():
    from attnjax.nn import MultiHeadAttention
    from attnjax.parity import oracle_attention
    config = ModelConfig(vocab_size=VOCAB, d_model=64, num_layers=1, max_length=MAX_LEN,
                         attention=AttentionConfig(num_heads=4, head_dim=32, fused_qkv=False),
                         position=PositionConfig(kind="none"))
    assert config.head_dim == 32                               # not 64 // 4 = 16
    x = jax.random.normal(jax.random.key(0), (2, T_FULL, 64))
    positions = jnp.arange(T_FULL)[None]
    module = MultiHeadAttention(config)
    params = module.init(jax.random.key(1), x, positions)["params"]
    chex.assert_shape([params["query"]["kernel"], params["key"]["kernel"],
                       params["value"]["kernel"], params["out"]["kernel"]],
                      [(64, 4, 32), (64, 4, 32), (64, 4, 32), (4, 32, 64)])
    out, _ = module.apply({"params": params}, x, positions)
    chex.assert_shape(out, (2, T_FULL, 64))
    project = lambda name: np.einsum("btd,dnh->btnh", np.asarray(x, np.float64),
                                     np.asarray(params[name]["kernel"], np.float64))
    causal = np.tril(np.ones((T_FULL, T_FULL), bool))
    heads = oracle_attention(project("query"), project("key"), project("value"), mask=causal)
    expected = np.einsum("btnh,nhd->btd", heads, np.asarray(params["out"]["kernel"], np.float64))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)
    # an explicit head_dim frees d_model from divisibility by the head count
    ModelConfig(d_model=30, attention=AttentionConfig(num_heads=4, head_dim=8),
                position=PositionConfig(kind="alibi"))
