"""The attention module's slot tables: qk-norm, scale policy, sink and dropout placement.

Each ``model.attention`` choice is a name in a registry; its entry says what it does and
which ``model.attention`` fields it alone reads (``reads``), so the config refuses those
fields under any other choice, and which kernel options it asks for (``asks``), so the
config refuses a kernel that cannot honour it (``attnjax.config.kernel.kernel_request``).

Adding a choice to a slot = one function and one ``register`` call here (and, if it has a
setting of its own, a field of ``AttentionConfig`` named in ``reads``). Adding a score-shaping
option of the kernels (like soft-capping) = its math and name in ``attnjax.ops.attention``, a
field of ``AttentionConfig``, and one line in ``attnjax.config.kernel.score_arguments``.

References: Henry et al. 2020, "Query-Key Normalization for Transformers", and Dehghani et
al. 2023 (qk-norm); Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities" (fixed-RMS qk probe); Vaswani et al. 2017 (1/sqrt(d) scaling,
dropout); Miller 2023, Xiao et al. 2023 (sinks).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from attnjax.nn.axes import with_axes
from attnjax.ops.masks import visibility
from attnjax.registry import DROPOUTS, INITS, KERNELS, QK_NORMS, SCALES, SINKS

NORMS = {"rms": nn.RMSNorm, "layer": nn.LayerNorm}


def make_norm(config, name: str, kind: str | None = None, axis: str = "norm") -> nn.Module:
    """A norm over the last axis at ``model.norm_eps``, in ``model.dtype``: ``kind`` (default
    ``model.norm``) ``layer``, ``(x - mean x) / sqrt(var x + eps) * scale + bias``, or
    ``rms``, ``x / sqrt(mean x^2 + eps) * scale``; its scale and bias have the logical axis
    ``axis`` (``attnjax.nn.axes``)."""
    norm = NORMS[kind or config.norm]
    inits = {"scale_init": with_axes(nn.initializers.ones_init(), axis)}
    if norm is nn.LayerNorm:
        inits["bias_init"] = with_axes(nn.initializers.zeros_init(), axis)
    return norm(epsilon=config.norm_eps, dtype=jnp.dtype(config.dtype), name=name, **inits)


class QKNorm(NamedTuple):
    """``apply(module, q, k, attention_config, dtype) -> (q, k)`` on BTNH arrays; ``module``
    is the attention module (the learned norms read its model config's ``norm_eps``)."""
    apply: Callable
    reads: tuple[str, ...] = ()


class ScalePolicy(NamedTuple):
    """``scale(module, attention_config, head_dim)``: the logit scale, a float or ``[heads]``.
    ``host_multiplier``: it reads ``scale_multiplier`` on the host (at initialisation), so the
    multiplier cannot be a traced program argument (see ``attnjax.train.hyper``)."""
    scale: Callable
    asks: frozenset = frozenset()
    host_multiplier: bool = False


class Sink(NamedTuple):
    """``logit(module, attention_config)``: the sink logit per head, or ``None`` for no sink."""
    logit: Callable
    asks: frozenset = frozenset({"sink"})


class DropoutPlacement(NamedTuple):
    """Where ``dropout_rate`` applies: on the probabilities (one mask shared by all heads, or
    one per head) and/or on the attention output (before the residual)."""
    on_probs: bool = False
    shared_across_heads: bool = False
    on_output: bool = False
    reads: tuple[str, ...] = ("dropout_rate",)


def normalize_rms(x: jax.Array, kappa) -> jax.Array:
    """``sqrt(kappa) * x / rms(x)`` over the last axis: q and k with RMS ``sqrt(kappa)``, so
    ``q.k`` is at most ``kappa * head_dim``; no learned gain (Wortsman et al. 2023 probe)."""
    x32 = x.astype(jnp.float32)
    rms = jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (jnp.sqrt(kappa) * x32 / rms).astype(x.dtype)


def _learned_norm(kind: str) -> Callable:
    def apply(module, q, k, att, dtype):
        return (make_norm(module.config, "query_norm", kind, "head_dim")(q),
                make_norm(module.config, "key_norm", kind, "head_dim")(k))
    return apply


QK_NORMS.register("none", QKNorm(lambda module, q, k, att, dtype: (q, k)))
QK_NORMS.register("rms", QKNorm(_learned_norm("rms")))
QK_NORMS.register("layer", QKNorm(_learned_norm("layer")))
QK_NORMS.register("kappa", QKNorm(
    lambda module, q, k, att, dtype: (normalize_rms(q, att.qk_kappa),
                                      normalize_rms(k, att.qk_kappa)), reads=("qk_kappa",)))


def _fixed(policy: Callable[[int], float]) -> ScalePolicy:
    return ScalePolicy(lambda module, att, head_dim: att.scale_multiplier * policy(head_dim))


def _learned_scale(module, att, head_dim):
    """A temperature per head, ``exp(log_scale)``, initialised at ``multiplier / sqrt(d)``."""
    init = math.log(att.scale_multiplier / math.sqrt(head_dim))
    return jnp.exp(module.param("log_scale", with_axes(nn.initializers.constant(init), "heads"),
                                (att.num_heads,)))


SCALES.register("inv_sqrt_d", _fixed(lambda d: 1.0 / math.sqrt(d)))
SCALES.register("inv_d", _fixed(lambda d: 1.0 / d))
SCALES.register("constant", _fixed(lambda d: 1.0))
SCALES.register("learned", ScalePolicy(_learned_scale, asks=frozenset({"per_head_scale"}),
                                       host_multiplier=True))

SINKS.register("none", Sink(lambda module, att: None, asks=frozenset()))
SINKS.register("learned", Sink(lambda module, att: module.param(
    "sink", with_axes(nn.initializers.zeros, "heads"), (att.num_heads,))))
SINKS.register("plus_one", Sink(lambda module, att: 0.0))

DROPOUTS.register("none", DropoutPlacement(reads=()))
DROPOUTS.register("probs_shared", DropoutPlacement(on_probs=True, shared_across_heads=True))
DROPOUTS.register("probs_per_head", DropoutPlacement(on_probs=True))
DROPOUTS.register("output", DropoutPlacement(on_output=True))

# Initializers of the projections: ``make(scale)`` -> a flax initializer of a 2-D kernel
# ``[fan_in, fan_out]``; scale is the std of ``normal`` and the gain of ``xavier_uniform``
# (Var = gain^2 * 2 / (fan_in + fan_out), as torch.nn.init.xavier_uniform_); the config names
# the schemes that read a scale (``attnjax.config.model.SCALED_INITS``).
INITS.register("default", lambda scale: nn.initializers.lecun_normal())
INITS.register("zeros", lambda scale: nn.initializers.zeros)
INITS.register("normal", lambda scale: nn.initializers.normal(stddev=scale))
INITS.register("xavier_uniform",
               lambda scale: nn.initializers.variance_scaling(scale**2, "fan_avg", "uniform"))


def projection_init(att, parts: list[tuple[str, int]]):
    """The kernel initializer of a projection whose output columns are ``parts`` (``(name,
    width)`` for name in q, k, v, o, in column order): each part drawn with its own
    ``<name>_init`` at ``<name>_init_scale`` as if it were a projection of its own; flax's
    default (lecun normal over the whole kernel) when every part is ``default``."""
    schemes = [(getattr(att, f"{name}_init"), getattr(att, f"{name}_init_scale"))
               for name, _ in parts]
    if all(scheme == "default" for scheme, _ in schemes):
        return nn.initializers.lecun_normal()
    inits = [INITS.get(scheme)(scale) for scheme, scale in schemes]
    widths = [width for _, width in parts]

    def init(key, shape, dtype=jnp.float32):
        keys = jax.random.split(key, len(inits))
        return jnp.concatenate([fn(k, (shape[0], w), dtype)
                                for fn, k, w in zip(inits, keys, widths)], axis=1)
    return init


def head_init(att, part: str, heads: int, width: int, head: int):
    """The initializer of head ``head``'s own ``[fan_in, width]`` kernel in the per-head
    layout: its columns of a ``[fan_in, heads * width]`` kernel drawn by ``projection_init``,
    so each entry has the distribution it has in the separate layout (xavier's fan-out, for
    one, is the whole projection's, not the head's)."""
    whole = projection_init(att, [(part, heads * width)])

    def init(key, shape, dtype=jnp.float32):
        return whole(key, (shape[0], heads * width), dtype)[:, head * width:(head + 1) * width]
    return init


def padding_arguments(att, positions: jax.Array, token_mask: jax.Array) -> dict:
    """The arguments of ``dot_product_attention`` for a padded batch, ``token_mask`` ``[B, T]``
    True at real tokens: the per-example ``positions`` ``[B|1, T]`` for every position-based
    mask and bias, and with ``key_padding_mask`` segment ids ``1`` for real tokens and ``0``
    for pads, so key j is visible from query i only if ``token_mask`` agrees at i and j: a
    real token never sees a pad, and a pad sees pads (at least itself), so no row is empty."""
    positions = jnp.broadcast_to(positions, token_mask.shape)
    arguments = dict(query_positions=positions, key_positions=positions)
    if att.key_padding_mask:
        arguments["segment_ids"] = token_mask.astype(jnp.int32)
    return arguments


def visible_keys(config, T: int, token_mask: jax.Array | None = None) -> jax.Array | None:
    """The keys each query of a length-``T`` self-attention pass of ``config`` may see, as the
    ``visible`` argument of the statistics and regularisers (``ops.masks.visibility``: causal
    or bidirectional, the window, a padded batch's ``token_mask`` under ``key_padding_mask``),
    or None for the plain causal mask those assume by default (the same numbers bit for
    bit)."""
    padded = token_mask is not None and config.attention.key_padding_mask
    if config.causal and config.window is None and not padded:
        return None
    return visibility(T, T, config.causal, token_mask if padded else None, config.window)


def kernel_settings(att, kernel: str) -> dict:
    """The kernel's own ``model.attention`` settings that are set (``None`` = its default)."""
    return {name: getattr(att, name) for name in KERNELS.get(kernel).settings
            if getattr(att, name) is not None}


def probability_dropout(module, att, deterministic: bool) -> dict:
    """Keyword arguments of ``dot_product_attention`` for dropout on the probabilities."""
    placement = DROPOUTS.get(att.dropout)
    if deterministic or not placement.on_probs:
        return {}
    return dict(dropout_rate=att.dropout_rate, dropout_rng=module.make_rng("dropout"),
                dropout_shared_across_heads=placement.shared_across_heads)
