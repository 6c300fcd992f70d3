"""Claim files: ``experiments/claims/<group>/<ID>.py``, one claim each.

A claim file defines ``ID``, ``SOURCE`` (seed article and section), ``CLAIM`` (the claim in one
line), ``CRITERION`` (what confirms it, fixed before any result), ``verdict(results)`` (a
``Verdict``, or ``{part: Verdict}`` for a claim with lettered parts) and ``EXAMPLES`` (made-up
results on both sides of the criterion: ``[(results, {part: word})]``, which the tests check
``verdict`` against). Then either

- an op-level claim: ``measure() -> results`` (no training), or
- a training claim: ``get_config()`` (``attnjax.audit.settings.get_config``: S-text, so runs
  named the same in two claims are one run), ``get_sweep()`` (override dicts, as any
  experiment) and ``measure(runs: Runs) -> results`` on the trained runs;

and optionally ``plot(results, out_dir) -> list[Path]``, ``inputs() -> str`` (what the results
depend on outside the file, e.g. whether a pretrained model is installed: a change measures
them again), and for an op-level claim ``TEST_SIZE`` (module attribute -> value: fewer
lengths, regimes or timing rounds), with which the test suite runs the same measurement on
less. Results are JSON-able dicts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from attnjax.audit.dynamics import diverged
from attnjax.audit.verdict import Verdict
from attnjax.config import Config
from attnjax.rundir import RunDir
from attnjax.sweep.spec import Run, expand

REQUIRED = ("ID", "SOURCE", "CLAIM", "CRITERION", "verdict", "EXAMPLES", "measure")


def _natural(text: str) -> list:
    """Sort key: ``SC2`` before ``SC10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


@dataclasses.dataclass(frozen=True)
class Trained:
    """A trained run of the audit: its ``Run`` (name, overrides, config) and directory."""
    run: Run
    dir: RunDir

    @property
    def config(self) -> Config:
        return self.run.config

    @property
    def summary(self) -> dict:
        summary = self.dir.summary()
        if summary is None:
            raise ValueError(f"run {self.run.name!r} has not finished")
        return summary

    @property
    def failed(self) -> str | None:
        """Why the run failed (an error, or its divergence by CLAIMS.md's definition:
        ``attnjax.audit.dynamics.diverged``), or None."""
        return diverged(self)

    def loss(self, length: int | None = None) -> float:
        """Validation loss at ``length`` (default: the training length)."""
        return self.summary["eval"][str(length or self.config.data.length)]["loss"]


class Runs:
    """The trained runs of one claim, selected by their overrides."""

    def __init__(self, trained: list[Trained]):
        self.all = list(trained)

    def where(self, overrides: dict) -> list[Trained]:
        """The runs whose overrides include every item of ``overrides``, in sweep order."""
        return [t for t in self.all
                if all(k in t.run.overrides and t.run.overrides[k] == v
                       for k, v in overrides.items())]

    def by_seed(self, overrides: dict | None = None) -> dict[int, Trained]:
        """``{seed: run}`` of the arm with these overrides (and no other non-seed override)."""
        wanted = dict(overrides or {})
        arm = [t for t in self.all
               if {k: v for k, v in t.run.overrides.items() if k != "seed"} == wanted]
        if not arm:
            raise KeyError(f"no run with overrides {wanted}")
        return {t.config.seed: t for t in arm}


@dataclasses.dataclass(frozen=True)
class ClaimFile:
    """One loaded claim file (``text``: its source as loaded, which results are keyed by)."""
    path: Path
    module: ModuleType
    text: str

    @property
    def id(self) -> str:
        return self.module.ID

    @property
    def group(self) -> str:
        return self.path.parent.name

    @property
    def trains(self) -> bool:
        return hasattr(self.module, "get_sweep")

    def runs(self) -> list[Run]:
        """The claim's training runs (validated configs), none for an op-level claim."""
        return expand(self.path) if self.trains else []

    def measure(self, runs: Runs | None = None) -> dict:
        return self.module.measure(runs) if self.trains else self.module.measure()

    def verdicts(self, results: dict) -> dict[str, Verdict]:
        """``{claim id or id + part letter: Verdict}``."""
        verdict = self.module.verdict(results)
        if isinstance(verdict, Verdict):
            return {self.id: verdict}
        return {f"{self.id}{part}": v for part, v in verdict.items()}

    def inputs(self) -> str:
        """What its results depend on besides its file and runs (the file's ``inputs()``,
        e.g. a pretrained model's presence): part of their fingerprint."""
        return self.module.inputs() if hasattr(self.module, "inputs") else ""

    def plot(self, results: dict, out_dir: Path) -> list[Path]:
        if not hasattr(self.module, "plot"):
            return []
        out_dir.mkdir(parents=True, exist_ok=True)
        return list(self.module.plot(results, out_dir))


def load_claim(path: str | Path) -> ClaimFile:
    path = Path(path)
    text = path.read_text()
    module = _import(path)
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        raise ValueError(f"claim file {str(path)!r} lacks {', '.join(missing)}")
    if module.ID != path.stem:
        raise ValueError(f"claim file {str(path)!r} defines ID={module.ID!r}; name it "
                         f"{module.ID}.py")
    return ClaimFile(path, module, text)


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"attnjax_claim_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_claims(directory: str | Path, only: list[str] | None = None) -> list[ClaimFile]:
    """The claim files under ``directory`` (``<group>/<ID>.py``, groups and ids in natural
    order), or only the ids in ``only`` (an unknown id is an error listing the valid ones)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"claims directory {str(directory)!r} does not exist")
    paths = sorted((p for p in directory.glob("*/*.py") if not p.name.startswith("_")),
                   key=lambda p: (_natural(p.parent.name), _natural(p.stem)))
    by_id = {p.stem: p for p in paths}
    if only:
        unknown = [i for i in only if i not in by_id]
        if unknown:
            raise ValueError(f"--only: no claim {unknown[0]!r}; valid: {', '.join(by_id)}")
        paths = [p for p in paths if p.stem in set(only)]
    return [load_claim(p) for p in paths]
