"""The pure training and evaluation steps.

Objective on a batch with score weights ``w`` (``W = sum w`` over the *global* batch)::

    loss = sum_t w_t [CE_t + z * log^2 Z_t] / W  +  sum_r c_r * R_r(attention)

``CE`` is the cross-entropy of the model family's objective (``attnjax.models``: its ``sums``;
the decoder's is the next token, ``w = 0`` on the pads of a padded batch, and the family's
``arguments`` hand the model a padded batch's positions and mask), ``Z`` the softmax
normaliser of the output logits (z-loss, PaLM), ``R_r`` the active attention regularisers
with coefficients ``c_r`` (``attnjax.train.regularizers``: entropy, weight std, sharpening
KL). Sums are formed per micro-batch and per device and divided by the global ``W``, so gradient
accumulation and data parallelism give the same update as one big batch. A step whose loss or
gradient is not finite leaves parameters and optimizer state unchanged and is counted.

References: Chowdhery et al. 2022, "PaLM" (z-loss).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from attnjax.config import Config
from attnjax.models import build, family
from attnjax.models.probe import head_stat_arrays, special_attention
from attnjax.nn.slots import visible_keys
from attnjax.nn.transformer import sown_by_layer
from attnjax.train.optim import learning_rate_schedule, make_optimizer
from attnjax.train.state import DROPOUT_STREAM, EVAL_DROPOUT_STREAM, TrainState, stream_key


def parameter_group(path) -> str:
    """The group of a parameter path: its first two names when it is nested three or more
    deep (``block_0/attention/qkv/kernel`` -> ``block_0/attention``), else its first
    (``embed/embedding`` -> ``embed``)."""
    names = [str(getattr(key, "key", key)) for key in path]
    return "/".join(names[:2] if len(names) >= 3 else names[:1])


def squared_norms_by_group(grads) -> dict[str, jax.Array]:
    """``{group: ||g_group||_2^2}`` per ``parameter_group``; they sum to the global norm's
    square, so the step computes each square once and derives both from them."""
    squares: dict[str, jax.Array] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        group = parameter_group(path)
        squares[group] = squares.get(group, 0.0) + jnp.sum(jnp.square(leaf.astype(jnp.float32)))
    return squares


def _split_micro(batch: dict, parts: int) -> dict:
    """``[parts, rows / parts, ...]``: micro-batch ``i`` holds rows ``i, i + parts, ...``, so a
    batch sharded over devices in contiguous blocks (the mesh's ``data`` axis) leaves every
    micro-batch spread over all of them. Contiguous micro-batches would each sit on one
    device: the compiler all-gathered the whole batch and every device computed every
    micro-batch, losing the data parallelism (2 devices, ``grad_accum=2``)."""
    return jax.tree_util.tree_map(
        lambda x: x.reshape(-1, parts, *x.shape[1:]).swapaxes(0, 1), batch)


def make_train_step(config: Config, axis_name: str | None = None) -> Callable:
    """``train_step(state, batch) -> (state, metrics)``; with ``axis_name`` it is the per-device
    body of a pmap whose sums are ``psum``-ed over that axis."""
    model, tx = build(config.model), make_optimizer(config.train)
    objective_of = family(config.model)
    cfg = config.train
    schedule = learning_rate_schedule(cfg)
    total = (lambda x: jax.lax.psum(x, axis_name)) if axis_name else (lambda x: x)
    regularizers = cfg.regularizers()
    coefficient = lambda name: getattr(cfg, regularizers[name].coefficient)

    def objective(params, micro, rng, weight_total, replicas):
        logits, aux = model.apply({"params": params}, micro["inputs"],
                                  **objective_of.arguments(micro), deterministic=False,
                                  return_weights=bool(regularizers), rngs={"dropout": rng})
        sums = objective_of.sums(logits, micro)
        loss = (sums["ce"] + cfg.z_loss * sums["z"]) / weight_total
        visible = visible_keys(config.model, micro["inputs"].shape[1], micro.get("token_mask"))
        terms = {name: reg.term(aux["attn_weights"], visible)
                 for name, reg in regularizers.items()}
        # each term's mean over micro-batches and devices: their gradients are summed
        for name, term in terms.items():
            loss = loss + coefficient(name) * term / (cfg.grad_accum * replicas)
        return loss, (sums, terms)

    def update(grads, params, opt_state):
        # taken only for a finite step (lax.cond), so a step never copies and selects between
        # an old and a new copy of every parameter and moment
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def train_step(state: TrainState, batch: dict):
        rng = jax.random.fold_in(stream_key(config.seed, DROPOUT_STREAM), state.step)
        if axis_name:
            rng = jax.random.fold_in(rng, jax.lax.axis_index(axis_name))
        weight_total = jnp.maximum(total(batch["weights"].sum()), 1.0)
        replicas = jax.lax.psum(1, axis_name) if axis_name else 1

        def accumulate(grads, xs):
            index, micro = xs
            (_, (sums, terms)), g = jax.value_and_grad(objective, has_aux=True)(
                state.params, micro, jax.random.fold_in(rng, index), weight_total, replicas)
            return jax.tree_util.tree_map(jnp.add, grads, g), (sums, terms)

        zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
        grads, (sums, terms) = jax.lax.scan(
            accumulate, zeros, (jnp.arange(cfg.grad_accum), _split_micro(batch, cfg.grad_accum)))
        grads = total(grads)
        sums = total(jax.tree_util.tree_map(jnp.sum, sums))
        terms = {name: term.mean() for name, term in terms.items()}
        if axis_name:
            terms = jax.lax.pmean(terms, axis_name)
        ce = sums["ce"] / weight_total
        loss = ce + cfg.z_loss * sums["z"] / weight_total
        for name, term in terms.items():
            loss = loss + coefficient(name) * term
        squares = squared_norms_by_group(grads)
        grad_norm = jnp.sqrt(sum(squares.values()))
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        params, opt_state = jax.lax.cond(finite, update, lambda _, params, opt_state: (
            params, opt_state), grads, state.params, state.opt_state)
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                               skipped=state.skipped + (~finite).astype(jnp.int32))
        metrics = {"loss": loss, "ce": ce, "accuracy": sums["correct"] / weight_total,
                   "grad_norm": grad_norm, "lr": schedule(state.step),
                   "skipped": new_state.skipped,
                   **{f"reg/{name}": term for name, term in terms.items()},
                   **{f"grad_norm/{group}": jnp.sqrt(s) for group, s in squares.items()}}
        return new_state, metrics

    return train_step


def make_eval_step(config: Config, train_mode: bool = False) -> Callable:
    """``eval_step(params, batch, index) -> sums`` (the family's ``sums`` and ``scores``):
    deterministic, or with ``train_mode`` with dropout on as in training (masks a function of
    the run's seed and ``index``, the forward pass's number in the evaluation, independent of
    the training masks)."""
    model, objective_of = build(config.model), family(config.model)

    def eval_step(params, batch, index):
        rng = jax.random.fold_in(stream_key(config.seed, EVAL_DROPOUT_STREAM), index)
        scores = objective_of.scores
        logits, aux = model.apply({"params": params}, batch["inputs"],
                                  **objective_of.arguments(batch), deterministic=not train_mode,
                                  return_weights=scores is not None,
                                  rngs={"dropout": rng} if train_mode else None)
        sums = objective_of.sums(logits, batch)
        return sums if scores is None else {**sums, **scores(logits, aux, batch)}

    return eval_step


def make_diagnostics(config: Config) -> Callable:
    """``diagnostics(params, batch) -> {"max_attn_logit", ...}``: the largest attention logit
    over the pairs that meet, over all layers and heads (sown by the attention modules); for
    data with special tokens (``Family.marked``), the attention on each marked one per layer
    as ``attn_<name>/L{l}`` (``models.probe.special_attention``); with
    ``train.head_metrics``, every head's statistics (``attnjax.models.probe``) as
    ``head_<stat>/L{l}H{h}``."""
    model, cfg = build(config.model), config.model
    arguments = family(cfg).arguments
    marked = family(cfg).marked(config.data)

    def diagnostics(params, batch):
        _, variables = model.apply({"params": params}, batch["inputs"], **arguments(batch),
                                   mutable=["intermediates"])
        sown = sown_by_layer(variables["intermediates"], cfg.num_layers)
        out = {"max_attn_logit": jnp.max(jnp.stack([s["max_logit"] for s in sown]))}
        if marked:
            mass = special_attention(cfg, params, batch["inputs"], arguments(batch), marked)
            out.update({f"attn_{name}/L{l}": value[l] for name, value in mass.items()
                        for l in range(cfg.num_layers)})
        if config.train.head_metrics:
            stats = head_stat_arrays(cfg, params, batch["inputs"], arguments(batch))
            out.update({f"head_{name}/L{l}H{h}": value[l, h] for name, value in stats.items()
                        for l in range(cfg.num_layers) for h in range(cfg.attention.num_heads)})
        return out

    return diagnostics
