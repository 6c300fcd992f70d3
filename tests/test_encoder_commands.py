"""Everything a user does with a decoder, on a tiny encoder: train and exact resume after
SIGKILL, eval, a sweep (one after the other, vmapped seeds, worker processes; Ray and
several processes in test_ray.py and test_distributed.py), attention pictures with [CLS] and
[SEP], heads, compare, report and info."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import family_commands
from attnjax.rundir import RunDir
from helpers import TINY_MLM, run_cli

# 60 steps, 5 per dispatch: checkpoints at 30 and 60 (a kill after 30 resumes from it)
ENCODER = {**TINY_MLM, "train.steps": 60, "train.steps_per_dispatch": 5,
           "train.eval_every": 30, "train.checkpoint_every": 30, "train.log_every": 10,
           "data.eval_lengths": [16]}

METRICS = ["attn_cls/L0", "attn_sep/L0"]


def write_experiment(path: Path, seeds=(0, 1)) -> Path:
    """The tiny encoder experiment at ``path``, sweeping ``seeds``."""
    return family_commands.write_experiment(path, ENCODER, METRICS, seeds)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    return write_experiment(tmp_path_factory.mktemp("encoder") / "encoder.py")


@pytest.fixture(scope="module")
def trained(experiment, tmp_path_factory):
    return family_commands.train_alone(experiment, tmp_path_factory.mktemp("trained") / "run")


def test_an_encoder_resumes_bit_identically_after_sigkill(experiment, trained, tmp_path,
                                                         capsys):
    family_commands.check_resume_after_sigkill(experiment, trained, tmp_path / "run", ENCODER,
                                               kill_after=40, capsys=capsys)
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
    report, _ = family_commands.check_sweep_on_launcher(experiment, trained, launcher,
                                                        tmp_path, capsys)
    assert all(metric in report for metric in METRICS)


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
