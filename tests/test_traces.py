"""Runs of one structure trace their programs once: the promise the sweep launchers rest on
(``attnjax.train.hyper``: seed and scalar hyperparameters are program arguments, not part of
the program). Runs that differ in seed, learning rate, weight decay, z-loss and dropout rate,
trained one after another in one process, trace the training program, the evaluation step and
the diagnostics once between them; a run of another structure traces each again."""

import collections
import functools

import jax
import numpy as np
import pytest

from attnjax.train import hyper, loop, parallel, train
from helpers import TINY_INDUCTION, tiny_config

# dropout on (its rate is then a value), two dispatches of 5 steps, one evaluation and one
# checkpoint at the end
BASE = {**TINY_INDUCTION, "model.attention.dropout": "probs_per_head",
        "model.attention.dropout_rate": 0.1, "train.steps": 10, "train.steps_per_dispatch": 5,
        "train.eval_every": 10, "train.checkpoint_every": 10}

SAME_STRUCTURE = [
    {},
    {"seed": 1, "train.learning_rate": 3e-3, "model.attention.dropout_rate": 0.2},
    {"seed": 2, "train.weight_decay": 0.01, "train.z_loss": 1e-4,
     "model.attention.dropout_rate": 0.3},
]
OTHER_STRUCTURE = {"model.attention.num_heads": 4}


@pytest.fixture
def traces(monkeypatch):
    """Counts traces of the training program, the evaluation step and the diagnostics, by the
    number of heads of the config each was traced for: the factories ``make_train_step`` /
    ``make_eval_step`` / ``make_diagnostics`` are called inside the traced function bodies, once
    per trace. The caches of compiled programs are swapped for empty ones for the test (and the
    full ones put back after it), so every structure starts untraced whatever ran before."""
    counts = {"train": collections.Counter(), "eval": collections.Counter(),
              "diagnostics": collections.Counter()}

    def counting(name, factory):
        def make(config, *args, **kwargs):
            counts[name][config.model.attention.num_heads] += 1
            return factory(config, *args, **kwargs)
        return make

    for module, cache in ((parallel, "_program"), (loop, "compiled_eval_step"),
                          (loop, "_compiled_diagnostics")):
        cached = getattr(module, cache)
        monkeypatch.setattr(module, cache, functools.lru_cache(cached.cache_info().maxsize)(
            cached.__wrapped__))
    monkeypatch.setattr(parallel, "make_train_step",
                        counting("train", parallel.make_train_step))
    monkeypatch.setattr(loop, "make_eval_step", counting("eval", loop.make_eval_step))
    monkeypatch.setattr(loop, "make_diagnostics",
                        counting("diagnostics", loop.make_diagnostics))
    return counts


def test_runs_of_one_structure_trace_once_and_another_structure_again(tmp_path, traces):
    configs = [tiny_config(BASE, **overrides) for overrides in SAME_STRUCTURE]
    assert len({hyper.structure(c) for c in configs}) == 1      # values differ, structure not
    assert len(set(configs)) == len(configs)
    summaries = [train(c, tmp_path / f"run{i}", progress=False) for i, c in enumerate(configs)]
    assert [s["status"] for s in summaries] == ["finished"] * 3
    # the values reached the program: three runs, three different trainings
    assert len({s["train_loss"] for s in summaries}) == 3
    assert len({s["eval"]["16"]["loss"] for s in summaries}) == 3
    for name in ("train", "eval", "diagnostics"):
        assert traces[name] == {2: 1}, (name, traces[name])
    # one Python-level program object, holding one executable
    assert parallel._program.cache_info().misses == 1
    program = parallel._program(hyper.structure(configs[0]), tuple(jax.devices()), None)
    assert program._cache_size() == 1
    # (a run on one device: no mesh its evaluations are laid out on)
    assert loop.compiled_eval_step(hyper.structure(configs[0]), None, False,
                                   None)._cache_size() == 1

    # another structure (more heads) is another program: traced again, once
    other = tiny_config(BASE, **OTHER_STRUCTURE)
    assert not hyper.same_structure(other, configs[0])
    summary = train(other, tmp_path / "other", progress=False)
    assert summary["status"] == "finished" and np.isfinite(summary["train_loss"])
    for name in ("train", "eval", "diagnostics"):
        assert traces[name] == {2: 1, 4: 1}, (name, traces[name])
    assert parallel._program.cache_info().misses == 2


def _lowered_step(config) -> str:
    from attnjax.data import load_dataset
    from attnjax.train.state import init_state
    runner = parallel.Runner(config, load_dataset(config.data))
    state = runner.abstract(jax.eval_shape(lambda: init_state(config)))
    return runner.lower(state, hyper.as_arrays([config], stacked=False)).as_text()


def test_a_zero_rate_is_structural_so_no_dropout_mask_is_drawn():
    """A traced zero rate would still draw a Bernoulli mask of every activation at every step
    (it measured 8% of a small model's step); a zero rate is no program argument, so the
    program draws none, while a non-zero rate stays a value."""
    zero = tiny_config(TINY_INDUCTION, **{"model.residual_dropout": 0.0})
    on = tiny_config(TINY_INDUCTION, **{"model.residual_dropout": 0.1})
    assert "model.residual_dropout" not in hyper.value_fields(zero)
    assert "model.residual_dropout" in hyper.value_fields(on)
    assert hyper.structure(zero).model.residual_dropout == 0.0
    assert hyper.structure(on).model.residual_dropout == 0.5
    assert "_bernoulli" not in _lowered_step(zero)
    assert "_bernoulli" in _lowered_step(on)
