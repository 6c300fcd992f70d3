"""Statistics of attention, as pure ``jax.numpy`` functions: each is defined once here and
used by the training objective (entropy regulariser), the training diagnostics (max logit,
per-head metrics) and the analysis tools.

Causality is a mask, not an assumption: every statistic of weights or logits takes the mask
they were computed under, ``visible`` (bool, broadcastable to the weights ``[..., B, heads, T,
S]`` or the logits; True where query i may see key j; ``ops.masks.visibility`` builds it from
causality, a window and a padded batch's token mask). Only visible entries are read (a weight
elsewhere counts as 0 and, in the regularisers, gets no gradient), and a query row counts iff
it sees at least one key: a padded query gets an all-False row and is left out of every mean,
a padded key an all-False column. ``visible=None`` is the causal mask ``j <= i + (S - T)`` for
weights computed under it: they are 0 on the hidden entries and every row sees a key, so they
are read as they are, in the statistics' unmasked arithmetic; passing the causal mask gives the
same numbers (bit for bit op by op; a jitted program may fuse the masked sums differently, by
a float32 ulp).

Weight statistics read probabilities ``w`` ``[layers, B, heads, T, T]`` and return
``[layers, heads]``: a mean over the ``B`` examples and their counted query rows (causal: all
``T``; row 0 sees only key 0, so it always has entropy 0, max weight 1 and sink mass 1).
``n_i`` is the number of keys row i sees (causal: ``i + 1``); ``0 log 0 = 0`` throughout.

- ``entropy``: ``-sum_j p_ij log p_ij`` over the visible keys, in nats.
- ``normalized_entropy``: row i's entropy divided by ``log n_i``, the entropy of the uniform
  distribution over its visible keys; 1 = uniform, 0 = one key. Rows with ``n_i = 1``
  (``log 1 = 0``; causal: row 0) are left out of this mean.
- ``max_weight``: ``max_j p_ij`` over the visible keys.
- ``sink_mass``: ``p_i0``, the weight on the first key (an attention sink; 0 where it is
  hidden).
- ``activation_ratio``: the share of the visible entries, over all examples and rows, whose
  weight is above 0.1; under the causal mask a sliding window's zeroed keys count as visible
  and inactive.
- ``previous_token``: ``p_{i,i-1}``, the weight on the previous key, over the rows that see it
  (causal: i >= 1).
- ``induction_score`` (with the tokens ``x``): the weight ``sum_{j in S_i} p_ij`` on the keys
  that follow an earlier occurrence of the current token, ``S_i = {j visible from i : 1 <= j <
  i, x_{j-1} = x_i}``, averaged over the rows whose ``S_i`` is not empty (NaN when no row has
  one).

From queries and keys (after qk-norm and RoPE): ``masked_max_logit``, the largest ``scale *
q_i . k_j`` over the visible pairs per head (before score bias and soft-capping;
``causal_max_logit`` under the causal mask), and the RMS over tokens of each head's query and
key norms (``qk_statistics``: the query rows that see a key, the keys some query sees).

Between vectors and distributions (float64 NumPy unless said otherwise):

- ``cosine``: ``<a, b> / (||a|| ||b||)`` of two flattened arrays.
- ``mean_pairwise_cosine`` (jax.numpy): for hidden states ``x`` ``[..., B, T, D]``, each
  sequence's mean over the ``T (T - 1)`` ordered position pairs ``i != j`` of
  ``cos(x_i, x_j)``, then the mean over the ``B`` sequences; near 1 when every position carries
  about the same vector (uniform attention outputs the running mean of the values).
- ``js_divergence``: Jensen-Shannon divergence ``JS(P, Q) = KL(P||M)/2 + KL(Q||M)/2``,
  ``M = (P + Q)/2``, natural log: ``0 <= JS <= ln 2``, 0 iff ``P = Q``, ln 2 iff disjoint.
- ``head_divergence``: for weights ``[layers, B, heads, T, T]``, the ``[layers, heads, heads]``
  matrix of ``JS(p_{h,i}, p_{g,i})`` between two heads' rows over their visible keys, averaged
  over the query rows ``i >= start`` that both heads count (causal: row 0 is one-hot on key 0
  for every head, hence ``start = 1``; pass 0 for a bidirectional mask) and the ``B``
  examples.
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
from attnjax.ops.masks import visibility

WEIGHT_STATS = ("entropy", "norm_entropy", "max_weight", "sink_mass", "active_frac",
                "prev_token")
QK_STATS = ("max_logit", "q_norm", "k_norm")


def visible_or_causal(visible, T: int, S: int) -> jax.Array:
    """``visible`` as a bool array, or the causal mask ``j <= i + (S - T)`` ``[1, 1, T, S]``
    when it is None."""
    if visible is None:
        return visibility(T, S, causal=True, offset=S - T)
    return jnp.asarray(visible, bool)


def masked_weights(w: jax.Array, visible) -> tuple[jax.Array, jax.Array | None]:
    """``(w with 0 on the hidden entries, the mask)``, no gradient reaching a hidden entry; or
    ``(w, None)`` when ``visible`` is None: causal weights are 0 there already and every row
    counts."""
    if visible is None:
        return w, None
    shown = jnp.asarray(visible, bool)
    return jnp.where(shown, w, 0.0), shown


def counted_rows(shown: jax.Array | None) -> jax.Array | None:
    """The query rows that see a key (None: every row)."""
    return None if shown is None else shown.any(-1)


def masked_mean(x: jax.Array, where=None, axis=None) -> jax.Array:
    """The mean of ``x`` over ``axis`` of the entries where ``where`` (broadcast to ``x``) holds,
    all when it is None; NaN where none is."""
    if where is None:
        return x.mean(axis)
    where = jnp.broadcast_to(where, x.shape)
    total = jnp.where(where, x, 0.0).sum(axis, dtype=jnp.promote_types(x.dtype, jnp.float32))
    # times the reciprocal count, as XLA evaluates ``mean`` (a division by a constant), so an
    # all-True ``where`` gives the mean's bits
    return (total * (1 / where.sum(axis))).astype(x.dtype)


def row_entropy(p: jax.Array) -> jax.Array:
    """``-sum_j p_j log p_j`` over the last axis, with ``0 log 0 = 0`` (nats)."""
    return -(p * jnp.log(jnp.where(p > 0, p, 1.0))).sum(-1)


def mean_entropy(weights, visible=None) -> jax.Array:
    """Mean over layers (each ``[B, heads, T, S]``), examples, heads and counted query rows of
    the row entropy over the visible keys: the attention-entropy regulariser's term."""
    def per_layer(w):
        w, shown = masked_weights(w, visible)
        return masked_mean(row_entropy(w), counted_rows(shown))
    return jnp.mean(jnp.stack([per_layer(w) for w in weights]))


