"""The deliberately unsafe PyTorch-style masking kernel (``attnjax.ops.masked_fill``): each of
its settings reproduces the idiom it names, value for value, and its safe settings compute the
reference kernel's function."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.config import AttentionConfig, ModelConfig
from attnjax.models.decoder import DecoderLM
from attnjax.ops import dot_product_attention
from attnjax.registry import KERNELS

B, T, N, K, H = 2, 9, 4, 2, 8


def qkv(seed=0, scale=1.0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (scale * rng.normal(size=(B, T, N, H)).astype(dtype),
            scale * rng.normal(size=(B, T, K, H)).astype(dtype),
            rng.normal(size=(B, T, K, H)).astype(dtype))


def attend(q, k, v, **kwargs):
    return dot_product_attention(q, k, v, implementation="masked_fill", **kwargs)


def torch_style(q, k, v, visible, fill, add=False, after=False, bias=0.0):
    """float64 NumPy ``scores.masked_fill(~visible, fill).softmax(-1) @ v`` (or the additive
    or multiply-after-softmax forms), with NumPy's own inf/NaN arithmetic."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k, v = np.repeat(k, N // K, axis=2), np.repeat(v, N // K, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H) + np.asarray(bias, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if after:
            e = np.exp(s - s.max(-1, keepdims=True))
            p = e / e.sum(-1, keepdims=True) * visible
        else:
            s = s + np.where(visible, 0.0, fill) if add else np.where(visible, s, fill)
            e = np.exp(s - s.max(-1, keepdims=True))
            p = e / e.sum(-1, keepdims=True)
        return np.einsum("bnts,bsnh->btnh", p, v), p


def padded_causal(lengths):
    causal = np.tril(np.ones((T, T), bool))
    keys = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    return causal[None, None] & keys[:, None, None, :]


def test_registered_as_a_different_function_that_breaks_the_contract_on_purpose():
    spec = KERNELS.get("masked_fill")
    assert not spec.exact and not spec.safe
    assert {"mask_fill", "mask_mode", "logits_dtype", "causal_offset"} <= set(spec.settings)


def test_safe_settings_equal_the_reference_kernel_with_gradients():
    q, k, v = qkv()
    bias = np.random.default_rng(3).normal(size=(1, N, T, T)).astype(np.float32)
    kwargs = dict(is_causal=True, key_value_seq_lengths=jnp.array([T, 6]), bias=bias)
    ours = attend(q, k, v, **kwargs)
    reference = dot_product_attention(q, k, v, implementation="reference", **kwargs)
    chex.assert_trees_all_close(ours, reference, rtol=1e-5, atol=1e-6)
    loss = lambda name: jax.grad(lambda *a: (dot_product_attention(
        *a, implementation=name, **kwargs) ** 2).sum(), argnums=(0, 1, 2))(q, k, v)
    chex.assert_trees_all_close(loss("masked_fill"), loss("reference"), rtol=1e-5, atol=1e-6)


def test_minus_inf_fill_gives_nan_exactly_where_masked_fill_softmax_does():
    q, k, v = qkv()
    lengths = [T, 0]                                   # example 1: every row sees no key
    visible = padded_causal(lengths)
    out, weights = attend(q, k, v, is_causal=True, key_value_seq_lengths=jnp.array(lengths),
                          mask_fill=-jnp.inf, return_weights=True)
    expected_out, expected_p = torch_style(q, k, v, visible, -np.inf)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected_out))
    np.testing.assert_array_equal(np.isnan(weights), np.isnan(expected_p))
    assert np.isnan(np.asarray(out)[1]).all() and np.isfinite(np.asarray(out)[0]).all()
    np.testing.assert_allclose(np.asarray(out)[0], expected_out[0], rtol=1e-5, atol=1e-6)
    # the safe kernels give zeros there
    safe = dot_product_attention(q, k, v, is_causal=True, key_value_seq_lengths=jnp.array(lengths))
    np.testing.assert_array_equal(np.asarray(safe)[1], 0.0)


