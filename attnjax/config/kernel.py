"""The one map from a model config to the attention kernel it runs and the options it asks of
that kernel, used by the config's validation, the attention module and the KV-cache decoder
alike: a kernel that cannot honour what a model asks is refused here, before anything is
traced.
"""

from __future__ import annotations

from attnjax.ops.attention import check_kernel_supports, requested_options
from attnjax.registry import DROPOUTS, KERNELS, POSITIONS, SCALES, SINKS

# the options a KV-cache step asks of the kernel: queries placed after the cached keys
DECODE_OPTIONS = frozenset({"positions", "padding", "cross_attention"})


def score_arguments(model) -> dict:
    """The static mask and score-shaping arguments of ``dot_product_attention`` a
    ``ModelConfig`` asks for (causal as ``model.causal`` says; window; soft-capping)."""
    return dict(is_causal=model.causal, local_window_size=model.window,
                logit_soft_cap=model.attention.logit_soft_cap)


def kernel_request(model, *, decode: bool = False, return_weights: bool = False,
                   padded: bool = False) -> tuple[str, frozenset]:
    """``(kernel, options)``: the kernel a ``ModelConfig`` runs and the ``OPTIONS`` it asks of
    it, for training (``decode=False``) or a KV-cache step, with or without returning the
    weights (a kernel that cannot return them is swapped for ``reference``, which computes the
    same function), on padded batches or not (``padded``: per-example positions and, with
    ``key_padding_mask``, segment ids). Raises a one-line ValueError naming
    ``model.attention.kernel`` when the kernel cannot honour them, or the field that cannot
    decode (a bidirectional model, the position encoding)."""
    att = model.attention
    scores = score_arguments(model)
    asks = set(requested_options(
        bias=True if POSITIONS.get(model.position.kind).bias is not None else None,
        window=scores["local_window_size"], logit_soft_cap=scores["logit_soft_cap"],
        dropout_rate=att.dropout_rate if DROPOUTS.get(att.dropout).on_probs else 0.0,
        value_head_dim=model.value_head_dim != model.head_dim,
        positions=padded, segment=padded and att.key_padding_mask))
    asks |= SCALES.get(att.scale).asks | SINKS.get(att.sink).asks
    if decode:
        if not model.causal:
            field = (f"family={model.family!r} (bidirectional)" if model.attention.causal
                     else "attention.causal=False")
            raise ValueError(f"decoding with the KV cache: model.{field} cannot decode (a later "
                             "token would change the earlier outputs)")
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
