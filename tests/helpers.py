"""Plain constants and helpers shared by the test files (fixtures live in ``conftest.py``).

Imported as ``from helpers import ...``: ``tests/`` is on ``sys.path`` through ``pythonpath``
in ``[tool.pytest.ini_options]`` of pyproject.toml.

- ``REPO``: the repository root.
- ``COMPILE_CACHE``: the one persistent JAX compilation cache of a test session. ``conftest.py``
  turns it on for the test processes; ``subprocess_env()`` hands it to the processes tests
  start, so a program compiled once is loaded everywhere else.
- ``run_cli(capsys, *args)``: the command line in this process; ``deterministic(records)``:
  metrics records without their timings, for comparing two runs.
- The tiny configs, as dotted-override dicts (they also go verbatim into the experiment files
  and scripts that subprocess tests write): ``TINY_MODEL`` and ``TINY_SCHEDULE`` are the parts;
  ``TINY_TEXT``, ``TINY_INDUCTION`` and ``TINY_MQAR`` the whole configs per task (``TINY_MLM``
  and ``TINY_CLASSIFY`` those of the encoder family). A file that
  needs another shape derives it from one of these with a visible override,
  ``tiny_config(TINY_MQAR, **{"train.steps": 200})``, never a copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnjax.config import Config, apply_overrides
from attnjax.compilation import quick_compile_flags

REPO = Path(__file__).resolve().parents[1]

# Under the repository's (git-ignored) .pytest_cache: empty on a clean clone, reused by later
# sessions. Entries are keyed by the program, jax/jaxlib version, backend and flags, so a
# stale one is never loaded in place of another; ``rm -rf .pytest_cache`` empties it.
# A directory set through JAX_COMPILATION_CACHE_DIR (e.g. a CI cache) is used instead.
COMPILE_CACHE = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR")
                     or REPO / ".pytest_cache" / "jax-compile")

# Every program is cached, however fast it compiled: a test session compiles thousands of small
# ones, and the subprocess tests (resume after SIGKILL, worker processes) recompile everything
# the process before them already compiled.
COMPILE_CACHE_ENV = {"JAX_COMPILATION_CACHE_DIR": str(COMPILE_CACHE),
                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}

# XLA's CPU optimisation level of the session and the processes it starts: the lowest, as its
# programs run for milliseconds and code generation is most of their cost (every process of
# the suite at one level, so runs compare bit for bit: attnjax.compilation)
SUITE_LEVEL = 0


def subprocess_env(**extra: str) -> dict:
    """The environment for a Python subprocess of a test: this one's, attnjax importable from
    the checkout, the session's compilation cache, and ``extra`` (``XLA_FLAGS`` in it keep
    the session's optimisation level, ``SUITE_LEVEL``)."""
    if "XLA_FLAGS" in extra:
        extra["XLA_FLAGS"] = quick_compile_flags(extra["XLA_FLAGS"], SUITE_LEVEL)
    return {**os.environ, "PYTHONPATH": str(REPO), **COMPILE_CACHE_ENV, **extra}


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """``attnjax ARGS`` in this process: (exit status, stdout, stderr). ``main`` returns the
    status; argparse (errors, --help, --version) raises SystemExit instead."""
    from attnjax import cli
    try:
        code = cli.main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def raises_one_line(fn, *fragments) -> str:
    """``fn()`` raises a one-line ValueError containing every fragment (literally); its
    message."""
    with pytest.raises(ValueError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def deterministic(records: list[dict]) -> list[dict]:
    """Metrics records without ``tokens_per_s`` (wall-clock), the part two runs can share."""
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]


# ---------------------------------------------------------------- tiny configs

# 2 heads of width 8, one layer.
TINY_MODEL = {"model.d_model": 16, "model.num_layers": 1, "model.max_length": 16,
              "model.attention.num_heads": 2}

# 20 steps: a log every 5, evaluation and a checkpoint at 10 and 20 (a resume has one to start
# from), one small evaluation batch.
TINY_SCHEDULE = {"train.batch_size": 4, "train.steps": 20, "train.warmup_steps": 2,
                 "train.log_every": 5, "train.eval_every": 10, "train.checkpoint_every": 10,
                 "train.eval_batches": 1, "train.eval_batch_size": 4}

# Byte-level text; set data.path to a corpus file (None: the built-in corpus).
TINY_TEXT = {**TINY_MODEL, **TINY_SCHEDULE, "data.task": "text", "data.length": 12}

TINY_INDUCTION = {**TINY_MODEL, **TINY_SCHEDULE, "data.task": "induction", "data.length": 16,
                  "data.vocab_size": 16, "model.vocab_size": 16}

# MQAR's 8 key-value pairs and their 8 queries need 24 tokens or more: length 32.
TINY_MQAR = {**TINY_MODEL, **TINY_SCHEDULE, "data.task": "mqar", "data.length": 32,
             "model.max_length": 32, "data.vocab_size": 64, "model.vocab_size": 64}


# The encoder family: masked-language modelling on padded byte-level sentence pairs, and the
# first_repeat classification on [CLS], padded.
TINY_MLM = {**TINY_MODEL, **TINY_SCHEDULE, "model.family": "encoder", "data.task": "mlm",
            "data.length": 12, "model.vocab_size": 260, "data.padding": "right",
            "data.min_length": 5, "data.segments": "pair", "model.type_vocab_size": 2,
            "model.embed_norm": True}
TINY_CLASSIFY = {**TINY_MODEL, **TINY_SCHEDULE, "model.family": "encoder",
                 "model.classifier": "cls", "data.task": "first_repeat", "data.length": 12,
                 "data.vocab_size": 16, "model.vocab_size": 16, "data.padding": "right",
                 "data.min_length": 4}


# The seq2seq family: reversal of padded sequences of 2..11 content tokens (and EOS).
TINY_SEQ2SEQ = {**TINY_MODEL, **TINY_SCHEDULE, "model.family": "seq2seq",
                "data.task": "reversal", "data.length": 12, "data.vocab_size": 12,
                "model.vocab_size": 12, "data.padding": "right", "data.min_length": 3}


def tiny_config(base: dict, **overrides) -> Config:
    """The validated ``Config`` of ``base`` (one of the dicts above) with dotted ``overrides``:
    ``tiny_config(TINY_TEXT, **{"data.path": str(corpus)})``."""
    return apply_overrides(Config(), {**base, **overrides})
