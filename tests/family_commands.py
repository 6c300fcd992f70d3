"""What the command tests of a model family share (tests/test_encoder_commands.py,
tests/test_seq2seq_commands.py): a tiny experiment file sweeping seeds, the run it trains
alone, a SIGKILL-and-resume check and a sweep-on-a-launcher check against that run."""

from __future__ import annotations

import signal
from pathlib import Path

import chex
import numpy as np

from attnjax.cli import main
from attnjax.rundir import RunDir
from attnjax.sweep.launch import run_sweep
from helpers import deterministic, run_cli, tiny_config
from test_train import cli, final_params, wait_for_step

EXPERIMENT = '''
"""A tiny sweep of seeds."""
from attnjax.config import Config, apply_overrides
from attnjax.sweep import product


def get_config():
    return apply_overrides(Config(), OVERRIDES)


def get_sweep():
    return product({"seed": SEEDS})


def get_report():
    return {"metrics": METRICS}
'''


def write_experiment(path: Path, overrides: dict, metrics: list[str], seeds=(0, 1)) -> Path:
    """An experiment at ``path``: ``overrides``, a sweep over ``seeds``, report ``metrics``."""
    path.write_text(EXPERIMENT.replace("OVERRIDES", repr(overrides))
                    .replace("SEEDS", repr(list(seeds))).replace("METRICS", repr(metrics)))
    return path


def train_alone(experiment: Path, workdir: Path) -> Path:
    """Seed 0 of ``experiment`` trained by ``attnjax train`` in this process."""
    assert main(["train", str(experiment), "--workdir", str(workdir), "--no-progress"]) == 0
    return workdir


def check_resume_after_sigkill(experiment: Path, trained: Path, workdir: Path,
                               overrides: dict, kill_after: int, capsys) -> None:
    """Training (a subprocess) killed by SIGKILL past step ``kill_after`` and run again (the
    same command, in this process) ends with the metrics and parameters of ``trained``, bit
    for bit."""
    args = ("train", str(experiment), "--workdir", str(workdir), "--no-progress")
    process = cli(*args)
    wait_for_step(workdir, kill_after, process)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err[-2000:]
    assert deterministic(RunDir(workdir).metrics()) == deterministic(RunDir(trained).metrics())
    config = tiny_config(overrides)
    params, step = final_params(workdir, config)
    expected, expected_step = final_params(trained, config)
    assert step == expected_step == config.train.steps
    chex.assert_trees_all_equal(params, expected)


def check_sweep_on_launcher(experiment: Path, trained: Path, launcher: str, tmp_path: Path,
                            capsys) -> tuple[str, str]:
    """A two-seed sweep on ``launcher``: both finish, seed 0 equals ``trained`` (vmapped: up
    to float32 summation order), ``report`` and ``compare`` run; their outputs. The
    ``processes`` launcher gets one worker, which trains both seeds (several workers side by
    side: tests/test_sweep.py)."""
    sweep = tmp_path / "sweep"
    record = run_sweep(experiment, sweep, launcher=launcher, progress=False, log=lambda *_: None,
                       jobs=1 if launcher == "processes" else None)
    assert [r["status"] for r in record["runs"]] == ["finished", "finished"]
    seed0 = next(p for p in sweep.iterdir() if p.is_dir() and "seed=0" in p.name)
    for a, b in zip(deterministic(RunDir(seed0).metrics()),
                    deterministic(RunDir(trained).metrics()), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=2e-6, atol=1e-7, err_msg=key)
    code, report, err = run_cli(capsys, "report", str(sweep))
    assert code == 0, err
    code, compared, err = run_cli(capsys, "compare", str(trained), str(seed0), "--out",
                                  str(tmp_path / "compare"))
    assert code == 0, err
    return report, compared
