"""Scalar hyperparameters passed to the compiled training program as arguments.

A config splits into a *structure* (everything that decides shapes and the program: widths,
kernel, position encoding, whether dropout is on at all) and *values* (the seed and scalar
hyperparameters below). The program is compiled for the structure and takes the values as
traced arguments, so

- runs that differ only in values reuse one compiled program (the sequential sweep launcher),
- and can train as one ``jax.vmap``-ed program, one lane per run (the vmap launcher).

Inside the program the values are put back into the config as tracers (``inject``); the model
and the optimizer read them from the config as usual and never branch on them. A rate that is
zero stays a concrete zero, not an argument: a traced zero would still draw a dropout mask of
every activation at every step (the whole program compiles out instead).
"""

from __future__ import annotations

import jax.numpy as jnp

from attnjax.config import Config, apply_overrides, program_arguments
from attnjax.config.fields import RATE, derive, lookup
from attnjax.registry import SCALES

# dotted field -> (dtype, canonical value), from the fields declared with ``argument=``; a
# rate (no canonical value: RATE) that is 0 in one run and not in another changes the structure
VALUES = {path: ({int: jnp.int32, float: jnp.float32}[kind], canonical)
          for path, (kind, canonical) in program_arguments(Config).items()}


def value_fields(config: Config) -> tuple[str, ...]:
    """The fields that are program arguments for this config: every value but a rate that is
    zero (structural, so dropout compiles out). A scale policy that reads
    ``scale_multiplier`` on the host (the learned scale's initial value) keeps it structural."""
    fields = tuple(f for f, (_, canonical) in VALUES.items()
                   if canonical != RATE or lookup(config, f) > 0)
    if SCALES.get(config.model.attention.scale).host_multiplier:
        fields = tuple(f for f in fields if f != "model.attention.scale_multiplier")
    return fields


def structure(config: Config) -> Config:
    """The config with every value set to a canonical one: equal structures compile to the
    same program. A rate keeps whether it is zero (a non-zero one becomes 0.5)."""
    canonical = {path: 0.5 if VALUES[path][1] == RATE else VALUES[path][1]
                 for path in value_fields(config)}
    return apply_overrides(config, canonical)


def as_arrays(configs: list[Config], stacked: bool) -> dict:
    """Values of ``configs`` as arrays: stacked ``[runs]`` for a vmapped group, else the
    single config's scalars."""
    fields = value_fields(configs[0])
    make = lambda path, xs: jnp.asarray(xs if stacked else xs[0], VALUES[path][0])
    return {path: make(path, [lookup(c, path) for c in configs]) for path in fields}


def _replace(node, parts: list[str], value):
    child = value if len(parts) == 1 else _replace(getattr(node, parts[0]), parts[1:], value)
    return derive(node, **{parts[0]: child})


def inject(config: Config, traced: dict) -> Config:
    """``config`` with the given fields replaced by (traced) arrays, without validation (the
    concrete configs were validated when they were built). Use only inside a trace."""
    for path, value in traced.items():
        config = _replace(config, path.split("."), value)
    return config


def same_structure(a: Config, b: Config) -> bool:
    return structure(a) == structure(b)