def masked_max_logit(q: jax.Array, k: jax.Array, scale, visible=None) -> jax.Array:
    """``[N]``: the largest ``scale * q_i . k_j`` over the visible pairs (and examples) per
    head, -inf for a head that sees none, from ``q`` ``[B, T, N, H]``, ``k`` ``[B, S, K, H]``,
    ``scale`` scalar or ``[N]`` and ``visible`` broadcastable to the logits ``[B, N, T, S]``
    (None: causal, ``j <= i + (S - T)``)."""
    N = q.shape[2]
    scale = jnp.broadcast_to(jnp.asarray(scale, jnp.float32), (N,))
    logits = scaled_logits(q, expand_kv_heads(k, N), scale, None)               # [B,N,T,S]
    shown = visible_or_causal(visible, *logits.shape[-2:])
    return jnp.where(shown, logits, -jnp.inf).max(axis=(0, 2, 3))


def causal_max_logit(q: jax.Array, k: jax.Array, scale) -> jax.Array:
    """``masked_max_logit`` under the causal mask ``j <= i + (S - T)``."""
    return masked_max_logit(q, k, scale)


def qk_statistics(q: jax.Array, k: jax.Array, scale, visible=None) -> dict[str, jax.Array]:
    """``max_logit`` (``masked_max_logit``), ``q_norm``, ``k_norm`` of one layer, each ``[N]``:
    ``sqrt(mean_{b,t} ||q_{bth}||^2)``, the RMS over tokens of the L2 norm of head h's query
    (key) vectors, over the queries that see a key (the keys some query sees) in any head; a
    GQA key head is reported for each query head that reads it."""
    (B, T, N, _), (S, K) = q.shape, k.shape[1:3]
    queries = keys = None                                   # None: every token counts
    if visible is not None:
        shown = jnp.broadcast_to(jnp.asarray(visible, bool), (B, N, T, S))
        queries, keys = shown.any(axis=(1, 3))[..., None], shown.any(axis=(1, 2))[..., None]
    rms = lambda x, counted: jnp.sqrt(masked_mean(jnp.sum(x.astype(jnp.float32) ** 2, -1),
                                                  counted, axis=(0, 1)))
    return {"max_logit": masked_max_logit(q, k, scale, visible), "q_norm": rms(q, queries),
            "k_norm": jnp.repeat(rms(k, keys), N // K)}


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


def head_divergence(w, start: int = 1, visible=None) -> np.ndarray:
    """``[layers, heads, heads]``: entry ``(l, h, g)`` is ``JS(p_{lbhi}, p_{lbgi})`` (nats) of
    the rows over their visible keys, averaged over the query rows ``i >= start`` that see a key
    in both heads and the examples b of weights ``w`` ``[layers, B, heads, T, T]``; symmetric, 0
    on the diagonal, at most ln 2."""
    w = np.asarray(w, np.float64)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [layers, B, heads, T, T], got shape {w.shape}")
    if not 0 <= start < w.shape[-1]:
        raise ValueError(f"start must be in [0, T) = [0, {w.shape[-1]}), got {start}")
    counted = np.ones(w.shape[:-1], bool)                   # None: every row counts
    if visible is not None:
        shown = np.broadcast_to(np.asarray(visible, bool), w.shape)
        w, counted = np.where(shown, w, 0.0), shown.any(-1)
    rows, counted = w[..., start:, :], counted[..., start:]                     # [L, B, N, T']
    N = w.shape[2]
    out = np.zeros((w.shape[0], N, N))
    for h in range(N):
        for g in range(h + 1, N):
            both = counted[:, :, h] & counted[:, :, g]
            js = np.where(both, js_divergence(rows[:, :, h], rows[:, :, g]), 0.0)
            out[:, h, g] = out[:, g, h] = js.sum((1, 2)) / both.sum((1, 2))
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


def _as_5d(mask: jax.Array | None) -> jax.Array | None:
    """A mask broadcastable to ``[layers, B, heads, T, T]`` with all five axes."""
    return None if mask is None else mask[(None,) * (5 - mask.ndim)]


def _check_weights(w) -> jax.Array:
    w = jnp.asarray(w, jnp.float32)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [layers, B, heads, T, T], got shape {w.shape}")
    return w


def _weights(w, visible) -> tuple[jax.Array, jax.Array | None]:
    """``masked_weights`` of ``[layers, B, heads, T, T]`` weights in float32, the mask 5-D."""
    w, shown = masked_weights(_check_weights(w), visible)
    return w, _as_5d(shown)


def _mean_rows(x: jax.Array, rows: jax.Array | None) -> jax.Array:
    """``[layers, B, heads, T]`` -> ``[layers, heads]``: mean over examples and the rows where
    ``rows`` holds (None: every row)."""
    return masked_mean(x, rows, axis=(1, 3))


def entropy(w, visible=None) -> jax.Array:
    """Mean over counted rows of ``-sum_j p_ij log p_ij`` (visible j) in nats,
    ``[layers, heads]``."""
    w, shown = _weights(w, visible)
    return _mean_rows(row_entropy(w), counted_rows(shown))


def normalized_entropy(w, visible=None) -> jax.Array:
    """Mean over the rows with ``n_i >= 2`` visible keys of ``H_i / log n_i`` (1 = uniform over
    the visible keys), ``[layers, heads]``; NaN when there is none (causal: T = 1)."""
    w, shown = _weights(w, visible)
    if shown is None:       # causal: row i sees n_i = i + 1 keys, rows 1.. two or more
        T = w.shape[-1]
        return _mean_rows(row_entropy(w)[..., 1:]
                          / jnp.log(jnp.arange(2, T + 1, dtype=jnp.float32)), None)
    n = shown.sum(-1)
    counted = jnp.broadcast_to(n >= 2, w.shape[:-1])
    h = jnp.where(counted, row_entropy(w) / jnp.log(n), 0.0)   # 0 / 0 on rows with one key
    # rows 1.. summed apart from row 0: under the causal mask, where row 0 is not counted, the
    # sum is then the unmasked one above, bit for bit
    total = h[..., 1:].sum(axis=(1, 3)) + h[..., 0].sum(axis=1)
    return total * (1 / counted.sum(axis=(1, 3)))


def max_weight(w, visible=None) -> jax.Array:
    """Mean over counted rows of ``max_j p_ij`` (visible j), ``[layers, heads]``."""
    w, shown = _weights(w, visible)
    return _mean_rows(w.max(-1), counted_rows(shown))


def sink_mass(w, visible=None) -> jax.Array:
    """Mean over counted rows of ``p_i0``, the weight on the first key (0 where it is hidden),
    ``[layers, heads]``."""
    w, shown = _weights(w, visible)
    return _mean_rows(w[..., 0], counted_rows(shown))


def activation_ratio(w, threshold: float = 0.1, visible=None) -> jax.Array:
    """Share of the visible entries (all examples and rows) whose weight is above
    ``threshold``, ``[layers, heads]``: ``mean_b #above_b / mean_b #visible_b``."""
    w = _check_weights(w)
    shown = _as_5d(visible_or_causal(visible, *w.shape[-2:]))
    above = ((w > threshold) & shown).sum(axis=(-2, -1))                       # [L, B, N]
    return above.mean(axis=1) / shown.sum(axis=(-2, -1)).mean(axis=1)


def previous_token(w, visible=None) -> jax.Array:
    """Mean of ``p_{i,i-1}`` over the rows that see key i - 1 (None: rows i >= 1),
    ``[layers, heads]``; NaN when none does."""
    w, shown = _weights(w, visible)
    previous = lambda x: jnp.diagonal(x, offset=-1, axis1=-2, axis2=-1)
    return _mean_rows(previous(w),
                      None if shown is None else previous(jnp.broadcast_to(shown, w.shape)))


def induction_score(w, tokens, visible=None) -> jax.Array:
    """Mean weight on the visible keys after earlier occurrences of the query's token (see the
    module docstring), ``[layers, heads]``; ``tokens`` ``[B, T]``."""
    w = _check_weights(w)
    tokens = jnp.asarray(tokens)
    if tokens.shape != (w.shape[1], w.shape[-1]):
        raise ValueError(f"tokens must be [B, T] = {[w.shape[1], w.shape[-1]]}, "
                         f"got {list(tokens.shape)}")
    T = tokens.shape[1]
    i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    before = jnp.concatenate([jnp.full_like(tokens[:, :1], -1), tokens[:, :-1]], 1)  # x_{j-1}
    target = (before[:, None, :] == tokens[:, :, None]) & (j >= 1) & (j < i)     # [B, T, T]
    target = target[None, :, None] & _as_5d(visible_or_causal(visible, T, T))  # [L|1,B,N|1,T,T]
    mass = (w * target).sum(-1)                                                 # [L, B, N, T]
    rows = target.any(-1)
    return (mass * rows).sum(axis=(1, 3)) / rows.sum(axis=(1, 3))


def attention_to(w, keys, visible=None) -> jax.Array:
    """Mean over counted rows of ``sum_j p_ij`` over the keys ``j`` where ``keys`` (bool
    ``[B, S]``) holds: the attention mass on those keys (e.g. [CLS] and [SEP]), ``[layers,
    heads]``."""
    w, shown = _weights(w, visible)
    mass = (w * jnp.asarray(keys, bool)[None, :, None, None, :]).sum(-1)       # [L, B, N, T]
    return _mean_rows(mass, counted_rows(shown))


def argmax_hits(w, gold, counted) -> tuple[jax.Array, jax.Array]:
    """``(hits [layers, heads], count)``: the rows whose largest weight (``w`` ``[layers, B,
    heads, T, S]``) is on their gold key ``gold`` ``[B, T]`` (``-1``: none), among the rows
    ``counted`` ``[B, T]`` with a gold key, and how many such rows there are (e.g. the
    alignment of a cross-attention head with the source positions a target copies)."""
    has = counted & (gold >= 0)
    hit = (w.argmax(-1) == gold[None, :, None, :]) & has[None, :, None, :]
    return hit.sum((1, 3)).astype(jnp.float32), has.sum().astype(jnp.float32)


def weight_statistics(w, visible=None) -> dict[str, jax.Array]:
    """The statistics of ``w`` (under ``visible``) alone, keyed by the names in
    ``WEIGHT_STATS``."""
    return {"entropy": entropy(w, visible), "norm_entropy": normalized_entropy(w, visible),
            "max_weight": max_weight(w, visible), "sink_mass": sink_mass(w, visible),
            "active_frac": activation_ratio(w, visible=visible),
            "prev_token": previous_token(w, visible)}
