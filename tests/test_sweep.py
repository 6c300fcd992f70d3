"""Sweeps: expansion and naming, launchers, skip-finished and resume, failure isolation, and
vmapped runs equal to the same runs trained alone."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attnjax.config import AttentionConfig, Config, ModelConfig, TrainConfig, apply_overrides
from attnjax.rundir import RunDir, SweepDir
from attnjax.sweep import cross, expand, product, run_name, zip_axes
from attnjax.sweep.launch import (choose_launcher, divergence, longest_first, run_sweep,
                                  vmap_groups, work)
from attnjax.sweep import workers
from attnjax.sweep.workers import core_shares
from attnjax.train import hyper, loop, train
from helpers import COMPILE_CACHE_ENV, TINY_INDUCTION, deterministic, run_cli, subprocess_env

# five steps per dispatch: a stop flag checked three times stops a run after 15 of its 20 steps
TINY = {**TINY_INDUCTION, "train.steps_per_dispatch": 5}

EXPERIMENT = '''
"""A tiny sweep: attnjax sweep tiny.py --workdir DIR"""
from attnjax.config import Config, apply_overrides
from attnjax.sweep import product


def get_config():
    return apply_overrides(Config(), TINY)


def get_sweep():
    return SWEEP
'''


def write_experiment(tmp_path, sweep: str) -> Path:
    path = tmp_path / "tiny.py"
    path.write_text(EXPERIMENT.replace("TINY", repr(TINY)).replace("SWEEP", sweep))
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
    path = write_experiment(tmp_path,
                            'product({"seed": [0, 1], "model.attention.num_heads": [1, 4]})')
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


def test_work_is_the_flop_estimate_and_orders_tasks_longest_first(tmp_path):
    """``work``, computed by hand for a config: 3 L d (6d + T) per trained token (training
    is three forward passes), L d (6d + n) per evaluated token at length n, with evaluations
    at every eval_every steps, at the end, and of the initial parameters."""
    config = apply_overrides(Config(), {
        "model.d_model": 16, "model.num_layers": 2, "model.max_length": 32,
        "model.attention.num_heads": 2, "data.task": "induction", "data.length": 8,
        "data.eval_lengths": [32], "train.batch_size": 4, "train.steps": 10,
        "train.eval_every": 4, "train.eval_batches": 2, "train.eval_batch_size": 3,
        "train.log_every": 2, "train.checkpoint_every": 2, "train.warmup_steps": 1})
    per_token = lambda n: 2 * 16 * (6 * 16 + n)
    trained = 3 * per_token(8) * 8 * 4 * 10
    evaluated = (per_token(8) * 8 + per_token(32) * 32) * 2 * 3
    assert work(config) == trained + 4 * evaluated          # steps 4, 8, 10 and the initial
    path = write_experiment(tmp_path, 'product({"train.steps": [100, 400, 200], '
                            '"seed": [0, 1]})')
    tasks = longest_first(vmap_groups(expand(path), max_size=1))
    assert [t[0].config.train.steps for t in tasks] == [400, 400, 200, 200, 100, 100]
    assert [t[0].config.seed for t in tasks] == [0, 1] * 3      # ties keep their order


def test_structure_keeps_whether_dropout_is_on():
    base = Config(model=ModelConfig(attention=AttentionConfig(dropout="output",
                                                              dropout_rate=0.1)))
    other = apply_overrides(base, {"model.attention.dropout_rate": 0.3, "seed": 5,
                                   "train.learning_rate": 0.01})
    assert hyper.same_structure(base, other)
    assert not hyper.same_structure(base, apply_overrides(base, {"model.residual_dropout": 0.1}))


# ---------------------------------------------------------------- launching

def test_vmapped_runs_equal_solo_runs(tmp_path):
    """Three runs differing in every kind of value (seed, learning rate, warmup, dropout rate,
    position-embedding scale, qk-norm kappa), trained as one vmapped program, write what each
    writes when trained alone."""
    sweep = ('[{"seed": 0, "train.learning_rate": 1e-3, "model.attention.dropout_rate": 0.1,'
             '  "train.warmup_steps": 2, "model.position.added_scale": 1.0,'
             '  "model.attention.qk_kappa": 1.0},'
             ' {"seed": 1, "train.learning_rate": 3e-3, "model.attention.dropout_rate": 0.2,'
             '  "train.warmup_steps": 9, "model.position.added_scale": 8.0,'
             '  "model.attention.qk_kappa": 3.0},'
             ' {"seed": 2, "train.learning_rate": 2e-3, "model.attention.dropout_rate": 0.3,'
             '  "train.warmup_steps": 0, "model.position.added_scale": 0.5,'
             '  "model.attention.qk_kappa": 0.5}]')
    path = write_experiment(tmp_path, sweep)
    dropout = ["model.attention.dropout=probs_per_head", "model.attention.dropout_rate=0.1",
               "model.residual_dropout=0.1", "train.head_metrics=true",
               "model.position.kind=sinusoidal", "model.attention.qk_norm=kappa"]
    assert len(vmap_groups(expand(path, dropout))) == 1
    record = run_sweep(path, tmp_path / "sweep", launcher="vmap", overrides=dropout,
                       progress=False, log=quiet)
    assert [r["status"] for r in record["runs"]] == ["finished"] * 3
    for run in expand(path, dropout):
        alone = tmp_path / "alone" / run.name
        solo_summary = train(run.config, alone, progress=False)
        vmapped = RunDir(tmp_path / "sweep" / run.name).metrics()
        solo = RunDir(alone).metrics()
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
        np.testing.assert_allclose(summary["initial_loss"], solo_summary["initial_loss"],
                                   rtol=2e-6)
    # the three runs really differ (seeds and rates were not collapsed)
    losses = {RunDir(tmp_path / "sweep" / r["name"]).metrics()[-1]["loss"]
              for r in record["runs"]}
    assert len(losses) == 3


def test_failures_are_isolated_and_finished_runs_skipped(tmp_path):
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
    errors = {r["name"]: r["error"] for r in SweepDir(tmp_path / "sweep").record()["runs"]}
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
    """Stands in for the SIGTERM flag: 'raised' from its ``checks``-th look on (as if SIGTERM
    came then); the loop looks once per dispatch."""
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
        return self.count >= self.checks


def test_interrupted_sweep_resumes_exactly(tmp_path, monkeypatch):
    """A sweep stopped mid-run (SIGTERM) is marked interrupted and stops launching; rerun, it
    resumes that run from its checkpoint, and every run equals an uninterrupted sweep's."""
    path = write_experiment(tmp_path, 'product({"seed": [0, 1]})')
    here = dict(launcher="sequential", progress=False, log=quiet)   # the patch is in-process
    run_sweep(path, tmp_path / "whole", **here)
    with monkeypatch.context() as patch:
        patch.setattr(loop, "_StopFlag", _StopAfter)
        record = run_sweep(path, tmp_path / "resumed", **here)
    assert [r["status"] for r in record["runs"]] == ["interrupted", "pending"]
    assert not (tmp_path / "resumed" / "seed=1").exists()   # stopped launching
    record = run_sweep(path, tmp_path / "resumed", **here)
    assert [r["status"] for r in record["runs"]] == ["finished", "finished"]
    for name in ("seed=0", "seed=1"):
        whole = RunDir(tmp_path / "whole" / name).metrics()
        resumed = RunDir(tmp_path / "resumed" / name).metrics()
        assert deterministic(whole) == deterministic(resumed)


