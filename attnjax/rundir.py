"""Run and sweep directories: the only code that knows their layout.

    RUN/                          a run directory (``RunDir``)
      .writer.lock                held by the one process that writes the run (``writing``)
      config.json                 the run's Config, stored by the first ``train``
      metrics.jsonl               one JSON object per logged step (a torn last line is ignored)
      summary.json                written last, atomically: the run finished
      ckpt/                       orbax checkpoints: latest 2 + best-N (``attnjax.checkpoint``)
      tensorboard/                TensorBoard events of the same scalars
      evals/<label>.json          evaluation variants: {"<length>": {"loss", "accuracy"}}
      eval.json                   the last ``attnjax eval``: checkpoint, step, overrides, results
      error.txt                   traceback of a sweep run that failed
      imported.json               an imported model's source (``attnjax.pretrained.run``)
      tokenizer.json              its tokenizer (``data.tokenizer``, kept relative to RUN)
    SWEEP/                        a sweep directory (``SweepDir``)
      .writer.lock                held by the sweep's driver (``writing``)
      sweep.json                  the sweep's record (``attnjax.sweep.record``)
      <run name>/                 one run directory per run

One process writes a run or sweep directory at a time (``attnjax.locks``); readers take no
lock. Files are replaced atomically (a temporary file, then ``os.replace``), so a reader never
sees half of one, or appended to (metrics.jsonl, whose torn last line, cut short by a kill, is
the end of the file). A run's identity is its config, stored in config.json and with every
checkpoint: a writer with another config is refused against either. No path a run keeps
names its own directory: a file of its own is named relative to it (``RunDir.stored``), so a
run directory can be moved or copied and still read, and resumed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from attnjax import locks
from attnjax.checkpoint import Checkpoints
from attnjax.config import Config, from_dict, to_dict
from attnjax.config.mesh import PLACEMENT
from attnjax.outputs import saving, write_atomic
from attnjax.userfiles import read_json

WHICH = ("best", "latest")              # the checkpoints ``RunDir.params`` can load
IMPORTED = "imported.json"              # the record of an imported model's run
RECENT_SECONDS = 120                    # metrics written this recently + no summary = running
OWN_PATHS = (("data", "tokenizer"),)    # config fields that may name a file of the run itself


class _Absent:
    def __repr__(self):
        return "(absent)"


ABSENT = _Absent()      # the value of a key one of two compared dicts does not have


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (``attnjax.outputs.write_atomic``)."""
    write_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, data) -> None:
    """Write ``data`` as JSON to ``path`` atomically (``write_text_atomic``)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True))


def _read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None if there is no such file; a file that is too
    large, not UTF-8, not JSON or not an object is one line naming it (``read_json``)."""
    return read_json(path) if path.is_file() else None


def _checked_summary(summary: dict, path: Path) -> dict:
    """``summary`` if its fields have the types readers use; else one line naming ``path``."""
    number = (int, float, type(None))
    evals = summary.get("eval", {})
    valid = (isinstance(summary.get("status"), str)
             and isinstance(summary.get("step", 0), int)
             and isinstance(summary.get("skipped_updates", 0), int)
             and isinstance(summary.get("train_loss"), number)
             and isinstance(evals, dict)
             and all(isinstance(r, dict) and isinstance(r.get("loss"), number)
                     for r in evals.values()))
    if not valid:
        raise ValueError(f"{path} is not a run summary (status, step, skipped_updates, "
                         "train_loss, eval with a loss per length)")
    return summary


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


def inside(base: Path, name, what: str) -> Path:
    """``base / name`` for a ``name`` read from a file: a relative path with no ``..``, so
    it stays inside ``base``; else a one-line ValueError naming ``what`` it is."""
    parts = Path(name).parts if isinstance(name, str) else ()
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise ValueError(f"{what} {name!r} is not a path inside {str(base)!r}")
    return base / name


