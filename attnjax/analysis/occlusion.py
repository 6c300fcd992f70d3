"""Occlusion attribution beside the attention weights: does a head-mean attention row rank the
keys the way their removal hurts the prediction?

- importance: for example b, query position i and key position j,
  ``I[b, i, j] = mean_{d < D} l_i(x with x_j <- r_{d, b, j}) - l_i(x)``, the mean rise of the
  cross-entropy ``l_i`` (nats) of target ``y_i`` at position i when token j is replaced by a
  random other token ``r_{d, b, j} = (x_j + 1 + u) mod V``, ``u ~ U{0 .. V - 2}`` drawn from
  ``fold_in(key(seed), d)`` (``replacement_tokens``): deterministic in the seed, and never the
  token it replaces. A causal model's ``l_i`` reads only ``x_0 .. x_i``, so ``I[b, i, j] = 0``
  for ``j > i``. All ``T x D`` occluded copies of the batch run through one jitted program: a
  ``lax.map`` over chunks of about ``MEMORY`` bytes of logits and activations, each one
  forward pass over the batch and its occluded copies stacked along the batch axis, which
  yields every query's row at once.
- embedding drift (an encoder that outputs hidden states): ``E[b, j] = 1 - cos(e(x), e(x with
  x_j <- [MASK]))``, ``e`` the mean-pooled last hidden states, a sentence embedding
  (``embedding_occlusion``).
- agreement: ``rho[b, i] = spearman(I[b, i, :i+1], a[b, i, :i+1])``, Spearman's rank
  correlation over the keys ``j <= i`` between the importance and the last layer's attention
  weights averaged over heads ``a = mean_h p_{L-1, b, h}`` (NaN for rows with one key or a
  constant side). HD5 reads its median over the scored queries.

References: Zeiler & Fergus 2014, "Visualizing and Understanding Convolutional Networks"
(occlusion); Jain & Wallace 2019, "Attention is not Explanation"; Wiegreffe & Pinter 2019,
"Attention is not not Explanation".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import attention_weights
from attnjax.analysis.figures import subplots
from attnjax.config import Config
from attnjax.models import build, family, mean_pool
from attnjax.ops.stats import spearman

MEMORY = 2 ** 28        # bytes of one vmapped chunk of occluded forward passes (about)


def replacement_tokens(inputs, vocab_size: int, seed, draw) -> jax.Array:
    """``r_d`` ``[B, T]``: for every position a token other than ``inputs``' own, uniform over
    the other ``vocab_size - 1``, from ``fold_in(key(seed), draw)``."""
    inputs = jnp.asarray(inputs)
    u = jax.random.randint(jax.random.fold_in(jax.random.key(seed), draw), inputs.shape, 0,
                           vocab_size - 1)
    return ((inputs + 1 + u) % vocab_size).astype(inputs.dtype)


def token_losses(model, params, inputs, targets) -> jax.Array:
    """``l_i`` ``[B, T]``: the cross-entropy of each target (nats) under ``model`` (a model
    family's module)."""
    logits, _ = model.apply({"params": params}, inputs)
    target = jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return jax.nn.logsumexp(logits, -1) - target


def _chunk(config: Config, batch: int, length: int, copies: int) -> int:
    m = config.model
    per_copy = 4 * batch * length * (m.vocab_size + 8 * m.d_model * m.num_layers)
    return max(1, min(copies, MEMORY // per_copy))


@functools.lru_cache(maxsize=8)
def _compiled_importance(model_config, draws: int, chunk: int):
    model, V = build(model_config), model_config.vocab_size

    def importance(params, inputs, targets, seed):
        B, T = inputs.shape
        copies = T * draws
        steps = -(-copies // chunk)
        j, d = (a.ravel() for a in jnp.meshgrid(jnp.arange(T), jnp.arange(draws),
                                                indexing="ij"))
        pad = steps * chunk - copies                  # j = -1: a copy left as it is
        j = jnp.concatenate([j, jnp.full((pad,), -1, j.dtype)]).reshape(steps, chunk)
        d = jnp.concatenate([d, jnp.zeros((pad,), d.dtype)]).reshape(steps, chunk)

        replacements = jnp.stack([replacement_tokens(inputs, V, seed, k)
                                  for k in range(draws)])                    # [D, B, T]

        def rise(index):
            # the batch itself and `chunk` occluded copies in one forward pass, so that the
            # difference compares rows of one computation (exactly 0 where nothing changed)
            occluded = jax.vmap(lambda j, d: jnp.where(jnp.arange(T) == j, replacements[d],
                                                       inputs))(*index)
            x = jnp.concatenate([inputs[None], occluded]).reshape(-1, T)
            y = jnp.broadcast_to(targets, (chunk + 1, B, T)).reshape(-1, T)
            losses = token_losses(model, params, x, y).reshape(chunk + 1, B, T)
            return losses[1:] - losses[0]                                      # [chunk, B, T]

        out = jax.lax.map(rise, (j, d)).reshape(steps * chunk, B, T)[:copies]
        return out.reshape(T, draws, B, T).mean(1).transpose(1, 2, 0)          # [B, i, j]

    return jax.jit(importance)


def occlusion_importance(config: Config, params, inputs, targets, *, draws: int = 8,
                         seed: int = 0) -> np.ndarray:
    """``I`` ``[B, T(query i), T(key j)]`` float32, as defined in the module docstring."""
    inputs, targets = jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32)
    if inputs.ndim != 2 or inputs.shape != targets.shape:
        raise ValueError(f"inputs and targets must be [B, T] of one shape, got "
                         f"{inputs.shape} and {targets.shape}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    B, T = inputs.shape
    chunk = _chunk(config, B, T, T * draws)
    return np.asarray(_compiled_importance(config.model, draws, chunk)(params, inputs, targets,
                                                                       seed))


@functools.lru_cache(maxsize=8)
def _compiled_drift(model_config):
    model = build(model_config)

    def drift(params, inputs, replacement):
        B, T = inputs.shape
        occluded = jnp.where(jnp.eye(T, dtype=bool)[:, None, :], replacement, inputs[None])
        x = jnp.concatenate([inputs[None], occluded]).reshape(-1, T)         # [(T+1) B, T]
        pooled = mean_pool(model.apply({"params": params}, x)[0]).reshape(T + 1, B, -1)
        cos = (pooled[1:] * pooled[0]).sum(-1) / (jnp.linalg.norm(pooled[1:], axis=-1)
                                                  * jnp.linalg.norm(pooled[0], axis=-1))
        return (1.0 - cos).T                                                   # [B, j]

    return jax.jit(drift)


def embedding_occlusion(config: Config, params, inputs, replacement: int) -> np.ndarray:
    """``[B, T]``: for a model that outputs hidden states, the drift ``1 - cos`` of each
    example's sentence embedding (its mean-pooled last hidden states) when its token j alone
    is replaced by ``replacement`` (BERT's ``[MASK]``); all ``T`` occluded copies and the
    batch in one forward pass."""
    if family(config.model).objective(config.model) != "embedding":
        raise ValueError("embedding occlusion needs a model that outputs hidden states "
                         f"(model.classifier='hidden'), got model.family="
                         f"{config.model.family!r}, classifier={config.model.classifier!r}")
    inputs = jnp.asarray(inputs, jnp.int32)
    return np.asarray(_compiled_drift(config.model)(params, inputs, replacement))


def head_mean_weights(config: Config, params, inputs) -> np.ndarray:
    """``a`` ``[B, T, T]``: the last layer's attention weights averaged over its heads."""
    return attention_weights(config, params, inputs)[-1].mean(1)


def rank_agreement(importance, weights) -> np.ndarray:
    """``rho`` ``[B, T]``: per query row i, Spearman's rho over the keys ``j <= i`` of
    ``importance`` and ``weights`` (both ``[B, T, T]``); NaN for row 0."""
    importance, weights = np.asarray(importance), np.asarray(weights)
    if importance.shape != weights.shape or importance.ndim != 3:
        raise ValueError(f"importance {importance.shape} and weights {weights.shape} must be "
                         "[B, T, T] of one shape")
    B, T = importance.shape[:2]
    return np.asarray([[spearman(importance[b, i, :i + 1], weights[b, i, :i + 1])
                        for i in range(T)] for b in range(B)])


def occlusion_agreement(config: Config, params, batch: dict, *, draws: int = 8,
                        seed: int = 0) -> dict:
    """``{"importance" [B, T, T], "weights" [B, T, T] (head mean, last layer), "rho" [B, T],
    "queries" (a [B, T] mask: scored rows i >= 1 with a finite rho), "median"}`` on a batch
    (``inputs``, ``targets``, ``weights``)."""
    importance = occlusion_importance(config, params, batch["inputs"], batch["targets"],
                                      draws=draws, seed=seed)
    weights = head_mean_weights(config, params, batch["inputs"])
    rho = rank_agreement(importance, weights)
    queries = (np.asarray(batch["weights"]) > 0) & np.isfinite(rho)
    return {"importance": importance, "weights": weights, "rho": rho, "queries": queries,
            "median": float(np.median(rho[queries])) if queries.any() else float("nan")}


def plot_occlusion(result: dict, example: int, queries, labels: list[str], path, title: str,
                   max_keys: int = 40):
    """For each query i of ``queries`` (positions of ``example``), a row of two bar charts
    over the keys ``j <= i`` (the last ``max_keys`` of them): the head-mean last-layer weights
    and the occlusion importance, titled with the row's Spearman rho."""
    queries = list(queries)
    if not queries:
        raise ValueError("queries must not be empty")
    fig, axes = subplots(len(queries), 2, figsize=(12.0, 2.3 * len(queries) + 0.8),
                         squeeze=False, layout="constrained")
    for row, i in enumerate(queries):
        lo = max(0, i + 1 - max_keys)
        keys = np.arange(lo, i + 1)
        shown = f"keys {lo}..{i}" if lo else f"keys 0..{i}"
        panels = ((result["weights"][example, i, lo:i + 1], "attention weight (head mean)",
                   "tab:blue"),
                  (result["importance"][example, i, lo:i + 1], "loss rise when occluded (nats)",
                   "tab:orange"))
        for col, (values, ylabel, colour) in enumerate(panels):
            ax = axes[row, col]
            ax.bar(keys, values, color=colour, width=0.8)
            ax.axhline(0.0, color="0.5", linewidth=0.6)
            ax.set_xticks(keys, [labels[j] for j in keys], fontsize=7 if len(keys) > 24 else 8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_xlim(lo - 0.6, i + 0.6)
        axes[row, 0].set_title(f"query {i} ('{labels[i]}'), {shown}", fontsize=9, loc="left")
        axes[row, 1].set_title(f"Spearman rho = {result['rho'][example, i]:.2f}", fontsize=9,
                               loc="left")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)


def draw_embedding_occlusion(axes, labels: list[str], attention, drift) -> None:
    """On two axes, bars over the tokens: the attention a query pays them, and the sentence
    embedding's drift when each is masked (``embedding_occlusion``)."""
    keys = np.arange(len(labels))
    panels = ((attention, "[CLS] attention (last layer, head mean)", "tab:blue"),
              (drift, "embedding change 1 - cos when masked", "tab:orange"))
    for ax, (values, ylabel, colour) in zip(axes, panels):
        ax.bar(keys, values, color=colour, width=0.8)
        ax.set_xticks(keys, labels, rotation=60, fontsize=7 if len(keys) > 24 else 8)
        ax.set_ylabel(ylabel, fontsize=8)


def plot_embedding_occlusion(labels: list[str], attention, drift, path, title: str):
    """``draw_embedding_occlusion`` as a figure of two panels, titled with Spearman's rho."""
    fig, axes = subplots(1, 2, figsize=(12.0, 3.6), layout="constrained")
    draw_embedding_occlusion(axes, labels, attention, drift)
    fig.suptitle(f"{title}; Spearman rho = {spearman(attention, drift):.2f}", fontsize=10)
    fig.savefig(path, dpi=100)
