"""Checkpoint comparison: the math on hand-computed cases, a run against itself and against its
own killed-and-resumed copy (exactly zero difference), different vocabularies,
runs without a checkpoint or still writing, sweeps, and bad input."""

import json
import math
import os
import re
import shutil

import chex
import numpy as np
import pytest

from attnjax.analysis.compare import (ABSENT, attention_divergence, compare_runs, compare_sweep,
                                      comparison, config_differences, cosine, js_divergence,
                                      load_run, parameter_differences, relative_l2)
from attnjax.config import Config, apply_overrides, to_dict
from attnjax.rundir import RunDir
from attnjax.train import train
from attnjax.train.state import init_state
from helpers import TINY_TEXT, tiny_config

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def tiny(corpus, **overrides) -> Config:
    return tiny_config(TINY_TEXT, **{"data.path": str(corpus), **overrides})


# ------------------------------------------------------------------------------- the math

def test_js_divergence_hand_cases():
    p = np.array([0.2, 0.3, 0.5])
    assert js_divergence(p, p) == 0.0
    assert js_divergence([1.0, 0.0], [0.0, 1.0]) == pytest.approx(math.log(2), abs=1e-12)
    # M = [3/4, 1/4]: KL(P||M) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3), KL(Q||M) = ln(4/3)
    expected = 0.75 * math.log(4 / 3)
    assert js_divergence([0.5, 0.5], [1.0, 0.0]) == pytest.approx(expected, abs=1e-6)
    assert js_divergence([1.0, 0.0], [0.5, 0.5]) == pytest.approx(expected, abs=1e-6)
    rows = js_divergence(np.array([[0.5, 1.0], [0.5, 0.0]]), np.array([[1.0, 0.0], [0.0, 1.0]]),
                         axis=0)                              # distributions in columns
    np.testing.assert_allclose(rows, [expected, math.log(2)], atol=1e-12)
    with pytest.raises(ValueError, match="q has shape"):
        js_divergence([0.5, 0.5], [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="^p must be"):
        js_divergence([-0.5, 1.5], [1.0, 0.0])


def test_relative_l2_and_cosine_hand_cases():
    assert relative_l2([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert relative_l2([3.0, 4.0], [0.0, 0.0]) == 1.0
    assert relative_l2([3.0, 4.0], [6.0, 8.0]) == 1.0
    assert relative_l2([[3.0], [4.0]], [3.0, 9.0]) == 1.0      # flattened; ||(0, 5)|| / 5
    assert cosine([1.0, 0.0], [0.0, 1.0]) == 0.0
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(1 / math.sqrt(2), abs=1e-12)
    assert cosine([1.0, 2.0], [-2.0, -4.0]) == pytest.approx(-1.0, abs=1e-12)
    assert cosine([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert math.isnan(cosine([0.0, 0.0], [1.0, 0.0]))
    with pytest.raises(ValueError, match="b has 3 elements"):
        relative_l2([1.0, 2.0], [1.0, 2.0, 3.0])


def test_parameter_and_config_differences_hand_cases():
    a = {"block_10": {"w": np.array([3.0, 4.0])}, "block_2": {"w": np.array([1.0, 0.0])},
         "embed": np.zeros((2, 3)), "only_a": np.ones(1)}
    b = {"block_10": {"w": np.array([0.0, 0.0])}, "block_2": {"w": np.array([1.0, 1.0])},
         "embed": np.zeros((4, 3)), "only_b": np.ones(1)}
    rows, other = parameter_differences(a, b)
    assert [r["path"] for r in rows] == ["block_2/w", "block_10/w"]       # natural order
    assert rows[0]["relative_l2"] == 1.0 and rows[1]["relative_l2"] == 1.0
    assert rows[0]["cosine"] == pytest.approx(1 / math.sqrt(2)) and math.isnan(rows[1]["cosine"])
    assert other == [{"path": "embed", "reason": "shape (2, 3) vs (4, 3)"},
                     {"path": "only_a", "reason": "missing in B"},
                     {"path": "only_b", "reason": "missing in A"}]
    old = {"model": {"x": 1, "y": {"z": 2}}, "seed": 0}
    new = {"model": {"x": 1, "y": {"z": 3}}, "seed": 1, "extra": 5}
    assert config_differences(old, new) == [("extra", ABSENT, 5), ("model.y.z", 2, 3),
                                            ("seed", 0, 1)]
    assert config_differences(old, old) == []


def test_attention_divergence_per_layer_and_head():
    eye = np.tile(np.eye(2), (1, 1, 1, 1, 1))                        # [1, 1, 1, 2, 2]
    uniform_row = np.array([[1.0, 0.0], [0.5, 0.5]])[None, None, None]
    wa = np.concatenate([eye, eye], axis=2)                           # 1 layer, 2 heads
    wb = np.concatenate([eye, uniform_row], axis=2)
    js = attention_divergence(wa, np.concatenate([wb, wb], axis=0))  # B has 2 layers
    chex.assert_shape(js, (1, 2))
    # head 1: row 0 identical (0), row 1 is [0, 1] vs [1/2, 1/2] -> 3/4 ln(4/3); mean of rows
    np.testing.assert_allclose(js, [[0.0, 0.375 * math.log(4 / 3)]], atol=1e-12)


# ------------------------------------------------------------------------------- real runs

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A (uninterrupted); B: A's directory as a kill right after the step-10 checkpoint leaves
    it (later checkpoints and the summary gone), then resumed to step 20; C: a run of another
    vocabulary holding one checkpoint (its initial state, saved as the loop saves)."""
    root = tmp_path_factory.mktemp("runs")
    (root / "corpus.txt").write_text(TEXT)
    config = tiny(root / "corpus.txt")
    train(config, root / "a", progress=False)
    shutil.copytree(root / "a", root / "b")
    (root / "b" / "summary.json").unlink()
    for step in (root / "b" / "ckpt").iterdir():
        if step.name.isdigit() and int(step.name) > 10:
            shutil.rmtree(step)
    assert load_run(root / "b", "B", "latest").step == 10
    assert train(config, root / "b", progress=False)["status"] == "finished"
    other = apply_overrides(config, {"model.vocab_size": 260})
    run_c = RunDir(root / "c")
    run_c.prepare(other)
    checkpoints = run_c.checkpoints()
    checkpoints.save(0, init_state(other), to_dict(other), val_loss=math.log(256))
    checkpoints.wait()
    checkpoints.close()
    return root


def _read(out):
    return (out / "report.md").read_text()


def test_a_checkpoint_against_itself_is_identical(runs, tmp_path, assert_png):
    summary = compare_runs(runs / "a", runs / "a", tmp_path)
    assert "config: 0 difference(s)" in summary and "report:" in summary
    assert "attention JS (nats, at most ln 2 = 0.693): mean 0.0000" in summary
    report = _read(tmp_path)
    assert "The configs are identical." in report
    params = [line for line in report.splitlines() if line.startswith("| `")]
    assert len(params) == 13 and "Not comparable" not in report   # embed, block (10), final norm
    assert all(line.endswith(" | 0 | 1 |") for line in params)      # relative L2, cosine
    assert "| 0 | 0.0000 | 0.0000 | 0.0000 |" in report              # layer 0: heads 0, 1, mean
    # pixels = figsize x 110 dpi: (9, 1.4 + 0.24 * 13 parameters), (4.5, 3) for 1 x 2 heads,
    # (7.5, 4.5)
    for name, size in (("parameters.png", (990, 497)), ("attention_js.png", (495, 330)),
                       ("loss_curves.png", (825, 495))):
        assert_png(tmp_path / name, size)
        assert f"]({name})" in report


def test_resumed_run_equals_uninterrupted_exactly(runs, tmp_path):
    result = comparison(load_run(runs / "a", "A", "latest"), load_run(runs / "b", "B", "latest"),
                        tmp_path)
    assert result["a"].step == result["b"].step == 20
    assert result["config"] == [] and result["notes"] == []
    assert all(r["relative_l2"] == 0.0 for r in result["params"][0])
    chex.assert_shape(result["attention"], (1, 2))
    assert np.all(result["attention"] == 0.0)
    assert [(n, ea["loss"]) for n, ea, _ in result["eval"]] == [
        (n, eb["loss"]) for n, _, eb in result["eval"]]


def test_different_vocabularies_skip_attention_and_embedding(runs, tmp_path):
    summary = compare_runs(runs / "a", runs / "c", tmp_path)
    report = _read(tmp_path)
    assert "attention: skipped (different vocabularies" in summary
    assert "Skipped: different vocabularies (model.vocab_size, data.vocab_size): (256, 256) in " \
           "A (a), (260, 256) in B (c)." in report
    assert "| `embed/embedding` | shape (256, 16) vs (260, 16) |" in report
    assert "| `model.vocab_size` | 256 | 260 |" in report
    assert not (tmp_path / "attention_js.png").exists()


def test_run_without_checkpoint_compares_config_and_metrics(runs, tmp_path, assert_png):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        shutil.copy(runs / "a" / name, bare / name)
    summary = compare_runs(runs / "a", bare, tmp_path / "out")
    report = _read(tmp_path / "out")
    assert "B (bare) has no usable checkpoint: only its config and metrics are compared" in report
    assert "Not compared: a run has no usable checkpoint." in report
    assert "Skipped: B (bare) has no checkpoint." in report
    assert "val loss @ length 12" in summary
    assert_png(tmp_path / "out" / "loss_curves.png", (825, 495))


def test_run_still_writing_is_compared_at_its_latest_checkpoint_and_untouched(runs, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(runs / "a", live)
    (live / "summary.json").unlink()
    unfinished = live / "ckpt" / "30.orbax-checkpoint-tmp-1"
    unfinished.mkdir()
    os.utime(live / "metrics.jsonl", (0, 0))            # old metrics: the tmp save decides
    summary = compare_runs(live, runs / "c", tmp_path / "out", which="best")  # (no attention)
    assert "A (live) is still running; compared its latest checkpoint at step 20" in summary
    assert unfinished.is_dir()                            # read-only: nothing cleaned up
    assert "A (live) has no summary.json; its latest logged val_loss is" in _read(tmp_path / "out")


def test_sweep_against_a_baseline_by_name(runs, tmp_path, assert_png):
    sweep = tmp_path / "sweep"
    for name, source in (("base", "a"), ("resumed", "b"), ("vocab=260", "c")):
        shutil.copytree(runs / source, sweep / name)
    statuses = [("base", "finished"), ("resumed", "finished"), ("vocab=260", "finished"),
                ("later", "pending")]
    (sweep / "sweep.json").write_text(json.dumps(
        {"runs": [{"name": n, "status": s} for n, s in statuses]}))
    summary = compare_sweep(sweep, "base", tmp_path / "out")
    report = _read(tmp_path / "out")
    assert "resumed: finished; params rel. L2 median/max 0 / 0; attention JS mean/max " \
           "0.0000 / 0.0000" in summary
    assert "later: pending, no run directory yet" in summary
    assert "| vocab=260 | finished | `model.vocab_size` |" in report
    assert "[report](<vocab=260/report.md>)" in report
    assert "Skipped: different vocabularies" in (tmp_path / "out" / "vocab=260" / "report.md"
                                                 ).read_text()
    assert_png(tmp_path / "out" / "overview.png", (1210, 330))     # (11, 2.2 + 0.4 * 2 runs)


def test_bad_input_is_one_line(runs, tmp_path):
    not_a_run = f"^{re.escape(repr(str(tmp_path)))} is not a run directory"
    with pytest.raises(ValueError, match=not_a_run):
        compare_runs(runs / "a", tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match=f"^{re.escape(repr(str(tmp_path)))} is not a sweep "
                                         "directory"):
        compare_sweep(tmp_path, "base", tmp_path / "out")
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"name": "x"}]}))
    with pytest.raises(ValueError, match="^baseline 'nope' is neither a run directory"):
        compare_sweep(tmp_path, "nope", tmp_path / "out")
    with pytest.raises(ValueError, match="^which='last' is not valid; choices: best, latest"):
        compare_runs(runs / "a", runs / "a", tmp_path / "out", which="last")
