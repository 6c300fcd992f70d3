"""Per-run overhead (``attnjax bench startup``), and what JAX's persistent compilation cache
saves.

The same run is trained twice, each time by a new ``attnjax train`` process into a new run
directory, both processes sharing one compilation cache that starts empty. Per process: its
wall time (interpreter start and imports included), the phases of its ``summary.json``
(``attnjax.train.loop``: setup, first dispatch, training, logging, evaluation, checkpoints)
and how many files it added to the cache (each compiled program adds its own). The second
process finds every program the first compiled, so it adds none and its first dispatch no
longer compiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnjax.bench.common import write_json
from attnjax.rundir import RunDir
from attnjax.train.loop import PHASES


def _cache_entries(cache: Path) -> int:
    return sum(1 for p in cache.rglob("*") if p.is_file()) if cache.is_dir() else 0


def startup_overhead(experiment: str, overrides: list[str] = (), runs: int = 2) -> list[dict]:
    """One row per process: ``wall_s``, the summary's ``seconds`` and ``new_cache_entries``."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        env = {**os.environ, "ATTNJAX_COMPILE_CACHE": str(cache)}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)        # this benchmark's cache, not another
        for i in range(runs):
            workdir, before = Path(tmp) / f"run{i}", _cache_entries(cache)
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "attnjax.cli", "train", experiment,
                                   *overrides, "--workdir", str(workdir), "--no-progress"],
                                  env=env, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if done.returncode:
                raise RuntimeError(f"attnjax train failed: {done.stderr.strip()[-2000:]}")
            rows.append({"process": i + 1, "wall_s": wall,
                         "seconds": RunDir(workdir).summary()["seconds"],
                         "new_cache_entries": _cache_entries(cache) - before})
    return rows


def run_startup_benchmark(experiment: str = "experiments/baseline.py",
                          overrides: list[str] = (), out: str | None = None) -> list[dict]:
    """``startup_overhead`` as a table (seconds per phase, one column per process)."""
    rows = startup_overhead(experiment, overrides)
    print(f"{experiment} {' '.join(overrides)}: the same run in new processes, one shared "
          "compilation cache (empty at first)")
    print(f"{'':<24}" + "".join(f"{'process ' + str(r['process']):>12}" for r in rows))
    lines = [("process wall", [r["wall_s"] for r in rows]),
             ("run (summary total)", [r["seconds"]["total"] for r in rows])]
    lines += [(f"  {phase}", [r["seconds"].get(phase, 0.0) for r in rows]) for phase in PHASES]
    for label, values in lines:
        print(f"{label:<24}" + "".join(f"{v:>11.2f}s" for v in values))
    print(f"{'cache files added':<24}" + "".join(f"{r['new_cache_entries']:>12}" for r in rows))
    write_json(out, {"experiment": experiment, "overrides": list(overrides), "rows": rows})
    return rows
