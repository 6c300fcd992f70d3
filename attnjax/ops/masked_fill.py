"""A deliberately unsafe, PyTorch-style masking kernel, for measuring what the safe kernels
avoid.

Practitioners often write attention as ``scores.masked_fill(~mask, fill).softmax(-1)`` (or
``scores + (1 - mask) * fill``, or ``softmax(scores) * mask``). Each choice has failure modes
the exact kernels rule out by construction (``attention.py``: float32 logits, one finite fill
selected in, zero rows for queries that see nothing). This kernel makes every choice a
setting, so their effect can be measured:

- ``mask_fill``: the value masked logits get (``-1e4``, ``-5e3``, ``-1e9``, ``-inf``...;
  ``None``: the most negative finite value of the logits' dtype). With ``-inf`` a query that
  sees no key gets ``softmax([-inf, ...]) = NaN``, exactly as ``masked_fill`` + softmax; with a
  finite fill it gets the uniform distribution over all keys (the mean of V).
- ``mask_mode``: ``select`` (``where(mask, s, fill)``, as ``masked_fill``) or ``add``
  (``s + (1 - mask) * fill``: a large logit plus a finite fill is not the fill, and the fill
  times 1 in float16 overflows for ``|fill| > 65504``).
- ``logits_dtype``: ``float32``, or ``input``: scores, scaling and softmax in the inputs'
  dtype, so float16 logits can overflow to ``inf`` (and then ``NaN``).
- ``mask_after_softmax``: softmax over every key, then multiply the mask in (rows no longer
  sum to 1: the renormalisation bug).
- ``causal_offset``: key j visible from query i iff ``j <= i + causal_offset`` (``torch.triu``
  with ``diagonal = 1 + causal_offset``): 0 is causal attention, -1 hides the diagonal (row 0
  then sees nothing), +1 lets every query see the next token.

With ``mask_fill=None``, ``select``, ``float32``, no mask after softmax and offset 0 it computes
the reference kernel's function wherever a query sees at least one key. It is registered as a
*different function* (``exact=False``): the parity guarantees of the exact kernels do not
cover it.

References: Vaswani et al. 2017 (masked scaled dot-product attention); the PyTorch
``Tensor.masked_fill`` / ``nn.functional.softmax`` idiom this reproduces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.ops.attention import KernelSpec, block_bias, expand_kv_heads
from attnjax.ops.masks import combine_masks
from attnjax.registry import KERNELS

MASK_MODES = ("select", "add")
LOGITS_DTYPES = ("float32", "input")


def _in(dtype, x: jax.Array) -> jax.Array:
    """``x`` rounded to ``dtype``'s precision and range (overflow gives inf), kept in its own
    dtype: XLA on CPU computes half-precision arithmetic in float32 and would hide it."""
    info = jnp.finfo(dtype)
    return jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)


def masked_fill_attention(query, key, value, *, bias, mask, scale, logit_soft_cap, sink, dropout,
                          return_weights, mask_fill: float | None = None,
                          mask_mode: str = "select", logits_dtype: str = "float32",
                          mask_after_softmax: bool = False, causal_offset: int = 0):
    """Kernel with the shared signature (see attention.py); settings as in the module
    docstring. Soft-capping, sinks and dropout are refused by the front door."""
    del logit_soft_cap, sink, dropout  # not supported
    if mask_mode not in MASK_MODES:
        raise ValueError(f"mask_mode={mask_mode!r} is not valid; choices: {', '.join(MASK_MODES)}")
    if logits_dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits_dtype={logits_dtype!r} is not valid; choices: "
                         f"{', '.join(LOGITS_DTYPES)}")
    B, T, N, H = query.shape
    S = key.shape[1]
    dtype = query.dtype if logits_dtype == "input" else jnp.promote_types(query.dtype,
                                                                           jnp.float32)
    key, value = expand_kv_heads(key, N), expand_kv_heads(value, N)
    s = _in(dtype, jnp.einsum("bqnh,bknh->bnqk", query.astype(dtype), key.astype(dtype),
                              preferred_element_type=dtype))
    s = _in(dtype, s * scale[:, None, None].astype(dtype))
    b = block_bias(bias, mask, 0, T, 0, S)
    if b is not None:
        s = _in(dtype, s + b.astype(dtype))
    q_pos, k_pos = mask.positions(0, T, 0, S)
    causal = (k_pos[:, None, None, :] <= q_pos[:, None, :, None] + causal_offset
              if mask.is_causal else None)
    visible = combine_masks(mask._replace(is_causal=False).block(0, T, 0, S), causal)
    fill = jnp.asarray(jnp.finfo(dtype).min if mask_fill is None else mask_fill, dtype)
    if visible is None or mask_after_softmax:
        probs = jax.nn.softmax(s, axis=-1)
        if visible is not None:
            probs = probs * visible.astype(dtype)
    elif mask_mode == "select":
        probs = jax.nn.softmax(jnp.where(visible, s, fill), axis=-1)
    else:
        probs = jax.nn.softmax(_in(dtype, s + _in(dtype, (1 - visible.astype(dtype)) * fill)),
                               axis=-1)
    out = jnp.einsum("bnqk,bknh->bqnh", probs.astype(value.dtype), value,
                     preferred_element_type=jnp.promote_types(value.dtype, dtype))
    out = out.astype(query.dtype)
    if return_weights:
        return out, probs.astype(jnp.float32)
    return out


KERNELS.register("masked_fill", KernelSpec(
    masked_fill_attention,
    frozenset({"bias", "dense_bias", "mask", "positions", "window", "block_causal", "segment",
               "padding", "per_head_scale", "return_weights", "cross_attention",
               "value_head_dim"}),
    exact=False, safe=False,
    settings=("mask_fill", "mask_mode", "logits_dtype", "mask_after_softmax", "causal_offset")))
