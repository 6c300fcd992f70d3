"""Run and sweep directories on hand-built files: the stored config and its check, config
differences, metrics with a torn line, summaries, liveness, errors, evaluation variants, the
one checkpoint loader, the sweep record, atomic writes."""

import json
import os
import re

import chex
import pytest

from attnjax.config import Config, to_dict
from attnjax.rundir import (
    ABSENT,
    NoCheckpointError,
    RunDir,
    SweepDir,
    config_differences,
    write_json_atomic,
)
from helpers import TINY_MODEL, tiny_config

# the tiny model; data and training at their defaults but for the length (nothing trains)
SMALL = {**TINY_MODEL, "data.length": 8}


def small(**overrides) -> Config:
    return tiny_config(SMALL, **overrides)


def test_prepare_stores_the_config_and_refuses_another(tmp_path):
    run = RunDir(tmp_path / "run")
    assert not run.exists()
    run.prepare(small())
    assert run.exists() and run.checkpoint_dir.is_dir()
    assert run.config() == small()
    assert run.config_dict() == json.loads(json.dumps(to_dict(small())))
    run.prepare(small())                                  # the same config again: accepted
    with pytest.raises(ValueError, match=re.escape(
            "holds a run with another config (model.d_model: 16 -> 32; seed: 0 -> 3)")):
        run.prepare(small(**{"model.d_model": 32, "seed": 3}))
    assert run.config() == small()                        # the stored config is untouched


def test_prepare_fills_fields_added_later_with_their_defaults(tmp_path):
    run = RunDir(tmp_path)
    stored = to_dict(small())
    del stored["train"]["keep_best"]                      # as written before the field existed
    (tmp_path / "config.json").write_text(json.dumps(stored))
    run.prepare(small())
    assert run.config().train.keep_best == 1


def test_prepare_of_an_unwritable_directory_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ValueError, match="is not writable"):
        RunDir(tmp_path / "file" / "run").prepare(small())


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ValueError, match=f"^{re.escape(repr(str(tmp_path)))} is not a run "
                                         r"directory \(no config.json\)$"):
        RunDir(tmp_path).config()


def test_config_differences_hand_case():
    old = {"model": {"x": 1, "y": {"z": 2, "gone": True}}, "seed": 0, "same": [1, 2]}
    new = {"model": {"x": 1, "y": {"z": 3}}, "seed": 1, "same": [1, 2], "extra": {"k": 5}}
    assert config_differences(old, new) == [("extra", ABSENT, {"k": 5}),
                                            ("model.y.gone", True, ABSENT),
                                            ("model.y.z", 2, 3), ("seed", 0, 1)]
    assert config_differences(new, new) == []
    assert repr(ABSENT) == "(absent)"


def test_metrics_ignore_a_torn_last_line(tmp_path):
    run = RunDir(tmp_path)
    assert run.metrics() == []
    run.metrics_path.write_text('{"step": 5, "loss": 2.0}\n{"step": 10, "loss": 1.5}\n'
                                '{"step": 15, "lo')
    assert run.metrics() == [{"step": 5, "loss": 2.0}, {"step": 10, "loss": 1.5}]


def test_summary_none_until_written(tmp_path):
    run = RunDir(tmp_path)
    assert run.summary() is None
    run.write_summary({"status": "finished", "step": 20})
    assert run.summary() == {"status": "finished", "step": 20}


def test_is_running(tmp_path):
    run = RunDir(tmp_path)
    assert not run.is_running()                            # nothing written yet
    run.metrics_path.write_text('{"step": 5}\n')
    assert run.is_running()                                # fresh metrics, no summary
    os.utime(run.metrics_path, (0, 0))
    assert not run.is_running()                            # stale metrics
    (run.checkpoint_dir / "30.orbax-checkpoint-tmp-1").mkdir(parents=True)
    assert run.is_running()                                # a save under way
    run.write_summary({"status": "finished"})
    assert not run.is_running()                            # finished


