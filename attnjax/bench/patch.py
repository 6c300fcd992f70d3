"""Capture and patching (``attnjax bench patch``): what capturing named points costs against a
forward pass that captures nothing, and W interventions as one batched pass
(``patching.run_worlds``) against a Python loop of W single patched passes.

Rows: ``capture`` (none, every head's output ``z``, every point), each with the median
seconds of a forward pass on the config's evaluation batch and the compiled program's
temporary and output bytes; ``patching``: W zero-ablations of one head each (the heads taken
in turn) on ``examples`` sequences, batched (all W worlds in one vmapped pass, and mapped over
groups of ``patching.group_of(examples)`` worlds) against looped, and their ratios: a batched
pass does the loop's arithmetic in bigger matrix products and without W dispatches, so it
gains where one pass leaves the device idle (few examples) and not where one pass already
fills it; on a CPU, groups whose activations stay in cache beat one pass over all worlds.
Parameters are a random initialisation (time does not depend on their values).
"""

from __future__ import annotations

import jax
import numpy as np

from attnjax.analysis.patching import (group_of, heads_where, lower, match_points, patch,
                                       point_names, run, run_worlds, stack)
from attnjax.bench.common import median_seconds, write_json
from attnjax.config import Config
from attnjax.data import load_dataset
from attnjax.train.state import init_params

CAPTURES = {"none": (), "z": ("*.z",), "every point": ("*",)}


def _memory(config: Config, params, batch, names) -> dict:
    stats = lower(config, params, batch, capture=names).compile().memory_analysis()
    return {"temp_bytes": int(stats.temp_size_in_bytes),
            "output_bytes": int(stats.output_size_in_bytes)}


def run_patch_benchmark(config: Config, worlds: int = 64, examples=(1, 4), repeats: int = 3,
                        out: str | None = None) -> dict:
    """Print and return (and write to ``out``) the rows of the module docstring."""
    params = init_params(config)
    batch = jax.tree_util.tree_map(np.asarray, load_dataset(config.data).batch(
        config.seed, 0, config.train.eval_batch_size, config.data.length, "val"))
    names = point_names(config, batch)
    capture_rows = []
    for label, patterns in CAPTURES.items():
        selected = match_points(names, patterns) if patterns else []
        seconds = median_seconds(lambda s=selected: run(config, params, batch, capture=s),
                                 repeats=repeats)
        capture_rows.append({"capture": label, "points": len(selected), "seconds": seconds,
                             **_memory(config, params, batch, selected)})
    base = capture_rows[0]["seconds"]
    for row in capture_rows:
        row["vs_none"] = row["seconds"] / base
    L, N = config.model.num_layers, config.model.attention.num_heads
    z = [f"block_{layer}.attention.z" for layer in range(L)]
    single = [{name: patch(0.0, where=heads_where(name, [w % N] if l == (w // N) % L else [],
                                                   N)) for l, name in enumerate(z)}
              for w in range(worlds)]
    together = stack(single)
    patching = []
    for count in examples:
        few = jax.tree_util.tree_map(lambda x, n=count: x[:n], batch)
        group = group_of(count)
        batched = median_seconds(lambda b=few: run_worlds(config, params, b, together)[0],
                                 repeats=repeats)
        grouped = median_seconds(lambda b=few, g=group: run_worlds(
            config, params, b, together, group=g)[0], repeats=repeats)
        looped = median_seconds(lambda b=few: [run(config, params, b, patches=p)[0]
                                               for p in single], repeats=repeats)
        patching.append({"worlds": worlds, "examples": count, "batched_seconds": batched,
                         "group": group, "grouped_seconds": grouped,
                         "looped_seconds": looped, "speedup": looped / batched,
                         "grouped_speedup": looped / grouped})
    print(f"capture (d_model {config.model.d_model}, {L} layers, {N} heads, batch "
          f"{config.train.eval_batch_size} x {config.data.length} tokens):")
    print(f"  {'capture':<12} {'points':>6} {'ms':>9} {'vs none':>8} {'temp MB':>9} "
          f"{'output MB':>10}")
    for row in capture_rows:
        print(f"  {row['capture']:<12} {row['points']:>6} {row['seconds'] * 1e3:>9.2f} "
              f"{row['vs_none']:>8.2f} {row['temp_bytes'] / 2**20:>9.2f} "
              f"{row['output_bytes'] / 2**20:>10.2f}")
    for row in patching:
        print(f"patching {worlds} zero-ablations of {row['examples']} example(s): looped "
              f"{row['looped_seconds'] * 1e3:.1f} ms; batched {row['batched_seconds'] * 1e3:.1f} "
              f"ms ({row['speedup']:.2f}x); in groups of {row['group']} worlds "
              f"{row['grouped_seconds'] * 1e3:.1f} ms ({row['grouped_speedup']:.2f}x)")
    result = {"rows": capture_rows, "patching": patching}
    write_json(out, result)
    return result
