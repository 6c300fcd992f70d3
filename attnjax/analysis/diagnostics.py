"""Per-head attention diagnostics: one number per (layer, head).

The weight statistics are pure ``jax.numpy`` functions of causal attention probabilities
``w`` ``[layers, B, heads, T, T]`` (row i is query i's distribution over keys 0..i) and return
``[layers, heads]``. Each is a mean over the ``B`` examples and all ``T`` query rows (row 0
sees only key 0, so it always has entropy 0, max weight 1 and sink mass 1):

- ``entropy``: ``-sum_j p_ij log p_ij`` (0 log 0 = 0), in nats.
- ``norm_entropy``: row i's entropy divided by ``log(i + 1)``, the entropy of the uniform
  distribution over its ``i + 1`` causally allowed keys; 1 = uniform, 0 = one key. Row 0
  (``log 1 = 0``) is left out of this mean.
- ``max_weight``: ``max_j p_ij``.
- ``sink_mass``: ``p_i0``, the weight on the first token (an attention sink).
- ``active_frac``: the fraction of causally allowed weights (``j <= i``) above 0.1; a sliding
  window's zeroed keys count as allowed and inactive.
- ``prev_token``: ``p_{i,i-1}``, the weight on the previous token (rows i >= 1).

And with the tokens ``x``: ``induction``, the weight ``sum_{j in S_i} p_ij`` on the keys that
follow an earlier occurrence of the current token, ``S_i = {j : 1 <= j < i, x_{j-1} = x_i}``
(what an induction head attends to), averaged over the rows whose ``S_i`` is not empty (NaN
when no row has one).

From the queries and keys the model sows under ``return_weights`` (after qk-norm and RoPE):

- ``max_logit``: the largest ``scale * q_i . k_j`` over causal pairs, before score bias and
  soft-capping (per head; the training loop logs the maximum over heads);
- ``q_norm`` / ``k_norm``: ``sqrt(mean_{b,t} ||q_{bth}||^2)``, the RMS over tokens of the L2
  norm of head h's query (key) vectors; a GQA key head is reported for each query head that
  reads it. ``|q . k| <= ||q|| ||k||`` bounds the logit.

And from the parameters, ``pos_sim@p``: how alike the position encoding makes positions 0 and
p, per kind: learned / sinusoidal: cosine similarity of the embedding vectors ``e_0`` and
``e_p``; rope: ``tr(R_p) / head_dim``, the cosine between a vector rotated to position 0 and
the same vector rotated to p, averaged over directions (``(2 sum_j cos(p theta_j) + H - d) / H``
with d the rotary width; same for every head); alibi / t5: ``exp(b_h(-p) - b_h(0))``, the factor
by which the position bias alone scales the weight of a key p tokens back relative to the
query's own position (per head; the t5 table is per layer). ``none`` and encodings unknown
here give NaN, and so does any ``p >= model.max_length`` (the model never saw that position).

References: Michel et al. 2019 (per-head analysis); Olsson et al. 2022, "In-context Learning
and Induction Heads" (previous-token and induction heads); Xiao et al. 2023, "Efficient
Streaming Language Models with Attention Sinks" (sink mass); Wortsman et al. 2023
(attention-logit growth); Su et al. 2021 (RoPE); Press et al. 2022 (ALiBi); Raffel et al. 2020
(T5 bias).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config import Config
from attnjax.nn import DecoderLM
from attnjax.nn.attention import base_scale
from attnjax.ops import positions as P
from attnjax.ops.attention import scaled_logits

WEIGHT_STATS = ("entropy", "norm_entropy", "max_weight", "sink_mass", "active_frac",
                "prev_token")
QK_STATS = ("max_logit", "q_norm", "k_norm")
STATS = WEIGHT_STATS + ("induction",) + QK_STATS
POSITION_OFFSETS = (10, 100)


def _check_weights(w) -> jax.Array:
    w = jnp.asarray(w, jnp.float32)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be [layers, B, heads, T, T], got shape {w.shape}")
    return w


def _row_entropy(w: jax.Array) -> jax.Array:
    return -(w * jnp.log(jnp.where(w > 0, w, 1.0))).sum(-1)


def _mean_rows(x: jax.Array) -> jax.Array:
    """``[layers, B, heads, T]`` -> ``[layers, heads]``: mean over examples and rows."""
    return x.mean(axis=(1, 3))


def entropy(w) -> jax.Array:
    """Mean row entropy ``-sum_j p_ij log p_ij`` in nats, ``[layers, heads]``."""
    return _mean_rows(_row_entropy(_check_weights(w)))


def normalized_entropy(w) -> jax.Array:
    """Mean over rows i >= 1 of ``H_i / log(i + 1)`` (1 = uniform over the allowed keys);
    NaN when T = 1."""
    w = _check_weights(w)
    T = w.shape[-1]
    if T < 2:
        return jnp.full((w.shape[0], w.shape[2]), jnp.nan)
    h = _row_entropy(w)[..., 1:] / jnp.log(jnp.arange(2, T + 1, dtype=jnp.float32))
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


def head_scales(config: Config, params) -> list[jax.Array]:
    """The logit scale of each layer's heads, ``[heads]`` per layer (learned or fixed)."""
    att, H = config.model.attention, config.model.head_dim
    if att.scale == "learned":
        return [jnp.exp(params[f"block_{i}"]["attention"]["log_scale"])
                for i in range(config.model.num_layers)]
    fixed = jnp.full((att.num_heads,), base_scale(att.scale, H, att.scale_multiplier))
    return [fixed] * config.model.num_layers


