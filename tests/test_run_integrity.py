"""Nothing lost: one writer per run and sweep directory (real concurrent processes), metrics
rewritten atomically on resume, a torn last line dropped and said so, and a run's identity
checked against its checkpoints as against config.json."""

from __future__ import annotations

import errno
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from attnjax import locks
from attnjax.checkpoint import Checkpoints
from attnjax.config import to_dict
from attnjax.rundir import RunDir
from attnjax.sweep.launch import launch_runs
from attnjax.sweep.spec import expand
from attnjax.train import train
from attnjax.train.logging import _quiet_full_disk
from helpers import TINY_INDUCTION, deterministic, run_cli, subprocess_env, tiny_config

# long enough to be alive while a second writer tries and readers read; stopped by SIGTERM
ENDLESS = {**TINY_INDUCTION, "train.steps": 100_000, "train.log_every": 5,
           "train.eval_every": 20, "train.checkpoint_every": 20}


def write_experiment(path: Path, overrides: dict, sweep: list | None = None) -> Path:
    path.write_text(textwrap.dedent(f"""
        from attnjax.config import Config, apply_overrides
        def get_config():
            return apply_overrides(Config(), {overrides!r})
        def get_sweep():
            return {sweep or [{}]!r}
    """))
    return path


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "attnjax.cli", *args], env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(condition, process: subprocess.Popen, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            err = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"exited with {process.returncode}: {err}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def lock_holder(directory: Path) -> str:
    path = directory / locks.LOCK_NAME
    return path.read_text().strip() if path.is_file() else ""


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=120)


def snapshot(directory: Path) -> dict:
    """Each file's modification time; a file a live writer removes during the walk (an old
    checkpoint it prunes) is left out rather than failing the walk."""
    times = {}
    for folder, _, names in os.walk(directory):       # os.walk skips folders that vanish
        for name in names:
            path = Path(folder) / name
            try:
                times[str(path.relative_to(directory))] = path.stat().st_mtime_ns
            except FileNotFoundError:
                continue
    return times


@pytest.mark.trains
def test_a_second_train_on_a_run_being_trained_is_refused_before_touching_it(tmp_path, capsys):
    experiment = write_experiment(tmp_path / "endless.py", ENDLESS)
    workdir = tmp_path / "run"
    first = start("train", str(experiment), "--workdir", str(workdir), "--no-progress")
    try:
        wait_until(lambda: RunDir(workdir).has_checkpoint(), first)
        code, out, err = run_cli(capsys, "eval", str(workdir))    # readers take no lock
        assert code == 0 and "loss" in out, err
        assert lock_holder(workdir) == str(first.pid)
        before = snapshot(workdir)
        code, out, err = run_cli(capsys, "train", str(experiment), "--workdir", str(workdir),
                                 "--no-progress")                 # the second, in this process
        assert code == 2, err
        assert err.count("\n") == 1 and f"being written by process {first.pid}" in err, err
        after = snapshot(workdir)       # the first writer goes on; the second wrote nothing
        assert after["config.json"] == before["config.json"]
        assert not [name for name in after if ".write-test" in name], after
    finally:
        stop(first)
    steps = [r["step"] for r in RunDir(workdir).metrics()]
    assert steps == sorted(set(steps)), steps


@pytest.mark.trains
def test_a_second_sweep_driver_on_a_sweep_being_run_is_refused(tmp_path, capsys):
    experiment = write_experiment(tmp_path / "endless.py", ENDLESS, [{"seed": 0}, {"seed": 1}])
    sweep = tmp_path / "sweep"
    args = ("sweep", str(experiment), "--workdir", str(sweep), "--launcher", "sequential",
            "--no-progress")
    first = start(*args)
    try:
        wait_until(lambda: (sweep / "seed=0" / "metrics.jsonl").is_file(), first)
        record = (sweep / "sweep.json").read_text()
        code, _, err = run_cli(capsys, *args)                        # the second, in this process
        assert code == 2, err
        assert err.count("\n") == 1 and f"sweep directory {str(sweep)!r}" in err, err
        assert f"process {first.pid}" in err, err
        assert (sweep / "sweep.json").read_text() == record
        for reader in ("sweep-status", "report"):                   # readers take no lock
            code, out, err = run_cli(capsys, reader, str(sweep))
            assert code == 0 and ("seed=0" in out or "did not finish" in out), (reader, err)
    finally:
        stop(first)


