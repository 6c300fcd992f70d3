"""``DIR/sweep.json``: what a sweep is and how far it got. Written only by the launching
process, atomically, after every change, so a killed sweep leaves a readable record.

    {"experiment": "experiments/heads.py", "overrides": ["train.steps=100"],
     "launcher": "vmap",
     "runs": [{"name": "num_heads=4,seed=1", "overrides": {...},
               "status": "pending" | "running" | "finished" | "failed" | "interrupted",
               "error": null | "ValueError: ...", "summary": null | {...summary.json...},
               "evals": {"rope+yarn": {"64": {"loss": ..., "accuracy": ...}}}}]}

A run's directory is ``DIR/<name>``; its own files (summary.json, checkpoints) are the truth
the launcher resumes from, and the record mirrors them.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnjax.sweep.spec import Run
from attnjax.train.loop import write_json_atomic

RECORD = "sweep.json"


def load_record(directory: str | Path) -> dict:
    path = Path(directory) / RECORD
    if not path.is_file():
        raise ValueError(f"{str(directory)!r} is not a sweep directory (no {RECORD})")
    return json.loads(path.read_text())


def open_record(directory: Path, experiment: str, overrides: list[str], launcher: str,
                runs: list[Run]) -> dict:
    """The sweep's record, created or checked against an existing one (same experiment and
    overrides; new runs of an edited ``get_sweep()`` are appended as pending)."""
    path = directory / RECORD
    if path.is_file():
        record = json.loads(path.read_text())
        if record["overrides"] != list(overrides):
            raise ValueError(f"{str(directory)!r} holds a sweep run with overrides "
                             f"{record['overrides']}, not {list(overrides)}; use a new --workdir")
    else:
        record = {"experiment": str(experiment), "overrides": list(overrides), "runs": []}
    record["launcher"] = launcher
    known = {entry["name"] for entry in record["runs"]}
    for run in runs:
        if run.name not in known:
            record["runs"].append({"name": run.name, "overrides": run.overrides,
                                   "status": "pending", "error": None, "summary": None,
                                   "evals": {}})
    save_record(directory, record)
    return record


def save_record(directory: Path, record: dict):
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(directory / RECORD, record)


def entry(record: dict, name: str) -> dict:
    return next(e for e in record["runs"] if e["name"] == name)
