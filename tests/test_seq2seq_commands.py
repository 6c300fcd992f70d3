"""What a user does with a decoder, on a tiny encoder–decoder: train and exact resume after
SIGKILL, a sweep on each in-process and worker launcher (Ray in test_ray.py, several
processes in test_distributed.py) whose report shows exact match and alignment, and the
attention pictures with cross-attention and the encoder's."""

from __future__ import annotations

from pathlib import Path

import chex
import jax
import numpy as np
import pytest

import family_commands
from attnjax.analysis.capture import model_arguments, probe_examples, stream_attention
from attnjax.analysis.heads import (evaluate_gates, head_importance, knockout_losses,
                                    pruning_curve, validation_batches)
from attnjax.rundir import RunDir
from helpers import TINY_SEQ2SEQ, run_cli

# 40 steps, 5 per dispatch: checkpoints at 20 and 40 (a kill after 20 resumes from it)
SEQ2SEQ = {**TINY_SEQ2SEQ, "train.steps": 40, "train.steps_per_dispatch": 5,
           "train.eval_every": 20, "train.checkpoint_every": 20, "train.log_every": 10}
METRICS = ["val_exact_match", "val_alignment"]


def write_experiment(path: Path, seeds=(0, 1)) -> Path:
    """The tiny encoder-decoder experiment at ``path``, sweeping ``seeds``."""
    return family_commands.write_experiment(path, SEQ2SEQ, METRICS, seeds)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    return write_experiment(tmp_path_factory.mktemp("seq2seq") / "seq2seq.py")


@pytest.fixture(scope="module")
def trained(experiment, tmp_path_factory):
    return family_commands.train_alone(experiment, tmp_path_factory.mktemp("trained") / "run")


def test_a_seq2seq_run_resumes_bit_identically_after_sigkill(experiment, trained, tmp_path,
                                                            capsys):
    family_commands.check_resume_after_sigkill(experiment, trained, tmp_path / "run", SEQ2SEQ,
                                               kill_after=25, capsys=capsys)
    summary = RunDir(trained).summary()["eval"]["12"]
    assert 0 <= summary["exact_match"] <= 1 and 0 < summary["alignment"] <= 1


@pytest.mark.parametrize("launcher", ["sequential", "vmap", "processes"])
def test_a_seq2seq_sweep_on_a_launcher_reports_and_compares(experiment, trained, launcher,
                                                            tmp_path, capsys):
    report, compared = family_commands.check_sweep_on_launcher(experiment, trained, launcher,
                                                               tmp_path, capsys)
    assert all(metric in report for metric in METRICS)
    # seed 0 against itself: the family's metrics, each with no difference
    for name in ("exact_match", "alignment"):
        line = next(x for x in compared.splitlines() if x.startswith(f"val {name} @ length 12"))
        assert line.endswith("(B - A = +0.0000)"), line


def test_attention_pictures_show_cross_and_encoder_attention(trained, tmp_path, capsys,
                                                            assert_png):
    code, out, err = run_cli(capsys, "attention", str(trained), "--out", str(tmp_path))
    assert code == 0, err
    for name in ("L0H0", "cross_L0H1", "cross_grid", "encoder_L0H0", "encoder_grid"):
        assert_png(tmp_path / f"{name}.png")
    config, params, _ = RunDir(trained).params()
    probe = probe_examples(config)
    cross = stream_attention(config, params, probe["inputs"], model_arguments(config, probe))
    assert set(cross) == {"cross", "encoder"}
    weights, real = cross["cross"], probe["source_mask"][None, :, None, None, :]
    chex.assert_shape(weights, (1, 4, 2, 12, 12))            # layers, B, heads, T, S
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)   # every target row
    assert (weights[np.broadcast_to(~real, weights.shape)] == 0).all()   # pads never seen
    # the per-head alignment of cross_heads.md, counted by hand from those weights
    scored = (probe["weights"] > 0) & (probe["alignment"] >= 0)
    text = (tmp_path / "cross_heads.md").read_text()
    assert "## Encoder self-attention heads" in text and "| L0.H1 | " in text.split("Encoder")[1]
    rows = text.splitlines()[6:]
    for head in range(2):
        hits = (weights[0, :, head].argmax(-1) == probe["alignment"])[scored].mean()
        assert rows[head].startswith(f"| L0.H{head} | {hits:.4g} |"), (rows[head], hits)


