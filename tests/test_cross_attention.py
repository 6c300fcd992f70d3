"""Cross-attention in ``MultiHeadAttention`` (``cross=True``): queries of one sequence over the
keys and values of another, against a float64 NumPy oracle for every kernel that can run it
(the others refused in one line), with padding on both sides and unequal lengths, beams that
share a source, and the static cache that decoding reads."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.config import AttentionConfig, ModelConfig, PositionConfig
from attnjax.config.kernel import kernel_request
from attnjax.nn import MultiHeadAttention
from attnjax.parity import oracle_attention
from attnjax.registry import KERNELS, POSITIONS

B, T, S, D_MODEL = 2, 7, 11, 32
SOURCE_LENGTHS = np.array([11, 6])          # example 1's source keys >= 6 are pads
TARGET_LENGTHS = np.array([7, 4])           # example 1's queries >= 4 are pads (rows kept)


def config(kernel="reference", **attention):
    attention = {"num_heads": 4, "num_kv_heads": 2, **attention}
    return ModelConfig(d_model=D_MODEL, num_layers=1, max_length=16,
                       attention=AttentionConfig(kernel=kernel, **attention))


def streams(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, D_MODEL)).astype(np.float32)
    source = rng.normal(size=(B, S, D_MODEL)).astype(np.float32)
    x[1, TARGET_LENGTHS[1]:] = 0.0                       # the pads' embeddings, as a batch has
    source_mask = np.arange(S)[None, :] < SOURCE_LENGTHS[:, None]
    source[~source_mask] = 0.0
    return x, source, source_mask


def init(cfg, x, source, source_mask):
    module = MultiHeadAttention(cfg, cross=True)
    return module, module.init(jax.random.key(0), x, None, source=source,
                               source_mask=source_mask)["params"]


def oracle(params, x, source, source_mask):
    """float64: ``softmax(q k^T / sqrt(H)) v W_o`` over the real source keys, from the
    module's separate projections."""
    w = {name: np.asarray(params[name]["kernel"], np.float64)
         for name in ("query", "key", "value", "out")}
    q = np.einsum("btd,dnh->btnh", x, w["query"])
    k = np.einsum("bsd,dkh->bskh", source, w["key"])
    v = np.einsum("bsd,dkh->bskh", source, w["value"])
    heads = oracle_attention(q, k, v, mask=source_mask[:, None, None, :])
    return np.einsum("btnh,nhd->btd", heads, w["out"])


def cross_capable(kernel: str) -> bool:
    try:
        kernel_request(config(kernel), padded=True, cross=True)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("kernel", [k for k in KERNELS.names() if KERNELS.get(k).available()])
def test_every_kernel_matches_the_oracle_or_is_refused_in_one_line(kernel):
    x, source, source_mask = streams()
    if not cross_capable(kernel):
        with pytest.raises(ValueError) as refusal:
            init(config(kernel), x, source, source_mask)
        message = str(refusal.value)
        assert "\n" not in message and message.startswith("cross-attention: model.attention")
        return
    module, params = init(config(kernel), x, source, source_mask)
    forward = jax.jit(lambda p, x, s: module.apply({"params": p}, x, None, source=s,
                                                   source_mask=source_mask)[0])
    got = np.asarray(forward(params, x, source), np.float64)
    want = oracle(params, x, source, source_mask)
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=1e-5)
    assert np.abs(got[1]).max() > 0.1             # a padded example's rows are real outputs
    if KERNELS.get(kernel).exact and kernel != "reference":   # gradients equal the reference's
        reference = MultiHeadAttention(config(), cross=True)
        grad = lambda m: jax.jit(jax.grad(lambda p, x, s: m.apply(
            {"params": p}, x, None, source=s, source_mask=source_mask)[0].sum(),
            argnums=(0, 1, 2)))(params, x, source)
        chex.assert_trees_all_close(grad(module), grad(reference), atol=1e-5, rtol=1e-5)


