"""The machine a measurement ran on, in one line (reports state it beside their figures)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe() -> str:
    """The CPU model and core count, and the jax version and backend."""
    import jax
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return (f"{cpu}, {len(os.sched_getaffinity(0))} cores; jax {jax.__version__} "
            f"({jax.default_backend()})")
