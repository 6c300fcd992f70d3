"""Tests for attnjax.ops.masks: small boolean matrices written out by hand."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.ops.masks import (MaskSpec, block_causal_mask, causal_mask, combine_masks,
                               lengths_to_valid, mask_value, padding_mask, segment_mask,
                               sliding_window_mask, visibility)


def pos(n, start=0):
    """Positions ``[1, n]`` as the kernels pass them."""
    return (start + jnp.arange(n))[None, :]


def as_matrix(rows):
    """'1 0 1' strings -> bool matrix."""
    return np.array([[c == "1" for c in row.split()] for row in rows], bool)


# ----------------------------------------------------------------------------- causal


def test_causal_mask_square():
    got = causal_mask(pos(4), pos(4))
    chex.assert_shape(got, (1, 1, 4, 4))
    assert got.dtype == jnp.bool_
    want = as_matrix(["1 0 0 0",
                      "1 1 0 0",
                      "1 1 1 0",
                      "1 1 1 1"])
    np.testing.assert_array_equal(got[0, 0], want)


def test_causal_mask_uses_positions_not_indices():
    # Two new queries at positions 2 and 3 after a cache of keys 0..3 (KV-cache decoding).
    got = causal_mask(pos(2, start=2), pos(4))
    chex.assert_shape(got, (1, 1, 2, 4))
    np.testing.assert_array_equal(got[0, 0], as_matrix(["1 1 1 0",
                                                         "1 1 1 1"]))
    # Per-example positions broadcast over the batch axis.
    q_pos = jnp.array([[0, 1], [5, 6]])
    k_pos = jnp.array([[0, 1, 2], [4, 5, 6]])
    got = causal_mask(q_pos, k_pos)
    chex.assert_shape(got, (2, 1, 2, 3))
    np.testing.assert_array_equal(got[0, 0], as_matrix(["1 0 0", "1 1 0"]))
    np.testing.assert_array_equal(got[1, 0], as_matrix(["1 1 0", "1 1 1"]))


# ----------------------------------------------------------------------------- sliding window


@pytest.mark.parametrize("left,right,rows", [
    (1, 0, ["1 0 0 0 0",
            "1 1 0 0 0",
            "0 1 1 0 0",
            "0 0 1 1 0",
            "0 0 0 1 1"]),
    (2, 1, ["1 1 0 0 0",
            "1 1 1 0 0",
            "1 1 1 1 0",
            "0 1 1 1 1",
            "0 0 1 1 1"]),
    (0, 2, ["1 1 1 0 0",
            "0 1 1 1 0",
            "0 0 1 1 1",
            "0 0 0 1 1",
            "0 0 0 0 1"]),
    (None, 0, ["1 0 0 0 0",       # unbounded left, nothing right = causal
               "1 1 0 0 0",
               "1 1 1 0 0",
               "1 1 1 1 0",
               "1 1 1 1 1"]),
    (1, None, ["1 1 1 1 1",       # the whole future stays visible
               "1 1 1 1 1",
               "0 1 1 1 1",
               "0 0 1 1 1",
               "0 0 0 1 1"]),
    (None, None, ["1 1 1 1 1"] * 5),
])
def test_sliding_window_mask(left, right, rows):
    got = sliding_window_mask(pos(5), pos(5), left, right)
    chex.assert_shape(got, (1, 1, 5, 5))
    np.testing.assert_array_equal(got[0, 0], as_matrix(rows))


def test_sliding_window_none_none_equals_no_mask_and_none_zero_equals_causal():
    np.testing.assert_array_equal(sliding_window_mask(pos(6), pos(6), None, 0),
                                  causal_mask(pos(6), pos(6)))


# ----------------------------------------------------------------------------- block causal


def test_block_causal_mask_block3_len7():
    # Blocks {0,1,2} {3,4,5} {6}: full attention inside a block and to every earlier block.
    got = block_causal_mask(pos(7), pos(7), 3)
    chex.assert_shape(got, (1, 1, 7, 7))
    want = as_matrix(["1 1 1 0 0 0 0",
                      "1 1 1 0 0 0 0",
                      "1 1 1 0 0 0 0",
                      "1 1 1 1 1 1 0",
                      "1 1 1 1 1 1 0",
                      "1 1 1 1 1 1 0",
                      "1 1 1 1 1 1 1"])
    np.testing.assert_array_equal(got[0, 0], want)


def test_block_causal_block1_is_causal():
    np.testing.assert_array_equal(block_causal_mask(pos(6), pos(6), 1), causal_mask(pos(6), pos(6)))


# ----------------------------------------------------------------------------- padding


def test_lengths_to_valid():
    got = lengths_to_valid(jnp.array([2, 4, 0]), jnp.arange(4))
    np.testing.assert_array_equal(got, [[1, 1, 0, 0],
                                        [1, 1, 1, 1],
                                        [0, 0, 0, 0]])
    # Index offset (a block that starts at 3).
    np.testing.assert_array_equal(lengths_to_valid(jnp.array([4]), 3 + jnp.arange(3)),
                                  [[1, 0, 0]])


def test_padding_mask_combinations():
    q_valid = jnp.array([[True, True, False], [True, False, False]])
    k_valid = jnp.array([[True, False], [True, True]])
    assert padding_mask(None, None) is None

    only_k = padding_mask(None, k_valid)
    chex.assert_shape(only_k, (2, 1, 1, 2))
    np.testing.assert_array_equal(only_k[:, 0, 0], k_valid)

    only_q = padding_mask(q_valid, None)
    chex.assert_shape(only_q, (2, 1, 3, 1))
    np.testing.assert_array_equal(only_q[:, 0, :, 0], q_valid)

    both = padding_mask(q_valid, k_valid)
    chex.assert_shape(both, (2, 1, 3, 2))
    np.testing.assert_array_equal(both[0, 0], as_matrix(["1 0", "1 0", "0 0"]))
    np.testing.assert_array_equal(both[1, 0], as_matrix(["1 1", "0 0", "0 0"]))


# ----------------------------------------------------------------------------- segments


def test_segment_mask_packed_sequences():
    ids = jnp.array([[0, 0, 1, 1, 1]])
    got = segment_mask(ids, ids)
    chex.assert_shape(got, (1, 1, 5, 5))
    np.testing.assert_array_equal(got[0, 0], as_matrix(["1 1 0 0 0",
                                                        "1 1 0 0 0",
                                                        "0 0 1 1 1",
                                                        "0 0 1 1 1",
                                                        "0 0 1 1 1"]))


def test_segment_mask_cross():
    got = segment_mask(jnp.array([[1, 2]]), jnp.array([[2, 1, 1, 3]]))
    chex.assert_shape(got, (1, 1, 2, 4))
    np.testing.assert_array_equal(got[0, 0], as_matrix(["0 1 1 0", "1 0 0 0"]))


# ----------------------------------------------------------------------------- combine


def test_combine_masks_is_and_ignoring_none():
    a = jnp.array([[True, True, False, False]])
    b = jnp.array([[True, False, True, False]])
    assert combine_masks() is None
    assert combine_masks(None, None) is None
    np.testing.assert_array_equal(combine_masks(None, a, None), a)
    np.testing.assert_array_equal(combine_masks(a, None, b), [[True, False, False, False]])
    # Broadcasting: [1, 4] & [3, 1].
    c = jnp.array([[True], [False], [True]])
    got = combine_masks(a, c)
    chex.assert_shape(got, (3, 4))
    np.testing.assert_array_equal(got, [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])


# ----------------------------------------------------------------------------- visibility


def test_visibility_causal_window_offset_and_nothing():
    got = visibility(3, 3, causal=True)
    chex.assert_shape(got, (1, 1, 3, 3))
    np.testing.assert_array_equal(got[0, 0], as_matrix(["1 0 0", "1 1 0", "1 1 1"]))
    # two queries after three cached keys (offset 3), a window of 2: keys i + 2 and i + 3
    np.testing.assert_array_equal(visibility(2, 5, causal=True, window=(1, 0), offset=3)[0, 0],
                                  as_matrix(["0 0 1 1 0", "0 0 0 1 1"]))
    np.testing.assert_array_equal(visibility(2, 3, causal=False, window=(1, None))[0, 0],
                                  as_matrix(["1 1 1", "1 1 1"]))            # j > i - 2 only
    np.testing.assert_array_equal(visibility(3, 3, causal=False, window=(1, 1))[0, 0],
                                  as_matrix(["1 1 0", "1 1 1", "0 1 1"]))   # |i - j| <= 1
    np.testing.assert_array_equal(visibility(2, 3, causal=False)[0, 0], np.ones((2, 3)))


def test_visibility_of_a_padded_batch():
    real = np.array([[True, True, False], [False, True, True]])          # right, left padded
    got = visibility(3, 3, causal=False, token_mask=real)
    chex.assert_shape(got, (2, 1, 3, 3))
    np.testing.assert_array_equal(got[0, 0], as_matrix(["1 1 0", "1 1 0", "0 0 0"]))
    np.testing.assert_array_equal(got[1, 0], as_matrix(["0 0 0", "0 1 1", "0 1 1"]))
    np.testing.assert_array_equal(visibility(3, 3, causal=True, token_mask=real)[1, 0],
                                  as_matrix(["0 0 0", "0 1 0", "0 1 1"]))
    with pytest.raises(ValueError, match=r"token_mask must be \[B, T\] with T = S"):
        visibility(3, 4, causal=True, token_mask=real)


# ----------------------------------------------------------------------------- MaskSpec


def _numpy_full_mask(dense, T, S, window, block, q_len, kv_len, q_seg, kv_seg):
    """The same mask written directly in NumPy, element by element."""
    B = q_len.shape[0]
    out = np.zeros((B, dense.shape[1], T, S), bool)
    for b in range(B):
        for n in range(dense.shape[1]):
            for i in range(T):
                for j in range(S):
                    out[b, n, i, j] = (dense[b, n, i, j] and j <= i
                                       and i - window[0] <= j <= i + window[1]
                                       and j // block <= i // block
                                       and i < q_len[b] and j < kv_len[b]
                                       and q_seg[b, i] == kv_seg[b, j])
    return out


@pytest.fixture(scope="module")
def combined_spec():
    rng = np.random.default_rng(0)
    B, N, T = 2, 3, 11
    dense = rng.random((B, N, T, T)) < 0.8
    q_len, kv_len = np.array([11, 7]), np.array([9, 11])
    seg = np.array([[0] * 4 + [1] * 5 + [2] * 2, [0] * 6 + [1] * 5])
    spec = MaskSpec(dense=jnp.asarray(dense), is_causal=True, window=(4, 1), causal_block_size=2,
                    query_seq_lengths=jnp.asarray(q_len), key_value_seq_lengths=jnp.asarray(kv_len),
                    q_segment_ids=jnp.asarray(seg), kv_segment_ids=jnp.asarray(seg))
    want = _numpy_full_mask(dense, T, T, (4, 1), 2, q_len, kv_len, seg, seg)
    return spec, want


def test_maskspec_full_block_matches_numpy(combined_spec):
    spec, want = combined_spec
    got = jax.jit(lambda: spec.block(0, 11, 0, 11))()
    chex.assert_shape(got, want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("q_start,k_start", [(0, 0), (4, 0), (4, 5), (7, 3), (6, 6)])
def test_maskspec_sub_block_equals_slice(combined_spec, q_start, k_start):
    # The chunked kernel calls block() with traced starts and static sizes (4, 5); the jitted
    # function is compiled once and reused for every start.
    spec, want = combined_spec
    got = _jitted_block(spec)(q_start, k_start)
    np.testing.assert_array_equal(got, want[:, :, q_start:q_start + 4, k_start:k_start + 5])


def test_maskspec_sub_block_other_sizes(combined_spec):
    spec, want = combined_spec
    got = jax.jit(lambda: spec.block(5, 6, 7, 4))()
    np.testing.assert_array_equal(got, want[:, :, 5:11, 7:11])


_JITTED = {}


def _jitted_block(spec):
    if id(spec) not in _JITTED:
        _JITTED[id(spec)] = (spec, jax.jit(lambda qs, ks: spec.block(qs, 4, ks, 5)))
    return _JITTED[id(spec)][1]


def test_maskspec_nothing_masked_is_none():
    assert MaskSpec().block(0, 4, 0, 4) is None


def test_maskspec_positions_offset():
    # Queries at positions 6, 7 (after 6 cached keys), keys 0..7, causal + window (2, 0).
    spec = MaskSpec(is_causal=True, window=(2, 0), q_positions=jnp.array([[6, 7]]))
    np.testing.assert_array_equal(spec.block(0, 2, 0, 8)[0, 0],
                                  as_matrix(["0 0 0 0 1 1 1 0",
                                             "0 0 0 0 0 1 1 1"]))


# ----------------------------------------------------------------------------- mask value


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
def test_mask_value_is_finite_most_negative(dtype):
    value = mask_value(dtype)
    assert isinstance(value, float)
    assert np.isfinite(value) and value < 0
    assert value == float(jnp.finfo(dtype).min)
    # Representable in the dtype itself (does not round to -inf).
    assert bool(jnp.isfinite(jnp.asarray(value, dtype)))


# ----------------------------------------------------------------------------- key ranges


@pytest.mark.parametrize("spec, start, end, expected", [
    (MaskSpec(is_causal=True), 4, 8, (0, 8)),
    (MaskSpec(window=(2, 1)), 4, 8, (2, 9)),
    (MaskSpec(is_causal=True, window=(3, 0)), 4, 8, (1, 8)),
    (MaskSpec(window=(None, 2)), 12, 16, (0, 16)),
    (MaskSpec(is_causal=True, q_positions=pos(4, 4)), 4, 8, (0, 16)),   # values: not known
    (MaskSpec(), 4, 8, (0, 16)),
])
def test_key_range_by_hand(spec, start, end, expected):
    assert spec.key_range(start, end, 16) == expected


@pytest.mark.parametrize("window", [None, (0, 0), (2, 1), (3, None), (None, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_key_range_holds_every_visible_key(causal, window):
    """Every key a query block may see lies in its range (so a kernel can drop the rest)."""
    spec = MaskSpec(is_causal=causal, window=window)
    T = 12
    block = spec.block(0, T, 0, T)
    visible = np.ones((T, T), bool) if block is None else np.asarray(block)[0, 0]
    for start in range(0, T, 5):
        end = min(start + 5, T)
        lo, hi = spec.key_range(start, end, T)
        outside = np.ones(T, bool)
        outside[lo:hi] = False
        assert not visible[start:end, outside].any(), (start, lo, hi)
