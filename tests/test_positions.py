"""Tests for attnjax.ops.positions: hand-computed and sourced golden values."""

import functools
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from attnjax.ops import positions as P

# ----------------------------------------------------------------------------- sinusoidal


def test_sinusoidal_shape_and_values():
    table = P.sinusoidal_table(16, 8)
    chex.assert_shape(table, (16, 8))
    assert table.dtype == jnp.float32
    # dim 8: PE[p, 2i] = sin(p / 1e4^(2i/8)); 1e4^(2/8) = 10, 1e4^(6/8) = 1000.
    np.testing.assert_allclose(table[0], [0, 1] * 4, atol=0)
    np.testing.assert_allclose(table[5, 0:2], [math.sin(5), math.cos(5)], rtol=1e-6)
    np.testing.assert_allclose(table[5, 2:4], [math.sin(0.5), math.cos(0.5)], rtol=1e-6)
    np.testing.assert_allclose(table[7, 6:8], [math.sin(0.007), math.cos(0.007)], rtol=1e-6)


def test_sinusoidal_embedding_matches_table_rows():
    table = P.sinusoidal_table(32, 6)
    pos = jnp.array([[3, 0, 31], [7, 7, 12]])
    emb = P.sinusoidal_embedding(pos, 6)
    chex.assert_shape(emb, (2, 3, 6))
    np.testing.assert_array_equal(emb, table[pos])
    assert P.sinusoidal_table(4, 4, dtype=jnp.bfloat16).dtype == jnp.bfloat16


def test_sinusoidal_odd_dim_raises():
    with pytest.raises(ValueError, match="dim"):
        P.sinusoidal_table(4, 5)


# ----------------------------------------------------------------------------- RoPE

def _rope(x, pos, **kw):
    """x [H] at one integer position -> [H] (B = T = N = 1)."""
    return P.apply_rope(jnp.asarray(x, jnp.float32)[None, None, None], jnp.array([pos]), **kw)[
        0, 0, 0]


def test_rope_relative_property():
    kq, kk = jax.random.split(jax.random.PRNGKey(0))
    q, k = jax.random.normal(kq, (16,)), jax.random.normal(kk, (16,))
    norm = float(jnp.linalg.norm(q) * jnp.linalg.norm(k))
    for offset in (0, 3, -5):
        scores = [float(_rope(q, m) @ _rope(k, m - offset)) for m in (5, 17, 60, 103)]
        # float32 angles up to ~100 rad carry ~1e-5 rad error -> bound relative to |q||k|.
        np.testing.assert_allclose(scores, scores[0], atol=1e-5 * norm)
    # ...and it does depend on the offset.
    assert abs(float(_rope(q, 5) @ _rope(k, 2)) - float(_rope(q, 5) @ _rope(k, 4))) > 1e-3


def test_rope_preserves_norm_and_position_zero_is_identity():
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 7, 3, 8))
    pos = jnp.array([[0, 1, 2, 3, 50, 51, 999], [0, 10, 20, 30, 40, 50, 60]])
    y = P.apply_rope(x, pos)
    chex.assert_shape(y, x.shape)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1),
                               rtol=1e-6)
    np.testing.assert_array_equal(y[:, 0], x[:, 0])  # cos 0 = 1, sin 0 = 0 exactly


def test_rope_positions_1d_broadcast_over_batch():
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 5, 2, 4))
    pos = jnp.arange(5) + 2
    np.testing.assert_array_equal(P.apply_rope(x, pos),
                                  P.apply_rope(x, jnp.broadcast_to(pos, (3, 5))))


def test_rope_partial_rotary_leaves_tail_unchanged():
    assert P.rope_rotary_dim(10, 0.5) == 4  # int(5) rounded down to even
    assert P.rope_rotary_dim(64, 0.25) == 16
    x = jax.random.normal(jax.random.PRNGKey(3), (1, 4, 2, 10))
    y = P.apply_rope(x, jnp.arange(4) * 7, rotary_fraction=0.5)
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    np.testing.assert_array_equal(y[..., :4], P.apply_rope(x[..., :4], jnp.arange(4) * 7))
    with pytest.raises(ValueError, match="rotary_fraction"):
        P.rope_rotary_dim(4, 0.25)


