"""Run outputs: ``metrics.jsonl`` (one JSON object per logged step), TensorBoard events, and a
progress bar with ETA and the current loss.

On resume the metrics file is cut back to the restored step (and a torn last line from a kill
is dropped), so a resumed run's file equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from tqdm import tqdm


def read_metrics(path: str | Path) -> list[dict]:
    """Every complete record of a ``metrics.jsonl`` (a torn last line is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


class MetricsWriter:
    """Appends records to ``workdir/metrics.jsonl`` and scalars to TensorBoard."""

    def __init__(self, workdir: Path, resume_step: int):
        self.path = workdir / "metrics.jsonl"
        kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        from tensorboardX import SummaryWriter
        logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)  # NaN: metrics.jsonl has it
        self.tensorboard = SummaryWriter(str(workdir / "tensorboard"), purge_step=resume_step + 1)

    def write(self, step: int, record: dict):
        record = {"step": int(step), **{k: _plain(v) for k, v in record.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(key, value, step)

    def close(self):
        self.tensorboard.close()


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
