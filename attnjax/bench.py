"""Attention kernel benchmark: compiled memory (XLA's memory analysis) and wall time.

For each kernel and sequence length, jit-compiles the gradient of ``sum(attention(q, k, v)^2)``
with respect to q, k and v (causal, BTNH), reads the temporary buffer size XLA allocates for
it, and times it (median of ``repeats`` calls after one warm-up). Ratios in one run are what
to compare; absolute times on a shared machine are noisy.

Also here: training throughput (tokens/s, MFU) and vmap vs sequential sweeps, and the helpers
the other benchmarks share (``median_seconds``, ``write_json``); the compiled memory of a
training step is in ``attnjax.bench_memory``, generation timing in ``attnjax.bench_generate``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

from attnjax.ops import dot_product_attention
from attnjax.registry import KERNELS, POSITIONS


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


def median_seconds(fn, *args, repeats: int = 3) -> float:
    """Median wall time of ``repeats`` calls of ``fn(*args)``, each waited for, after one
    warm-up call (compilation excluded)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def write_json(out: str | None, result: dict) -> None:
    """Write ``result`` with the machine it was measured on (``machine``) as JSON to ``out``
    (its directory made), if given, and say so."""
    if out:
        from attnjax.machine import describe
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"machine": describe(), **result}, indent=2))
        print(f"wrote {out}")


def run(lengths=(1024, 4096), kernels=None, out: str | None = None, **shape) -> list[dict]:
    """Measure every exact kernel available on this backend at each length; print a table,
    and write JSON to ``out`` if given."""
    kernels = kernels or [n for n, s in KERNELS.items()
                          if s.exact and s.available()]
    rows = []
    for length in lengths:
        base = None
        for kernel in kernels:
            row = measure(kernel, length, **shape)
            base = base or row
            row["grad_mem_vs_" + base["kernel"]] = row["grad_temp_mb"] / base["grad_temp_mb"]
            row["grad_time_vs_" + base["kernel"]] = row["grad_s"] / base["grad_s"]
            rows.append(row)
            print(f"{kernel:>11} {row['dtype']:>8} T={length:>6}  "
                  f"fwd {row['forward_temp_mb']:9.1f} MB "
                  f"{row['forward_s'] * 1e3:8.1f} ms   grad {row['grad_temp_mb']:9.1f} MB "
                  f"{row['grad_s'] * 1e3:8.1f} ms   grad memory "
                  f"x{row['grad_mem_vs_' + base['kernel']]:.3f}"
                  f"  time x{row['grad_time_vs_' + base['kernel']]:.2f} (vs {base['kernel']})",
                  flush=True)
    write_json(out, {"backend": jax.default_backend(),
                     "devices": [str(d) for d in jax.devices()], "rows": rows})
    return rows


def matmul_peak_flops(sizes=(512, 1024, 2048), repeats: int = 20) -> float:
    """Best float32 FLOP/s of square matmuls on this backend (the MFU denominator): the
    fastest of ``repeats`` calls at each size, best size kept."""
    dot = jax.jit(lambda a, b: a @ b)
    peak = 0.0
    for n in sizes:
        a = jax.random.normal(jax.random.key(0), (n, n))
        jax.block_until_ready(dot(a, a))
        for _ in range(repeats):
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
    from attnjax.train.state import init_params
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


def train_loop(config):
    """``(advance, steps_per_call)``: attnjax's compiled training loop of ``config``, compiled
    and warmed up by one dispatch; ``advance(calls)`` runs ``calls`` more dispatches on the
    state it keeps and returns their wall seconds."""
    from attnjax.data import load_dataset
    from attnjax.train import hyper
    from attnjax.train.parallel import Runner
    from attnjax.train.state import init_state
    runner = Runner(config, load_dataset(config.data))
    values = hyper.as_arrays([config], stacked=False)
    state = runner.place(init_state(config))

    def advance(calls: int) -> float:
        nonlocal state
        start = time.perf_counter()
        for _ in range(calls):
            state, metrics = runner.run(state, values)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    advance(1)
    return advance, runner.steps_per_call


