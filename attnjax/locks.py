"""One writer per directory: an exclusive OS file lock held for the whole life of a writer.

The lock is ``flock`` on a file inside the directory, so it dies with its process: a run
killed by SIGKILL or the out-of-memory killer leaves no stale lock. The holder's pid is
written into the file, and a second writer is refused with one line naming it, before it
touches anything. Readers never lock. A process may take a lock it already holds (nested
``hold`` calls share it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = ".writer.lock"

_held: dict[str, list] = {}        # resolved lock path -> [file descriptor, nesting depth]


class BusyError(ValueError):
    """Another process writes this directory."""


@contextlib.contextmanager
def hold(directory: str | Path, what: str):
    """Hold ``directory``'s writer lock (creating the directory) for the ``with`` block;
    ``BusyError`` when another process holds it. ``what``: the directory, in words."""
    directory = Path(directory)
    path = str((directory / LOCK_NAME).resolve())
    if path in _held:
        _held[path][1] += 1
    else:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise ValueError(f"{what} {str(directory)!r} is not writable "
                             f"({error.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise BusyError(f"{what} {str(directory)!r} is being written by process {holder} "
                            f"(it holds {LOCK_NAME}); wait for it to end or use another "
                            "directory") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        _held[path] = [fd, 1]
    try:
        yield
    finally:
        _held[path][1] -= 1
        if not _held[path][1]:
            fd, _ = _held.pop(path)
            os.close(fd)        # closing the last descriptor releases the flock