@pytest.mark.trains
def test_a_sweep_worker_takes_its_runs_lock(tmp_path):
    """A run whose directory another process writes is not trained twice: its worker is
    refused, the run recorded as failed naming the holder, and a retry trains it."""
    experiment = write_experiment(tmp_path / "tiny.py", TINY_INDUCTION, [{"seed": 0}])
    runs = expand(experiment)
    sweep = tmp_path / "sweep"
    with locks.hold(sweep / runs[0].name, "run directory"):
        record = launch_runs(runs, sweep, label="tiny", launcher="processes", jobs=1,
                             progress=False, log=lambda line: None)
    (run,) = record["runs"]
    assert run["status"] == "failed"
    assert f"being written by process {os.getpid()}" in run["error"]
    assert not (sweep / runs[0].name / "metrics.jsonl").exists()
    record = launch_runs(runs, sweep, label="tiny", launcher="processes", jobs=1,
                         progress=False, retry_failed=True, log=lambda line: None)
    assert record["runs"][0]["status"] == "finished"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny run (checkpoints at 10 and 20)."""
    workdir = tmp_path_factory.mktemp("finished") / "run"
    train(tiny_config(TINY_INDUCTION), workdir, progress=False)
    return workdir


def back_to_step_10(finished: Path, workdir: Path) -> None:
    """``workdir``: ``finished`` as if killed after its checkpoint at step 10 (its metrics
    already past it)."""
    shutil.copytree(finished, workdir)
    (workdir / "summary.json").unlink()
    shutil.rmtree(workdir / "ckpt" / "20")


@pytest.mark.trains
def test_a_resume_killed_while_rewriting_metrics_loses_nothing(finished, tmp_path):
    workdir = tmp_path / "run"
    back_to_step_10(finished, workdir)
    metrics = (workdir / "metrics.jsonl").read_text()
    marker = tmp_path / "in-the-window"
    script = tmp_path / "slow_replace.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        import attnjax.rundir
        replace = os.replace
        def slow_replace(src, dst):
            if str(dst).endswith("metrics.jsonl"):
                open({str(marker)!r}, "w").close()
                time.sleep(600)
            replace(src, dst)
        attnjax.rundir.os.replace = slow_replace
        from attnjax.config import Config, apply_overrides
        from attnjax.train import train
        train(apply_overrides(Config(), {TINY_INDUCTION!r}), {str(workdir)!r}, progress=False)
    """))
    process = subprocess.Popen([sys.executable, str(script)], env=subprocess_env())
    wait_until(marker.exists, process)
    process.kill()
    process.wait()
    assert (workdir / "metrics.jsonl").read_text() == metrics
    train(tiny_config(TINY_INDUCTION), workdir, progress=False)
    assert deterministic(RunDir(workdir).metrics()) == deterministic(RunDir(finished).metrics())


