"""What the benchmarks share: ``median_seconds`` (the timing rule of every benchmark) and
``write_json`` (a result with the machine it was measured on)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

from attnjax.machine import describe


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
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"machine": describe(), **result}, indent=2))
        print(f"wrote {out}")
