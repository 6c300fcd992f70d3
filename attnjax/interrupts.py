"""SIGTERM as Ctrl-C: ``raise_interrupt`` is the handler that turns the signal a scheduler or
``kill`` sends into ``KeyboardInterrupt`` in the main thread, so that the ``finally`` blocks of
what was running (a sweep's workers, an import's staging directory) clean up before the
process ends, and the command line says in one line that it was interrupted."""

from __future__ import annotations

import signal


def raise_interrupt(signum, frame):
    """A signal handler: raise ``KeyboardInterrupt('signal SIGTERM')`` (the signal's name)."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")
