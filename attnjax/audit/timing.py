"""Timing for the audit's speed claims: medians of calls interleaved across the compared
functions, so a change in the (shared, noisy) machine's load falls on all of them alike."""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np


def interleaved_times(calls: dict[str, Callable[[], object]], *, repeats: int = 5,
                      budget_s: float = 0.3, most: int = 25) -> dict[str, list[float]]:
    """``{name: fn}`` (no-argument callables) -> the seconds of each timed call of ``fn()``,
    compile and first call excluded: each function runs at least ``repeats`` times, a fast one
    more (about ``budget_s`` of calls, at most ``most``), in rounds of one call of each in
    turn."""
    counts = {}
    for name, fn in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(fn())
        counts[name] = int(np.clip(budget_s / max(time.perf_counter() - start, 1e-9),
                                   repeats, max(most, repeats)))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(max(counts.values(), default=0)):
        for name, fn in calls.items():
            if round_ < counts[name]:
                start = time.perf_counter()
                jax.block_until_ready(fn())
                times[name].append(time.perf_counter() - start)
    return times


def interleaved_medians(calls: dict[str, Callable[[], object]], **counts) -> dict[str, float]:
    """The median of each function's ``interleaved_times`` (same arguments)."""
    return {name: float(np.median(t)) for name, t in interleaved_times(calls, **counts).items()}


def blocked_medians(calls: dict[str, Callable[[], object]], blocks: int,
                    **counts) -> tuple[dict[str, float], list[dict[str, float]]]:
    """``interleaved_times`` of ``calls`` run ``blocks`` times in a row: each function's median
    over all of them, and each block's medians (their spread shows the machine's noise)."""
    runs = [interleaved_times(calls, **counts) for _ in range(blocks)]
    pooled = {name: float(np.median(sum((run[name] for run in runs), []))) for name in calls}
    return pooled, [{name: float(np.median(t)) for name, t in run.items()} for run in runs]


def spread(ratios: list[float], limit: float) -> str:
    """``blocks x1.02, x0.97, x1.15``: a measured ratio in each block of timing rounds, and
    whether ``limit`` lies among them (then the verdict moves with the machine's load)."""
    text = "blocks " + ", ".join(f"x{r:.2f}" for r in ratios)
    if min(ratios) <= limit < max(ratios):
        text += f": x{limit:g} is inside their spread, the verdict moves with the machine's load"
    return text
