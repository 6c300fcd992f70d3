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


def cross_arguments(model) -> dict:
    """``score_arguments`` of cross-attention: every source key is visible to every query (no
    causal mask and no window, which relate positions of one sequence); soft-capping as in
    self-attention."""
    return dict(is_causal=False, local_window_size=None,
                logit_soft_cap=model.attention.logit_soft_cap)


def kernel_request(model, *, decode: bool = False, return_weights: bool = False,
                   padded: bool = False, cross: bool = False) -> tuple[str, frozenset]:
    """``(kernel, options)``: the kernel a ``ModelConfig`` runs and the ``OPTIONS`` it asks of
    it, for training (``decode=False``) or a KV-cache step, with or without returning the
    weights (a kernel that cannot return them is swapped for ``reference``, which computes the
    same function), on padded batches or not (``padded``: per-example positions and, with
    ``key_padding_mask``, segment ids). Raises a one-line ValueError naming
    ``model.attention.kernel`` when the kernel cannot honour them, or the field that cannot
    decode (a bidirectional model, the position encoding).

    ``cross``: cross-attention (``cross_arguments``), queries of one sequence over the keys of
    another: no causal mask, window or position bias (they relate positions of one sequence),
    keys of another length, and ``padded`` means the source's pads are hidden by segment ids;
    its static cache is read whole at every decoding step, so decoding asks nothing more."""
    att = model.attention
    scores = cross_arguments(model) if cross else score_arguments(model)
    biased = not cross and POSITIONS.get(model.position.kind).bias is not None
    asks = set(requested_options(
        bias=True if biased else None,
        window=scores["local_window_size"], logit_soft_cap=scores["logit_soft_cap"],
        dropout_rate=att.dropout_rate if DROPOUTS.get(att.dropout).on_probs else 0.0,
        value_head_dim=model.value_head_dim != model.head_dim, cross_attention=cross,
        positions=padded and not cross, segment=padded and (cross or att.key_padding_mask)))
    asks |= SCALES.get(att.scale).asks | SINKS.get(att.sink).asks
    if decode and not cross:
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
    use = ("cross-attention: " if cross else "") + ("decoding with the KV cache: " if decode
                                                    else "")
    check_kernel_supports(kernel, frozenset(asks), field=f"{use}model.attention.kernel")
    if decode and not cross and spec.causal_only_aligned:
        raise ValueError(f"{use}model.attention.kernel={kernel!r} handles causal attention only "
                         "for queries and keys of equal length; decode with another kernel")
    return kernel, frozenset(asks)