def test_cross_attention_and_encoder_heads_are_knocked_out_by_name(trained, tmp_path, capsys):
    """``attnjax heads`` adds the cross-attention and encoder heads' knockout, importance and
    pruning; gating a head to 0 is zeroing its rows of its attention's output projection."""
    code, out, err = run_cli(capsys, "heads", str(trained), "--out", str(tmp_path))
    assert code == 0, err
    report = (tmp_path / "knockout.md").read_text()
    for group in ("cross", "encoder"):
        assert f"## The {group}-attention heads" in report
        assert f"| {group} head | knockout delta loss | importance" in report
        for picture in ("knockout", "importance", "pruning"):
            assert (tmp_path / f"{group}_{picture}.png").stat().st_size > 0
    config, params, _ = RunDir(trained).params()
    batches = validation_batches(config)
    ones = np.ones((1, 2))
    baseline = evaluate_gates(config, params, ones, batches)["loss"]
    for group, path in (("cross", ("block_0", "cross_attention")),
                        ("encoder", ("encoder", "block_0", "attention"))):
        delta = knockout_losses(config, params, batches, group=group)
        chex.assert_shape(delta, (1, 2))
        for head in range(2):
            cut = jax.tree.map(lambda x: x, params)
            module = cut
            for name in path:
                module = module[name]
            module["out"]["kernel"] = module["out"]["kernel"].at[head].set(0.0)  # [heads, D, d]
            zeroed = evaluate_gates(config, cut, ones, batches)["loss"] - baseline
            np.testing.assert_allclose(delta[0, head], zeroed, rtol=1e-4, atol=1e-6)
        assert np.abs(delta).max() > 0


@pytest.mark.parametrize("group", ["cross", "encoder"])
def test_cross_attention_and_encoder_head_importance_and_pruning(trained, group):
    """A group's importance is the derivative of the loss by its gates (central differences,
    the other groups at 1); its pruning runs from all of its heads to none of them."""
    config, params, _ = RunDir(trained).params()
    batches = validation_batches(config)
    one = [jax.tree.map(lambda x: np.repeat(np.asarray(x)[:1], len(x), 0), batches[0])]
    importance = head_importance(config, params, one, normalize=False, group=group)
    loss = lambda gates, b: evaluate_gates(config, params, np.ones((1, 2)), b,
                                           {group: gates})["loss"]
    eps = 0.02                   # float32 rounding ~1e-5 of the difference quotient here
    for head in range(2):
        plus, minus = np.ones((1, 2)), np.ones((1, 2))
        plus[0, head] += eps
        minus[0, head] -= eps
        fd = (loss(plus, one) - loss(minus, one)) / (2 * eps)
        np.testing.assert_allclose(importance[0, head], abs(fd), rtol=1e-2, atol=5e-5)
    curve = pruning_curve(config, params, batches, steps=2, group=group)
    np.testing.assert_allclose(curve["loss"][0], loss(np.ones((1, 2)), batches), rtol=1e-6)
    np.testing.assert_allclose(curve["loss"][-1], loss(np.zeros((1, 2)), batches), rtol=1e-6)
    assert sorted(curve["pruned"]) == [(0, 0), (0, 1)]
    with pytest.raises(ValueError, match="head group 'nope' is not one of model.family="
                                         "'seq2seq''s: self, cross, encoder"):
        head_importance(config, params, one, group="nope")
