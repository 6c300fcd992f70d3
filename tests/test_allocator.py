"""The allocator policy of the ``attnjax`` process (``attnjax.allocator``): a 64 MiB buffer, and
a 96 MiB one asked for by another thread (XLA's, which run the programs), are served from
glibc's heap instead of mappings of their own, in the process that applies it and in a child
started with ``child_environment``; ``ATTNJAX_KEEP_FREED=0`` leaves both alone."""

import json
import platform
import subprocess
import sys

import pytest

from attnjax.allocator import OPT_OUT, child_environment

# The bytes glibc maps (mallinfo2's hblkhd) for a 64 MiB buffer while it is held, and whether
# the heap still holds it after it is freed (arena bytes, its top chunk not trimmed); then the
# bytes it maps for a 96 MiB buffer that a thread asks for (more than a thread's own arena,
# 64 MiB at most, can hold). argv[1]: "apply" calls keep_freed_memory first.
PROBE = r"""
import ctypes, json, sys, threading
from attnjax.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "apply" else None

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = libc.mallinfo2().hblkhd
buffer = libc.malloc(64 << 20)
mapped = libc.mallinfo2().hblkhd - before
libc.free(buffer)
heap = libc.mallinfo2().arena

def in_a_thread(mapped_by_thread):
    before = libc.mallinfo2().hblkhd
    buffer = libc.malloc(96 << 20)
    mapped_by_thread.append(libc.mallinfo2().hblkhd - before)
    libc.free(buffer)

thread_mapped = []
thread = threading.Thread(target=in_a_thread, args=(thread_mapped,))
thread.start()
thread.join()
print(json.dumps({"applied": applied, "mapped": mapped, "heap": heap,
                  "thread_mapped": thread_mapped[0]}))
"""


def probe(mode: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")
def test_a_large_buffer_stays_in_the_heap_where_the_policy_applies():
    plain = {k: v for k, v in child_environment().items() if k not in ("GLIBC_TUNABLES", OPT_OUT)}
    default = probe("none", plain)
    assert default["mapped"] >= 64 << 20                 # glibc's default: a mapping of its own
    assert default["thread_mapped"] >= 96 << 20
    # without one arena for every thread, the thread's buffer is mapped even so
    no_mappings = {**plain, "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}
    assert probe("none", no_mappings)["thread_mapped"] >= 96 << 20
    applied = probe("apply", plain)
    assert applied["applied"] is True and applied["mapped"] == applied["thread_mapped"] == 0
    assert applied["heap"] >= 64 << 20                   # freed, and kept for the next call
    child = probe("none", child_environment(plain))
    assert child["mapped"] == child["thread_mapped"] == 0 and child["heap"] >= 64 << 20
    refused = probe("apply", {**plain, OPT_OUT: "0"})
    assert refused["applied"] is False and refused["mapped"] >= 64 << 20
    assert refused["thread_mapped"] >= 96 << 20


def test_the_child_environment_adds_to_tunables_already_given():
    env = child_environment({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0", "HOME": "/h"})
    assert env == {"HOME": "/h", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:"
                   "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647:"
                   "glibc.malloc.arena_max=1"}
    assert child_environment({OPT_OUT: "0", "HOME": "/h"}) == {OPT_OUT: "0", "HOME": "/h"}
