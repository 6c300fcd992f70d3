"""Run outputs: a run directory's metrics (one JSON object per logged step) and TensorBoard
events (``attnjax.rundir``), a progress bar with ETA and the current loss, and the seconds
each phase of a run took.

On resume the metrics file is cut back to the restored step, atomically (a torn last line from
a kill is dropped, and said so), so a resumed run's file equals an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import sys
import threading
import time

from tqdm import tqdm

from attnjax.rundir import RunDir


def _quiet_full_disk(hook):
    """``threading.excepthook`` that drops the "no space left on device" of TensorBoard's writer
    thread, which would print a traceback, and passes everything else to ``hook``: a full disk
    is reported in one line where the run writes what it resumes from (its checkpoints)."""
    def quiet(args):
        full = isinstance(args.exc_value, OSError) and args.exc_value.errno == errno.ENOSPC
        if not (full and type(args.thread).__module__.startswith("tensorboardX")):
            hook(args)
    return quiet


class MetricsWriter:
    """Appends records to a run's metrics file and scalars to its TensorBoard events."""

    def __init__(self, run_dir: RunDir, resume_step: int, enabled: bool = True):
        """``enabled=False``: write nothing (the processes of a multi-process run other than
        the first)."""
        self.enabled = enabled
        if not enabled:
            return
        self.path = run_dir.metrics_path
        run_dir.cut_metrics(resume_step)
        from tensorboardX import SummaryWriter
        logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)  # NaN: metrics.jsonl has it
        self.tensorboard = SummaryWriter(str(run_dir.tensorboard_dir),
                                         purge_step=resume_step + 1)
        self._excepthook = threading.excepthook
        threading.excepthook = _quiet_full_disk(self._excepthook)

    def write(self, step: int, record: dict):
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _plain(v) for k, v in record.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(key, value, step)

    def close(self):
        if self.enabled:
            try:
                self.tensorboard.close()
            finally:
                threading.excepthook = self._excepthook


def _plain(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


class Progress:
    """A tqdm bar on stderr: steps done of total, rate, ETA, latest loss."""

    def __init__(self, total: int, start: int, enabled: bool = True):
        self.bar = tqdm(total=total, initial=start, disable=not enabled, file=sys.stderr,
                        dynamic_ncols=True, unit="step", smoothing=0.1)

    def update(self, steps: int, **postfix):
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)
        self.bar.update(steps)

    def close(self):
        self.bar.close()


class Phases:
    """Wall seconds per phase of a run: ``with phases("evaluation"): ...`` adds the block's
    time to ``phases.seconds["evaluation"]``; a phase entered inside another counts in the
    inner one only."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._inner: list[float] = []     # per open phase: seconds spent in phases inside it

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if self._inner:
            self._inner[-1] += seconds

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            inner = self._inner.pop()
            self.add(name, time.perf_counter() - start - inner)
