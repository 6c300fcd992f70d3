"""Sweeps: expansion and naming, launchers, skip-finished and resume, failure isolation, and
vmapped runs equal to the same runs trained alone."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, TrainConfig,
                            apply_overrides)
from attnjax.sweep import cross, expand, product, run_name, zip_axes
from attnjax.sweep.launch import divergence, run_sweep, vmap_groups
from attnjax.sweep.record import load_record
from attnjax.train import hyper, loop, train
from attnjax.train.logging import read_metrics

ROOT = Path(__file__).resolve().parents[1]
COMPILE_CACHE = ROOT / ".pytest_cache" / "jax-compile"

EXPERIMENT = '''
"""A tiny sweep: attnjax sweep tiny.py --workdir DIR"""
from attnjax.config import AttentionConfig, Config, DataConfig, ModelConfig, TrainConfig
from attnjax.sweep import product


def get_config():
    return Config(
        model=ModelConfig(vocab_size=16, d_model=16, num_layers=1, max_length=16,
                          attention=AttentionConfig(num_heads=2)),
        data=DataConfig(task="induction", length=16, vocab_size=16),
        train=TrainConfig(steps=20, batch_size=8, warmup_steps=2, log_every=5, eval_every=10,
                          checkpoint_every=10, eval_batches=2, eval_batch_size=8,
                          steps_per_dispatch=5))


def get_sweep():
    return SWEEP
'''


def write_experiment(tmp_path, sweep: str) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(EXPERIMENT.replace("SWEEP", sweep))
    return path


def quiet(*_):
    pass


# ---------------------------------------------------------------- expansion and naming

def test_product_zip_cross():
    assert product({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
    assert zip_axes({"a": [1, 2], "b": ["x", "y"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    assert cross([{"a": 1}, {"a": 2}], [{"b": 3}]) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]
    with pytest.raises(ValueError, match="equal length"):
        zip_axes({"a": [1, 2], "b": [1]})


def test_run_names_are_stable_and_readable():
    a = {"seed": 1, "model.attention.num_heads": 4, "train.learning_rate": 0.003}
    b = dict(reversed(list(a.items())))
    assert run_name(a) == run_name(b) == "num_heads=4,seed=1,learning_rate=0.003"
    assert run_name({}) == "base"
    # two keys with the same last part keep their full names
    assert run_name({"model.dropout": 0.1, "train.dropout": 0.2}) == \
        "model.dropout=0.1,train.dropout=0.2"
    assert run_name({"data.path": "a/b c", "flag": True, "lengths": (64, 128)}) == \
        "path=a_b_c,flag=true,lengths=64_128"


def test_expand_builds_validated_configs(tmp_path):
    path = write_experiment(tmp_path, 'product({"seed": [0, 1], "model.attention.num_heads": [1, 4]})')
    runs = expand(path, ["train.steps=10"])
    assert [r.name for r in runs] == ["num_heads=1,seed=0", "num_heads=4,seed=0",
                                      "num_heads=1,seed=1", "num_heads=4,seed=1"]
    assert runs[1].config.model.attention.num_heads == 4 and runs[1].config.seed == 0
    assert all(r.config.train.steps == 10 for r in runs)  # command-line overrides apply to all


def test_expand_errors_name_the_run(tmp_path):
    with pytest.raises(ValueError, match=r"sweep run 'num_heads=3'.*d_model"):
        expand(write_experiment(tmp_path, '[{"model.attention.num_heads": 3}]'))
    with pytest.raises(ValueError, match="twice"):
        expand(write_experiment(tmp_path, '[{"seed": 1}, {"seed": 1}]'))


def test_vmap_groups_by_structure(tmp_path):
    path = write_experiment(tmp_path, 'product({"model.attention.num_heads": [1, 2], '
                            '"seed": [0, 1], "train.learning_rate": [1e-3, 3e-3]})')
    groups = vmap_groups(expand(path))
    assert [len(g) for g in groups] == [4, 4]
    assert {g[0].config.model.attention.num_heads for g in groups} == {1, 2}
    assert [len(g) for g in vmap_groups(expand(path), max_size=3)] == [3, 1, 3, 1]


def test_structure_keeps_whether_dropout_is_on():
    base = Config(model=ModelConfig(attention=AttentionConfig(dropout="output",
                                                              dropout_rate=0.1)))
    other = apply_overrides(base, {"model.attention.dropout_rate": 0.3, "seed": 5,
                                   "train.learning_rate": 0.01})
    assert hyper.same_structure(base, other)
    assert not hyper.same_structure(base, apply_overrides(base, {"model.residual_dropout": 0.1}))


# ---------------------------------------------------------------- launching

@pytest.fixture(scope="module")
def compile_cache():
    previous = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(COMPILE_CACHE))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    yield
    jax.config.update("jax_compilation_cache_dir", previous)


def test_vmapped_runs_equal_solo_runs(tmp_path, compile_cache):
    """Three runs differing in seed, learning rate and dropout rates, trained as one vmapped
    program, write what each writes when trained alone."""
    sweep = ('[{"seed": 0, "train.learning_rate": 1e-3, "model.attention.dropout_rate": 0.1},'
             ' {"seed": 1, "train.learning_rate": 3e-3, "model.attention.dropout_rate": 0.2},'
             ' {"seed": 2, "train.learning_rate": 2e-3, "model.attention.dropout_rate": 0.3}]')
    path = write_experiment(tmp_path, sweep)
    dropout = ["model.attention.dropout=probs_per_head", "model.attention.dropout_rate=0.1",
               "model.residual_dropout=0.1", "train.head_metrics=true"]
    record = run_sweep(path, tmp_path / "sweep", launcher="vmap", overrides=dropout,
                       progress=False, log=quiet)
    assert [r["status"] for r in record["runs"]] == ["finished"] * 3
    for run in expand(path, dropout):
        alone = tmp_path / "alone" / run.name
        solo_summary = train(run.config, alone, progress=False)
        vmapped = read_metrics(tmp_path / "sweep" / run.name / "metrics.jsonl")
        solo = read_metrics(alone / "metrics.jsonl")
        assert [r["step"] for r in vmapped] == [r["step"] for r in solo] == [5, 10, 15, 20]
        assert {"head_entropy/L0H1", "head_sink_mass/L0H0"} <= set(vmapped[0])   # per-head metrics
        for a, b in zip(vmapped, solo):
            assert set(a) == set(b)
            for key in set(a) - {"tokens_per_s"}:
                np.testing.assert_allclose(a[key], b[key], rtol=2e-6, atol=1e-7, err_msg=key)
        summary = json.loads((tmp_path / "sweep" / run.name / "summary.json").read_text())
        np.testing.assert_allclose(summary["eval"]["16"]["loss"],
                                   solo_summary["eval"]["16"]["loss"], rtol=2e-6)
        np.testing.assert_allclose(summary["train_loss"], solo_summary["train_loss"], rtol=2e-6)
    # the three runs really differ (seeds and rates were not collapsed)
    losses = {read_metrics(tmp_path / "sweep" / r["name"] / "metrics.jsonl")[-1]["loss"]
              for r in record["runs"]}
    assert len(losses) == 3


def test_failures_are_isolated_and_finished_runs_skipped(tmp_path, compile_cache):
    """A run that raises (missing data file) and runs that diverge (absurd learning rate) are
    recorded as failed; the others finish; a rerun trains nothing again."""
    sweep = ('product({"train.learning_rate": [1e-3, 1e30], "seed": [0, 1]})'
             ' + [{"data.task": "tokens", "data.path": "/nonexistent/tokens.bin"}]')
    path = write_experiment(tmp_path, sweep)
    record = run_sweep(path, tmp_path / "sweep", launcher="vmap", progress=False, log=quiet)
    status = {r["name"]: r["status"] for r in record["runs"]}
    assert status == {"seed=0,learning_rate=0.001": "finished",
                      "seed=1,learning_rate=0.001": "finished",
                      "seed=0,learning_rate=1e+30": "failed",
                      "seed=1,learning_rate=1e+30": "failed",
                      "path=_nonexistent_tokens.bin,task=tokens": "failed"}
    errors = {r["name"]: r["error"] for r in load_record(tmp_path / "sweep")["runs"]}
    assert errors["seed=0,learning_rate=1e+30"].startswith("diverged")
    assert "FileNotFoundError" in errors["path=_nonexistent_tokens.bin,task=tokens"]
    assert "Traceback" in (tmp_path / "sweep" / "path=_nonexistent_tokens.bin,task=tokens" /
                           "error.txt").read_text()
    finished = tmp_path / "sweep" / "seed=0,learning_rate=0.001" / "summary.json"
    before = finished.stat().st_mtime_ns
    lines = []
    run_sweep(path, tmp_path / "sweep", launcher="sequential", progress=False, log=lines.append)
    assert lines[0].startswith("sweep of 5 runs: 2 finished, 0 to run")
    assert finished.stat().st_mtime_ns == before


def test_divergence_rule():
    config = Config(train=TrainConfig(steps=100))
    ok = {"eval": {"16": {"loss": 1.0}}, "train_loss": 1.0, "skipped_updates": 10}
    assert divergence(ok, config) is None
    assert "11 of 100" in divergence({**ok, "skipped_updates": 11}, config)
    assert "not finite" in divergence({**ok, "train_loss": float("nan")}, config)


class _StopAfter:
    """Stands in for the SIGTERM flag: 'raised' after ``checks`` looks (as if SIGTERM came)."""
    checks = 3

    def __init__(self):
        self.count = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    @property
    def raised(self):
        self.count += 1
        return self.count > self.checks


def test_interrupted_sweep_resumes_exactly(tmp_path, compile_cache, monkeypatch):
    """A sweep stopped mid-run (SIGTERM) is marked interrupted and stops launching; rerun, it
    resumes that run from its checkpoint, and every run equals an uninterrupted sweep's."""
    path = write_experiment(tmp_path, 'product({"seed": [0, 1]})')
    run_sweep(path, tmp_path / "whole", progress=False, log=quiet)
    with monkeypatch.context() as patch:
        patch.setattr(loop, "_StopFlag", _StopAfter)
        record = run_sweep(path, tmp_path / "resumed", progress=False, log=quiet)
    assert [r["status"] for r in record["runs"]] == ["interrupted", "pending"]
    assert not (tmp_path / "resumed" / "seed=1").exists()   # stopped launching
    record = run_sweep(path, tmp_path / "resumed", progress=False, log=quiet)
    assert [r["status"] for r in record["runs"]] == ["finished", "finished"]
    for name in ("seed=0", "seed=1"):
        whole = read_metrics(tmp_path / "whole" / name / "metrics.jsonl")
        resumed = read_metrics(tmp_path / "resumed" / name / "metrics.jsonl")
        strip = lambda rs: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rs]
        assert strip(whole) == strip(resumed)


def test_processes_launcher_and_cli(tmp_path):
    """Two worker processes; then ``sweep-status`` shows every run finished."""
    path = write_experiment(tmp_path, '[{"seed": 0}, {"seed": 1}]')
    env = {"PATH": str(Path(sys.executable).parent), "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": str(COMPILE_CACHE),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "attnjax.cli"]
    done = subprocess.run(cli + ["sweep", str(path), "--workdir", str(tmp_path / "s"),
                                 "--launcher", "processes", "--jobs", "2", "--no-progress"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["status"] for r in load_record(tmp_path / "s")["runs"]] == ["finished"] * 2
    status = subprocess.run(cli + ["sweep-status", str(tmp_path / "s")], capture_output=True,
                            text=True, env=env, cwd=ROOT, timeout=120)
    assert status.returncode == 0 and status.stdout.count("finished") >= 2
    bad = subprocess.run(cli + ["sweep", str(path), "--workdir", str(tmp_path / "s"),
                                "model.attention.num_heads=3"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "d_model" in bad.stderr