def test_a_padded_source_gives_the_outputs_of_the_source_alone():
    x, source, source_mask = streams()
    module, params = init(config(), x, source, source_mask)
    padded = module.apply({"params": params}, x, None, source=source, source_mask=source_mask)[0]
    n = SOURCE_LENGTHS[1]
    alone = module.apply({"params": params}, x[1:], None, source=source[1:, :n])[0]
    np.testing.assert_allclose(padded[1], alone[0], atol=1e-6, rtol=1e-6)
    # and the pads were hidden: changing them changes nothing
    noisy = source.copy()
    noisy[1, n:] = 100.0
    again = module.apply({"params": params}, x, None, source=noisy, source_mask=source_mask)[0]
    np.testing.assert_array_equal(np.asarray(again), np.asarray(padded))


@pytest.mark.parametrize("kind", [k for k in POSITIONS.names() if k != "none"])
def test_position_encodings_stay_out_of_cross_attention(kind):
    """RoPE, ALiBi and T5 relate positions of one sequence; absolute encodings live in the
    embeddings: the cross-attention layer is the same function under every encoding."""
    x, source, source_mask = streams()
    base, params = init(config(), x, source, source_mask)
    other = MultiHeadAttention(dataclasses.replace(config(), position=PositionConfig(kind=kind)),
                               cross=True)
    assert jax.tree.structure(other.init(jax.random.key(0), x, None, source=source)["params"]) \
        == jax.tree.structure(params)
    apply = lambda m: m.apply({"params": params}, x, jnp.arange(T)[None] + 5, source=source,
                              source_mask=source_mask)[0]
    np.testing.assert_array_equal(np.asarray(apply(other)), np.asarray(apply(base)))


def test_beams_of_a_source_share_its_keys_and_values():
    """R rows per source (beams) against the source repeated per row: the same outputs and
    weights, with the source's keys and values computed for B sources, not B R rows."""
    x, source, source_mask = streams()
    module, params = init(config(), x, source, source_mask)
    R = 3
    beams = np.concatenate([x[:, ::-1], x, 0.5 * x], axis=0).reshape(R, B, T, D_MODEL)
    beams = beams.swapaxes(0, 1).reshape(B * R, T, D_MODEL)       # source b's beams adjacent
    out, weights = module.apply({"params": params}, beams, None, source=source,
                                source_mask=source_mask, return_weights=True)
    repeated = np.repeat(source, R, axis=0)
    want, want_weights = module.apply({"params": params}, beams, None, source=repeated,
                                      source_mask=np.repeat(source_mask, R, axis=0),
                                      return_weights=True)
    np.testing.assert_allclose(out, want, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(weights, want_weights, atol=1e-7)
    chex.assert_shape(weights, (B * R, 4, T, S))
    np.testing.assert_array_equal(np.asarray(weights)[R:, :, :, SOURCE_LENGTHS[1]:], 0.0)


def test_decoding_fills_the_static_cache_once_and_then_only_reads_it():
    x, source, source_mask = streams()
    module, params = init(config(), x, source, source_mask)
    whole = module.apply({"params": params}, x, None, source=source, source_mask=source_mask)[0]
    first, cache = module.apply({"params": params}, x[:, :1], None, source=source,
                                source_mask=source_mask, decode=True, mutable=["cache"])
    chex.assert_shape(cache["cache"]["cross_key"], (B, S, 2, 8))
    steps = [first[0]]
    for t in range(1, T):
        out, after = module.apply({"params": params, **cache}, x[:, t:t + 1], None,
                                  decode=True, mutable=["cache"])
        chex.assert_trees_all_equal(after, cache)           # read, never rewritten
        steps.append(out[0])
    np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, atol=1e-6, rtol=1e-6)


def test_missing_source_and_empty_cache_are_one_line_errors():
    x, source, source_mask = streams()
    module, params = init(config(), x, source, source_mask)
    with pytest.raises(ValueError, match="^cross-attention needs the source sequence"):
        module.apply({"params": params}, x, None)
    with pytest.raises(ValueError, match="^the cross-attention cache is empty"):
        module.apply({"params": params}, x, None, decode=True, mutable=["cache"])
