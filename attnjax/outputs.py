"""Where commands write: the directories and files their options name (``--out``, ``--workdir``,
``--publish``), and the result files they save into a run. Each way such a place can be wrong
is one ``ValueError`` line naming the option, the path and the reason, so that the command
line shows that line instead of a traceback (``FileExistsError``, ``NotADirectoryError``,
``PermissionError`` from deep inside a writer):

- ``output_directory``: a directory to write into: it, or one of its parents, is a file; or
  it cannot be written (a read-only file system, no permission). Creates it, or (``create=False``,
  for a command that refuses bad input before writing anything) only checks it could.
- ``output_file``: a file to write: it is a directory, or its directory fails as above.
- ``saving``: around the write of a result file (``eval.json``) into a run: any ``OSError`` is
  one ``NotSavedError`` line, ``could not save NAME in DIR (REASON)``, which a read command
  prints after its results instead of failing (see ``attnjax eval``).
- ``staged_directory``: a directory written whole or not at all (an imported run, an
  exported model): written in a staging directory beside it and renamed into place.
- ``write_atomic``: a file written whole or not at all, through a temporary file beside it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

from attnjax.interrupts import raise_interrupt


def write_atomic(path: str | Path, data: bytes, tmp_suffix: str = ".tmp") -> None:
    """Write ``data`` to ``path`` through ``path`` + ``tmp_suffix`` and ``os.replace``: a
    reader, or a process killed midway, sees the old file or the new one, never part of one
    (writers in several processes at once each need a suffix of their own)."""
    path = Path(path)
    tmp = path.with_name(path.name + tmp_suffix)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:       # a full disk, a directory in the way: no stray half file
        with contextlib.suppress(OSError):       # (a read-only one refuses the unlink too)
            tmp.unlink(missing_ok=True)
        raise


class NotSavedError(ValueError):
    """A result file that could not be written into a directory (one line: the file, the
    directory, the reason)."""


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (a dangling symbolic link counts)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return candidate


def _not_a_directory(path: Path) -> str:
    """Why ``path``, which exists, is no directory to write into, in words."""
    if path.is_symlink() and not path.exists():
        return "is a broken symbolic link"
    return "is a file, not a directory" if path.is_file() else "is not a directory"


def _read_only_reason(directory: Path) -> str:
    """Why the existing ``directory`` cannot be written into, as the OS would say it."""
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "Read-only file system" if read_only else "Permission denied"


def _checked_place(path: Path, flag: str, named: Path) -> Path:
    """The nearest existing of ``path`` and its ancestors, checked to be a directory, for the
    directory ``path`` that option ``flag`` (given ``named``) is to write into; else one
    ValueError line."""
    existing = _nearest_existing(path)
    if not existing.is_dir():
        where = "" if existing == named else f": {str(existing)!r}"
        raise ValueError(f"{flag} {str(named)!r}{where} {_not_a_directory(existing)}")
    return existing


def output_directory(path: str | Path, flag: str, create: bool = True) -> Path:
    """The directory ``path`` that option ``flag`` (e.g. ``--out``) names for a command's
    output: created with its parents and checked writable (a file is created in it and
    removed); with ``create=False`` only checked that it could be (nothing is written). One
    ValueError line naming ``flag``, the path and the reason otherwise: it exists as a file, a
    parent is a file, or it cannot be written (read-only, no permission)."""
    path = Path(path)
    existing = _checked_place(path, flag, path)
    unwritable = (f"{flag} {str(path)!r} is not writable" if existing == path else
                  f"{flag} {str(path)!r} cannot be created in {str(existing)!r}")
    if not create:
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{unwritable} ({_read_only_reason(existing)})")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ValueError(f"{unwritable} ({error.strerror or type(error).__name__})") from None
    return path


def output_file(path: str | Path, flag: str) -> Path:
    """The file ``path`` that option ``flag`` names for a command to write (e.g. ``bench
    --out FILE.json``), checked before the command works: not a directory, not a read-only
    file, and its directory as ``output_directory(..., create=False)`` checks it; nothing is
    written. One ValueError line naming ``flag``, the path and the reason otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory, not a file")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ValueError(f"{flag} {str(path)!r} is not writable "
                             f"({_read_only_reason(path.parent)})")
        return path
    existing = _checked_place(path.parent, flag, path)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r} cannot be written in {str(existing)!r} "
                         f"({_read_only_reason(existing)})")
    return path


@contextlib.contextmanager
def saving(name: str, directory: str | Path):
    """Around the writing of the file ``name`` into ``directory`` (a result a command keeps
    beside its input, e.g. a run's ``eval.json``): an ``OSError`` (a read-only or full file
    system, no permission, a directory where the file should be) becomes one
    ``NotSavedError`` line, ``could not save NAME in DIR (REASON)``."""
    try:
        yield
    except OSError as error:
        raise NotSavedError(f"could not save {name} in {str(directory)!r} "
                            f"({error.strerror or type(error).__name__})") from None


@contextlib.contextmanager
def staged_directory(path: str | Path, verb: str):
    """Around the writing of the directory ``path`` (which must not exist, or be empty): yields
    a staging directory beside it, ``.<verb>-<name>-<pid>``, renamed to ``path`` when the block
    ends, so that no reader ever sees part of it. An error, Ctrl-C or SIGTERM (turned into
    ``KeyboardInterrupt`` for the block, in the main thread) removes the staging directory on
    the way out; those a SIGKILL left (their process gone) are removed first."""
    path = Path(path)
    remove_stale_staging(path, verb)
    staging = path.with_name(f".{verb}-{path.name}-{os.getpid()}")
    previous = (signal.signal(signal.SIGTERM, raise_interrupt)
                if threading.current_thread() is threading.main_thread() else None)
    try:
        staging.mkdir(parents=True)
        yield staging
        os.rename(staging, path)          # replaces an empty directory at ``path``
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def remove_stale_staging(path: Path, verb: str) -> None:
    """Remove the staging directories (``staged_directory``) of ``path`` whose process is gone
    (killed by SIGKILL, which no ``finally`` survives)."""
    for staging in path.parent.glob(f"{glob.escape(f'.{verb}-{path.name}')}-*"):
        pid = staging.name.rsplit("-", 1)[1]
        if pid.isdigit() and not running(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0 checks without sending one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's
        return True
    return True
