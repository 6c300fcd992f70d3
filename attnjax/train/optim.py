"""Optimizer: AdamW with linear warmup then cosine decay, global-norm clipping, and weight decay
on matrices only (norm scales, biases and per-head scalars are not decayed).

References: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from attnjax.config import TrainConfig


def learning_rate_schedule(cfg: TrainConfig):
    """``lr * (step + 1) / warmup`` for ``step < warmup``, then a cosine from ``lr`` down to
    ``lr * final_lr_fraction`` at ``steps`` (so the first update is never zero)."""
    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = (step + 1) / jnp.maximum(cfg.warmup_steps, 1)
        progress = jnp.clip((step - cfg.warmup_steps)
                            / jnp.maximum(cfg.steps - cfg.warmup_steps, 1), 0, 1)
        cosine = cfg.final_lr_fraction + (1 - cfg.final_lr_fraction) * 0.5 * (
            1 + jnp.cos(jnp.pi * progress))
        return cfg.learning_rate * jnp.where(step < cfg.warmup_steps, warm, cosine)
    return schedule


def decay_mask(params):
    """True for parameters with two or more dimensions (weight matrices, embeddings)."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    parts = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
    parts.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2,
                             weight_decay=cfg.weight_decay, mask=decay_mask))
    return optax.chain(*parts)