def test_error_and_evaluation_variants(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.error() is None and run.evals() == {}
    run.write_error("Traceback ...\nValueError: boom\n")
    assert run.error() == "Traceback ...\nValueError: boom\n"
    run.write_eval_variant("rope+yarn", {"64": {"loss": 1.5, "accuracy": 0.5}})
    run.write_eval_variant("alibi", {"64": {"loss": 2.0, "accuracy": 0.25}})
    assert run.evals() == {"alibi": {"64": {"loss": 2.0, "accuracy": 0.25}},
                           "rope+yarn": {"64": {"loss": 1.5, "accuracy": 0.5}}}
    assert list(run.evals()) == ["alibi", "rope+yarn"]


def test_params_loads_the_best_or_latest_checkpoint(tmp_path):
    from attnjax.train.state import init_state
    config = small()
    run = RunDir(tmp_path)
    run.prepare(config)
    with pytest.raises(NoCheckpointError, match="has no usable checkpoint"):
        run.params()
    assert not run.has_checkpoint()
    first, second = init_state(config), init_state(small(seed=1))
    checkpoints = run.checkpoints()
    checkpoints.save(10, first, to_dict(config), val_loss=1.0)
    checkpoints.save(20, second, to_dict(config), val_loss=2.0)
    checkpoints.wait()
    checkpoints.close()
    assert run.has_checkpoint()
    loaded, params, step = run.params("best")
    assert loaded == config and step == 10
    chex.assert_trees_all_equal(params, first.params)
    _, params, step = run.params("latest")
    assert step == 20
    chex.assert_trees_all_equal(params, second.params)
    with pytest.raises(ValueError, match="which='last' is not valid; choices: best, latest"):
        run.params("last")


def test_params_build_no_model_and_no_optimizer(tmp_path, monkeypatch):
    from attnjax.train import state
    config = small()
    run = RunDir(tmp_path)
    run.prepare(config)
    saved = state.init_state(config)
    checkpoints = run.checkpoints()
    checkpoints.save(10, saved, to_dict(config), val_loss=1.0)
    checkpoints.close()
    state._init_program.cache_clear()

    def refuse(*args, **kwargs):
        raise AssertionError("loading parameters built a model or an optimizer")
    monkeypatch.setattr(state, "make_optimizer", refuse)
    monkeypatch.setattr(state, "build", refuse)
    _, params, step = run.params()
    assert step == 10
    chex.assert_trees_all_equal(params, saved.params)


def test_params_of_a_checkpoint_saved_without_a_parameter_digest(tmp_path):
    """Checkpoints written before the parameter digest: the whole state's digest, over its
    fields in TrainState order, checks them."""
    import orbax.checkpoint as ocp
    from attnjax.checkpoint import state_digest
    from attnjax.train.state import init_state
    config = small()
    run = RunDir(tmp_path)
    run.prepare(config)
    saved = init_state(config)
    meta = {"config": to_dict(config), "digest": state_digest(saved), "step": 10}
    with ocp.CheckpointManager(run.checkpoint_dir.absolute()) as manager:
        manager.save(10, args=ocp.args.Composite(state=ocp.args.StandardSave(saved),
                                                 meta=ocp.args.JsonSave(meta)))
        manager.wait_until_finished()
    _, params, step = run.params("latest")
    assert step == 10
    chex.assert_trees_all_equal(params, saved.params)


def test_params_whose_bytes_do_not_match_their_digest_fall_back(tmp_path, capsys):
    from attnjax.train.state import init_state
    config = small()
    run = RunDir(tmp_path)
    run.prepare(config)
    first, second = init_state(config), init_state(small(seed=1))
    checkpoints = run.checkpoints()
    checkpoints.save(10, first, to_dict(config), val_loss=1.0)
    checkpoints.save(20, second, to_dict(config), val_loss=2.0)
    checkpoints.close()
    meta = run.checkpoint_dir / "20" / "meta" / "metadata"
    record = json.loads(meta.read_text())
    record["params_digest"] = "0" * 64
    meta.write_text(json.dumps(record))
    _, params, step = run.params("latest")
    assert step == 10
    chex.assert_trees_all_equal(params, first.params)
    assert "checkpoint 20" in capsys.readouterr().err


def test_sweep_record_errors_name_the_file(tmp_path):
    sweep = SweepDir(tmp_path)
    assert not sweep.exists()
    with pytest.raises(ValueError, match=re.escape(
            f"{str(tmp_path)!r} is not a sweep directory (no {tmp_path / 'sweep.json'})")):
        sweep.record()
    (tmp_path / "sweep.json").write_text('{"runs": [')
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path / 'sweep.json'))} is not "
                                         "valid JSON"):
        sweep.record()
    (tmp_path / "sweep.json").write_text('{"runs": {}}')
    with pytest.raises(ValueError, match="has no 'runs' list"):
        sweep.record()
    sweep.save({"runs": [{"name": "seed=0"}]})
    assert sweep.exists() and sweep.record() == {"runs": [{"name": "seed=0"}]}
    assert sweep.run("seed=0").path == tmp_path / "seed=0"


def test_write_json_atomic_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "data.json"
    write_json_atomic(path, {"b": 1, "a": [1, 2]})
    write_json_atomic(path, {"c": 3})                     # replaced, not appended
    assert json.loads(path.read_text()) == {"c": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["data.json"]