def test_rope_half_split_golden():
    # H = 4, half-split: pairs (0, 2) with inv_freq 1 and (1, 3) with 1e4^(-2/4) = 0.01.
    # x = e0 at position 1: y0 = cos 1, y2 = x0 sin 1 = sin 1, others 0.
    np.testing.assert_allclose(_rope([1, 0, 0, 0], 1), [math.cos(1), 0, math.sin(1), 0],
                               rtol=1e-6, atol=1e-7)
    # x = e1 at position 1: rotated by 0.01 into feature 3.
    np.testing.assert_allclose(_rope([0, 1, 0, 0], 1), [0, math.cos(0.01), 0, math.sin(0.01)],
                               rtol=1e-6, atol=1e-7)
    # x = e2 at position 1: y0 = -x2 sin 1, y2 = x2 cos 1.
    np.testing.assert_allclose(_rope([0, 0, 1, 0], 1), [-math.sin(1), 0, math.cos(1), 0],
                               rtol=1e-6, atol=1e-7)


def test_rope_half_split_is_a_permutation_of_interleaved():
    """Scores equal a float64 RoFormer (interleaved) RoPE on permuted features."""
    h, m, n = 8, 9, 4
    q, k = np.random.default_rng(0).normal(size=(2, h))
    inv = 1e4 ** (-np.arange(0, h, 2) / h)

    def interleaved(x, p):  # pairs (2j, 2j+1)
        c, s = np.cos(p * inv), np.sin(p * inv)
        out = np.empty_like(x)
        out[0::2] = x[0::2] * c - x[1::2] * s
        out[1::2] = x[1::2] * c + x[0::2] * s
        return out

    perm = np.concatenate([np.arange(0, h, 2), np.arange(1, h, 2)])  # interleaved -> halves
    ref = interleaved(q, m) @ interleaved(k, n)
    got = float(_rope(q[perm], m) @ _rope(k[perm], n))
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(_rope(q[perm], m)), interleaved(q, m)[perm],
                               rtol=1e-5, atol=1e-6)


def test_rope_frequencies_golden():
    # rotary_dim 8, base 1e4: theta_i = 1e4^(-2i/8) = 10^-i, i = 0..3.
    kw = dict(base=1e4, scale=4.0, train_length=2048)
    inv, f = P.rope_frequencies(8)
    np.testing.assert_allclose(inv, [1, 0.1, 0.01, 0.001], rtol=1e-6)
    assert float(f) == 1.0
    # linear (PI): theta / 4.
    inv, f = P.rope_frequencies(8, schedule="linear", **kw)
    np.testing.assert_allclose(inv, [0.25, 0.025, 0.0025, 0.00025], rtol=1e-6)
    assert float(f) == 1.0
    # ntk: base' = 1e4 * 4^(8/6) = 63496.042...; base'^(-i/4) = 10^-i * 4^(-i/3):
    # 4^(-1/3) = 0.62996..., 4^(-2/3) = 0.39685..., 4^(-1) = 0.25.
    inv, f = P.rope_frequencies(8, schedule="ntk", **kw)
    np.testing.assert_allclose(inv, [1.0, 0.06299605249474366, 0.003968502629920499, 0.00025],
                               rtol=1e-6)
    assert float(f) == 1.0
    # yarn: i(N) = 8 ln(2048 / (2 pi N)) / (2 ln 1e4);
    # i(32) = 8 ln(10.1859) / 18.4207 = 1.00800 -> low = floor = 1;
    # i(1) = 8 ln(325.949) / 18.4207 = 2.51315 -> high = ceil = 3.
    # ramp_i = clip((i - 1) / 2, 0, 1) = [0, 0, 0.5, 1]; theta' = (1 - r) theta + r theta / 4:
    # [1, 0.1, 0.01 * (0.5 + 0.125) = 0.00625, 0.001 / 4 = 0.00025] (pair 0, 1 kept, 3 = PI).
    # factor = 0.1 ln 4 + 1 = 1.1386294361...
    inv, f = P.rope_frequencies(8, schedule="yarn", **kw)
    np.testing.assert_allclose(inv, [1.0, 0.1, 0.00625, 0.00025], rtol=1e-6)
    np.testing.assert_allclose(f, 1.138629436111989, rtol=1e-7)


