"""Sweep specification: lists of override dicts, their stable run names, and expansion.

An experiment file may define ``get_sweep() -> list[dict]``, each dict a set of dotted
overrides of ``get_config()`` (``{"model.attention.num_heads": 4, "seed": 1}``). The helpers
build such lists::

    product({"a": [1, 2], "b": [3, 4]})   -> [{a:1,b:3}, {a:1,b:4}, {a:2,b:3}, {a:2,b:4}]
    zip_axes({"a": [1, 2], "b": [3, 4]})  -> [{a:1,b:3}, {a:2,b:4}]
    cross(sweep_1, sweep_2)               -> every merge of one dict from each

A run's name is a pure function of its overrides (keys sorted, so reordering axes never renames
a run): ``num_heads=4,seed=1``. A name longer than a directory name may safely be (``MAX_NAME``
bytes; the file system's limit is 255: a long ``data.path``, or many axes) keeps a readable
prefix and ends in a hash of the full overrides, which stay in the run's config and in
sweep.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from pathlib import Path

from attnjax.config import Config, apply_overrides, parse_overrides
from attnjax.experiment import checked_config, load_experiment

BASE_NAME = "base"
MAX_NAME = 240      # bytes of a run name kept whole; a longer one is shortened (``run_name``)
PREFIX = 150        # bytes of a shortened name's readable prefix (then ``~`` and 16 hex digits)


def product(axes: dict[str, list]) -> list[dict]:
    """Cartesian product of the value lists; the first key varies slowest."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*axes.values())]


def zip_axes(axes: dict[str, list]) -> list[dict]:
    """The i-th values of every list together; all lists must have the same length."""
    lengths = {key: len(values) for key, values in axes.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"zip_axes needs lists of equal length, got {lengths}")
    keys = list(axes)
    return [dict(zip(keys, values)) for values in zip(*axes.values())]


def cross(*sweeps: list[dict]) -> list[dict]:
    """Every combination of one override dict from each sweep, merged (later wins)."""
    return [{k: v for part in combo for k, v in part.items()}
            for combo in itertools.product(*sweeps)]


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "_".join(_format_value(v) for v in value)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", str(value))


def run_name(overrides: dict) -> str:
    """``key=value`` pairs joined by commas, keys sorted; a key is shortened to its last dotted
    part unless two keys of the same run share it. No overrides: ``base``. A name over
    ``MAX_NAME`` bytes becomes its first ``PREFIX`` bytes, ``~`` and the first 16 hex digits
    of the SHA-256 of the overrides as sorted JSON (167 bytes at most)."""
    if not overrides:
        return BASE_NAME
    keys = sorted(overrides)
    last = [key.rsplit(".", 1)[-1] for key in keys]
    short = {key: part if last.count(part) == 1 else key for key, part in zip(keys, last)}
    name = ",".join(f"{short[key]}={_format_value(overrides[key])}" for key in keys)
    if len(name.encode()) <= MAX_NAME:
        return name
    full = json.dumps(overrides, sort_keys=True, default=str)
    digest = hashlib.sha256(full.encode()).hexdigest()[:16]
    prefix = name.encode()[:PREFIX].decode(errors="ignore")
    return f"{prefix}~{digest}"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: its name, the sweep's overrides for it, and its validated config."""
    name: str
    overrides: dict
    config: Config


def expand(experiment: str | Path, overrides: list[str] | dict = ()) -> list[Run]:
    """The runs of an experiment file: ``get_config()`` with each ``get_sweep()`` entry applied,
    then the command-line ``overrides`` (which win). Every config is validated here, before
    anything is compiled; an error names the run."""
    module = load_experiment(experiment)
    entries = module.get_sweep() if hasattr(module, "get_sweep") else [{}]
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"get_sweep() of {str(experiment)!r} must return a list of dicts")
    base = checked_config(module.get_config(), experiment)
    cli = parse_overrides(overrides) if isinstance(overrides, (list, tuple)) else dict(overrides)
    runs, seen = [], {}
    for entry in entries:
        name = run_name(entry)
        if name in seen:
            raise ValueError(f"get_sweep() of {str(experiment)!r} lists run {name!r} twice")
        seen[name] = True
        try:    # the entry and the command line's overrides (which win), validated together
            config = apply_overrides(base, {**entry, **cli})
        except ValueError as error:
            raise ValueError(f"sweep run {name!r}: {error}") from None
        runs.append(Run(name, dict(entry), config))
    return runs
