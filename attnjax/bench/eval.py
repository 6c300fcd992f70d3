"""Evaluation passes (``attnjax bench eval``): how many tokens one forward pass of an
evaluation should hold.

The evaluation (``attnjax.train.loop``) scores every batch of a length in one dispatch, as
forward passes of ``eval_chunk_rows`` sequences run one after another. This benchmark times
that same compiled program with passes of other sizes over the same sequences: forward tokens
per second against tokens per pass, and which size the rule picks. A pass whose activations
no longer stay in cache is slower per token, which is why the rule caps a pass at
``EVAL_CHUNK_TOKENS``; the measured throughputs are in docs/PERFORMANCE.md (``eval.json``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.bench.common import median_seconds, write_json
from attnjax.config import Config
from attnjax.data import load_dataset
from attnjax.train import hyper, loop
from attnjax.train.state import init_state


def eval_throughput(config: Config, tokens_per_pass=(256, 512, 1024, 2048, 4096, 8192),
                    sequences: int = 256, repeats: int = 3) -> list[dict]:
    """One row per pass size: ``tokens_per_pass``, ``rows`` (sequences per pass), forward
    ``tokens_per_s`` (median of ``repeats`` over ``sequences`` validation sequences) and
    ``chosen`` (the size the rule picks for ``train.eval_batch_size``)."""
    length = config.data.length
    dataset, params = load_dataset(config.data), init_state(config).params
    batch = jax.tree_util.tree_map(np.asarray, dataset.batch(config.seed, 0, sequences, length,
                                                             "val"))
    step = loop.compiled_eval_step(hyper.structure(config.evaluated()), None, False)
    values = hyper.as_arrays([config], stacked=False)
    chosen = loop.eval_chunk_rows(config.train.eval_batch_size, length)
    rows = []
    for rows_per_pass in sorted({max(1, t // length) for t in tokens_per_pass}):
        if sequences % rows_per_pass:
            continue
        chunks = jax.tree_util.tree_map(
            lambda x, r=rows_per_pass: jnp.asarray(x.reshape(-1, r, *x.shape[1:])), batch)
        seconds = median_seconds(step, values, params, chunks, repeats=repeats)
        rows.append({"tokens_per_pass": rows_per_pass * length, "rows": rows_per_pass,
                     "tokens_per_s": sequences * length / seconds,
                     "chosen": rows_per_pass == chosen})
    return rows


def run_eval_benchmark(config: Config, out: str | None = None) -> list[dict]:
    """``eval_throughput`` printed as a table (throughput also relative to the fastest size)
    and written to ``out``."""
    rows = eval_throughput(config)
    fastest = max(r["tokens_per_s"] for r in rows)
    for r in rows:
        r["vs_fastest"] = r["tokens_per_s"] / fastest
    m = config.model
    print(f"evaluation forward passes: d_model {m.d_model}, {m.num_layers} layers, "
          f"{m.attention.num_heads} heads, length {config.data.length}")
    print(f"{'tokens/pass':>12} {'rows':>5} {'tokens/s':>10} {'vs fastest':>11}  chosen")
    for r in rows:
        print(f"{r['tokens_per_pass']:>12} {r['rows']:>5} {r['tokens_per_s']:>10,.0f} "
              f"{r['vs_fastest']:>10.2f}x  {'*' if r['chosen'] else ''}")
    shape = {"d_model": m.d_model, "num_layers": m.num_layers,
             "num_heads": m.attention.num_heads, "length": config.data.length}
    write_json(out, {"model": shape, "rows": rows, "backend": jax.default_backend()})
    return rows
