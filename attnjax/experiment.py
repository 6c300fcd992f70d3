"""Experiment files: ``experiments/<name>.py`` with ``get_config()`` (and later ``get_sweep()``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from attnjax.config import Config, apply_overrides


def load_experiment(path: str | Path) -> ModuleType:
    """Import an experiment file by path."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"experiment file {str(path)!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"attnjax_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"experiment file {str(path)!r} defines no get_config()")
    return module


def experiment_config(path: str | Path, overrides: list[str] | dict = ()) -> Config:
    """``get_config()`` of the file with ``KEY=VALUE`` overrides applied (validated)."""
    config = load_experiment(path).get_config()
    return apply_overrides(config, overrides) if overrides else config
