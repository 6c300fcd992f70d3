"""Statistics of attention, as pure ``jax.numpy`` functions: each is defined once here and
used by the training objective (entropy regulariser), the training diagnostics (max logit,
per-head metrics) and the analysis tools.

Weight statistics read causal attention probabilities ``w`` ``[layers, B, heads, T, T]`` (row
i is query i's distribution over keys 0..i) and return ``[layers, heads]``: a mean over the
``B`` examples and all ``T`` query rows (row 0 sees only key 0, so it always has entropy 0,
max weight 1 and sink mass 1). ``0 log 0 = 0`` throughout.

- ``entropy``: ``-sum_j p_ij log p_ij``, in nats.
- ``normalized_entropy``: row i's entropy divided by ``log(i + 1)``, the entropy of the
  uniform distribution over its ``i + 1`` causally allowed keys; 1 = uniform, 0 = one key.
  Row 0 (``log 1 = 0``) is left out of this mean.
- ``max_weight``: ``max_j p_ij``.
- ``sink_mass``: ``p_i0``, the weight on the first token (an attention sink).
- ``activation_ratio``: the fraction of causally allowed weights (``j <= i``) above 0.1; a
  sliding window's zeroed keys count as allowed and inactive.
- ``previous_token``: ``p_{i,i-1}``, the weight on the previous token (rows i >= 1).
- ``induction_score`` (with the tokens ``x``): the weight ``sum_{j in S_i} p_ij`` on the keys
  that follow an earlier occurrence of the current token, ``S_i = {j : 1 <= j < i, x_{j-1} =
  x_i}``, averaged over the rows whose ``S_i`` is not empty (NaN when no row has one).

From queries and keys (after qk-norm and RoPE): ``causal_max_logit``, the largest ``scale *
q_i . k_j`` over causal pairs per head (before score bias and soft-capping), and the RMS over
tokens of each head's query and key norms (``qk_statistics``).

Between vectors and distributions (float64 NumPy unless said otherwise):

- ``cosine``: ``<a, b> / (||a|| ||b||)`` of two flattened arrays.
- ``mean_pairwise_cosine`` (jax.numpy): for hidden states ``x`` ``[..., B, T, D]``, each
  sequence's mean over the ``T (T - 1)`` ordered position pairs ``i != j`` of
  ``cos(x_i, x_j)``, then the mean over the ``B`` sequences; near 1 when every position carries
  about the same vector (uniform attention outputs the running mean of the values).
- ``js_divergence``: Jensen-Shannon divergence ``JS(P, Q) = KL(P||M)/2 + KL(Q||M)/2``,
  ``M = (P + Q)/2``, natural log: ``0 <= JS <= ln 2``, 0 iff ``P = Q``, ln 2 iff disjoint.
- ``head_divergence``: for weights ``[layers, B, heads, T, T]``, the ``[layers, heads, heads]``
  matrix of ``JS(p_{h,i}, p_{g,i})`` between two heads' rows, averaged over query rows
  ``i >= start`` (row 0 is one-hot on key 0 for every head) and the ``B`` examples.
- ``spearman``: Spearman's rank correlation, the Pearson correlation of the ranks (ties get
  their average rank).

References: Michel et al. 2019 (per-head analysis); Olsson et al. 2022, "In-context Learning
and Induction Heads" (previous-token and induction heads); Xiao et al. 2023, "Efficient
Streaming Language Models with Attention Sinks" (sink mass); Wortsman et al. 2023
(attention-logit growth); Lin 1991, "Divergence Measures Based on the Shannon Entropy"
(Jensen-Shannon divergence).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.ops.attention import expand_kv_heads, scaled_logits

WEIGHT_STATS = ("entropy", "norm_entropy", "max_weight", "sink_mass", "active_frac",
                "prev_token")
QK_STATS = ("max_logit", "q_norm", "k_norm")


def row_entropy(p: jax.Array) -> jax.Array:
    """``-sum_j p_j log p_j`` over the last axis, with ``0 log 0 = 0`` (nats)."""
    return -(p * jnp.log(jnp.where(p > 0, p, 1.0))).sum(-1)


def mean_entropy(weights) -> jax.Array:
    """Mean over layers (each ``[B, heads, T, S]``), examples, heads and query rows of the row
    entropy: the attention-entropy regulariser's term."""
    return jnp.mean(jnp.stack([row_entropy(w).mean() for w in weights]))


def causal_max_logit(q: jax.Array, k: jax.Array, scale) -> jax.Array:
    """``[N]``: the largest ``scale * q_i . k_j`` over causal pairs ``j <= i`` (and examples)
    per head, from ``q`` ``[B, T, N, H]``, ``k`` ``[B, T, K, H]``, ``scale`` scalar or ``[N]``."""
    N, T = q.shape[2], q.shape[1]
    scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float32), (N,))
    logits = scaled_logits(q, expand_kv_heads(k, N), scale, None)               # [B,N,T,T]
    causal = jnp.tril(jnp.ones((T, T), bool))
    return jnp.where(causal, logits, -jnp.inf).max(axis=(0, 2, 3))