def qk_statistics(q: jax.Array, k: jax.Array, scale: jax.Array) -> dict[str, jax.Array]:
    """``max_logit``, ``q_norm``, ``k_norm`` of one layer, each ``[N]``, from ``q``
    ``[B, T, N, H]``, ``k`` ``[B, T, K, H]`` and ``scale`` ``[N]``."""
    B, T, N, H = q.shape
    K = k.shape[2]
    logits = scaled_logits(q.reshape(B, T, K, N // K, H), k, scale.reshape(K, N // K), None)
    causal = jnp.tril(jnp.ones((T, T), bool))
    max_logit = jnp.where(causal, logits, -jnp.inf).max(axis=(0, 3, 4)).reshape(N)
    rms = lambda x: jnp.sqrt(jnp.mean(jnp.sum(x.astype(jnp.float32) ** 2, -1), axis=(0, 1)))
    return {"max_logit": max_logit, "q_norm": rms(q), "k_norm": jnp.repeat(rms(k), N // K)}


def capture(config: Config, params, tokens) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Jittable: ``(weights [layers, B, heads, T, T], qk statistics [layers, heads])`` from one
    forward pass with ``return_weights`` (see ``qk_statistics``)."""
    model = DecoderLM(config.model)
    (_, aux), state = model.apply({"params": params}, tokens, return_weights=True,
                                  mutable=["intermediates"])
    weights = jnp.stack([w.astype(jnp.float32) for w in aux["attn_weights"]])
    per_layer = []
    for i, scale in enumerate(head_scales(config, params)):
        sown = state["intermediates"][f"block_{i}"]["attention"]
        per_layer.append(qk_statistics(sown["queries"][0], sown["keys"][0], scale))
    return weights, {name: jnp.stack([s[name] for s in per_layer]) for name in QK_STATS}


def head_stat_arrays(config: Config, params, tokens) -> dict[str, jax.Array]:
    """Jittable: the weight, induction and qk statistics, name -> ``[layers, heads]``."""
    weights, qk = capture(config, params, tokens)
    return {**weight_statistics(weights), "induction": induction_score(weights, tokens), **qk}


@functools.lru_cache(maxsize=8)
def _compiled_stats(config: Config):
    return jax.jit(functools.partial(head_stat_arrays, config))


def _cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def position_similarity(config: Config, params, offset: int) -> np.ndarray:
    """``pos_sim@offset`` ``[layers, heads]`` as defined in the module docstring."""
    model, (L, N) = config.model, (config.model.num_layers, config.model.attention.num_heads)
    kind, pos = model.position.kind, model.position
    out = np.full((L, N), np.nan)
    if offset >= model.max_length:
        return out
    if kind == "learned":
        table = np.asarray(params["position_embedding"])
        out[:] = _cosine(table[0], table[offset])
    elif kind == "sinusoidal":
        e = np.asarray(P.sinusoidal_embedding(jnp.asarray([0, offset]), model.d_model))
        out[:] = _cosine(e[0], e[1])
    elif kind == "rope":
        H = model.head_dim
        basis = jnp.broadcast_to(jnp.eye(H, dtype=jnp.float32), (1, 2, H, H))  # heads = e_i
        rotated = np.asarray(P.apply_rope(
            basis, jnp.asarray([0, offset]), base=pos.rope_base,
            rotary_fraction=pos.rope_fraction, schedule=pos.rope_scaling, scale=pos.rope_scale,
            train_length=pos.train_length or model.max_length), np.float64)[0]
        # rows are R_0 e_i and R_p e_i (times one attention factor): sum_i cos = tr(R_p)
        out[:] = np.sum(rotated[0] * rotated[1]) / np.sum(rotated[0] * rotated[0])
    elif kind == "alibi":
        out[:] = np.exp(-P.alibi_slopes(N) * offset)[None, :]
    elif kind == "t5":
        buckets = np.asarray(P.t5_relative_position_bucket(
            jnp.asarray([-offset, 0]), bidirectional=False, num_buckets=pos.t5_num_buckets,
            max_distance=pos.t5_max_distance))
        for i in range(L):
            table = np.asarray(params[f"block_{i}"]["attention"]["relative_bias"], np.float64)
            out[i] = np.exp(table[buckets[0]] - table[buckets[1]])
    return out


def head_statistics(config: Config, params, tokens) -> dict[str, np.ndarray]:
    """Every statistic of the module docstring on ``tokens`` ``[B, T]``: name -> ``[layers,
    heads]`` float64 (``STATS``, then ``pos_sim@10``, ``pos_sim@100``)."""
    arrays = _compiled_stats(config)(params, jnp.asarray(tokens))
    stats = {name: np.asarray(arrays[name], np.float64) for name in STATS}
    for offset in POSITION_OFFSETS:
        stats[f"pos_sim@{offset}"] = position_similarity(config, params, offset)
    return stats


def format_head_table(stats: dict[str, np.ndarray]) -> str:
    """A Markdown table, one row per ``L{layer}.H{head}``, one column per statistic."""
    if not stats:
        raise ValueError("stats must hold at least one statistic")
    names = list(stats)
    L, N = np.shape(stats[names[0]])
    lines = ["| head | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for layer in range(L):
        for head in range(N):
            cells = [f"{float(stats[n][layer, head]):.4g}" for n in names]
            lines.append(f"| L{layer}.H{head} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def make_head_metrics(config: Config) -> Callable:
    """``fn(params, tokens [B, T]) -> {"head_<stat>/L{l}H{h}": scalar}``, jittable: the
    ``STATS`` of every head as 0-d float32 arrays (no ``pos_sim``, which depends on the
    parameters only), for the training loop to log every ``log_every`` steps behind
    ``train.head_metrics``. Traced inside the caller's jit (the config may hold traced
    hyperparameters, so nothing here is cached by config)."""

    def head_metrics(params, tokens):
        stats = head_stat_arrays(config, params, tokens)
        L, N = config.model.num_layers, config.model.attention.num_heads
        return {f"head_{name}/L{l}H{h}": value[l, h] for name, value in stats.items()
                for l in range(L) for h in range(N)}

    return head_metrics
