"""The C allocator's policy for a process that runs compiled programs: freed memory is kept.

XLA:CPU takes each call's temporary buffer from ``malloc`` and frees it when the call ends.
glibc serves a request above its mmap threshold (32 MiB at most) with a fresh mapping that it
unmaps when freed, so every call of a program whose temporaries pass it (attention's gradient
at 1024 tokens and more, a training step at one step per dispatch) page-faults the buffer in
again, zero-filled by the kernel. Kept in glibc's heap instead (``M_MMAP_MAX = 0``, with the
heap trimmed only past 2 GiB free), the next call reuses it. XLA runs programs on threads of
its own, and glibc gives such a thread an arena of its own, a heap of at most 64 MiB: a larger
request is mapped whatever ``M_MMAP_MAX`` says (flash attention's forward pass at 4096 tokens
asks for 85 MiB at every call). One arena for every thread (``M_ARENA_MAX = 1``)
serves it from the main heap too. The price is that a process holds on to its peak heap until
it exits. What it saves: ``attnjax bench attention`` and ``attnjax bench torch``
(docs/PERFORMANCE.md).

The ``attnjax`` command applies it to its own process, to the worker processes of a sweep,
and to the PyTorch worker it compares against (through ``GLIBC_TUNABLES``, read when a process
starts); a program importing attnjax as a library decides for itself (``keep_freed_memory``,
before its first computation: glibc reads the limit on arenas when a thread first needs one).
``ATTNJAX_KEEP_FREED=0`` leaves the allocator as it is; other C libraries (musl) are left
alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameters (malloc.h) and the values of the policy
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
POLICY = {"mmap_max": (M_MMAP_MAX, 0), "trim_threshold": (M_TRIM_THRESHOLD, 2**31 - 1),
          "arena_max": (M_ARENA_MAX, 1)}
OPT_OUT = "ATTNJAX_KEEP_FREED"


def wanted(environ=os.environ) -> bool:
    """Whether the policy applies: unless ``ATTNJAX_KEEP_FREED=0``."""
    return environ.get(OPT_OUT, "1") != "0"


def keep_freed_memory() -> bool:
    """Apply the policy to this process (glibc's ``mallopt``); True where it took effect."""
    if not wanted():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError):                    # no C library, or not glibc
        return False
    return all(mallopt(param, value) == 1 for param, value in POLICY.values())


def child_environment(environ=os.environ) -> dict:
    """``environ`` with the policy for a process it starts, as glibc's tunables."""
    if not wanted(environ):
        return dict(environ)
    tunables = [f"glibc.malloc.{name}={value}" for name, (_, value) in POLICY.items()]
    given = environ.get("GLIBC_TUNABLES")
    return {**environ, "GLIBC_TUNABLES": ":".join([given, *tunables] if given else tunables)}
