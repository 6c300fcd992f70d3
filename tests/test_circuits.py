"""Patching experiments (``attnjax.analysis.circuits``) on a small random decoder: each share
equals the same intervention run alone and scored by hand, both ways (denoising and noising)
and one position at a time; in the last layer a head's shares at each position add up to
its share at all of them; the clean input of the first block
at the corrupted position restores everything and elsewhere nothing; a path patch equals its
two steps run one at a time; an induction run's corrupted pairs differ in the first block
only; and ``attnjax patch`` writes its pictures and table."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.analysis.circuits import (head_patching, induction_pairs, path_patching,
                                       position_patching, target_logprob, text_pairs)
from attnjax.analysis.patching import heads_where, patch, positions_where, run
from attnjax.checkpoint import Checkpoints
from attnjax.config import to_dict
from attnjax.rundir import RunDir
from attnjax.train.state import init_params
from helpers import TINY_INDUCTION, TINY_TEXT, raises_one_line, run_cli, tiny_config

CONFIG = tiny_config(TINY_INDUCTION, **{"model.num_layers": 2})
HEADS = CONFIG.model.attention.num_heads


@pytest.fixture(scope="module")
def pairs():
    params = init_params(CONFIG)
    clean, corrupt = induction_pairs(CONFIG, 4)
    return params, clean, corrupt, target_logprob(clean)


def share(metric, clean, corrupt, patched) -> float:
    return float((metric(patched) - metric(corrupt)) / (metric(clean) - metric(corrupt)))


def tolerance(metric, clean_logits, corrupt_logits) -> float:
    """A share divides by the metric's change: float32 agreement of the metric (1e-6) over
    it."""
    return 1e-6 / abs(float(metric(clean_logits) - metric(corrupt_logits)))


def test_corrupted_induction_pairs_differ_in_the_first_block_only(pairs):
    _, clean, corrupt, _ = pairs
    block = CONFIG.data.length // 4
    assert (clean["inputs"][:, :block] != corrupt["inputs"][:, :block]).all()
    np.testing.assert_array_equal(clean["inputs"][:, block:], corrupt["inputs"][:, block:])
    assert (corrupt["inputs"] > 0).all()


def test_each_head_share_is_that_patch_alone_scored_by_hand(pairs):
    params, clean, corrupt, metric = pairs
    shares = head_patching(CONFIG, params, clean, corrupt, metric)
    clean_logits, got = run(CONFIG, params, clean, capture=["block_1.attention.z"])
    corrupt_logits, _ = run(CONFIG, params, corrupt)
    name = "block_1.attention.z"
    alone, _ = run(CONFIG, params, corrupt, patches={
        name: patch(got[name], where=heads_where(name, [1], HEADS))})
    np.testing.assert_allclose(shares[1, 1], share(metric, clean_logits, corrupt_logits, alone),
                               rtol=0, atol=tolerance(metric, clean_logits, corrupt_logits))


def test_noising_shares_are_the_clean_metric_lost_by_hand(pairs):
    params, clean, corrupt, metric = pairs
    lost = head_patching(CONFIG, params, corrupt, clean, metric)
    clean_logits, _ = run(CONFIG, params, clean)
    corrupt_logits, got = run(CONFIG, params, corrupt, capture=["block_0.attention.z"])
    name = "block_0.attention.z"
    alone, _ = run(CONFIG, params, clean, patches={
        name: patch(got[name], where=heads_where(name, [0], HEADS))})
    by_hand = float((metric(clean_logits) - metric(alone))
                    / (metric(clean_logits) - metric(corrupt_logits)))
    np.testing.assert_allclose(lost[0, 0], by_hand, rtol=0,
                               atol=tolerance(metric, clean_logits, corrupt_logits))


def test_head_shares_by_position_are_one_position_alone_and_add_up_in_the_last_layer(pairs):
    params, clean, corrupt, metric = pairs
    at = head_patching(CONFIG, params, clean, corrupt, metric, by_position=True)
    everywhere = head_patching(CONFIG, params, clean, corrupt, metric)
    chex.assert_shape(at, (2, HEADS, CONFIG.data.length))
    clean_logits, got = run(CONFIG, params, clean, capture=["block_0.attention.z"])
    corrupt_logits, _ = run(CONFIG, params, corrupt)
    atol = tolerance(metric, clean_logits, corrupt_logits)
    name, t = "block_0.attention.z", CONFIG.data.length // 2
    alone, _ = run(CONFIG, params, corrupt, patches={name: patch(
        got[name], where=heads_where(name, [1], HEADS) & positions_where(name, [t],
                                                                          CONFIG.data.length))})
    np.testing.assert_allclose(at[0, 1, t], share(metric, clean_logits, corrupt_logits, alone),
                               rtol=0, atol=atol)
    # a last-layer head's output at t reaches only position t's logits, and the metric is a
    # sum over positions
    np.testing.assert_allclose(at[1].sum(-1), everywhere[1], rtol=0, atol=CONFIG.data.length
                               * atol)


def test_the_first_blocks_clean_input_restores_all_at_the_corrupted_position_only(pairs):
    params, clean, _, metric = pairs
    corrupt = {**clean, "inputs": clean["inputs"].copy()}
    corrupt["inputs"][:, 2] = 1 + clean["inputs"][:, 2] % (CONFIG.data.vocab_size - 1)
    shares = position_patching(CONFIG, params, clean, corrupt, metric)
    atol = tolerance(metric, run(CONFIG, params, clean)[0], run(CONFIG, params, corrupt)[0])
    np.testing.assert_allclose(shares[0, 2], 1.0, rtol=0, atol=atol)
    np.testing.assert_allclose(np.delete(shares[0], 2), 0.0, rtol=0, atol=atol)


def test_a_path_share_is_its_two_steps_run_one_at_a_time(pairs):
    params, clean, corrupt, metric = pairs
    shares, senders, receivers = path_patching(CONFIG, params, clean, corrupt, metric)
    assert senders == [(0, h) for h in range(HEADS)] and receivers == [(1, h)
                                                                       for h in range(HEADS)]
    z = ["block_0.attention.z", "block_1.attention.z"]
    clean_logits, clean_z = run(CONFIG, params, clean, capture=z)
    corrupt_logits, corrupt_z = run(CONFIG, params, corrupt, capture=z)
    sender = heads_where(z[0], [1], HEADS)
    _, reached = run(CONFIG, params, corrupt, capture=["block_1.attention.k"], patches={
        z[0]: patch(jnp.where(sender, clean_z[z[0]], corrupt_z[z[0]])),
        z[1]: patch(corrupt_z[z[1]])})
    final, _ = run(CONFIG, params, corrupt, patches={"block_1.attention.k": patch(
        reached["block_1.attention.k"], where=heads_where("block_1.attention.k", [0], HEADS))})
    np.testing.assert_allclose(shares[1, 0, 1], share(metric, clean_logits, corrupt_logits,
                                                      final),
                               rtol=0, atol=tolerance(metric, clean_logits, corrupt_logits))
    # among chosen heads only (--paths): the same shares, of those senders and receivers
    chosen, senders, receivers = path_patching(CONFIG, params, clean, corrupt, metric,
                                               heads=[(1, 0), (0, 1)])
    assert senders == [(0, 1)] and receivers == [(1, 0)]
    np.testing.assert_allclose(chosen[0, 0], shares[1, 0], rtol=0,
                               atol=tolerance(metric, clean_logits, corrupt_logits))


def test_the_patch_command_writes_its_report_and_refuses_bad_pairs(pairs, tmp_path, capsys):
    params, *_ = pairs
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(CONFIG)
    checkpoints = Checkpoints(run_dir.checkpoint_dir)
    checkpoints.save_params(0, params, to_dict(CONFIG))
    checkpoints.close()
    code, out, err = run_cli(capsys, "patch", str(run_dir.path), "--out", str(tmp_path / "p"),
                             "--examples", "4", "--by-position", "--paths", "3")
    assert code == 0, err
    assert "| L1.H1 |" in out and "Largest paths among the 3 heads that recover the most" in out
    for picture in ("heads.png", "heads_noising.png", "heads_by_position.png", "positions.png",
                    "path.png"):
        assert (tmp_path / "p" / picture).stat().st_size > 5_000
    text = tiny_config(TINY_TEXT)
    raises_one_line(lambda: text_pairs(text, "abcd", "abc", "logit_diff:e,f"),
                    "--clean and --corrupt must have as many tokens, got 4 and 3")
    raises_one_line(lambda: text_pairs(text, "abcd", "abce", "logit_diff:ee,f"),
                    "--metric token 'ee' is 2 tokens of this run's text, not one")
    raises_one_line(lambda: induction_pairs(text, 4), "give --clean TEXT --corrupt TEXT")


def test_a_one_layer_run_is_patched_without_paths(tmp_path, capsys):
    """A one-layer model has no head feeding another: head and position patching, no path
    patching (its empty list of senders was an IndexError)."""
    config = tiny_config(TINY_INDUCTION)
    assert config.model.num_layers == 1
    run_dir = RunDir(tmp_path / "run")
    run_dir.prepare(config)
    checkpoints = Checkpoints(run_dir.checkpoint_dir)
    checkpoints.save_params(0, init_params(config), to_dict(config))
    checkpoints.close()
    code, out, err = run_cli(capsys, "patch", str(run_dir.path), "--out", str(tmp_path / "p"),
                             "--examples", "2")
    assert code == 0, err
    assert "No paths: a one-layer model" in out and "| L0.H1 |" in out
    assert out.splitlines()[-1] == (f"wrote heads.png, heads_noising.png, positions.png, "
                                    f"patching.md to {tmp_path / 'p'}")
    assert not (tmp_path / "p" / "path.png").exists()