def qk_statistics(q: jax.Array, k: jax.Array, scale) -> dict[str, jax.Array]:
    """``max_logit`` (``causal_max_logit``), ``q_norm``, ``k_norm`` of one layer, each ``[N]``:
    ``sqrt(mean_{b,t} ||q_{bth}||^2)``, the RMS over tokens of the L2 norm of head h's query
    (key) vectors; a GQA key head is reported for each query head that reads it."""
    N, K = q.shape[2], k.shape[2]
    rms = lambda x: jnp.sqrt(jnp.mean(jnp.sum(x.astype(jnp.float32) ** 2, -1), axis=(0, 1)))
    return {"max_logit": causal_max_logit(q, k, scale), "q_norm": rms(q),
            "k_norm": jnp.repeat(rms(k), N // K)}


def cosine(a, b) -> float:
    """``<a, b> / (||a|| ||b||)`` of the flattened arrays in float64; 1 if both are zero, NaN
    if exactly one is."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"b has {b.size} elements, a has {a.size}; they must match")
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else float("nan")
    return float(np.clip(a @ b / (na * nb), -1.0, 1.0))


def mean_pairwise_cosine(x) -> jax.Array:
    """``x`` ``[..., B, T, D]`` -> ``[...]``: ``mean_b 1/(T (T - 1)) sum_{i != j} cos(x_bi,
    x_bj)``, with ``cosine``'s conventions for zero vectors (1 for two, NaN for one); NaN when
    ``T < 2``."""
    x = jnp.asarray(x, jnp.float32)
    if x.ndim < 3:
        raise ValueError(f"x must be [..., B, T, D], got shape {x.shape}")
    T = x.shape[-2]
    if T < 2:
        return jnp.full(x.shape[:-3], jnp.nan)
    norm = jnp.linalg.norm(x, axis=-1)                                          # [..., B, T]
    zero = norm == 0
    unit = x / jnp.where(zero, 1.0, norm)[..., None]
    gram = jnp.clip(jnp.einsum("...id,...jd->...ij", unit, unit), -1.0, 1.0)
    both, one = zero[..., :, None] & zero[..., None, :], zero[..., :, None] ^ zero[..., None, :]
    gram = jnp.where(both, 1.0, jnp.where(one, jnp.nan, gram))
    off = ~jnp.eye(T, dtype=bool)
    return (jnp.where(off, gram, 0.0).sum((-2, -1)) / (T * (T - 1))).mean(-1)


def js_divergence(p, q, axis: int = -1) -> np.ndarray:
    """Jensen-Shannon divergence (nats) of distributions along ``axis``: in ``[0, ln 2]``.

    ``JS = KL(P||M)/2 + KL(Q||M)/2``, ``M = (P + Q)/2``, ``0 log 0 = 0``, in float64. Inputs
    are not renormalised; a row that is all zeros in both (a query that sees no key) gives 0."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    if p.shape != q.shape:
        raise ValueError(f"q has shape {q.shape}, p has shape {p.shape}; they must match")
    for name, x in (("p", p), ("q", q)):
        if np.any(x < 0) or not np.all(np.isfinite(x)):
            raise ValueError(f"{name} must be finite and non-negative (a distribution)")
    m = 0.5 * (p + q)

    def kl_to_m(x):     # sum x log(x / m) over x > 0 (there m >= x / 2 > 0)
        safe = np.where(x > 0, x, 1.0)
        return np.sum(np.where(x > 0, x * (np.log(safe) - np.log(np.where(x > 0, m, 1.0))), 0.0),
                      axis=axis)

    return np.clip(0.5 * kl_to_m(p) + 0.5 * kl_to_m(q), 0.0, np.log(2.0))


def head_divergence(w, start: int = 1) -> np.ndarray:
    """``[layers, heads, heads]``: entry ``(l, h, g)`` is ``JS(p_{lbhi}, p_{lbgi})`` (nats)
    averaged over the query rows ``i >= start`` and the examples b of weights ``w`` ``[layers,
    B, heads, T, T]``; symmetric, 0 on the diagonal, at most ln 2."""
    w = np.asarray(w, np.float64)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [layers, B, heads, T, T], got shape {w.shape}")
    if not 0 <= start < w.shape[-1]:
        raise ValueError(f"start must be in [0, T) = [0, {w.shape[-1]}), got {start}")
    rows = w[..., start:, :]
    N = w.shape[2]
    out = np.zeros((w.shape[0], N, N))
    for h in range(N):
        for g in range(h + 1, N):
            out[:, h, g] = out[:, g, h] = js_divergence(rows[:, :, h], rows[:, :, g]).mean((1, 2))
    return out


def average_ranks(x) -> np.ndarray:
    """Ranks 1..n of a 1-D array, ties given the mean of the ranks they span."""
    x = np.asarray(x, np.float64)
    if x.ndim != 1:
        raise ValueError(f"x must be 1-D, got shape {x.shape}")
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]                 # ties: sorted positions [start, end)
    ranks = np.empty(x.size)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def spearman(a, b) -> float:
    """Spearman's rho of two 1-D arrays: the Pearson correlation of their ``average_ranks``;
    NaN when either is constant or they hold fewer than 2 values."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if a.size != b.size:
        raise ValueError(f"b has {b.size} elements, a has {a.size}; they must match")
    if a.size < 2:
        return float("nan")
    ra, rb = average_ranks(a) - (a.size + 1) / 2, average_ranks(b) - (a.size + 1) / 2
    denominator = np.sqrt((ra @ ra) * (rb @ rb))
    return float(np.clip(ra @ rb / denominator, -1.0, 1.0)) if denominator > 0 else float("nan")


def _check_weights(w) -> jax.Array:
    w = jnp.asarray(w, jnp.float32)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [layers, B, heads, T, T], got shape {w.shape}")
    return w


def _mean_rows(x: jax.Array) -> jax.Array:
    """``[layers, B, heads, T]`` -> ``[layers, heads]``: mean over examples and rows."""
    return x.mean(axis=(1, 3))


def entropy(w) -> jax.Array:
    """Mean row entropy ``-sum_j p_ij log p_ij`` in nats, ``[layers, heads]``."""
    return _mean_rows(row_entropy(_check_weights(w)))


def normalized_entropy(w) -> jax.Array:
    """Mean over rows i >= 1 of ``H_i / log(i + 1)`` (1 = uniform over the allowed keys);
    NaN when T = 1."""
    w = _check_weights(w)
    T = w.shape[-1]
    if T < 2:
        return jnp.full((w.shape[0], w.shape[2]), jnp.nan)
    h = row_entropy(w)[..., 1:] / jnp.log(jnp.arange(2, T + 1, dtype=jnp.float32))
    return _mean_rows(h)


def max_weight(w) -> jax.Array:
    """Mean over rows of ``max_j p_ij``, ``[layers, heads]``."""
    return _mean_rows(_check_weights(w).max(-1))


def sink_mass(w) -> jax.Array:
    """Mean over rows of ``p_i0``, the weight on the first token, ``[layers, heads]``."""
    return _mean_rows(_check_weights(w)[..., 0])


def activation_ratio(w, threshold: float = 0.1) -> jax.Array:
    """Fraction of causally allowed weights (``j <= i``) above ``threshold``,
    ``[layers, heads]``."""
    w = _check_weights(w)
    T = w.shape[-1]
    allowed = jnp.tril(jnp.ones((T, T), bool))
    above = ((w > threshold) & allowed).sum(axis=(-2, -1))
    return above.mean(axis=1) / allowed.sum()


def previous_token(w) -> jax.Array:
    """Mean over rows i >= 1 of ``p_{i,i-1}``, ``[layers, heads]``; NaN when T = 1."""
    w = _check_weights(w)
    if w.shape[-1] < 2:
        return jnp.full((w.shape[0], w.shape[2]), jnp.nan)
    return _mean_rows(jnp.diagonal(w, offset=-1, axis1=-2, axis2=-1))


def induction_score(w, tokens) -> jax.Array:
    """Mean weight on the keys after earlier occurrences of the query's token (see the module
    docstring), ``[layers, heads]``; ``tokens`` ``[B, T]``."""
    w = _check_weights(w)
    tokens = jnp.asarray(tokens)
    if tokens.shape != (w.shape[1], w.shape[-1]):
        raise ValueError(f"tokens must be [B, T] = {[w.shape[1], w.shape[-1]]}, "
                         f"got {list(tokens.shape)}")
    T = tokens.shape[1]
    i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    before = jnp.concatenate([jnp.full_like(tokens[:, :1], -1), tokens[:, :-1]], 1)  # x_{j-1}
    target = (before[:, None, :] == tokens[:, :, None]) & (j >= 1) & (j < i)     # [B, T, T]
    mass = (w * target[None, :, None]).sum(-1)                                  # [L, B, N, T]
    rows = target.any(-1)[None, :, None]                                        # [1, B, 1, T]
    return (mass * rows).sum(axis=(1, 3)) / rows.sum(axis=(1, 3))


def weight_statistics(w) -> dict[str, jax.Array]:
    """The statistics of ``w`` alone, keyed by the names in ``WEIGHT_STATS``."""
    return {"entropy": entropy(w), "norm_entropy": normalized_entropy(w),
            "max_weight": max_weight(w), "sink_mass": sink_mass(w),
            "active_frac": activation_ratio(w), "prev_token": previous_token(w)}
