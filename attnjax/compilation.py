"""How attnjax compiles: JAX's persistent compilation cache, and XLA's CPU backend at
optimisation level 1 for processes that compile many small programs and train each briefly
(the claims audit's workers, the test suite).

Level 1 compiles a small training program in about half the time of the default level and
trains as fast. Levels agree to float32 rounding, not always bit for bit: a decoder's losses
are the same bits at levels 0, 1 and the default, an encoder's or an encoder-decoder's can
differ in the last place, so runs are compared bit for bit only when one level compiled
them (every process of the test suite uses level 0, every worker of the audit level 1). The
test suite goes down to level 0 (``level=0``): its programs run for milliseconds, so code
generation is most of their cost. XLA reads its flags once, when the backend starts, so they
must be in ``XLA_FLAGS`` before a process first computes.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import jax

QUICK_LEVEL = 1
QUICK_COMPILE = f"--xla_backend_optimization_level={QUICK_LEVEL}"


def quick_compile_flags(flags: str | None, level: int = QUICK_LEVEL) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with the CPU backend's optimisation ``level`` added
    (``QUICK_COMPILE`` by default), unless they already choose a level."""
    flags = flags or ""
    if "xla_backend_optimization_level" in flags:
        return flags
    return f"{flags} --xla_backend_optimization_level={level}".strip()


def flags_level() -> int | None:
    """XLA's CPU optimisation level that this process's ``XLA_FLAGS`` choose, None if they
    choose none."""
    match = re.search(r"--xla_backend_optimization_level=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def quick_compiling_workers():
    """Processes started inside compile with ``quick_compile_flags`` of this one's
    ``XLA_FLAGS``; this process's own environment is restored after."""
    saved = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = quick_compile_flags(saved)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK | os.X_OK)


def enable_compile_cache():
    """JAX's persistent compilation cache, so a second invocation skips compilation. Directory:
    ``$ATTNJAX_COMPILE_CACHE`` (empty: off), default ``~/.cache/attnjax/xla``, left off where
    it cannot be written; a directory already set through ``JAX_COMPILATION_CACHE_DIR`` is
    kept."""
    path = os.environ.get("ATTNJAX_COMPILE_CACHE", str(Path.home() / ".cache/attnjax/xla"))
    if path and not _writable(Path(path)):    # (JAX would warn at every program): no cache
        return
    if path and not jax.config.jax_compilation_cache_dir:   # JAX_COMPILATION_CACHE_DIR wins
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
