"""Sweep launchers (``attnjax bench sweep``): the wall time of one sweep with each launcher,
compilation and worker start-up included, against its arithmetic floor (the sweep's model
FLOPs at the matmul peak measured in the same run); the runs of every launcher must agree."""

from __future__ import annotations

import os
import tempfile
import time

import jax
import numpy as np

from attnjax.bench.common import write_json
from attnjax.bench.flops import matmul_peak_flops, run_flops
from attnjax.config import apply_overrides
from attnjax.experiment import experiment_config
from attnjax.rundir import SweepDir
from attnjax.sweep.launch import launch_runs
from attnjax.sweep.spec import Run


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