def train_throughput(config, steps: int = 50) -> dict:
    """Tokens/s of the compiled training loop (after one warm-up dispatch)."""
    advance, steps_per_call = train_loop(config)
    calls = max(steps // steps_per_call, 1)
    seconds = advance(calls)
    tokens = calls * steps_per_call * config.train.batch_size * config.data.length
    return {"tokens_per_s": tokens / seconds, "seconds": seconds,
            "steps": calls * steps_per_call}


def train_settings() -> dict:
    """The settings of the training benchmark: (a) width 256, 4 layers, 8 heads, sequence 256,
    batch 16; (b) the nanoGPT CPU setting (REFERENCES.md); (c) (b)'s model at sequence 1024,
    batch 4. Learned absolute positions, as the plain Flax peer has (``attnjax.bench_peer``),
    and the ``triangular`` kernel, attnjax's fastest exact one for causal training (the
    default ``reference`` kernel computes the masked half of the scores as the peer does)."""
    from attnjax.config import Config, apply_overrides
    common = {"data.task": "text", "model.vocab_size": 256, "model.num_layers": 4,
              "model.position.kind": "learned", "model.attention.kernel": "triangular"}
    a = {**common, "model.d_model": 256, "model.attention.num_heads": 8, "model.max_length": 256,
         "data.length": 256, "train.batch_size": 16}
    b = {**common, "model.d_model": 128, "model.attention.num_heads": 4, "model.max_length": 64,
         "data.length": 64, "train.batch_size": 12}
    c = {**b, "model.max_length": 1024, "data.length": 1024, "train.batch_size": 4}
    return {name: apply_overrides(Config(), {**o, "train.log_every": 10, "train.eval_every": 10,
                                             "train.checkpoint_every": 10})
            for name, o in (("a: d256 L4 H8 T256 B16", a), ("b: nanoGPT d128 L4 H4 T64 B12", b),
                            ("c: d128 L4 H4 T1024 B4", c))}


def run_train_benchmark(steps: int = 50, out: str | None = None) -> list[dict]:
    """Tokens/s and model-FLOPs utilisation against a matmul peak measured in the same run,
    for each setting and for 1 vs 10 steps per dispatch; at 10, also the plain Flax peer's
    tokens/s and ``peer_ratio`` (``attnjax.bench_peer``)."""
    from attnjax.bench_peer import peer_comparison
    from attnjax.config import apply_overrides
    peak = matmul_peak_flops()
    print(f"matmul peak (float32, best of 512^2..2048^2): {peak / 1e9:.1f} GFLOP/s", flush=True)
    rows = []
    for name, config in train_settings().items():
        per_token = model_flops_per_token(config)
        for per_dispatch in (1, 10):
            cfg = apply_overrides(config, {"train.steps_per_dispatch": per_dispatch})
            peer = peer_comparison(cfg, steps) if per_dispatch > 1 else None
            result = train_throughput(cfg, steps) if peer is None else peer
            peak = max(peak, matmul_peak_flops())  # a noisy machine: keep the best seen
            mfu = result["tokens_per_s"] * per_token / peak
            rows.append({"setting": name, "kernel": cfg.model.attention.kernel,
                         "steps_per_dispatch": per_dispatch,
                         "flops_per_token": per_token, "peak_flops": peak, "mfu": mfu, **result})
            versus = "" if peer is None else (
                f"  peer {peer['peer_tokens_per_s']:>9,.0f} tokens/s  peer_ratio "
                f"{peer['peer_ratio']:.2f}x ({peer['peer_ratio_low']:.2f}-"
                f"{peer['peer_ratio_high']:.2f} over {peer['rounds']} rounds)")
            print(f"{name:<32} steps/dispatch {per_dispatch:>2}: "
                  f"{result['tokens_per_s']:>9,.0f} tokens/s  MFU {mfu:6.1%}{versus}", flush=True)
    for row in rows:  # every ratio against the best peak of the whole run
        row["peak_flops"], row["mfu"] = peak, row["tokens_per_s"] * row["flops_per_token"] / peak
    print(f"MFU against the run's best matmul peak {peak / 1e9:.1f} GFLOP/s: " + ", ".join(
        f"{r['setting'][:1]}/{r['steps_per_dispatch']} {r['mfu']:.1%}" for r in rows))
    write_json(out, {"backend": jax.default_backend(), "rows": rows})
    return rows


SWEEP_LAUNCHERS = ("sequential", "vmap", "processes", "vmap-processes", "ray", "auto")


def run_sweep_benchmark(experiment: str = "experiments/baseline.py", seeds: int = 8,
                        steps: int = 300, launchers=SWEEP_LAUNCHERS,
                        out: str | None = None) -> dict:
    """Wall time of the same sweep (``seeds`` seeds of ``experiment`` at ``steps`` steps) with
    each launcher, in fresh directories, compilation and worker start-up included (JAX's
    persistent compilation cache off, so no launcher inherits another's programs), and the
    largest per-run validation-loss difference from the first launcher's (runs must agree).

    Against the arithmetic: ``floor_s`` is the sweep's model FLOPs (``run_flops``, with the
    evaluations the runs logged plus the initial loss's) at the best float32 matmul peak
    measured in the run (``matmul_peak_flops``, before and after the launchers), the time no
    launcher can beat on this machine; each row's ``peak_fraction`` is ``floor_s / seconds``."""
    import os
    import tempfile

    from attnjax.config import apply_overrides
    from attnjax.experiment import experiment_config
    from attnjax.rundir import SweepDir
    from attnjax.sweep.launch import launch_runs
    from attnjax.sweep.spec import Run
    base = experiment_config(experiment, {"train.steps": steps})
    runs = [Run(f"seed={seed}", {"seed": seed}, apply_overrides(base, {"seed": seed}))
            for seed in range(seeds)]
    times, losses = {}, {}
    peak = matmul_peak_flops()
    cache = os.environ.get("ATTNJAX_COMPILE_CACHE")
    enabled = jax.config.jax_enable_compilation_cache
    os.environ["ATTNJAX_COMPILE_CACHE"] = ""            # workers inherit it: no cache
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for launcher in launchers:
                start = time.perf_counter()
                record = launch_runs(runs, f"{tmp}/{launcher}", label=experiment,
                                     launcher=launcher, progress=False, log=lambda *_: None)
                times[launcher] = time.perf_counter() - start
                losses[launcher] = [r["summary"]["eval"][str(base.data.length)]["loss"]
                                    for r in record["runs"]]
            logged = SweepDir(f"{tmp}/{launchers[0]}").run(runs[0].name).metrics()
            evaluations = 1 + sum("val_loss" in r for r in logged)    # + the initial loss's
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        if cache is None:
            os.environ.pop("ATTNJAX_COMPILE_CACHE")
        else:
            os.environ["ATTNJAX_COMPILE_CACHE"] = cache
    peak = max(peak, matmul_peak_flops())
    flops = seeds * run_flops(base, evaluations)
    floor = flops / peak
    first = launchers[0]
    rows = [{"launcher": name, "seconds": times[name], "speedup": times[first] / times[name],
             "peak_fraction": floor / times[name],
             "mean_val_loss": float(np.mean(losses[name])),
             "max_loss_difference": float(np.max(np.abs(np.subtract(losses[name],
                                                                    losses[first]))))}
            for name in launchers]
    print(f"{seeds} seeds of {experiment}, {steps} steps each (d_model {base.model.d_model}, "
          f"{base.model.num_layers} layers, batch {base.train.batch_size}, length "
          f"{base.data.length}) on {os.cpu_count()} cores, compilation included")
    print(f"model FLOPs {flops / 1e12:.2f} T ({evaluations} evaluations per run): "
          f"{floor:.1f} s at the run's best matmul peak, {peak / 1e9:.0f} GFLOP/s")
    print(f"{'launcher':<15} {'wall s':>8} {'vs ' + first:>15} {'of peak':>8} "
          f"{'mean val loss':>14} {'max diff':>9}")
    for r in rows:
        print(f"{r['launcher']:<15} {r['seconds']:>8.1f} {r['speedup']:>14.2f}x "
              f"{r['peak_fraction']:>8.0%} {r['mean_val_loss']:>14.4f} "
              f"{r['max_loss_difference']:>9.1e}")
    result = {"experiment": experiment, "seeds": seeds, "steps": steps, "rows": rows,
              "val_loss": losses, "backend": jax.default_backend(), "model_flops": flops,
              "peak_flops": peak, "floor_s": floor, "evaluations_per_run": evaluations}
    write_json(out, result)
    return result