def test_llama3_frequencies_golden():
    # theta = [1, 0.1, 0.01, 0.001]: wavelengths 2 pi / theta = 6.28, 62.8, 628, 6283. With
    # L = 2048, l = 1, h = 4: below L / h = 512 kept (pairs 0, 1); above L / l = 2048 scaled
    # by 1/8 (pair 3); pair 2 mixes with r = (2048 * 0.01 / (2 pi) - 1) / 3 = 0.753164:
    # 0.01 ((1 - r) / 8 + r) = 0.0078401886.
    inv, f = P.rope_frequencies(8, schedule="llama3", scale=8.0, train_length=2048)
    np.testing.assert_allclose(inv, [1.0, 0.1, 0.007840188600689215, 0.000125], rtol=1e-6)
    assert float(f) == 1.0
    # bands moved: l = 2, h = 8 -> kept below 256, scaled above 1024; pair 2 (628) mixes with
    # r = (3.259493 - 2) / 6 = 0.2099155: 0.01 ((1 - r) / 8 + r) = 0.0030868
    inv, _ = P.rope_frequencies(8, schedule="llama3", scale=8.0, train_length=2048,
                                low_freq_factor=2.0, high_freq_factor=8.0)
    r = (2048 * 0.01 / (2 * math.pi) - 2) / 6
    np.testing.assert_allclose(inv, [1.0, 0.1, 0.01 * ((1 - r) / 8 + r), 0.000125], rtol=1e-6)
    with pytest.raises(ValueError, match="low_freq_factor < high_freq_factor"):
        P.rope_frequencies(8, schedule="llama3", scale=8.0, train_length=2048,
                           low_freq_factor=4.0, high_freq_factor=4.0)


def test_yarn_short_train_length():
    # train_length 128 < 2 pi 32 ~ 201: i(32) = -0.196 -> floor -1 -> clipped to 0;
    # i(1) = 8 ln(128 / 2pi) / 18.4207 = 1.309 -> high = 2. ramp = [0, 0.5, 1, 1]:
    # [1, 0.1 (0.5 + 0.5 / 4) = 0.0625, 0.01 / 4, 0.001 / 4]: pair 0 still keeps theta_0.
    inv, f = P.rope_frequencies(8, schedule="yarn", scale=4.0, train_length=128)
    np.testing.assert_allclose(inv, [1.0, 0.0625, 0.0025, 0.00025], rtol=1e-6)
    # scale 1: no change and no temperature.
    inv, f = P.rope_frequencies(8, schedule="yarn", scale=1.0, train_length=128)
    np.testing.assert_allclose(inv, [1, 0.1, 0.01, 0.001], rtol=1e-6)
    assert float(f) == 1.0


def test_yarn_factor_multiplies_output():
    x = jax.random.normal(jax.random.PRNGKey(4), (1, 3, 2, 8))
    y = P.apply_rope(x, jnp.zeros(3, jnp.int32), schedule="yarn", scale=4.0, train_length=2048)
    np.testing.assert_allclose(y, x * (0.1 * math.log(4) + 1), rtol=1e-6)


def test_linear_schedule_equals_default_at_scaled_positions():
    inv_lin, _ = P.rope_frequencies(16, schedule="linear", scale=3.0)
    inv_def, _ = P.rope_frequencies(16)
    np.testing.assert_allclose(inv_lin, inv_def / 3.0, rtol=1e-6)
    # Scale 4 (a power of two): (4 p) * (theta / 4) == p * theta exactly in float.
    x = jax.random.normal(jax.random.PRNGKey(5), (2, 6, 2, 16))
    p = jnp.arange(6) * 5
    np.testing.assert_array_equal(P.apply_rope(x, 4 * p, schedule="linear", scale=4.0),
                                  P.apply_rope(x, p))


