"""Position encodings: sinusoidal, RoPE (with length-scaling schedules), ALiBi, T5 buckets.

All functions are pure ``jax.numpy`` (ALiBi slopes are plain NumPy constants).
Layouts: q/k are BTNH = [batch, seq, heads, head_dim]; additive biases are
[batch|1, heads, q_len, k_len].

RoPE pairing convention: HALF-SPLIT (GPT-NeoX / Llama-HF ``rotate_half``). Inside
the rotary part of width d, feature j is paired with feature j + d/2 and the pair
is rotated by angle ``position * inv_freq[j]``. The RoFormer paper instead pairs
interleaved features (2j, 2j+1); the two conventions are equal up to a fixed
permutation of head features (so they give identical attention scores when q and
k use the same convention), but weights are not interchangeable without
permuting them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

ROPE_SCHEDULES = ("default", "linear", "ntk", "dynamic_ntk", "yarn", "llama3")


def _check_even_dim(dim: int, name: str = "dim") -> None:
    if dim < 2 or dim % 2:
        raise ValueError(f"{name} must be a positive even integer, got {dim}")


def sinusoidal_embedding(positions: jax.Array, dim: int, base: float = 10000.0,
                         dtype=jnp.float32) -> jax.Array:
    """Sinusoidal embedding of integer positions (interleaved sin/cos).

    PE[p, 2i] = sin(p / base^(2i/dim)),  PE[p, 2i+1] = cos(p / base^(2i/dim)).

    Args:
      positions: int array of any shape [...].
      dim: embedding width; must be even.
      base: wavelength base.
      dtype: output dtype (computed in float32).

    Returns:
      Array of shape [..., dim].

    References: Vaswani et al. 2017, "Attention Is All You Need".
    """
    _check_even_dim(dim)
    inv_freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = jnp.asarray(positions, jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., dim/2, 2]
    return pe.reshape(*angles.shape[:-1], dim).astype(dtype)


def sinusoidal_table(length: int, dim: int, base: float = 10000.0,
                     dtype=jnp.float32) -> jax.Array:
    """Table [length, dim] of ``sinusoidal_embedding`` at positions 0..length-1.

    References: Vaswani et al. 2017, "Attention Is All You Need".
    """
    return sinusoidal_embedding(jnp.arange(length), dim, base, dtype)


def _yarn_ramp(d: int, base: float, train_length: int, beta_fast: float,
               beta_slow: float) -> np.ndarray:
    """Per-pair ramp gamma_i in [0, 1]: 0 keeps theta_i, 1 uses theta_i / scale."""
    def index_of(rotations: float) -> float:  # pair index completing `rotations` turns
        return d * math.log(train_length / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(index_of(beta_fast)), 0)
    high = min(math.ceil(index_of(beta_slow)), d - 1)  # the reference code clamps to d - 1
    if high == low:
        high += 0.001  # as the reference code: avoid 0 / 0
    return np.clip((np.arange(d // 2) - low) / (high - low), 0.0, 1.0)


def rope_frequencies(rotary_dim: int, *, base: float = 10000.0, schedule: str = "default",
                     scale: float = 1.0, train_length: int | None = None,
                     seq_len: int | jax.Array | None = None, beta_fast: float = 32.0,
                     beta_slow: float = 1.0, low_freq_factor: float = 1.0,
                     high_freq_factor: float = 4.0) -> tuple[jax.Array, jax.Array]:
    """RoPE inverse frequencies under a length-scaling schedule.

    With d = rotary_dim and theta_i = base^(-2i/d), i = 0..d/2-1:

    * ``default``: theta_i.
    * ``linear`` (position interpolation): theta_i / scale, i.e. positions / scale.
    * ``ntk`` (NTK-aware): theta computed with base' = base * scale^(d/(d-2)).
    * ``dynamic_ntk``: as ``ntk`` with s = max(1, seq_len / train_length), where
      seq_len is the current total length (may be traced); ``scale`` is unused.
    * ``yarn`` (NTK-by-parts): with i(N) = d ln(train_length / (2 pi N)) / (2 ln base)
      the pair index that completes N rotations over train_length, low =
      max(floor(i(beta_fast)), 0), high = min(ceil(i(beta_slow)), d - 1) and
      gamma_i = clip((i - low) / (high - low), 0, 1),
      new theta_i = (1 - gamma_i) * theta_i + gamma_i * theta_i / scale.
      So HIGH-frequency pairs (small i, many rotations) keep theta_i (extrapolate)
      and LOW-frequency pairs (large i) are interpolated to theta_i / scale. The
      attention factor 0.1 ln(scale) + 1 (1 if scale <= 1) multiplies both q and
      k, so logits get its square. With base 1e4 the beta_fast = 32 cutoff exists
      only when train_length > 2 pi 32 ~ 201; below that the ramp starts at pair 0
      and YaRN degenerates towards PI plus the temperature term (in this discrete
      form pair 0 itself still keeps theta_0 = 1).
    * ``llama3`` (Llama 3.1's bands): with wavelength w_i = 2 pi / theta_i, L = train_length
      (the original context), l = low_freq_factor and h = high_freq_factor: pairs with
      w_i < L / h keep theta_i, pairs with w_i > L / l use theta_i / scale, and those between
      mix them by r_i = (L / w_i - l) / (h - l): (1 - r_i) theta_i / scale + r_i theta_i.
      No attention factor.

    Args:
      rotary_dim: number of rotated features d (even, >= 2).
      base: RoPE base b.
      schedule: one of ``ROPE_SCHEDULES``.
      scale: context extension factor s >= 1 (linear, ntk, yarn).
      train_length: original training length (dynamic_ntk, yarn).
      seq_len: current total length (dynamic_ntk only); may be a traced scalar.
      beta_fast: YaRN rotation count above which pairs are kept.
      beta_slow: YaRN rotation count below which pairs are interpolated.
      low_freq_factor, high_freq_factor: llama3's band edges l < h.

    Returns:
      (inv_freq [d/2] float32, attention_factor scalar float32).

    References: Su et al. 2021 (RoFormer); Chen et al. 2023 (Position
    Interpolation); bloc97 2023 (NTK-aware scaling); Peng et al. 2023 (YaRN); Grattafiori
    et al. 2024, "The Llama 3 Herd of Models" (llama3).
    """
    _check_even_dim(rotary_dim, "rotary_dim")
    if schedule not in ROPE_SCHEDULES:
        raise ValueError(f"rope schedule {schedule!r} is not one of: {', '.join(ROPE_SCHEDULES)}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    if schedule in ("dynamic_ntk", "yarn", "llama3") and train_length is None:
        raise ValueError(f"rope schedule {schedule!r} requires train_length")
    if schedule == "llama3" and not 0 < low_freq_factor < high_freq_factor:
        raise ValueError(f"rope schedule 'llama3' needs 0 < low_freq_factor < high_freq_factor, "
                         f"got {low_freq_factor} and {high_freq_factor}")
    if schedule in ("ntk", "dynamic_ntk") and rotary_dim < 4:
        raise ValueError(f"rope schedule {schedule!r} needs rotary_dim >= 4, got {rotary_dim}")
    d = rotary_dim
    exponent = np.arange(0, d, 2, dtype=np.float64) / d  # 2i / d
    theta = base ** -exponent
    factor = 1.0
    if schedule == "linear":
        theta = theta / scale
    elif schedule == "ntk":
        theta = (base * scale ** (d / (d - 2))) ** -exponent
    elif schedule == "dynamic_ntk":
        if seq_len is None:
            raise ValueError("rope schedule 'dynamic_ntk' requires seq_len")
        s = jnp.maximum(1.0, jnp.asarray(seq_len, jnp.float32) / train_length)
        log_base = math.log(base) + (d / (d - 2)) * jnp.log(s)
        inv_freq = jnp.exp(-jnp.asarray(exponent, jnp.float32) * log_base)
        return inv_freq, jnp.asarray(1.0, jnp.float32)
    elif schedule == "yarn":
        gamma = _yarn_ramp(d, base, train_length, beta_fast, beta_slow)
        theta = (1.0 - gamma) * theta + gamma * theta / scale
        factor = 0.1 * math.log(scale) + 1.0 if scale > 1 else 1.0
    elif schedule == "llama3":
        wavelength = 2 * math.pi / theta
        mix = (train_length / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        theta = np.where(wavelength < train_length / high_freq_factor, theta,
                         np.where(wavelength > train_length / low_freq_factor, theta / scale,
                                  (1.0 - mix) * theta / scale + mix * theta))
    return jnp.asarray(theta, jnp.float32), jnp.asarray(factor, jnp.float32)


def rope_rotary_dim(head_dim: int, rotary_fraction: float) -> int:
    """Rotary width: floor(head_dim * rotary_fraction) rounded down to even (>= 2)."""
    d = int(head_dim * rotary_fraction)
    d -= d % 2
    if not 0 < rotary_fraction <= 1 or d < 2:
        raise ValueError(f"rotary_fraction={rotary_fraction} with head_dim={head_dim} "
                         f"gives rotary_dim={d}; need 0 < rotary_fraction <= 1 and rotary_dim >= 2")
    return d


def apply_rope(x: jax.Array, positions: jax.Array, *, base: float = 10000.0,
               rotary_fraction: float = 1.0, schedule: str = "default", scale: float = 1.0,
               train_length: int | None = None, beta_fast: float = 32.0,
               beta_slow: float = 1.0, low_freq_factor: float = 1.0,
               high_freq_factor: float = 4.0) -> jax.Array:
    """Rotary position embedding, HALF-SPLIT pairing (GPT-NeoX / Llama-HF ``rotate_half``).

    With d the rotary width and phi_j = position * inv_freq[j], j < d/2:
      y[j]       = x[j] cos(phi_j) - x[j + d/2] sin(phi_j)
      y[j + d/2] = x[j + d/2] cos(phi_j) + x[j] sin(phi_j)
    Features d..H-1 pass through unchanged (partial rotary, GPT-NeoX style). The
    RoFormer paper pairs interleaved features (2j, 2j+1) instead; the two differ
    only by a fixed permutation of features. The whole output is multiplied by
    the schedule's attention factor (YaRN temperature; 1 otherwise), so applying
    this to both q and k scales logits by its square. For ``dynamic_ntk`` the
    current length is max(positions) + 1. Angles are computed in float32.

    Args:
      x: [B, T, N, H] queries or keys.
      positions: int [B, T] or [T].
      base, schedule, scale, train_length, beta_fast, beta_slow, low_freq_factor,
        high_freq_factor: see ``rope_frequencies``.
      rotary_fraction: fraction of each head's features to rotate.

    Returns:
      Array like x (same shape and dtype).

    References: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary
    Position Embedding".
    """
    if x.ndim != 4:
        raise ValueError(f"x must be [B, T, N, H], got shape {x.shape}")
    positions = jnp.asarray(positions)
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise TypeError(f"positions must be integers, got {positions.dtype}")
    if positions.ndim not in (1, 2) or positions.shape[-1] != x.shape[1]:
        raise ValueError(
            f"positions must be [B, T] or [T] with T={x.shape[1]}, got {positions.shape}")
    d = rope_rotary_dim(x.shape[-1], rotary_fraction)
    seq_len = jnp.max(positions) + 1 if schedule == "dynamic_ntk" else None
    inv_freq, factor = rope_frequencies(d, base=base, schedule=schedule, scale=scale,
                                        train_length=train_length, seq_len=seq_len,
                                        beta_fast=beta_fast, beta_slow=beta_slow,
                                        low_freq_factor=low_freq_factor,
                                        high_freq_factor=high_freq_factor)
    pos = positions if positions.ndim == 2 else positions[None]
    angles = pos.astype(jnp.float32)[:, :, None, None] * inv_freq  # [B|1, T, 1, d/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xf = x.astype(jnp.float32)
    x1, x2, rest = xf[..., : d // 2], xf[..., d // 2 : d], xf[..., d:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
    return (out * factor).astype(x.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi head slopes, float64 [num_heads].

    For n a power of two, m_i = 2^(-8 i / n), i = 1..n. Otherwise, with
    c = 2^floor(log2 n): the c slopes for c heads, then the slopes for 2c heads
    at even indices ([0::2]), first n - c of them. E.g. n = 12 gives
    2^-1..2^-8, 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (not monotonic, as in the paper).

    References: Press, Smith, Lewis 2022, "Train Short, Test Long" (ALiBi).
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    c = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = 2.0 ** (-8.0 * np.arange(1, c + 1) / c)
    if c == num_heads:
        return slopes
    return np.concatenate([slopes, alibi_slopes(2 * c)[0::2][: num_heads - c]])


def _as_batched(positions: jax.Array) -> jax.Array:
    positions = jnp.asarray(positions)
    return positions[None] if positions.ndim == 1 else positions


def alibi_bias(slopes, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
    """ALiBi additive bias -m_h |i - j|, float32 [B|1, N, Tq, Tk].

    On the causal region j <= i this equals the paper's -m_h (i - j); the
    symmetric distance makes it usable for bidirectional attention. It is added
    to the logits after the 1/sqrt(d) scaling (it is not scaled itself).

    Args:
      slopes: [N] head slopes, e.g. ``alibi_slopes(N)``.
      q_positions: int [B|1, Tq] (or [Tq]).
      k_positions: int [B|1, Tk] (or [Tk]).

    References: Press, Smith, Lewis 2022, "Train Short, Test Long" (ALiBi).
    """
    q, k = _as_batched(q_positions), _as_batched(k_positions)
    dist = jnp.abs(q[:, :, None] - k[:, None, :]).astype(jnp.float32)  # [B, Tq, Tk]
    m = jnp.asarray(slopes, jnp.float32)
    return -m[None, :, None, None] * dist[:, None]


def t5_relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool,
                                num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
    """T5 bucket of relative_position = key_pos - query_pos (int32, same shape).

    With n = query_pos - key_pos: if bidirectional, half the buckets go to each
    sign, keys after the query (n < 0) using the upper half, and n <- |n|;
    otherwise n <- max(n, 0), so all future keys share bucket 0. Of the remaining
    B buckets, n < B/2 gets its own bucket; larger n get
    B/2 + floor(ln(n / (B/2)) / ln(max_distance / (B/2)) * (B - B/2)),
    clipped to B - 1 (as the Mesh TensorFlow / T5 code, in float32).

    References: Raffel et al. 2020, "Exploring the Limits of Transfer Learning
    with a Unified Text-to-Text Transformer" (T5).
    """
    n = -jnp.asarray(relative_position, jnp.int32)
    ret = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    safe_n = jnp.maximum(n, max_exact).astype(jnp.float32)  # avoid log(0) in the unused branch
    large = max_exact + (jnp.log(safe_n / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return ret + jnp.where(n < max_exact, n, large)


def t5_bias(table: jax.Array, q_positions: jax.Array, k_positions: jax.Array, *,
            bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
    """T5 relative bias table[bucket(k - q)], shape [B|1, N, Tq, Tk].

    Args:
      table: [num_buckets, N] learned bias per bucket and head.
      q_positions: int [B|1, Tq] (or [Tq]).
      k_positions: int [B|1, Tk] (or [Tk]).
      bidirectional, num_buckets, max_distance: see ``t5_relative_position_bucket``.

    References: Raffel et al. 2020 (T5).
    """
    if table.shape[0] != num_buckets:
        raise ValueError(f"table has {table.shape[0]} rows but num_buckets={num_buckets}")
    q, k = _as_batched(q_positions), _as_batched(k_positions)
    buckets = t5_relative_position_bucket(
        k[:, None, :] - q[:, :, None], bidirectional=bidirectional,
        num_buckets=num_buckets, max_distance=max_distance)
    return jnp.moveaxis(table[buckets], -1, 1)  # [B, Tq, Tk, N] -> [B, N, Tq, Tk]
