"""Attention kernels (``attnjax bench attention``): compiled memory (XLA's memory analysis)
and wall time.

For each kernel and sequence length, jit-compiles the gradient of ``sum(attention(q, k, v)^2)``
with respect to q, k and v (causal, BTNH), reads the temporary buffer size XLA allocates for
it, and times it (median of ``repeats`` calls after one warm-up). Ratios in one run are what
to compare; absolute times on a shared machine are noisy. Given an interpreter that has torch
(``python``; by default this one, if it has torch), PyTorch's fused
``scaled_dot_product_attention`` forward and backward at the same shape is timed beside each
length (``attnjax/bench/torch_gpt.py`` in its own process, as ``bench torch`` runs it).
"""

from __future__ import annotations

import importlib.util
import sys

import jax

from attnjax.bench.common import median_seconds, write_json
from attnjax.bench.torch_peer import TorchWorker
from attnjax.ops import dot_product_attention
from attnjax.registry import KERNELS


def measure(kernel: str, length: int, *, batch=1, heads=4, head_dim=32, repeats=3,
            dtype: str = "float32") -> dict:
    """Temporary memory (MB) and median seconds of the forward and of the gradient, with q, k
    and v in ``dtype``."""
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (batch, length, heads, head_dim)).astype(dtype)
               for key in keys)
    attend = lambda q, k, v: dot_product_attention(q, k, v, is_causal=True, implementation=kernel)
    row = {"kernel": kernel, "length": length, "batch": batch, "heads": heads,
           "head_dim": head_dim, "dtype": dtype}
    for label, fn in (("forward", attend),
                      ("grad", jax.grad(lambda *a: (attend(*a) ** 2).sum(), argnums=(0, 1, 2)))):
        compiled = jax.jit(fn).lower(q, k, v).compile()
        row[f"{label}_temp_mb"] = compiled.memory_analysis().temp_size_in_bytes / 2**20
        row[f"{label}_s"] = median_seconds(compiled, q, k, v, repeats=repeats)
    return row


def _length_rows(kernels, length: int, worker, shape: dict) -> list[dict]:
    """Each kernel's ``measure`` at ``length``, its ratios against the first kernel's and,
    with a PyTorch ``worker``, SDPA's forward and backward (``sdpa_grad_ms``; ``vs_sdpa``:
    SDPA's time over the kernel's gradient time)."""
    sdpa = None
    full = {"batch": 1, "heads": 4, "head_dim": 32, "dtype": "float32", **shape}
    if worker is not None and full["dtype"] == "float32":      # SDPA is timed in float32
        sdpa = worker.ask({"attention": {"batch": full["batch"], "heads": full["heads"],
                                         "length": length, "head_dim": full["head_dim"],
                                         "repeats": full.get("repeats", 3)}})["seconds"]
    rows, base = [], None
    for kernel in kernels:
        row = measure(kernel, length, **shape)
        base = base or row
        row["grad_mem_vs_" + base["kernel"]] = row["grad_temp_mb"] / base["grad_temp_mb"]
        row["grad_time_vs_" + base["kernel"]] = row["grad_s"] / base["grad_s"]
        versus = ""
        if sdpa is not None:
            row["sdpa_grad_ms"], row["vs_sdpa"] = sdpa * 1e3, sdpa / row["grad_s"]
            versus = f"   SDPA {sdpa * 1e3:8.1f} ms: x{row['vs_sdpa']:.2f}"
        rows.append(row)
        print(f"{kernel:>11} {row['dtype']:>8} T={length:>6}  "
              f"fwd {row['forward_temp_mb']:9.1f} MB "
              f"{row['forward_s'] * 1e3:8.1f} ms   grad {row['grad_temp_mb']:9.1f} MB "
              f"{row['grad_s'] * 1e3:8.1f} ms   grad memory "
              f"x{row['grad_mem_vs_' + base['kernel']]:.3f}"
              f"  time x{row['grad_time_vs_' + base['kernel']]:.2f} (vs {base['kernel']})"
              + versus, flush=True)
    return rows


def run_attention_benchmark(lengths=(1024, 4096), kernels=None, out: str | None = None,
                            python: str | None = None, **shape) -> list[dict]:
    """``measure`` each of ``kernels`` (default: every exact kernel available on this
    backend, but those that run another's program here, ``runs_as``) at each length,
    ``shape`` its other arguments, and SDPA's time beside them when an interpreter with torch
    is given or this one has it; print a table, and write JSON to ``out`` if given."""
    kernels = kernels or [n for n, s in KERNELS.items()
                          if s.exact and s.available() and s.runs_as is None]
    if python is None and importlib.util.find_spec("torch") is not None:
        python = sys.executable
    worker = None if python is None else TorchWorker(python)
    rows = []
    try:
        for length in lengths:
            rows += _length_rows(kernels, length, worker, shape)
    finally:
        if worker is not None:
            worker.close()
    write_json(out, {"backend": jax.default_backend(),
                     "devices": [str(d) for d in jax.devices()], "rows": rows})
    return rows
