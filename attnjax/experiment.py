"""Experiment files: ``experiments/<name>.py`` with ``get_config()`` (and optionally
``get_sweep()``, ``get_eval_variants()``, ``get_report()``), and the shared small setting
most of them start from (:func:`small_text`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig, apply_overrides)
from attnjax.rundir import RunDir


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
    """``get_config()`` of the file, or the config a run directory's ``config.json`` holds
    (to train a model like it, e.g. fine-tune an imported one), with ``KEY=VALUE`` overrides
    applied (validated)."""
    if Path(path).suffix == ".json":
        config = RunDir(Path(path).parent).config()
    else:
        config = checked_config(load_experiment(path).get_config(), path)
    return apply_overrides(config, overrides) if overrides else config


def config_from_arguments(arguments: list[str], base: Config | None = None) -> Config:
    """The config command-line ``arguments`` name: an experiment file (``experiment_config``)
    then ``KEY=VALUE`` overrides, or overrides alone on ``base`` (default ``Config()``)."""
    if arguments and "=" not in arguments[0]:
        return experiment_config(arguments[0], arguments[1:])
    return apply_overrides(base or Config(), arguments)


def checked_config(config, path: str | Path) -> Config:
    """``config`` if it is a ``Config``; else one line naming the experiment file."""
    if not isinstance(config, Config):
        raise ValueError(f"get_config() of {str(path)!r} must return an attnjax.config.Config, "
                         f"got {type(config).__name__}")
    return config


def small_text(overrides: dict | None = None) -> Config:
    """The shared small setting of the experiments, with dotted ``overrides`` applied (so an
    experiment's ``get_config()`` shows only what it changes).

    A byte-level language model (vocabulary 256) on the built-in corpus (the interpreter's
    standard library, ``data.path=None``): 2 layers, width 64, 4 heads of head_dim 16, RoPE,
    context 32; AdamW at lr 3e-3 with 50 warmup steps and weight decay 0.1, batch 16, 600
    steps, 10 steps per dispatch; logged every 50 steps, evaluated (4 batches of 32 windows)
    and checkpointed once, at the end; seed 0.

    Why these values: two layers are the fewest that can form an induction head (Olsson et
    al. 2022) and 4 heads the fewest ALiBi's slopes call for (REFERENCES.md); width 64, batch
    16 and 600 steps at a learning rate high for this size keep a sweep of 10-15 runs to a few
    minutes on 2 CPU cores (each experiment's docstring gives its measured runtime), and 10
    steps per dispatch (one ``lax.scan``) keep the host out of the loop. Context 32 keeps
    attention cheap and leaves room to evaluate at 4-16x the training length. One evaluation,
    at the end, keeps evaluation out of the runtime; experiments that follow a curve evaluate
    more often.
    """
    config = Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=32,
                          attention=AttentionConfig(num_heads=4),
                          position=PositionConfig("rope")),
        data=DataConfig(task="text", path=None, length=32),
        train=TrainConfig(steps=600, batch_size=16, learning_rate=3e-3, warmup_steps=50,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=50,
                          eval_every=600, checkpoint_every=600, eval_batches=4,
                          eval_batch_size=32),
        seed=0)
    return apply_overrides(config, overrides or {})
