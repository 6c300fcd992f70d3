"""The q, k, v projection layouts of ``MultiHeadAttention`` (fused, separate, one matmul per
head) and the map of parameters between them, so layouts can be compared at equal weights."""

from __future__ import annotations

from collections.abc import Mapping

import jax.numpy as jnp

from attnjax.config import ModelConfig


def projection_layout(model: ModelConfig) -> str:
    """``fused``, ``separate`` or ``per_head``: how ``model`` lays out its q, k, v kernels."""
    att = model.attention
    return "per_head" if att.per_head_projections else "fused" if att.fused_qkv else "separate"


def _layout_of(params: Mapping) -> str | None:
    for layout, name in (("fused", "qkv"), ("separate", "query"), ("per_head", "query_0")):
        if name in params:
            return layout
    return None


def convert_projections(params, model: ModelConfig):
    """``params`` with the q, k, v projections of every attention module in it (a
    ``MultiHeadAttention``'s tree, or one holding several, e.g. a whole model's) re-laid out
    in ``model``'s layout (``projection_layout``), computing the same function.

    The layout a module's parameters are in is read from their names (``qkv``, ``query``,
    ``query_0``); kernels and biases move together: separate ``[d, heads, width]`` is the
    fused kernel split at ``N`` and ``N + K`` heads (at ``N H`` and ``(N + K) H`` columns when
    ``D != H``), and per head ``n`` its slice ``[d, n, :]``. Everything else is kept as is.
    """
    if not isinstance(params, Mapping):
        return params
    current = _layout_of(params)
    if current is None:
        return {name: convert_projections(sub, model) for name, sub in params.items()}
    att = model.attention
    N, K, H, D = att.num_heads, att.kv_heads, model.head_dim, model.value_head_dim
    target = projection_layout(model)
    rest = {name: sub for name, sub in params.items()
            if name not in ("qkv", "query", "key", "value")
            and not name.startswith(("query_", "key_", "value_"))}
    # each projection as {"kernel": [d, heads, width], "bias": [heads, width]} (bias optional)
    if current == "fused":
        split = {leaf: _split_fused(x, N, K, H, D) for leaf, x in params["qkv"].items()}
        q, k, v = ({leaf: parts[i] for leaf, parts in split.items()} for i in range(3))
    elif current == "separate":
        q, k, v = params["query"], params["key"], params["value"]
    else:
        q, k, v = ({leaf: jnp.stack([params[f"{name}_{i}"][leaf] for i in range(count)], -2)
                    for leaf in params[f"{name}_0"]}
                   for name, count in (("query", N), ("key", K), ("value", K)))
    if target == "separate":
        return {**rest, "query": q, "key": k, "value": v}
    if target == "fused":
        flat = (lambda x: x) if D == H else (lambda x: x.reshape(*x.shape[:-2], -1))
        return {**rest, "qkv": {leaf: jnp.concatenate([flat(p[leaf]) for p in (q, k, v)],
                                                      axis=-2 if D == H else -1)
                                for leaf in q}}
    return {**rest, **{f"{name}_{i}": {leaf: x[..., i, :] for leaf, x in p.items()}
                       for name, p, count in (("query", q, N), ("key", k, K), ("value", v, K))
                       for i in range(count)}}


def _split_fused(leaf, N: int, K: int, H: int, D: int) -> tuple:
    """A fused kernel ``[d, N + 2K, H]`` / ``[d, (N + K) H + K D]`` (or its bias, without
    ``d``) -> the query, key and value leaves ``[..., heads, width]``."""
    if D == H:
        return tuple(jnp.split(leaf, [N, N + K], axis=-2))
    lead = leaf.shape[:-1]
    q, k, v = jnp.split(leaf, [N * H, (N + K) * H], axis=-1)
    return q.reshape(*lead, N, H), k.reshape(*lead, K, H), v.reshape(*lead, K, D)
