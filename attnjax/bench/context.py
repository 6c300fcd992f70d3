"""Context parallelism measured (``attnjax bench context``): what a training step holds per
device against its length, for the ``ring`` and ``allgather`` kernels on a ``sequence`` axis of
all this process's devices and for the ``chunked`` kernel on one device, read from the
compiled programs (not run); the bytes each sends against the analytic figure; and the
balance of the causal work.

Per length and strategy: ``peak_bytes`` (XLA's memory analysis of the per-device program, as
``bench.memory``), ``sent_bytes`` (what the collectives of one step produce on a device,
``bench.mesh.collective_bytes``: the ring's hops counted per trip) against
``analytic_bytes`` (``ops.context.traffic`` per attention layer, forward and backward, times
the layers). Then, for a per-device ``budget``, the longest length each strategy fits (target:
about N times one device's); and ``ops.context.layout_work``'s max/mean of the visible
(query, key) pairs per device under the causal mask, contiguous against zig-zag (target <= 1.1
balanced, about 2 contiguous).

The model is small (width 256, 2 layers, 4 heads of 64), batch 1, so the sequence dominates.
On a CPU ask for devices with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``.
"""

from __future__ import annotations

import jax

from attnjax.bench.common import write_json
from attnjax.bench.memory import compile_buffers_only
from attnjax.bench.mesh import collective_bytes
from attnjax.config import Config, apply_overrides
from attnjax.data import load_dataset
from attnjax.ops.context import KERNEL_NAMES, layout_work, traffic
from attnjax.train import hyper
from attnjax.train.parallel import Runner
from attnjax.train.state import init_state

LENGTHS = (4096, 8192, 16384, 32768, 65536)
MODEL = {"model.d_model": 256, "model.num_layers": 2, "model.attention.num_heads": 4,
         "model.attention.fused_qkv": False, "data.task": "induction", "data.vocab_size": 256,
         "train.batch_size": 1}
BUDGET = 512 * 2**20


def step_row(config: Config, devices) -> dict:
    """Peak bytes per device and bytes sent per step of ``config``'s training dispatch on
    ``devices`` (compiled, not run)."""
    runner = Runner(config, load_dataset(config.data), devices)
    state = runner.abstract(jax.eval_shape(lambda: init_state(config)))
    lowered = runner.lower(state, hyper.as_arrays([config], stacked=False))
    compiled = compile_buffers_only(lowered)
    stats = compiled.memory_analysis()
    sent = collective_bytes(compiled.as_text())
    return {"peak_bytes": (stats.argument_size_in_bytes + stats.output_size_in_bytes
                           - stats.alias_size_in_bytes + stats.temp_size_in_bytes),
            "sent_bytes": sum(sent.values()) // runner.steps_per_call}


def _table_line(row: dict) -> str:
    mb = lambda key, width=9: f"{row[key] / 2**20:>{width}.1f}"
    return f"{row['length']:>7}{mb('chunked_peak_bytes', 15)}" + "".join(
        f"{mb(k + '_peak_bytes', 15)}{mb(k + '_sent_bytes')}{mb(k + '_analytic_bytes', 10)}"
        for k in KERNEL_NAMES)


def run_context_benchmark(lengths=LENGTHS, budget: int = BUDGET,
                          out: str | None = None) -> dict:
    """The rows of the module docstring; prints tables, JSON to ``out``."""
    n = jax.device_count()
    if n < 2:
        raise ValueError("bench context splits a sequence over this process's devices and "
                         "there is one: on a CPU set XLA_FLAGS="
                         "--xla_force_host_platform_device_count=8")
    print(f"training step per device, width 256, 2 layers, batch 1, on {n} "
          f"{jax.default_backend()} devices (sequence={n}) or one (chunked); MB", flush=True)
    print(f"{'length':>7}{'chunked 1 dev':>15}" + "".join(f"{k + ' peak':>15}{'sent':>9}"
                                                          f"{'analytic':>10}"
                                                          for k in KERNEL_NAMES), flush=True)
    rows = []
    for length in lengths:
        base = apply_overrides(Config(), {**MODEL, "data.length": length,
                                          "model.max_length": length})
        one = apply_overrides(base, {"model.attention.kernel": "chunked"})
        row = {"length": length, "chunked_peak_bytes": step_row(one, jax.devices()[:1])[
            "peak_bytes"]}
        for kernel in KERNEL_NAMES:
            split = apply_overrides(base, {"model.attention.kernel": kernel,
                                           "train.mesh.data": 1, "train.mesh.sequence": n})
            measured = step_row(split, jax.devices())
            flow = traffic(kernel, length, n, heads=4, kv_heads=4, head_dim=64)
            row.update({f"{kernel}_peak_bytes": measured["peak_bytes"],
                        f"{kernel}_sent_bytes": measured["sent_bytes"],
                        f"{kernel}_analytic_bytes": 2 * (flow["forward"] + flow["backward"])})
        rows.append(row)
        print(_table_line(row), flush=True)
    fits = {strategy: max((r["length"] for r in rows if r[f"{strategy}_peak_bytes"] <= budget),
                          default=None) for strategy in ("chunked", *KERNEL_NAMES)}
    print(f"longest length within {budget / 2**20:.0f} MB per device: " + ", ".join(
        f"{s} {v}" for s, v in fits.items()), flush=True)
    balance = {layout: layout_work(lengths[-1], n, layout=layout)["pairs_max_over_mean"]
               for layout in ("contiguous", "zigzag")}
    print(f"causal work per device at length {lengths[-1]}, max/mean: contiguous "
          f"{balance['contiguous']:.3f}, zig-zag {balance['zigzag']:.3f}", flush=True)
    result = {"devices": n, "budget_bytes": budget, "rows": rows, "longest_within_budget": fits,
              "balance": balance}
    write_json(out, {"backend": jax.default_backend(), **result})
    return result