def test_a_torn_last_line_is_dropped_on_resume_and_said_so_once(finished, tmp_path, capsys):
    workdir = tmp_path / "run"
    back_to_step_10(finished, workdir)
    with (workdir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 25, "loss": 1.')
    assert RunDir(workdir).metrics() == RunDir(finished).metrics()   # readers: the end
    train(tiny_config(TINY_INDUCTION), workdir, progress=False)
    err = capsys.readouterr().err
    assert err.count("torn line") == 1, err
    assert deterministic(RunDir(workdir).metrics()) == deterministic(RunDir(finished).metrics())


def test_without_config_json_the_checkpoints_config_still_guards_the_run(finished, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    (workdir / "config.json").unlink()
    metrics = (workdir / "metrics.jsonl").read_text()
    other = tiny_config(TINY_INDUCTION, seed=1, **{"train.learning_rate": 0.01})
    with pytest.raises(ValueError, match=r"another config \(in its checkpoints: "
                                         r"seed: 0 -> 1; train\.learning_rate"):
        train(other, workdir, progress=False)
    assert (workdir / "metrics.jsonl").read_text() == metrics
    assert not (workdir / "config.json").exists()
    summary = train(tiny_config(TINY_INDUCTION), workdir, progress=False)   # its own config
    assert summary == RunDir(finished).summary()
    assert json.loads((workdir / "config.json").read_text()) == json.loads(
        (finished / "config.json").read_text())


def test_config_json_edited_to_match_does_not_hide_the_checkpoints_config(finished, tmp_path):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    other = tiny_config(TINY_INDUCTION, seed=1)
    (workdir / "config.json").write_text(json.dumps(to_dict(other)))
    with pytest.raises(ValueError, match=r"in its checkpoints: seed: 0 -> 1"):
        train(other, workdir, progress=False)


def test_a_directory_of_another_programs_metrics_is_refused(tmp_path):
    workdir = tmp_path / "theirs"
    workdir.mkdir()
    (workdir / "metrics.jsonl").write_text('{"epoch": 1, "acc": 0.5}\n')
    with pytest.raises(ValueError, match="no config.json and no checkpoint"):
        train(tiny_config(TINY_INDUCTION), workdir, progress=False)
    assert (workdir / "metrics.jsonl").read_text() == '{"epoch": 1, "acc": 0.5}\n'
    assert sorted(p.name for p in workdir.iterdir()) == [locks.LOCK_NAME, "metrics.jsonl"]


def test_the_checkpoint_saved_config_is_the_newest_readable_one(finished):
    checkpoints = Checkpoints(finished / "ckpt", read_only=True)
    try:
        assert checkpoints.saved_config() == json.loads((finished / "config.json").read_text())
    finally:
        checkpoints.close()


def test_a_reader_follows_the_writer_past_a_checkpoint_it_removed(finished, tmp_path, capsys):
    """A reader opened when step 10 was the newest checkpoint; the writer then saved 20 and
    removed 10 (it keeps the newest ones): the reader restores 20, and says nothing."""
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    shutil.move(workdir / "ckpt" / "20", tmp_path / "20")
    reader = Checkpoints(workdir / "ckpt", read_only=True)
    try:
        shutil.move(tmp_path / "20", workdir / "ckpt" / "20")
        shutil.rmtree(workdir / "ckpt" / "10")
        params, step = reader.restore_params()
        assert step == 20 and params is not None
    finally:
        reader.close()
    assert capsys.readouterr().err == ""


def test_a_reader_opens_again_when_the_writer_removes_a_checkpoint_it_was_opening(
        finished, monkeypatch):
    """Opening reads every checkpoint's metrics; a checkpoint removed between the listing and
    the read (made to happen here on the first opening, as a writer keeping the newest ones
    does it) makes the reader open again, on what is left."""
    real, openings = ocp.CheckpointManager, []

    def racing(directory, **kwargs):
        openings.append(directory)
        if len(openings) == 1:
            raise FileNotFoundError(f"{directory}/10/metrics")
        return real(directory, **kwargs)
    monkeypatch.setattr(ocp, "CheckpointManager", racing)
    reader = Checkpoints(finished / "ckpt", read_only=True)
    try:
        params, step = reader.restore_params()
        assert step == 20 and params is not None and len(openings) == 2
    finally:
        reader.close()
    with pytest.raises(FileNotFoundError):     # a writer has no one to wait for
        openings.clear()
        Checkpoints(finished / "ckpt")


# ------------------------------------------------ run and sweep directories are data, not code

def test_reading_a_sweep_runs_none_of_its_code_and_follows_no_path_out(finished, tmp_path,
                                                                        capsys, monkeypatch):
    """A sweep.json naming a payload as its experiment, and runs named by absolute or ``..``
    paths: sweep-status, report and compare run nothing and write nothing outside --out."""
    marker = tmp_path / "payload-ran"
    payload = tmp_path / "payload.py"
    payload.write_text(f"open({str(marker)!r}, 'w').close()\n"
                       "def get_config():\n    raise SystemExit('payload')\n"
                       "def get_report():\n    return {'metrics': ['loss']}\n")
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    record = {"experiment": "payload.py", "overrides": [], "launcher": "sequential",
              "runs": [{"name": "seed=0", "overrides": {"seed": 0}, "status": "pending",
                        "error": None, "summary": None, "evals": {}}]}
    (sweep / "sweep.json").write_text(json.dumps(record))
    for command in (["sweep-status", str(sweep)], ["report", str(sweep)]):
        code, out, err = run_cli(capsys, *command)
        assert code == 0, err
    assert not marker.exists()
    for name in ("../escaped", str(tmp_path / "absolute"), "a/../../escaped"):
        record["runs"][0]["name"] = name
        (sweep / "sweep.json").write_text(json.dumps(record))
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        for command in (["sweep-status", str(sweep)], ["report", str(sweep)],
                        ["compare", str(sweep), "--baseline", str(finished),
                         "--out", str(tmp_path / "out")]):
            code, out, err = run_cli(capsys, *command)
            assert code == 2 and err.count("\n") == 1, (command, err)
            assert f"{name!r} is not a path inside" in err, err
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not marker.exists()


# ------------------------------------------------------------------------ a full disk

@pytest.fixture
def small_disk(tmp_path):
    """A 400 KiB tmpfs (room for a run's config and metrics, not its first checkpoint),
    mounted at ``tmp_path / "disk"``; unmounted after."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.mark.trains
def test_a_full_disk_is_one_line_and_the_resume_after_freeing_space_is_exact(small_disk,
                                                                              tmp_path, capsys):
    wide = {**TINY_INDUCTION, "model.d_model": 64, "model.num_layers": 2}   # ~1 MB checkpoints
    experiment = write_experiment(tmp_path / "wide.py", wide)
    workdir = small_disk / "run"
    code, _, err = run_cli(capsys, "train", str(experiment), "--workdir", str(workdir),
                           "--no-progress")
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert (f"the checkpoint of step 10 could not be written to {workdir / 'ckpt'} "
            "(no space left on device)") in err, err
    assert not list(workdir.glob(".write-test*"))
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    train(tiny_config(wide), workdir, progress=False)
    reference = tmp_path / "reference"
    train(tiny_config(wide), reference, progress=False)
    assert deterministic(RunDir(workdir).metrics()) == deterministic(RunDir(reference).metrics())


# ------------------------------------------------- readable errors, nothing written before them

@pytest.mark.parametrize("content, dtype, message", [
    (b"", "uint16", "holds 0 bytes, not a positive multiple of data.token_dtype='uint16'"),
    (b"abc", "uint16", "holds 3 bytes, not a positive multiple of data.token_dtype='uint16'"),
    (b"abcdefg", "uint32", "holds 7 bytes, not a positive multiple of data.token_dtype='uint32'"),
])
def test_token_files_of_a_wrong_size_name_the_file_and_the_field(tmp_path, content, dtype,
                                                                  message):
    path = tmp_path / "tokens.bin"
    path.write_bytes(content)
    config = tiny_config(TINY_INDUCTION, **{"data.task": "tokens", "data.path": str(path),
                                            "data.token_dtype": dtype})
    with pytest.raises(ValueError, match=re.escape(f"data.path={str(path)!r} {message}")):
        train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text", ["", "ab", "x" * 12])
def test_text_too_short_to_train_is_refused_before_the_run_directory_exists(tmp_path, text):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    config = tiny_config(TINY_INDUCTION, **{"data.task": "text", "data.path": str(corpus),
                                            "data.vocab_size": 256, "model.vocab_size": 256,
                                            "data.length": 12})
    with pytest.raises(ValueError, match=re.escape(f"data.path={str(corpus)!r}: the train "
                                                   "split has")):
        train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_corpus_directory_holding_the_environment_or_the_run_is_refused(tmp_path):
    text = {"data.task": "text", "data.vocab_size": 256, "model.vocab_size": 256}
    environment = Path(sys.prefix).parent
    with pytest.raises(ValueError, match="contains this Python environment"):
        train(tiny_config(TINY_INDUCTION, **text, **{"data.path": str(environment)}),
              tmp_path / "run", progress=False)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text " * 200)
    with pytest.raises(ValueError, match="contains the run directory"):
        train(tiny_config(TINY_INDUCTION, **text, **{"data.path": str(corpus)}),
              corpus / "run", progress=False)
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt"]


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe not utf-8", "is not UTF-8 text"),
    (b"[1, 2]", "holds a JSON list, not an object"),
    (b'{"model": {"d_model": "wide"}}', "model.d_model must be int"),
])
def test_a_bad_config_json_is_one_line_in_every_command(finished, tmp_path, capsys, content,
                                                         message):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    (workdir / "config.json").write_bytes(content)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"experiment": "x.py", "overrides": [], "runs": [
        {"name": "run", "overrides": {}, "status": "finished", "error": None,
         "summary": None, "evals": {}}]}))
    shutil.copytree(workdir, sweep / "run")
    experiment = write_experiment(tmp_path / "tiny.py", TINY_INDUCTION)
    for command in (["train", str(experiment), "--workdir", str(workdir)],
                    ["eval", str(workdir)],
                    ["generate", str(workdir), "--prompt", "1", "--tokens", "2"],
                    ["attention", str(workdir), "--out", str(tmp_path / "maps")],
                    ["sweep-status", str(sweep)], ["report", str(sweep)]):
        code, out, err = run_cli(capsys, *command)
        assert code == 2 and err.count("\n") == 1, (command, err)
        assert "config.json" in err and message in err, (command, err)


def test_a_summary_json_of_wrong_types_is_one_line(finished, tmp_path, capsys):
    workdir = tmp_path / "run"
    shutil.copytree(finished, workdir)
    (workdir / "summary.json").write_text('{"status": 3, "eval": []}')
    experiment = write_experiment(tmp_path / "tiny.py", TINY_INDUCTION)
    code, out, err = run_cli(capsys, "train", str(experiment), "--workdir", str(workdir))
    assert code == 2 and err.count("\n") == 1, err
    assert f"{workdir / 'summary.json'} is not a run summary" in err, err


def test_an_experiment_whose_get_config_is_not_a_config_is_one_line(tmp_path, capsys):
    experiment = tmp_path / "dicts.py"
    experiment.write_text("def get_config():\n    return {'seed': 1}\n")
    for command in ("train", "sweep"):
        code, out, err = run_cli(capsys, command, str(experiment), "--workdir",
                                 str(tmp_path / command))
        assert code == 2 and err.count("\n") == 1, err
        assert "must return an attnjax.config.Config, got dict" in err, err
        assert not (tmp_path / command).exists()


def test_tensorboards_full_disk_in_its_writer_thread_is_left_to_the_checkpoints_one_line():
    """TensorBoard writes from a thread of its own; its "no space left on device" would print a
    traceback beside the checkpoint's one line, so the run's hook drops that error alone."""
    seen = []
    hook = _quiet_full_disk(lambda args: seen.append(type(args.exc_value).__name__))
    writer = type("_EventLoggerThread", (threading.Thread,),
                  {"__module__": "tensorboardX.event_file_writer"})()
    for error, thread in ((OSError(errno.ENOSPC, "full"), writer),
                          (OSError(errno.ENOSPC, "full"), threading.Thread()),
                          (OSError(errno.EACCES, "denied"), writer)):
        hook(types.SimpleNamespace(exc_value=error, thread=thread))
    assert seen == ["OSError", "PermissionError"]   # another thread's, another error: printed