def test_core_shares_split_the_cores_disjointly(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert core_shares(2) == [[0, 1], [2, 3, 4]]
    assert core_shares(5) == [[0], [1], [2], [3], [4]]
    assert core_shares(7) == [[0], [1], [2], [3], [4], [0], [1]]


def _record(path: Path) -> dict | None:
    try:
        return json.loads((path / "sweep.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _running_worker(sweep: Path, trained: bool, timeout: float = 300) -> tuple[str, int]:
    """``(run name, worker pid)`` of a run marked running (``trained``: once it has logged)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for item in (_record(sweep) or {"runs": []})["runs"]:
            if item["status"] == "running" and "pid" in item and (
                    not trained or RunDir(sweep / item["name"]).metrics()):
                return item["name"], item["pid"]
        time.sleep(0.05)
    raise AssertionError("no run was ever marked running")


# Runs of 100 steps, a checkpoint and an evaluation at 50 and 100: a run logs from step 5
# on, so once one has logged, 95 steps (19 logs, 2 evaluations and checkpoints: about a second
# after compilation, more under load) are left for the kill to land in. The steps themselves
# cost next to nothing; the logs, evaluations and checkpoints are what a longer run adds.
KILLED = {"train.steps": 100, "train.checkpoint_every": 50, "train.eval_every": 50}


@pytest.fixture(scope="module")
def trained_alone(tmp_path_factory):
    """``run -> the directory of that run trained alone in this process``: the unbroken run a
    resumed one must equal, trained once per config for the cases below."""
    done = {}

    def alone(run):
        if run.config not in done:
            done[run.config] = tmp_path_factory.mktemp("alone") / run.name
            train(run.config, done[run.config], progress=False)
        return done[run.config]
    return alone


@pytest.mark.parametrize("launcher, moment", [("processes", "starting"),
                                              ("processes", "training"),
                                              ("vmap-processes", "training")])
def test_a_killed_worker_is_a_recorded_failure_and_the_others_finish(tmp_path, moment,
                                                                     launcher, trained_alone,
                                                                     capsys):
    """SIGKILL of a worker (as the out-of-memory killer does it) as soon as it is handed a run
    (still importing or compiling) or once the run has logged: that run's task is recorded as
    failed naming the signal, the other runs finish, nothing is left marked running, the
    command exits 1, and ``--retry-failed`` resumes it to the result of an unbroken run.
    Two workers: 3 runs (one is still to be handed out after the kill); vmap-processes: 4,
    in 2 groups of 2."""
    runs = 4 if launcher == "vmap-processes" else 3
    path = write_experiment(tmp_path, f'[{{"seed": s}} for s in range({runs})]')
    sweep = tmp_path / "s"
    overrides = [f"{k}={v}" for k, v in KILLED.items()]
    args = ["sweep", str(path), *overrides, "--workdir", str(sweep), "--launcher", launcher,
            "--jobs", "2", "--no-progress"]
    driver = subprocess.Popen([sys.executable, "-m", "attnjax.cli", *args], env=subprocess_env(),
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    name, pid = _running_worker(sweep, trained=moment == "training")
    if moment == "training" and len(os.sched_getaffinity(0)) >= 2:
        assert sorted(os.sched_getaffinity(pid)) in core_shares(2)     # pinned to its share
    os.kill(pid, signal.SIGKILL)
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 1, err[-2000:]
    records = {r["name"]: r for r in _record(sweep)["runs"]}
    killed = [r for r in records.values() if r["status"] == "failed"]
    assert name in {r["name"] for r in killed} and all("SIGKILL" in r["error"] for r in killed)
    assert len(killed) == (1 if launcher == "processes" else 2)    # vmap-processes: 2 groups of 2
    assert sum(r["status"] == "finished" for r in records.values()) == runs - len(killed)
    assert not any("pid" in r for r in records.values())
    assert f"{name}: failed" in out
    code, _, err = run_cli(capsys, *args, "--retry-failed")      # the retry: in this process
    assert code == 0, err[-2000:]
    assert {r["status"] for r in _record(sweep)["runs"]} == {"finished"}
    alone = trained_alone(next(r for r in expand(path, overrides) if r.name == name))
    for a, b in zip(deterministic(RunDir(sweep / name).metrics()),
                    deterministic(RunDir(alone).metrics()), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=2e-6, atol=1e-7, err_msg=key)


def test_auto_launcher_rule():
    assert choose_launcher(8, 2, "cpu")[0] == "processes"
    assert choose_launcher(1, 2, "cpu")[0] == "sequential"       # every core for one run
    assert choose_launcher(8, 1, "cpu")[0] == "sequential"
    assert choose_launcher(8, 16, "gpu")[0] == "vmap"             # one device, kept busy


def test_processes_launcher_and_cli(tmp_path, monkeypatch, capsys):
    """The default launcher, ``auto``, picks two worker processes on this CPU (one per core;
    on one core it would train in this process); then ``sweep-status`` shows every run
    finished. The commands run in this process (the launcher starts the workers itself); the
    workers inherit this env."""
    path = write_experiment(tmp_path, '[{"seed": 0}, {"seed": 1}]')
    for key, value in {"JAX_PLATFORMS": "cpu", "HOME": str(tmp_path), **COMPILE_CACHE_ENV}.items():
        monkeypatch.setenv(key, value)
    code, out, err = run_cli(capsys, "sweep", str(path), "--workdir", str(tmp_path / "s"),
                             "--no-progress")
    assert code == 0, err[-2000:]
    cores = len(os.sched_getaffinity(0))
    assert f"auto launcher: {'processes' if cores > 1 else 'sequential'}" in out
    assert [r["status"] for r in SweepDir(tmp_path / "s").record()["runs"]] == ["finished"] * 2
    code, out, err = run_cli(capsys, "sweep-status", str(tmp_path / "s"))
    assert code == 0 and out.count("finished") >= 2
    code, out, err = run_cli(capsys, "sweep", str(path), "--workdir", str(tmp_path / "s"),
                             "model.attention.num_heads=3")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "d_model" in err


def test_a_worker_killed_before_it_is_handed_its_run_fails_only_that_run(tmp_path, monkeypatch):
    """The out-of-memory killer may strike between a worker being chosen for a run and the run
    reaching it: the send finds the pipe broken, and the run is recorded as failed (not the
    whole sweep interrupted)."""
    path = write_experiment(tmp_path, '[{"seed": s} for s in range(2)]')
    give, killed = workers._Worker.give, []

    def killed_first(worker, task, run_dirs):
        if not killed:
            worker.process.kill()
            worker.process.join()
            killed.append(task[0].name)
        give(worker, task, run_dirs)

    monkeypatch.setattr(workers._Worker, "give", killed_first)
    record = run_sweep(path, tmp_path / "s", launcher="processes", jobs=2, progress=False,
                       log=quiet)
    runs = {r["name"]: r for r in record["runs"]}
    assert runs[killed[0]]["status"] == "failed" and "SIGKILL" in runs[killed[0]]["error"]
    assert [r["status"] for name, r in runs.items() if name != killed[0]] == ["finished"]
