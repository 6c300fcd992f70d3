"""The attention module's slot tables: qk-norm, scale policy, sink and dropout placement.

Each ``model.attention`` choice is a name in a registry; its entry says what it does and
which ``model.attention`` fields it alone reads (``reads``), so the config refuses those
fields under any other choice, and which kernel options it asks for (``asks``), so the
config refuses a kernel that cannot honour it. ``kernel_request`` is the one map from a
model config to the kernel it runs and the options it asks of it, used by the config
validation, the module and the KV-cache decoder alike.

Adding a choice to a slot = one function and one ``register`` call here (and, if it has a
setting of its own, a field of ``AttentionConfig`` named in ``reads``). Adding a score-shaping
option of the kernels (like soft-capping) = its math and name in ``attnjax.ops.attention``, a
field of ``AttentionConfig``, and one line in ``score_arguments``.

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

from attnjax.ops.attention import check_kernel_supports, requested_options
from attnjax.registry import DROPOUTS, INITS, KERNELS, POSITIONS, QK_NORMS, SCALES, SINKS

NORMS = {"rms": nn.RMSNorm, "layer": nn.LayerNorm}


class QKNorm(NamedTuple):
    """``apply(module, q, k, attention_config, dtype) -> (q, k)`` on BTNH arrays."""
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
        return (NORMS[kind](dtype=dtype, name="query_norm")(q),
                NORMS[kind](dtype=dtype, name="key_norm")(k))
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
    return jnp.exp(module.param("log_scale", nn.initializers.constant(init),
                                (att.num_heads,)))


SCALES.register("inv_sqrt_d", _fixed(lambda d: 1.0 / math.sqrt(d)))
SCALES.register("inv_d", _fixed(lambda d: 1.0 / d))
SCALES.register("constant", _fixed(lambda d: 1.0))
SCALES.register("learned", ScalePolicy(_learned_scale, asks=frozenset({"per_head_scale"}),
                                       host_multiplier=True))

SINKS.register("none", Sink(lambda module, att: None, asks=frozenset()))
SINKS.register("learned", Sink(lambda module, att: module.param(
    "sink", nn.initializers.zeros, (att.num_heads,))))
SINKS.register("plus_one", Sink(lambda module, att: 0.0))

DROPOUTS.register("none", DropoutPlacement(reads=()))
DROPOUTS.register("probs_shared", DropoutPlacement(on_probs=True, shared_across_heads=True))
DROPOUTS.register("probs_per_head", DropoutPlacement(on_probs=True))
DROPOUTS.register("output", DropoutPlacement(on_output=True))

# Initializers of the projections: ``make(scale)`` -> a flax initializer of a 2-D kernel
# ``[fan_in, fan_out]``; scale is the std of ``normal`` and the gain of ``xavier_uniform``
# (Var = gain^2 * 2 / (fan_in + fan_out), as torch.nn.init.xavier_uniform_).
INITS.register("default", lambda scale: nn.initializers.lecun_normal())
INITS.register("zeros", lambda scale: nn.initializers.zeros)
INITS.register("normal", lambda scale: nn.initializers.normal(stddev=scale))
INITS.register("xavier_uniform",
               lambda scale: nn.initializers.variance_scaling(scale**2, "fan_avg", "uniform"))
SCALED_INITS = ("normal", "xavier_uniform")     # the ones that read their *_init_scale


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


# the options a KV-cache step asks of the kernel: queries placed after the cached keys
DECODE_OPTIONS = frozenset({"positions", "padding", "cross_attention"})


def score_arguments(att) -> dict:
    """The static mask and score-shaping arguments of ``dot_product_attention`` a
    ``model.attention`` config asks for (causal unless ``causal=False``; window;
    soft-capping)."""
    return dict(is_causal=att.causal,
                local_window_size=None if att.window is None else (att.window - 1, 0),
                logit_soft_cap=att.logit_soft_cap)


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


def kernel_request(model, *, decode: bool = False, return_weights: bool = False,
                   padded: bool = False) -> tuple[str, frozenset]:
    """``(kernel, options)``: the kernel a ``ModelConfig`` runs and the ``OPTIONS`` it asks of
    it, for training (``decode=False``) or a KV-cache step, with or without returning the
    weights (a kernel that cannot return them is swapped for ``reference``, which computes the
    same function), on padded batches or not (``padded``: what ``padding_arguments`` passes).
    Raises a one-line ValueError naming ``model.attention.kernel`` when the kernel cannot
    honour them, or the field that cannot decode (``model.attention.causal``, the position
    encoding)."""
    att = model.attention
    scores = score_arguments(att)
    asks = set(requested_options(
        bias=True if POSITIONS.get(model.position.kind).bias is not None else None,
        window=scores["local_window_size"], logit_soft_cap=scores["logit_soft_cap"],
        dropout_rate=att.dropout_rate if DROPOUTS.get(att.dropout).on_probs else 0.0,
        value_head_dim=model.value_head_dim != model.head_dim,
        positions=padded, segment=padded and att.key_padding_mask))
    asks |= SCALES.get(att.scale).asks | SINKS.get(att.sink).asks
    if decode:
        if not att.causal:
            raise ValueError("decoding with the KV cache: model.attention.causal=False cannot "
                             "decode (a later token would change the earlier outputs)")
        asks |= DECODE_OPTIONS
        position = POSITIONS.get(model.position.kind)
        if position.decode_check is not None:
            position.decode_check(model)
    kernel, spec = att.kernel, KERNELS.get(att.kernel, "model.attention.kernel")
    if return_weights:
        asks.add("return_weights")
        if "return_weights" not in spec.supports:
            if not spec.exact:
                raise ValueError(f"model.attention.kernel={kernel!r} cannot return attention "
                                 "weights (it is not softmax attention)")
            kernel = "reference"
    use = "decoding with the KV cache: " if decode else ""
    check_kernel_supports(kernel, frozenset(asks), field=f"{use}model.attention.kernel")
    if decode and spec.causal_only_aligned:
        raise ValueError(f"{use}model.attention.kernel={kernel!r} handles causal attention only "
                         "for queries and keys of equal length; decode with another kernel")
    return kernel, frozenset(asks)


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
