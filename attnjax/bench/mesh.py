"""Memory and communication of a training step on each mesh (``attnjax bench mesh``), read
from the compiled program without running it (``--run-steps K`` then runs K dispatches).

For each mesh, the training dispatch ``attnjax train`` would run (``bench.memory``) is lowered
for the mesh and compiled; its per-device figures:

- ``state_bytes``: the parameters and optimizer state one device holds, from each leaf's shard
  shape; ``state_vs_even`` = ``state_bytes / (total / N)`` with ``N = fsdp x tensor``, the
  devices the state is split over (1.0: a perfect split);
- ``argument_bytes``, ``temp_bytes`` and ``peak_bytes``: XLA's memory analysis of the
  per-device program (``bench.memory``);
- ``all_gather_bytes``, ``reduce_scatter_bytes``, ``all_reduce_bytes``,
  ``collective_permute_bytes``, ``all_to_all_bytes``: the bytes the collectives of each kind
  produce on one device in one training step (``collective_bytes``: loops counted per trip);
- ``gather_analytic_bytes``: what FSDP gathers at least, ``sum_p bytes(p) / tensor_p`` over
  the parameters split over ``fsdp`` (each gathered once, whole but for its ``tensor`` split);
  the gradients' reduction moves as many bytes again.

The default model is Llama-shaped with about 110M parameters (``LLAMA_110M``), trained at
length 256, batch 8. The devices are this process's: on a CPU, ask for several with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (they share its cores: bytes are the
point, not time).
"""

from __future__ import annotations

import functools
import math
import re
import time

import jax
import numpy as np

from attnjax import sharding
from attnjax.sharding import mesh_overrides
from attnjax.bench.common import write_json
from attnjax.bench.memory import compile_buffers_only, tree_bytes
from attnjax.config import Config, apply_overrides
from attnjax.data import load_dataset
from attnjax.train import hyper
from attnjax.train.parallel import Runner
from attnjax.train.state import init_state

LLAMA_110M = {"model.d_model": 768, "model.num_layers": 12, "model.attention.num_heads": 16,
              "model.attention.num_kv_heads": 8, "model.attention.fused_qkv": False,
              "model.mlp": "swiglu", "model.norm": "rms", "model.mlp_bias": False,
              "model.attention.use_bias": False, "model.vocab_size": 32000,
              "model.max_length": 256, "data.task": "induction", "data.vocab_size": 32000,
              "data.length": 256, "train.batch_size": 8}
# fsdp 1/2/4/8, then tensor 2/4/8, data taking the devices left
MESHES = ("fsdp=1", "fsdp=2", "fsdp=4", "fsdp=8", "tensor=2", "tensor=4", "tensor=8")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")
BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
         "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}
_COLLECTIVE = re.compile(r"= (\(.*?\)|\S+) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
_WHILE = re.compile(r"while\(.*body=%([\w.\-]+).*?\"known_trip_count\":\{\"n\":\"(\d+)\"")
_CALLED = re.compile(r"(?:to_apply|calls|body|condition|branch_computations=\{[^}]*|"
                     r"true_computation|false_computation)=?%([\w.\-]+)")


def collective_bytes(hlo: str) -> dict[str, int]:
    """Per-device bytes each kind of collective produces in one run of a compiled program (its
    text): the sizes of their results (every element of a tuple result), a collective inside
    a loop counted once per trip (``known_trip_count``), inside a conditional as if taken."""
    own: dict[str, dict[str, int]] = {"": dict.fromkeys(COLLECTIVES, 0)}   # "": a fragment
    calls: dict[str, list[tuple[str, int]]] = {"": []}
    entry, current = None, ""
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(1)
            entry = current if line.startswith("ENTRY") else entry
            own[current], calls[current] = dict.fromkeys(COLLECTIVES, 0), []
            continue
        for result, kind in _COLLECTIVE.findall(line):
            for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", result):
                count = math.prod(int(d) for d in dims.split(",") if d)
                own[current][kind] += count * BYTES.get(dtype, 4)
        loop = _WHILE.search(line)
        if loop:
            calls[current].append((loop.group(1), int(loop.group(2))))
        else:
            calls[current] += [(name, 1) for name in _CALLED.findall(line)]

    @functools.cache
    def total(name: str) -> tuple:
        sums = dict(own.get(name, dict.fromkeys(COLLECTIVES, 0)))
        for callee, times in calls.get(name, []):
            for kind, value in zip(COLLECTIVES, total(callee)):
                sums[kind] += times * value
        return tuple(sums[kind] for kind in COLLECTIVES)

    if entry is None:                   # a fragment: its collectives as written
        return {kind: sum(o[kind] for o in own.values()) for kind in COLLECTIVES}
    return dict(zip(COLLECTIVES, total(entry)))


def _shard_bytes(tree) -> int:
    """Bytes one device holds of a tree of ``jax.ShapeDtypeStruct``s with shardings."""
    return sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
               for leaf in jax.tree_util.tree_leaves(tree))


