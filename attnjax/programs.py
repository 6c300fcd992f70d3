"""Programs kept between processes, so a command's second call starts warm.

JAX's persistent compilation cache (``attnjax.compilation``) spares a new process XLA's
compilation, but not what comes before it: tracing the Python model into a program and
lowering that to StableHLO, most of what a warm ``attnjax generate`` spends before its first
token. ``kept_call(key, fn, *args)`` calls the jitted ``fn`` through its exported program
(``jax.export``): the first process traces and lowers ``fn`` once, as a jitted call would,
and writes the serialized program beside the compilation cache; a later process reads it back,
calls it without tracing the model, and the compilation cache gives it the executable. The
program is the same StableHLO the jitted call compiles, so it computes the same numbers.

A program is found by the SHA-256 of ``key`` (the caller's name for everything ``fn`` closes
over: a config, its static arguments), the arguments' tree structure, shapes and dtypes,
attnjax's own source (every module's bytes: an edited kernel is a new program), the versions
of jax and jaxlib, the JAX settings that change a trace (64-bit types, matmul precision), the
backend and ``XLA_FLAGS``. It is written to a temporary file
and renamed into place, so a reader sees a whole file or none; a file that does not
deserialize (damaged, or from another version) is traced again and replaced. Without a
compilation cache directory (``ATTNJAX_COMPILE_CACHE`` empty) nothing is kept.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from pathlib import Path

import jax
import jaxlib
import numpy as np

from attnjax.outputs import write_atomic

SUBDIRECTORY = "attnjax-programs"     # beside the compiled executables, in the cache directory
KEPT_IN_PROCESS = 32                  # programs this process holds, the least recent dropped
_CALLS: dict[str, object] = {}        # this process's programs by digest, each jitted once


@functools.cache
def _source_digest() -> str:
    """The SHA-256 of attnjax's modules, by path and bytes."""
    root, digest = Path(__file__).parent, hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _digest(key: str, args) -> str:
    leaves, tree = jax.tree_util.tree_flatten(args)
    shapes = [(np.shape(x), str(jax.typeof(x).dtype)) for x in leaves]
    parts = (key, str(tree), shapes, _source_digest(), jax.__version__, jaxlib.__version__,
             jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision,
             jax.default_backend(), os.environ.get("XLA_FLAGS", ""))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _directory() -> Path | None:
    cache = jax.config.jax_compilation_cache_dir
    return Path(cache) / SUBDIRECTORY if cache else None


def _read(path: Path):
    """The exported program at ``path``, or None where there is none that deserializes."""
    try:
        return jax.export.deserialize(bytearray(path.read_bytes()))
    except Exception:      # absent, damaged, another version's: traced again and replaced
        return None


def _write(path: Path, exported) -> None:
    """``exported`` serialized at ``path`` atomically, through a temporary file of this
    process's (another may write the same program at once); a cache that cannot be written
    keeps nothing (the call goes on)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, exported.serialize(), f".{os.getpid()}.tmp")


def kept_call(key: str, fn, *args):
    """``fn(*args)`` (``fn`` jitted) through its kept program (the module docstring)."""
    directory = _directory()
    if directory is None:
        return fn(*args)
    digest = _digest(key, args)
    call = _CALLS.pop(digest, None)
    if call is None:
        path = directory / f"{digest}.jaxexport"
        exported = _read(path)
        if exported is None:
            specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x),
                                                                jax.typeof(x).dtype), args)
            exported = jax.export.export(fn)(*specs)
            _write(path, exported)
        call = jax.jit(exported.call)
    _CALLS[digest] = call                     # the most recent last
    while len(_CALLS) > KEPT_IN_PROCESS:
        del _CALLS[next(iter(_CALLS))]
    return call(*args)