def _normalised(config: Config | dict) -> dict:
    """A config as JSON reads it back (tuples as lists), fields added since it was stored
    at their defaults."""
    if isinstance(config, dict):
        config = from_dict(Config, config)
    return json.loads(json.dumps(to_dict(config)))


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
        """The stored config; fields added since the run started take their defaults; a path
        field kept relative to the run (``stored``) names its file wherever the run now is."""
        data = self.config_dict()
        for section, key in OWN_PATHS:
            value = data[section].get(key) if isinstance(data.get(section), dict) else None
            if isinstance(value, str) and not Path(value).is_absolute() and (
                    self.path / value).is_file():
                data[section][key] = str(self.path.absolute() / value)
        try:
            return from_dict(Config, data)
        except ValueError as error:
            raise ValueError(f"{self.path / 'config.json'}: {error}") from None

    def stored(self, config: Config | dict) -> dict:
        """``config`` as config.json and the checkpoints keep it: JSON as it reads back
        (``_normalised``), each path field (``OWN_PATHS``) that names a file inside this run
        directory written relative to it, so that the run can be moved or copied."""
        data, root = _normalised(config), self.path.absolute()
        for section, key in OWN_PATHS:
            value = data[section].get(key)
            if isinstance(value, str) and Path(value).absolute().is_relative_to(root):
                data[section][key] = str(Path(value).absolute().relative_to(root))
        return data

    def writing(self):
        """The run's writer lock, held for a ``with`` block (``attnjax.locks.hold``)."""
        return locks.hold(self.path, "run directory")

    def prepare(self, config: Config, store: bool = True) -> None:
        """Create the directory and store ``config``, or check it equals the stored one and
        the one its checkpoints were saved with; ``store=False`` (the other processes of a
        multi-process run): only check. A directory holding metrics of a run with neither a
        config nor a checkpoint (another program's files) is refused."""
        as_json = self.stored(config)
        if self.exists():
            self._check_same(self.config(), as_json, "")
        if self.has_checkpoint():
            stored = self._checkpoint_config()
            if stored is not None:
                self._check_same(stored, as_json, "in its checkpoints: ")
        elif not self.exists() and (self.metrics_path.exists() or self.summary_path.exists()):
            raise ValueError(f"workdir {str(self.path)!r} holds metrics.jsonl or summary.json "
                             "but no config.json and no checkpoint (files of another run or "
                             "program); use a new --workdir")
        self._check_writable()
        if store and not self.exists():
            write_json_atomic(self.path / "config.json", as_json)

    def _check_writable(self):
        probe = self.path / f".write-test-{os.getpid()}"
        try:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
        except OSError as error:
            raise ValueError(f"workdir {str(self.path)!r} is not writable "
                             f"({error.strerror})") from None
        finally:
            with contextlib.suppress(OSError):
                probe.unlink(missing_ok=True)

    def _check_same(self, stored: Config | dict, wanted: dict, where: str):
        """Refuse a config that differs from ``stored`` in anything but where the run is
        placed (``train.mesh``: a run resumes on any mesh, its checkpoints resharded)."""
        changed = [f"{key}: {a!r} -> {b!r}"
                   for key, a, b in config_differences(self.stored(stored), wanted)
                   if not key.startswith(PLACEMENT)]
        if changed:
            raise ValueError(f"workdir {str(self.path)!r} holds a run with another config "
                             f"({where}{'; '.join(changed[:3])}); use a new --workdir")

    def _checkpoint_config(self) -> dict | None:
        """The config the newest readable checkpoint was saved with."""
        checkpoints = self.checkpoints(read_only=True)
        try:
            return checkpoints.saved_config()
        finally:
            checkpoints.close()

    # ------------------------------------------------------------------- progress, results

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    def summary(self) -> dict | None:
        """The run's summary, or None if it has not finished."""
        summary = _read_json(self.summary_path)
        return None if summary is None else _checked_summary(summary, self.summary_path)

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary_path, summary)

    def metrics(self) -> list[dict]:
        """Every complete record of metrics.jsonl (a torn last line is the end of the file)."""
        return self._read_metrics()[0]

    def _read_metrics(self) -> tuple[list[dict], bool]:
        """The complete records, and whether a torn line ended the file."""
        if not self.metrics_path.is_file():
            return [], False
        records = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                return records, True
        return records, False

    def cut_metrics(self, step: int) -> None:
        """Keep the records up to ``step`` (a resume continues from there), rewritten
        atomically; a torn last line is dropped, and said so on stderr."""
        records, torn = self._read_metrics()
        if torn:
            print(f"attnjax: {self.metrics_path} ended in a torn line (a write cut short by a "
                  "kill); dropped it", file=sys.stderr)
        kept = [r for r in records if r["step"] <= step]
        write_text_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in kept))

    def is_running(self, recent_seconds: float = RECENT_SECONDS) -> bool:
        """No summary, and metrics written in the last ``recent_seconds`` or an unfinished
        checkpoint save."""
        if self.summary_path.exists():
            return False
        fresh = (self.metrics_path.is_file()
                 and time.time() - self.metrics_path.stat().st_mtime < recent_seconds)
        return fresh or any(self.checkpoint_dir.glob("*.orbax-checkpoint-tmp*"))

    def imported(self) -> dict | None:
        """The record of an imported model (``attnjax import``), or None for a trained run."""
        return _read_json(self.path / IMPORTED)

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
        """The results of evaluation variant ``label`` (evals/<label>.json); a run that cannot
        be written (read-only, full) is one ``NotSavedError`` line naming the file."""
        with saving(f"evals/{label}.json", self.path):
            (self.path / "evals").mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path / "evals" / f"{label}.json", results)

    def write_eval(self, record: dict) -> None:
        """The record of an ``attnjax eval`` (eval.json); a run that cannot be written
        (read-only, full, another user's) is one ``NotSavedError`` line naming the file, which
        ``attnjax eval`` prints after its results."""
        with saving("eval.json", self.path):
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
                params, step = checkpoints.restore_params(best=which == "best")
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
        for run in data["runs"]:          # names become paths: each must stay inside
            if isinstance(run, dict) and isinstance(run.get("name"), str):
                self.run(run["name"])
        return data

    def writing(self):
        """The sweep's writer lock, held for a ``with`` block (``attnjax.locks.hold``)."""
        return locks.hold(self.path, "sweep directory")

    def save(self, record: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.record_path, record)

    def run(self, name: str) -> RunDir:
        """The directory of run ``name``, which must lie inside the sweep directory."""
        return RunDir(inside(self.path, name, f"run name in {self.record_path}"))
