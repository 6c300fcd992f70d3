"""Everything a user does with a decoder, on a tiny encoder: train and exact resume after
SIGKILL, eval, a sweep (one after the other, vmapped seeds, worker processes; Ray and
several processes in test_ray.py and test_distributed.py), attention pictures with [CLS] and
[SEP], heads, compare, report and info."""

from __future__ import annotations

import signal
from pathlib import Path

import chex
import numpy as np
import pytest

from attnjax.rundir import RunDir
from attnjax.sweep.launch import run_sweep
from helpers import TINY_MLM, deterministic, run_cli, tiny_config
from test_train import cli, final_params, wait_for_step

# 60 steps, 5 per dispatch: checkpoints at 30 and 60 (a kill after 30 resumes from it)
ENCODER = {**TINY_MLM, "train.steps": 60, "train.steps_per_dispatch": 5,
           "train.eval_every": 30, "train.checkpoint_every": 30, "train.log_every": 10,
           "data.eval_lengths": [16]}

EXPERIMENT = '''
"""A tiny encoder sweep."""
from attnjax.config import Config, apply_overrides
from attnjax.sweep import product


def get_config():
    return apply_overrides(Config(), ENCODER)


def get_sweep():
    return product({"seed": SEEDS})


def get_report():
    return {"metrics": ["attn_cls/L0", "attn_sep/L0"]}
'''


def write_experiment(path: Path, seeds=(0, 1)) -> Path:
    """The tiny encoder experiment at ``path``, sweeping ``seeds``."""
    path.write_text(EXPERIMENT.replace("ENCODER", repr(ENCODER))
                    .replace("SEEDS", repr(list(seeds))))
    return path


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    return write_experiment(tmp_path_factory.mktemp("encoder") / "encoder.py")


@pytest.fixture(scope="module")
def trained(experiment, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("trained") / "run"
    process = cli("train", str(experiment), "--workdir", str(workdir), "--no-progress")
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    return workdir


def test_an_encoder_resumes_bit_identically_after_sigkill(experiment, trained, tmp_path):
    workdir = tmp_path / "run"
    args = ("train", str(experiment), "--workdir", str(workdir), "--no-progress")
    process = cli(*args)
    wait_for_step(workdir, 40, process)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    resumed = cli(*args)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-2000:]
    assert deterministic(RunDir(workdir).metrics()) == deterministic(RunDir(trained).metrics())
    config = tiny_config(ENCODER)
    params, step = final_params(workdir, config)
    expected, expected_step = final_params(trained, config)
    assert step == expected_step == 60
    chex.assert_trees_all_equal(params, expected)
    last = RunDir(trained).metrics()[-1]
    assert 0 < last["attn_cls/L0"] < 1 and 0 < last["attn_sep/L0"] < 1


def test_eval_reports_mlm_loss_and_accuracy_at_every_length(trained, capsys):
    code, out, err = run_cli(capsys, "eval", str(trained))
    assert code == 0, err
    rows = {int(line.split()[0]): line.split()[1:] for line in out.splitlines()
            if line.split() and line.split()[0].isdigit()}
    assert set(rows) == {12, 16}
    summary = RunDir(trained).summary()
    np.testing.assert_allclose(float(rows[12][0]), summary["eval"]["12"]["loss"], atol=1e-4)
    assert all(0 <= float(r[1]) <= 1 for r in rows.values())


def test_attention_pictures_label_cls_and_sep(trained, tmp_path, capsys):
    code, out, err = run_cli(capsys, "attention", str(trained), "--out", str(tmp_path),
                             "--text", "to be or not")
    assert code == 0, err
    assert (tmp_path / "L0H0.png").stat().st_size > 0 and (tmp_path / "grid.png").exists()
    assert "| L0.H0 |" in (tmp_path / "head_stats.md").read_text()


def test_heads_knockout_and_importance_on_the_mlm_loss(trained, tmp_path, capsys):
    code, out, err = run_cli(capsys, "heads", str(trained), "--out", str(tmp_path))
    assert code == 0, err
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())


def test_generate_refuses_an_encoder(trained, capsys):
    code, _, err = run_cli(capsys, "generate", str(trained), "--prompt", "ab")
    assert code != 0 and "text" in err


@pytest.mark.parametrize("launcher", ["sequential", "vmap", "processes"])
def test_an_encoder_sweep_on_a_launcher_reports_and_compares(experiment, trained, launcher,
                                                             tmp_path, capsys):
    sweep = tmp_path / "sweep"
    record = run_sweep(experiment, sweep, launcher=launcher, progress=False, log=lambda *_: None)
    assert [r["status"] for r in record["runs"]] == ["finished", "finished"]
    seed0 = next(p for p in sweep.iterdir() if p.is_dir() and "seed=0" in p.name)
    # seed 0 of the sweep is the run trained alone (vmapped: up to float32 summation order)
    for a, b in zip(deterministic(RunDir(seed0).metrics()),
                    deterministic(RunDir(trained).metrics()), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=2e-6, atol=1e-7, err_msg=key)
    code, out, err = run_cli(capsys, "report", str(sweep))
    assert code == 0, err
    assert "attn_cls/L0" in out and "attn_sep/L0" in out
    code, out, err = run_cli(capsys, "compare", str(trained), str(seed0), "--out",
                             str(tmp_path / "compare"))
    assert code == 0, err


def test_info_lists_what_each_family_supports(capsys):
    code, out, err = run_cli(capsys, "info", "--no-grads")
    assert code == 0, err
    encoder = next(line for line in out.splitlines() if line.strip().startswith("encoder"))
    assert "bidirectional, does not decode" in encoder and "linear (unpadded only)" in encoder
    decoder = next(line for line in out.splitlines() if line.strip().startswith("decoder"))
    assert "causal, decodes" in decoder


def test_strided_evaluation_refuses_a_bidirectional_model(trained, capsys):
    code, _, err = run_cli(capsys, "eval", str(trained), "--window", "8")
    assert code != 0 and "bidirectional" in err and len(err.strip().splitlines()) == 1