def test_dynamic_ntk():
    default, _ = P.rope_frequencies(8)
    for seq_len in (1, 100, 2048):  # s = max(1, seq_len / 2048) = 1
        inv, f = P.rope_frequencies(8, schedule="dynamic_ntk", train_length=2048, seq_len=seq_len)
        np.testing.assert_allclose(inv, default, rtol=1e-6)
        assert float(f) == 1.0
    for seq_len in (3072, 8192):  # s = seq_len / 2048
        inv, _ = P.rope_frequencies(8, schedule="dynamic_ntk", train_length=2048,
                                    seq_len=jnp.asarray(seq_len))
        ntk, _ = P.rope_frequencies(8, schedule="ntk", scale=seq_len / 2048)
        np.testing.assert_allclose(inv, ntk, rtol=1e-6)
    # apply_rope takes seq_len = max(positions) + 1 = 64 -> s = 4 with train_length 16.
    x = jax.random.normal(jax.random.PRNGKey(6), (1, 64, 1, 8))
    y_dyn = P.apply_rope(x, jnp.arange(64), schedule="dynamic_ntk", train_length=16)
    y_ntk = P.apply_rope(x, jnp.arange(64), schedule="ntk", scale=4.0)
    # frequencies agree to ~1 ulp; angles reach 63 rad, so compare with an absolute bound.
    np.testing.assert_allclose(y_dyn, y_ntk, atol=2e-5)
    y_short = P.apply_rope(x[:, :16], jnp.arange(16), schedule="dynamic_ntk", train_length=16)
    np.testing.assert_allclose(y_short, P.apply_rope(x[:, :16], jnp.arange(16)), atol=1e-5)


def test_rope_errors():
    msg = ("rope schedule 'bogus' is not one of: default, linear, ntk, dynamic_ntk, yarn, "
           "llama3")
    with pytest.raises(ValueError, match=re.escape(msg)):
        P.rope_frequencies(8, schedule="bogus")
    with pytest.raises(ValueError, match="scale"):
        P.rope_frequencies(8, schedule="linear", scale=0.5)
    with pytest.raises(ValueError, match="train_length"):
        P.rope_frequencies(8, schedule="yarn", scale=2.0)
    with pytest.raises(ValueError, match="train_length"):
        P.apply_rope(jnp.ones((1, 2, 1, 8)), jnp.arange(2), schedule="dynamic_ntk")
    with pytest.raises(ValueError, match="seq_len"):
        P.rope_frequencies(8, schedule="dynamic_ntk", train_length=16)
    with pytest.raises(ValueError, match="rotary_dim"):
        P.rope_frequencies(7)
    with pytest.raises(TypeError, match="positions"):
        P.apply_rope(jnp.ones((1, 2, 1, 8)), jnp.arange(2) / 2)


class RopeJitTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(
        dict(schedule="default"),
        dict(schedule="yarn", scale=4.0, train_length=32),
        dict(schedule="dynamic_ntk", train_length=4),
    )
    def test_apply_rope_jit(self, **kw):
        x = jax.random.normal(jax.random.PRNGKey(7), (2, 8, 2, 6))
        pos = jnp.arange(16).reshape(2, 8)
        fn = functools.partial(P.apply_rope, rotary_fraction=0.75, **kw)
        want = fn(x, pos)
        np.testing.assert_allclose(self.variant(fn)(x, pos), want, rtol=1e-6, atol=1e-6)
        # bfloat16 in -> bfloat16 out, within bfloat16 rounding (eps 2^-7) of the f32 result.
        got16 = self.variant(fn)(x.astype(jnp.bfloat16), pos)
        assert got16.dtype == jnp.bfloat16
        np.testing.assert_allclose(got16.astype(jnp.float32), want, rtol=2e-2, atol=2e-2)


# ----------------------------------------------------------------------------- ALiBi

def test_alibi_slopes_golden():
    np.testing.assert_array_equal(P.alibi_slopes(8), 2.0 ** -np.arange(1, 9))
    np.testing.assert_array_equal(P.alibi_slopes(1), [2.0 ** -8])
    twelve = [2.0 ** -e for e in (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5)]
    np.testing.assert_allclose(P.alibi_slopes(12), twelve, rtol=1e-15)
    # n = 6: c = 4 -> 2^-2, 2^-4, 2^-6, 2^-8; 8-head slopes 2^-1..2^-8 at [0::2] are
    # 2^-1, 2^-3, 2^-5, 2^-7, first 6 - 4 = 2 of them.
    np.testing.assert_allclose(P.alibi_slopes(6), 2.0 ** -np.array([2, 4, 6, 8, 1, 3]),
                               rtol=1e-15)
    assert P.alibi_slopes(12).dtype == np.float64
    with pytest.raises(ValueError, match="num_heads"):
        P.alibi_slopes(0)


