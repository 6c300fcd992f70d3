"""A sweep's record (``sweep.json`` of a sweep directory, see ``attnjax.rundir``): what the
sweep is and how far it got. Written only by the launching process, atomically, after every
change, so a killed sweep leaves a readable record.

    {"experiment": "experiments/heads.py", "overrides": ["train.steps=100"],
     "launcher": "vmap", "headline": ["max_attn_logit", ...],
     "runs": [{"name": "num_heads=4,seed=1", "overrides": {...},
               "status": "pending" | "running" | "finished" | "failed" | "interrupted",
               "error": null | "ValueError: ...", "summary": null | {...the run's summary...},
               "evals": {"rope+yarn": {"64": {"loss": ..., "accuracy": ...}}}}]}

Each run's own directory is the truth the launcher resumes from; the record mirrors it.
``headline``: the experiment's headline metrics (``attnjax.sweep.headline``), stored as data
so that reading the sweep runs none of the experiment's code.
"""

from __future__ import annotations

from attnjax.rundir import SweepDir
from attnjax.sweep.spec import Run


def open_record(sweep_dir: SweepDir, experiment: str, overrides: list[str], launcher: str,
                runs: list[Run], headline: list[str]) -> dict:
    """The sweep's record, created or checked against an existing one (same experiment and
    overrides; new runs of an edited ``get_sweep()`` are appended as pending)."""
    if sweep_dir.exists():
        record = sweep_dir.record()
        if record["overrides"] != list(overrides):
            raise ValueError(f"{str(sweep_dir.path)!r} holds a sweep run with overrides "
                             f"{record['overrides']}, not {list(overrides)}; use a new --workdir")
    else:
        record = {"experiment": str(experiment), "overrides": list(overrides), "runs": []}
    record["launcher"], record["headline"] = launcher, headline
    known = {entry["name"] for entry in record["runs"]}
    for run in runs:
        if run.name not in known:
            record["runs"].append({"name": run.name, "overrides": run.overrides,
                                   "status": "pending", "error": None, "summary": None,
                                   "evals": {}})
    sweep_dir.save(record)
    return record


def entry(record: dict, name: str) -> dict:
    return next(e for e in record["runs"] if e["name"] == name)
