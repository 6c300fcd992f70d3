"""Strided evaluation (``attnjax eval --stride N --score-last K --window W``): whole, disjoint
and overlapping windows score the same targets; the vectorised windows equal a loop of
separate forward passes; a model that sees no further back than its window loses nothing to
overlapping windows; bad combinations are refused in one line before anything compiles."""

import json

import jax
import numpy as np
import pytest

from attnjax.config import to_dict
from attnjax.data import Dataset
from attnjax.models.decoder import DecoderLM
from attnjax.rundir import RunDir
from attnjax.train import evaluate
from attnjax.train.state import init_params, init_state
from attnjax.train.strided import window_batch, windows
from helpers import TINY_MQAR, run_cli, tiny_config

# T = 4W as in PE14; MQAR (4 pairs fit in W) scores only its query positions, so the weights
# matter.
W, T = 16, 64
SETTINGS = {"whole": dict(window=T, stride=T), "disjoint": dict(window=W, stride=W),
            "overlap": dict(window=W, stride=W // 2, score_last=W // 2)}


# one layer of ALiBi attention over the last 8 keys: a model that sees no further back than
# W - K = 8 tokens; two evaluation batches
LOCAL = {"model.position.kind": "alibi", "model.attention.window": W // 2,
         "train.eval_batches": 2}


def tiny(**overrides):
    return tiny_config(TINY_MQAR, **{"data.length": W, "model.max_length": W,
                                     "data.num_pairs": 4, **overrides})


@pytest.mark.parametrize("setting", SETTINGS)
def test_whole_disjoint_and_overlapping_windows_score_every_target_once(setting):
    positions, scored = windows(T, **SETTINGS[setting])
    ids = np.arange(2 * T).reshape(2, T)          # two sequences, every target named
    batch = {"inputs": ids, "targets": ids, "weights": np.ones((2, T), np.float32)}
    windowed = window_batch(batch, positions, scored)
    rows = 2 * len(positions)
    assert windowed["inputs"].shape == (rows, positions.shape[1])
    starts = np.asarray(windowed["inputs"][:, 0])          # each window is a contiguous slice
    np.testing.assert_array_equal(windowed["inputs"], starts[:, None] + np.arange(len(scored[0])))
    chosen = np.asarray(windowed["targets"])[np.asarray(windowed["weights"]) > 0]
    np.testing.assert_array_equal(np.sort(chosen), np.arange(2 * T))   # count and identity


def test_padded_positions_count_from_each_window_start():
    # left padding: 3 pads (position 0), then 5 real tokens at positions 0..4
    positions = np.array([[0, 0, 0, 0, 1, 2, 3, 4]])
    batch = {"inputs": positions, "targets": positions, "weights": np.ones((1, 8), np.float32),
             "positions": positions, "token_mask": positions > 0}
    windowed = window_batch(batch, *windows(8, 4, 2))
    np.testing.assert_array_equal(windowed["positions"], [[0, 0, 0, 0], [0, 0, 1, 2],
                                                          [0, 1, 2, 3]])
    np.testing.assert_array_equal(windowed["token_mask"][2], [True] * 4)


@pytest.mark.parametrize("length, window, stride, score_last, message", [
    (T, 2 * T, 2 * T, None, f"--window {2 * T} must be between 1 and the evaluation length {T}"),
    (T, 0, 1, None, "--window 0 must be between 1"),
    (T, W, 2 * W, None, f"--stride {2 * W} must be between 1 and --window {W}"),
    (T, W, 0, None, "--stride 0 must be between 1"),
    (T, W, 8, 4, "--score-last 4 must equal --stride 8: fewer leaves targets unscored"),
    (T, W, 8, 12, "--score-last 12 must equal --stride 8"),
    (T, W, 10, None, f"--stride 10 must divide length - window = {T} - {W}"),
])
def test_combinations_that_miss_or_repeat_a_target_are_refused(length, window, stride,
                                                              score_last, message):
    with pytest.raises(ValueError, match=message) as error:
        windows(length, window, stride, score_last)
    assert "\n" not in str(error.value)


def test_refused_before_compiling(monkeypatch):
    from attnjax.train import loop
    monkeypatch.setattr(loop, "_evaluate_group", None)     # reached only after the checks
    config = tiny()
    with pytest.raises(ValueError, match="--stride 16 must divide length - window = 40 - 16"):
        evaluate(config, None, Dataset(config.data), [T, 40], stride=W)
    learned = tiny(**{"model.position.kind": "learned"})
    with pytest.raises(ValueError, match="max_length"):    # the learned table has W rows
        evaluate(learned, None, Dataset(learned.data), [T], window=2 * W)


@pytest.fixture(scope="module")
def evaluated():
    """One layer of ALiBi attention over the last 8 keys (``LOCAL``), evaluated at T = 4W
    without windows and in each setting: ``(config, params, dataset, results)``."""
    config = tiny(**LOCAL)
    params, dataset = init_params(config), Dataset(config.data)
    results = {name: evaluate(config, params, dataset, [T], **setting)[T]
               for name, setting in SETTINGS.items()}
    results["ordinary"] = evaluate(config, params, dataset, [T])[T]
    return config, params, dataset, results


def test_one_window_of_the_whole_sequence_is_the_ordinary_evaluation(evaluated):
    results = evaluated[-1]
    assert results["whole"] == results["ordinary"]


def brute_force(config, params, dataset, window, stride, score_last):
    """Loss and accuracy by a Python loop of separate forward passes, one window at a time,
    each scoring its last ``score_last`` targets (the first all), summed in float64."""
    forward = jax.jit(lambda tokens: DecoderLM(config.model).apply({"params": params}, tokens)[0])
    ce = correct = weight = 0.0
    for i in range(config.train.eval_batches):
        batch = jax.tree_util.tree_map(np.asarray, dataset.batch(
            config.seed, i, config.train.eval_batch_size, T, "val"))
        for start in range(0, T - window + 1, stride):
            logits = np.asarray(forward(batch["inputs"][:, start:start + window]), np.float64)
            first = 0 if start == 0 else window - score_last
            targets = batch["targets"][:, start + first:start + window]
            w = batch["weights"][:, start + first:start + window]
            logits = logits[:, first:]
            logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
            ce += ((logz - target_logit) * w).sum()
            correct += ((logits.argmax(-1) == targets) * w).sum()
            weight += w.sum()
    return {"loss": ce / weight, "accuracy": correct / weight}


def test_vectorised_windows_equal_a_loop_of_forward_passes(evaluated):
    config, params, dataset, results = evaluated
    setting = SETTINGS["overlap"]
    want = brute_force(config, params, dataset, setting["window"], setting["stride"],
                       setting["score_last"])
    np.testing.assert_allclose(results["overlap"]["loss"], want["loss"], rtol=1e-6)
    assert results["overlap"]["accuracy"] == pytest.approx(want["accuracy"], abs=1e-9)


def test_a_model_that_sees_only_its_window_loses_nothing_to_overlapping_windows(evaluated):
    """Each logit of the ``LOCAL`` model depends only on the 8 tokens up to it and their
    distances. The overlapping windows give every scored target those 8 tokens (W - K = 8
    before it), so they equal the whole; disjoint segments do not."""
    results = {name: r["loss"] for name, r in evaluated[-1].items()}
    np.testing.assert_allclose(results["overlap"], results["whole"], rtol=1e-6)
    assert abs(results["disjoint"] - results["whole"]) > 1e-4


def test_eval_command_with_windows(tmp_path, capsys):
    config, run = tiny(**LOCAL), RunDir(tmp_path / "run")   # a run's directory, untrained
    run.prepare(config)
    checkpoints = run.checkpoints()
    checkpoints.save(0, init_state(config), to_dict(config), val_loss=1.0)
    checkpoints.wait()
    checkpoints.close()
    code, out, err = run_cli(capsys, "eval", str(tmp_path / "run"), "--lengths", str(T),
                             "--stride", str(W // 2))
    assert code == 0, err[-2000:]
    assert "windows of 16 tokens every 8, each after the first scoring its last 8" in out
    record = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert record["strided"] == {"window": W, "stride": W // 2, "score_last": W // 2}
    code, out, err = run_cli(capsys, "eval", str(tmp_path / "run"), "--lengths", str(T),
                             "--stride", "8", "--score-last", "4")
    assert code == 2 and err.count("\n") == 1 and "--score-last 4 must equal --stride 8" in err