def test_alibi_bias_values():
    bias = P.alibi_bias([0.5, 0.25], jnp.array([[0, 1, 2]]), jnp.array([[0, 1, 2]]))
    chex.assert_shape(bias, (1, 2, 3, 3))
    assert bias.dtype == jnp.float32
    np.testing.assert_array_equal(bias[0, 0], [[0, -0.5, -1], [-0.5, 0, -0.5], [-1, -0.5, 0]])
    np.testing.assert_array_equal(bias[0, 1], 0.5 * np.asarray(bias[0, 0]))


def test_alibi_bias_causal_region():
    slopes = P.alibi_slopes(4)
    q = jnp.array([[5, 6, 7, 8], [2, 3, 4, 5]])
    k = jnp.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    bias = np.asarray(P.alibi_bias(slopes, q, k))
    i, j = np.asarray(q)[:, None, :, None], np.asarray(k)[:, None, None, :]
    want = -slopes[None, :, None, None] * (i - j)
    causal = np.broadcast_to(j <= i, bias.shape)
    np.testing.assert_allclose(bias[causal], want[causal], rtol=1e-6)


# ----------------------------------------------------------------------------- T5

# Bidirectional, 32 buckets -> 16 per sign, max_exact 8, max_distance 128, n = -rel:
#   rel 0 -> 0; rel -1 -> n 1 -> 1; rel +1 -> 16 + 1 = 17; rel -7 -> 7;
#   rel -8 -> 8 + int(ln(8/8) / ln(16) * 8) = 8; rel -12 -> 8 + int(0.405/2.773*8 = 1.17) = 9;
#   rel -60 -> 8 + int(ln 7.5 / ln 16 * 8 = 5.81) = 13; rel -100 -> 8 + int(7.29) = 15;
#   rel -200 -> 8 + int(ln 25 / ln 16 * 8 = 9.29) = 17 -> min(., 15) = 15; rel +200 -> 16+15 = 31.
BIDIRECTIONAL = {0: 0, -1: 1, 1: 17, -7: 7, 7: 23, -8: 8, -12: 9, -60: 13, -100: 15, -200: 15,
                 200: 31}
# Causal, 32 buckets, max_exact 16, n = max(-rel, 0):
#   rel +5 -> 0; rel -1 -> 1; rel -15 -> 15; rel -16 -> 16 + int(ln 1) = 16;
#   rel -20 -> 16 + int(ln 1.25 / ln 8 * 16 = 1.72) = 17; rel -100 -> 16 + int(14.10) = 30;
#   rel -127 -> 16 + int(15.94) = 31; rel -200 -> 16 + int(19.43) = 35 -> min(., 31) = 31.
CAUSAL = {5: 0, 0: 0, -1: 1, -15: 15, -16: 16, -20: 17, -100: 30, -127: 31, -200: 31}


@pytest.mark.parametrize("bidirectional,golden", [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_t5_buckets_golden(bidirectional, golden):
    rel = jnp.array(list(golden))
    got = P.t5_relative_position_bucket(rel, bidirectional=bidirectional)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, list(golden.values()))


def test_t5_bias_picks_table_rows():
    table = jnp.arange(64, dtype=jnp.float32).reshape(32, 2)  # table[b, h] = 2 b + h
    pos = jnp.array([[0, 1, 2]])
    bias = P.t5_bias(table, pos, pos, bidirectional=True, num_buckets=32, max_distance=128)
    chex.assert_shape(bias, (1, 2, 3, 3))
    # rel = k - q = [[0, 1, 2], [-1, 0, 1], [-2, -1, 0]] -> buckets [[0,17,18],[1,0,17],[2,1,0]].
    buckets = np.array([[0, 17, 18], [1, 0, 17], [2, 1, 0]])
    np.testing.assert_array_equal(bias[0, 0], 2 * buckets)
    np.testing.assert_array_equal(bias[0, 1], 2 * buckets + 1)
    causal = P.t5_bias(table, pos, pos, bidirectional=False, num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(causal[0, 0], 2 * np.array([[0, 0, 0], [1, 0, 0], [2, 1, 0]]))
