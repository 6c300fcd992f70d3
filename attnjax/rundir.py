"""Run and sweep directories: the only code that knows their layout.

    RUN/                          a run directory (``RunDir``)
      config.json                 the run's Config, stored by the first ``train``
      metrics.jsonl               one JSON object per logged step (a torn last line is ignored)
      summary.json                written last, atomically: the run finished
      ckpt/                       orbax checkpoints: latest 2 + best-N (``attnjax.checkpoint``)
      tensorboard/                TensorBoard events of the same scalars
      evals/<label>.json          evaluation variants: {"<length>": {"loss", "accuracy"}}
      eval.json                   the last ``attnjax eval``: checkpoint, step, overrides, results
      error.txt                   traceback of a sweep run that failed
    SWEEP/                        a sweep directory (``SweepDir``)
      sweep.json                  the sweep's record (``attnjax.sweep.record``)
      <run name>/                 one run directory per run

JSON files other than metrics.jsonl are written atomically (a temporary file, then
``os.replace``), so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from attnjax.checkpoint import Checkpoints
from attnjax.config import Config, from_dict, to_dict

WHICH = ("best", "latest")              # the checkpoints ``RunDir.params`` can load
RECENT_SECONDS = 120                    # metrics written this recently + no summary = running


class _Absent:
    def __repr__(self):
        return "(absent)"


ABSENT = _Absent()      # the value of a key one of two compared dicts does not have


def write_json_atomic(path: str | Path, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path):
    """The JSON in ``path``, or None if there is no such file."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg}, line {error.lineno})") from None


def config_differences(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """``(dotted key, old value, new value)`` for every key whose value differs, ``ABSENT``
    where a dict lacks the key; nested dicts are compared key by key, in sorted order."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, ABSENT), new.get(key, ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [(f"{key}.{k}", va, vb) for k, va, vb in config_differences(a, b)]
        elif a != b:
            out.append((key, a, b))
    return out


class NoCheckpointError(ValueError):
    """A run directory without a checkpoint that can be loaded."""


class RunDir:
    """One run directory (see the module docstring); nothing is read until asked."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "ckpt"

    # ------------------------------------------------------------------------ the config

    def exists(self) -> bool:
        """Whether this is a run directory (it has a config.json)."""
        return (self.path / "config.json").is_file()

    def config_dict(self) -> dict:
        """The stored config as raw JSON."""
        data = _read_json(self.path / "config.json")
        if data is None:
            raise ValueError(f"{str(self.path)!r} is not a run directory (no config.json)")
        return data

    def config(self) -> Config:
        """The stored config; fields added since the run started take their defaults."""
        return from_dict(Config, self.config_dict())

    def prepare(self, config: Config, store: bool = True) -> None:
        """Create the directory and store ``config``, or check it equals the stored one;
        ``store=False`` (the other processes of a multi-process run): only check."""
        try:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as error:
            raise ValueError(f"workdir {str(self.path)!r} is not writable "
                             f"({error.strerror})") from None
        as_json = json.loads(json.dumps(to_dict(config)))       # tuples read back as lists
        if not self.exists():
            if store:
                write_json_atomic(self.path / "config.json", as_json)
            return
        stored = json.loads(json.dumps(to_dict(self.config())))
        changed = [f"{key}: {a!r} -> {b!r}" for key, a, b in config_differences(stored, as_json)]
        if changed:
            raise ValueError(f"workdir {str(self.path)!r} holds a run with another config "
                             f"({'; '.join(changed[:3])}); use a new --workdir")

    # ------------------------------------------------------------------- progress, results

    def summary(self) -> dict | None:
        """The run's summary, or None if it has not finished."""
        return _read_json(self.path / "summary.json")

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.path / "summary.json", summary)

    def metrics(self) -> list[dict]:
        """Every complete record of metrics.jsonl (a torn last line is ignored)."""
        if not self.metrics_path.is_file():
            return []
        records = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return records

    def is_running(self, recent_seconds: float = RECENT_SECONDS) -> bool:
        """No summary, and metrics written in the last ``recent_seconds`` or an unfinished
        checkpoint save."""
        if (self.path / "summary.json").exists():
            return False
        fresh = (self.metrics_path.is_file()
                 and time.time() - self.metrics_path.stat().st_mtime < recent_seconds)
        return fresh or any(self.checkpoint_dir.glob("*.orbax-checkpoint-tmp*"))

    def error(self) -> str | None:
        """The traceback of a failed sweep run, or None."""
        path = self.path / "error.txt"
        return path.read_text() if path.is_file() else None

    def write_error(self, trace: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "error.txt").write_text(trace)

    def evals(self) -> dict:
        """Evaluation variants: label -> the JSON of ``evals/<label>.json``, by label."""
        return {path.stem: _read_json(path)
                for path in sorted((self.path / "evals").glob("*.json"))}

    def write_eval_variant(self, label: str, results: dict) -> None:
        (self.path / "evals").mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path / "evals" / f"{label}.json", results)

    def write_eval(self, record: dict) -> None:
        """The record of an ``attnjax eval`` (eval.json)."""
        write_json_atomic(self.path / "eval.json", record)

    # ------------------------------------------------------------------------- checkpoints

    def checkpoints(self, keep_best: int = 1, read_only: bool = False) -> Checkpoints:
        return Checkpoints(self.checkpoint_dir, keep_best, read_only=read_only)

    def has_checkpoint(self) -> bool:
        """Whether ckpt/ holds a finished save (usable or not)."""
        return self.checkpoint_dir.is_dir() and any(
            p.name.isdigit() for p in self.checkpoint_dir.iterdir())

    def params(self, which: str = "best") -> tuple[Config, object, int]:
        """``(config, params, step)`` of the best or latest good checkpoint, opened read-only
        (a run still training is left untouched); ``NoCheckpointError`` without one."""
        if which not in WHICH:
            raise ValueError(f"which={which!r} is not valid; choices: {', '.join(WHICH)}")
        config = self.config()
        params = step = None
        if self.has_checkpoint():
            checkpoints = self.checkpoints(config.train.keep_best, read_only=True)
            try:
                params, step = checkpoints.restore_params(
                    checkpoints.best_step() if which == "best" else None)
            finally:
                checkpoints.close()
        if params is None:
            raise NoCheckpointError(f"{str(self.path)!r} has no usable checkpoint")
        return config, params, step


class SweepDir:
    """One sweep directory (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def record_path(self) -> Path:
        return self.path / "sweep.json"

    def exists(self) -> bool:
        return self.record_path.is_file()

    def record(self) -> dict:
        """The sweep's record; ``ValueError`` if there is none or it is not one."""
        data = _read_json(self.record_path)
        if data is None:
            raise ValueError(f"{str(self.path)!r} is not a sweep directory "
                             f"(no {self.record_path})")
        if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
            raise ValueError(f"{self.record_path} has no 'runs' list")
        return data

    def save(self, record: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.record_path, record)

    def run(self, name: str) -> RunDir:
        return RunDir(self.path / name)