def _gathered_bytes(abstract, sizes: dict) -> int:
    """``gather_analytic_bytes`` of the module docstring."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(abstract.params):
        spec = [axes if isinstance(axes, tuple) else (axes,) for axes in leaf.sharding.spec]
        flat = [axis for axes in spec for axis in axes if axis]
        if "fsdp" in flat:
            split = math.prod(sizes[a] for a in flat if a != "fsdp")
            total += leaf.size * leaf.dtype.itemsize // split
    return total


def mesh_row(config: Config, run_steps: int = 0) -> dict:
    """The figures of the module docstring for ``config`` on this process's devices."""
    dataset = load_dataset(config.data)
    runner = Runner(config, dataset)
    shapes = jax.eval_shape(lambda: init_state(config))
    abstract = runner.abstract(shapes)
    values = hyper.as_arrays([config], stacked=False)
    host = None if dataset.on_device else dataset.batch(
        config.seed, 0, config.train.batch_size, config.data.length, "train")
    lowered = runner.lower(abstract, values, host)
    began = time.perf_counter()
    compiled = compile_buffers_only(lowered)
    compile_s = time.perf_counter() - began
    stats = compiled.memory_analysis()
    sizes = runner.layout.sizes
    total = tree_bytes(shapes.params) + tree_bytes(shapes.opt_state)
    split = sizes["fsdp"] * sizes["tensor"]
    state = _shard_bytes(abstract.params) + _shard_bytes(abstract.opt_state)
    row = {"mesh": " x ".join(f"{a}={s}" for a, s in sizes.items()),
           "devices": len(runner.devices),
           "parameters": sum(leaf.size for leaf in jax.tree_util.tree_leaves(shapes.params)),
           "state_total_bytes": total, "state_bytes": state,
           "state_vs_even": round(state / (total / split), 4),
           "argument_bytes": stats.argument_size_in_bytes,
           "temp_bytes": stats.temp_size_in_bytes,
           "peak_bytes": (stats.argument_size_in_bytes + stats.output_size_in_bytes
                          - stats.alias_size_in_bytes + stats.temp_size_in_bytes),
           "compile_s": round(compile_s, 1)}
    row.update({f"{kind.replace('-', '_')}_bytes": value // runner.steps_per_call
                for kind, value in collective_bytes(compiled.as_text()).items()})
    row["gather_analytic_bytes"] = _gathered_bytes(abstract, sizes)
    if run_steps:
        row.update(_run(config, runner, values, host, run_steps))
    return row


def _run(config: Config, runner: Runner, values, host, steps: int) -> dict:
    """Train ``steps`` dispatches from a new state made on the mesh: the losses, and the
    seconds of the dispatches after the first (which compiles)."""
    state, losses, seconds = runner.place(runner.start(config, quiet=True)), [], []
    for _ in range(steps):
        began = time.perf_counter()
        state, metrics = runner.run(state, values, host)
        losses += [float(x) for x in np.asarray(metrics["loss"]).reshape(-1)]
        seconds.append(time.perf_counter() - began)
    return {"losses": losses, "dispatch_s": round(float(np.median(seconds[1:] or seconds)), 2)}


def run_mesh_benchmark(config: Config, meshes=MESHES, run_steps: int = 0,
                       out: str | None = None) -> list[dict]:
    """``mesh_row`` of ``config`` (e.g. ``LLAMA_110M``) on each mesh of ``meshes``
    (``"fsdp=2,tensor=2"``); prints a table, JSON to ``out``."""
    for text in meshes:            # a wrong entry is refused before anything compiles
        sharding.check(apply_overrides(config, mesh_overrides(text)), jax.device_count())
    rows = []
    shapes = jax.eval_shape(lambda: init_state(config)).params
    print(f"training step of {sum(x.size for x in jax.tree_util.tree_leaves(shapes)) / 1e6:.1f}M "
          f"parameters, batch {config.train.batch_size} x length {config.data.length}, on "
          f"{jax.device_count()} {jax.default_backend()} device(s); MB per device")
    header = (f"{'mesh':<28}{'state':>9}{'vs even':>9}{'temps':>9}{'peak':>9}"
              f"{'gathered':>10}{'analytic':>10}{'reduced':>9}")
    print(header)
    for text in meshes:
        row = mesh_row(apply_overrides(config, mesh_overrides(text)), run_steps)
        rows.append(row)
        mb = {key: f"{value / 2**20:>9.1f}" for key, value in row.items()
              if key.endswith("_bytes")}
        reduced = row["reduce_scatter_bytes"] + row["all_reduce_bytes"]
        print(f"{row['mesh']:<28}{mb['state_bytes']}{row['state_vs_even']:>9.3f}"
              f"{mb['temp_bytes']}{mb['peak_bytes']} {mb['all_gather_bytes']}"
              f" {mb['gather_analytic_bytes']}{reduced / 2**20:>9.1f}"
              + (f"  losses {row['losses'][0]:.3f} -> {row['losses'][-1]:.3f}, "
                 f"{row['dispatch_s']} s per dispatch" if run_steps else ""))
    write_json(out, {"backend": jax.default_backend(), "rows": rows})
    return rows
