"""Model FLOPs and the machine's matmul peak, the two sides of model-FLOPs utilisation (MFU):
``model_flops_per_token`` and ``run_flops`` count the arithmetic a model or a whole run needs,
``matmul_peak_flops`` measures the fastest float32 matmul rate of this backend."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from attnjax.registry import POSITIONS
from attnjax.train.state import init_params


def matmul_peak_flops(sizes=(512, 1024, 2048), repeats: int = 20,
                      budget_s: float = 0.5, dtype=jnp.float32) -> float:
    """Best FLOP/s of square ``dtype`` matmuls on this backend (the MFU denominator): the
    fastest call at each size, best size kept; each size is called ``repeats`` times or, once
    three calls are done, until ``budget_s`` seconds are spent on it (a slow backend's big
    matmuls need no twenty tries to show their rate)."""
    dot = jax.jit(lambda a, b: a @ b)
    peak = 0.0
    for n in sizes:
        a = jax.random.normal(jax.random.key(0), (n, n), dtype)
        jax.block_until_ready(dot(a, a))
        began = time.perf_counter()
        for call in range(repeats):
            if call >= 3 and time.perf_counter() - began > budget_s:
                break
            start = time.perf_counter()
            jax.block_until_ready(dot(a, a))
            peak = max(peak, 2 * n**3 / (time.perf_counter() - start))
    return peak


def model_flops_per_token(config, context: int | None = None) -> float:
    """Training FLOPs per token: ``6 N + 6 L h (d_k + d_v) T`` (PaLM, appendix B: ``12 L d T``
    when ``h d_k = h d_v = d``), with N the parameters of every matmul including the (tied)
    output projection (not the position encoding's lookup tables), L layers, h heads of key
    width d_k and value width d_v, T context (``context``, default ``data.length``); plus
    ``4 L h d_v d`` for a frozen output projection (forward and input gradient, no weight
    gradient). A forward pass alone is a third of it."""
    params = init_params(config)
    tables = POSITIONS.get(config.model.position.kind).tables    # lookups, not matmuls
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    matmul = sum(leaf.size for path, leaf in flat
                 if leaf.ndim >= 2 and getattr(path[-1], "key", None) not in tables)
    m = config.model
    heads = m.attention.num_heads
    frozen = 4 * heads * m.value_head_dim * m.d_model if (
        m.attention.output_projection == "frozen") else 0
    return 6 * matmul + m.num_layers * (
        6 * heads * (m.head_dim + m.value_head_dim) * (context or config.data.length) + frozen)


def run_flops(config, evaluations: int) -> float:
    """Model FLOPs of a finished run of ``config``: its training steps
    (``model_flops_per_token`` of every trained token) and ``evaluations`` evaluations (a
    forward pass, a third of that, over every evaluated token at each evaluation length)."""
    t = config.train
    trained = t.steps * t.batch_size * config.data.length * model_flops_per_token(config)
    evaluated = t.eval_batches * t.eval_batch_size * sum(
        n * model_flops_per_token(config, n) / 3 for n in config.data.lengths)
    return trained + evaluations * evaluated