@pytest.mark.parametrize("fill", [-1e4, -5e3, -1e9])
def test_a_finite_fill_gives_a_fully_masked_row_the_mean_of_v(fill):
    q, k, v = qkv()
    lengths = [T, 0]
    out = attend(q, k, v, is_causal=True, key_value_seq_lengths=jnp.array(lengths),
                 mask_fill=fill)
    expected, _ = torch_style(q, k, v, padded_causal(lengths), fill)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    mean_v = np.repeat(v, N // K, axis=2)[1].mean(axis=0)             # [N, H]
    np.testing.assert_allclose(np.asarray(out)[1], np.broadcast_to(mean_v, (T, N, H)),
                               rtol=1e-5, atol=1e-6)


def test_a_fill_above_the_real_scores_leaks_weight_onto_masked_keys():
    """A fill is only a mask while it is far below every visible score: with scores near
    -6000 (here a uniform bias), -5e3 puts the weight on the *masked* keys; -1e4 does not."""
    q, k, v = qkv()
    bias = np.full((1, 1, T, T), -6000.0, np.float32)
    future = np.triu(np.ones((T, T), bool), 1)
    on_future = {}
    for fill in (-5e3, -1e4):
        _, weights = attend(q, k, v, bias=bias, is_causal=True, mask_fill=fill,
                            return_weights=True)
        _, expected = torch_style(q, k, v, padded_causal([T, T]), fill, bias=bias)
        # float32 scores near 6000 are spaced 4.9e-4 apart: probabilities agree to ~1e-3
        np.testing.assert_allclose(np.asarray(weights), expected, rtol=2e-3, atol=1e-6)
        # the mass each query (but the last, which has no future) puts on future keys
        on_future[fill] = (np.asarray(weights) * future).sum(-1)[..., :-1].mean()
    assert on_future[-5e3] > 0.99 and on_future[-1e4] < 1e-6, on_future
    _, safe = dot_product_attention(q, k, v, bias=bias, is_causal=True, return_weights=True)
    assert np.asarray(safe)[..., future].max() == 0.0


def test_additive_mode_and_mask_after_softmax_match_their_idioms():
    q, k, v = qkv()
    visible = padded_causal([T, 5])
    lengths = jnp.array([T, 5])
    out = attend(q, k, v, is_causal=True, key_value_seq_lengths=lengths, mask_mode="add",
                 mask_fill=-1e4)
    np.testing.assert_allclose(np.asarray(out), torch_style(q, k, v, visible, -1e4, add=True)[0],
                               rtol=1e-5, atol=1e-5)
    out, weights = attend(q, k, v, is_causal=True, key_value_seq_lengths=lengths,
                          mask_after_softmax=True, return_weights=True)
    expected_out, expected_p = torch_style(q, k, v, visible, None, after=True)
    np.testing.assert_allclose(np.asarray(weights), expected_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out), expected_out, rtol=1e-5, atol=1e-5)
    assert (np.asarray(weights).sum(-1)[:, :, :-1] < 1 - 1e-3).all()   # rows no longer sum to 1


def test_float16_logits_in_the_input_dtype_overflow():
    q, k, v = qkv(scale=100.0, dtype=np.float16)       # some q.k beyond float16's 65504
    wide = attend(q, k, v, is_causal=True)
    narrow = attend(q, k, v, is_causal=True, logits_dtype="input")
    assert np.isfinite(np.asarray(wide, np.float32)).all()
    assert np.isnan(np.asarray(narrow, np.float32)).any()
    raw = np.einsum("btnh,bsnh->bnts", q.astype(np.float32), np.repeat(k, 2, 2).astype(np.float32))
    assert np.abs(raw).max() > np.finfo(np.float16).max   # the overflow is real


@pytest.mark.parametrize("offset", [-1, 1])
def test_causal_offset_shifts_the_diagonal(offset):
    q, k, v = qkv()
    visible = np.tril(np.ones((T, T), bool), offset)[None, None]
    out, weights = attend(q, k, v, is_causal=True, causal_offset=offset, mask_fill=-1e9,
                          return_weights=True)
    expected_out, expected_p = torch_style(q, k, v, visible, -1e9)
    np.testing.assert_allclose(np.asarray(weights), expected_p, rtol=1e-5, atol=1e-6)
    if offset == 1:                                    # every query sees the next token
        assert np.asarray(weights)[..., np.arange(T - 1), np.arange(1, T)].min() > 0
    else:                                              # row 0 sees nothing: uniform
        np.testing.assert_allclose(np.asarray(weights)[..., 0, :], 1.0 / T, rtol=1e-6)


def test_as_the_model_kernel_with_safe_settings_it_gives_the_reference_logits():
    make = lambda kernel, **a: ModelConfig(vocab_size=32, d_model=32, num_layers=2, max_length=16,
                                           attention=AttentionConfig(kernel=kernel, **a))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, size=(2, 12)))
    params = DecoderLM(make("reference")).init(jax.random.key(0), tokens)["params"]
    logits = lambda config: DecoderLM(config).apply({"params": params}, tokens)[0]
    chex.assert_trees_all_close(logits(make("masked_fill")), logits(make("reference")),
                                rtol=1e-5, atol=1e-5)
    leaky = logits(make("masked_fill", causal_offset=1))
    assert float(jnp.abs(leaky - logits(make("reference"))).max()) > 1e-3
    with pytest.raises(ValueError, match=r"^model\.attention\.mask_fill=-10000\.0 means nothing "
                                         r"with kernel='reference'"):
        make("reference", mask_fill=-1e4)
