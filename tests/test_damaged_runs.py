"""Read-only and damaged runs, and output places that cannot be written: each is one line.

- A read-only run (a read-only bind mount as root, for whom permissions are no obstacle; its
  files' write bits cleared otherwise): ``eval`` reads its checkpoint, prints its results and
  says in one line that eval.json was not saved, exit status 0; nothing is written into it.
- ``--out`` / ``--workdir`` / ``--publish`` naming a file, a path under a file, or a place
  that cannot be written: one line naming the option (``attnjax.outputs``).
- A checkpoint whose data is truncated: one line reporting it, none of the tracebacks of the
  reads orbax abandons (checked at the file descriptors, with Python's own unraisable hook).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnjax import checkpoint
from attnjax.outputs import NotSavedError, output_directory, output_file
from attnjax.rundir import RunDir
from helpers import REPO, raises_one_line, run_cli
from test_limits import text_run  # noqa: F401  (a module fixture: a tiny trained text run)
from test_run_integrity import finished  # noqa: F401  (a module fixture: a tiny finished run)

UNWRITABLE = ("Read-only file system", "Permission denied")


def one_line(err: str) -> str:
    """``err``, checked to be exactly one line; that line."""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.strip()


def listing(directory: Path) -> list[tuple[str, int, int]]:
    """Every path under ``directory`` with its size and modification time (nanoseconds)."""
    return sorted((str(p.relative_to(directory)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in [directory, *directory.rglob("*")])


@pytest.fixture
def read_only(finished, tmp_path):  # noqa: F811
    """``finished`` seen through a path that cannot be written: a read-only bind mount (root
    may write any file its mode forbids), or, for another user, a copy without write bits."""
    view = tmp_path / "read-only"
    view.mkdir()
    if os.geteuid() != 0:
        shutil.copytree(finished, view, dirs_exist_ok=True)
        for path in [view, *view.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        yield view
        for path in [view, *view.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
        return
    mounted = subprocess.run(["mount", "--bind", str(finished), str(view)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot bind-mount a directory here: {mounted.stderr.strip()}")
    try:
        frozen = subprocess.run(["mount", "-o", "remount,ro,bind", str(view)],
                                capture_output=True, text=True)
        if frozen.returncode:
            pytest.skip(f"cannot make a bind mount read-only here: {frozen.stderr.strip()}")
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


# ------------------------------------------------------------------------ a read-only run

def test_eval_of_a_read_only_run_prints_its_results_and_one_line_on_eval_json(read_only,
                                                                               finished,  # noqa: F811
                                                                               capsys):
    before = listing(finished)
    code, out, err = run_cli(capsys, "eval", str(read_only))
    assert code == 0, err
    assert f"of {read_only}" in out and "val loss" in out, out
    line = one_line(err)
    assert line.startswith(f"attnjax: could not save eval.json in {str(read_only)!r} ("), line
    assert line.endswith("): the results above are not kept") and any(
        reason in line for reason in UNWRITABLE), line
    assert listing(finished) == before       # the checkpoint was read without a write


def test_analysis_written_into_a_read_only_run_is_one_line(read_only, capsys):
    out = read_only / "pictures"
    code, _, err = run_cli(capsys, "attention", str(read_only), "--out", str(out))
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"attnjax: error: --out {str(out)!r} cannot be created in "
                           f"{str(read_only)!r} ("), line
    assert any(reason in line for reason in UNWRITABLE), line
    assert not out.exists()


def test_reading_a_checkpoint_writes_nothing_into_the_run(finished):  # noqa: F811
    """The read-only checkpoint manager creates no directory, lock or temporary file."""
    before = listing(finished)
    _, params, step = RunDir(finished).params("latest")
    assert step == 20 and params is not None
    assert listing(finished) == before


def test_an_eval_record_that_cannot_be_saved_is_one_line_naming_the_file(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "eval.json.tmp").mkdir()         # where the record is written first
    raises_one_line(lambda: run.write_eval({"results": {}}), "could not save eval.json in",
                    str(tmp_path))
    (tmp_path / "evals").write_text("")           # a file where the variants' directory goes
    with pytest.raises(NotSavedError, match=r"could not save evals/yarn.json in .*\(File exists\)"):
        run.write_eval_variant("yarn", {})


# ------------------------------------------------------------ --out, --workdir, --publish

@pytest.fixture
def a_file(tmp_path) -> Path:
    """A regular file, where commands are told to write a directory."""
    path = tmp_path / "notes.txt"
    path.write_text("not a directory\n")
    return path


@pytest.mark.parametrize("command", [
    ["attention", "{finished}"],
    ["heads", "{finished}"],
    ["recall", "{finished}"],
    ["compare", "{finished}", "{finished}"],
    ["lens", "{text_run}", "--text", "hello"],
], ids=lambda command: command[0])
def test_out_under_a_file_is_one_line(command, finished, text_run, a_file, capsys):  # noqa: F811
    runs = {"finished": str(finished), "text_run": str(text_run)}
    out = a_file / "report"
    code, _, err = run_cli(capsys, *[part.format(**runs) for part in command], "--out", str(out))
    assert code == 2
    assert one_line(err) == (f"attnjax: error: --out {str(out)!r}: {str(a_file)!r} is a file, "
                             "not a directory")


def test_out_naming_a_file_is_one_line(finished, a_file, capsys):  # noqa: F811
    code, _, err = run_cli(capsys, "attention", str(finished), "--out", str(a_file))
    assert code == 2
    assert one_line(err) == f"attnjax: error: --out {str(a_file)!r} is a file, not a directory"
    assert a_file.read_text() == "not a directory\n"


def test_report_into_a_file_is_one_line(tmp_path, a_file, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"experiment": "x.py", "overrides": [],
                                                  "launcher": "sequential", "runs": []}))
    code, _, err = run_cli(capsys, "report", str(sweep), "--out", str(a_file))
    assert code == 2
    assert one_line(err) == f"attnjax: error: --out {str(a_file)!r} is a file, not a directory"


@pytest.mark.parametrize("command, flag", [
    (["sweep", str(REPO / "experiments" / "heads.py"), "--workdir", "{a_file}/sweep"],
     "--workdir"),
    (["audit", str(REPO / "experiments" / "claims"), "--workdir", "{a_file}/audit"],
     "--workdir"),
    (["audit", str(REPO / "experiments" / "claims"), "--workdir", "{tmp_path}/audit",
      "--publish", "{a_file}/AUDIT.md"], "--publish"),
    (["bench", "memory", "--out", "{a_file}/memory.json"], "--out"),
], ids=["sweep", "audit", "audit-publish", "bench"])
def test_places_under_a_file_are_refused_in_one_line_before_any_work(command, flag, a_file,
                                                                     tmp_path, capsys):
    argv = [part.format(a_file=a_file, tmp_path=tmp_path) for part in command]
    named = argv[argv.index(flag) + 1]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert one_line(err) == (f"attnjax: error: {flag} {named!r}: {str(a_file)!r} is a file, "
                             "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == [a_file.name]   # nothing written


def test_bench_out_naming_a_directory_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "bench", "memory", "--out", str(tmp_path))
    assert code == 2
    assert one_line(err) == f"attnjax: error: --out {str(tmp_path)!r} is a directory, not a file"


def test_train_workdir_under_a_file_is_one_line(a_file, tmp_path, capsys):
    experiment = tmp_path / "tiny.py"
    experiment.write_text("from attnjax.config import Config\n"
                          "def get_config():\n    return Config()\n")
    code, _, err = run_cli(capsys, "train", str(experiment), "--workdir", str(a_file / "run"))
    assert code == 2
    assert str(a_file / "run") in one_line(err)


def test_output_places(tmp_path, a_file):
    """``output_directory`` creates nested directories, and with ``create=False`` creates
    nothing; a dangling link, a file, a path under a file and a file named where a directory
    must be are each one line naming the option."""
    nested = tmp_path / "a" / "b"
    assert output_directory(nested, "--out", create=False) == nested and not nested.exists()
    assert output_directory(nested, "--out") == nested and nested.is_dir()
    assert list(nested.iterdir()) == []                    # the write test left nothing
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    raises_one_line(lambda: output_directory(dangling, "--out"),
                    f"--out {str(dangling)!r} is a broken symbolic link")
    raises_one_line(lambda: output_directory(a_file / "x" / "y", "--workdir", create=False),
                    f"--workdir {str(a_file / 'x' / 'y')!r}: {str(a_file)!r} is a file")
    raises_one_line(lambda: output_file(nested, "--out"), "is a directory, not a file")
    assert output_file(nested / "x.json", "--out") == nested / "x.json"


def test_a_read_only_place_is_one_line_naming_why(read_only):
    for check in (lambda: output_directory(read_only, "--out"),
                  lambda: output_directory(read_only / "x", "--out", create=False),
                  lambda: output_file(read_only / "x.json", "--out")):
        message = raises_one_line(check, str(read_only))
        assert any(reason in message for reason in UNWRITABLE), message


# -------------------------------------------------------------------- a damaged checkpoint

def damaged(finished: Path, tmp_path: Path, steps=(20,), files=lambda p: p.parent.name == "d"):  # noqa: F811
    """A copy of ``finished`` whose checkpoints at ``steps`` have the ``files`` of their state
    (default: the array data) cut to half their size."""
    run = tmp_path / "damaged"
    shutil.copytree(finished, run)
    for step in steps:
        for path in (run / "ckpt" / str(step)).rglob("*"):
            if path.is_file() and files(path):
                os.truncate(path, path.stat().st_size // 2)
    return run


@pytest.fixture
def as_a_process(monkeypatch, caplog):
    """The CLI as it runs in a process of its own: Python's unraisable hook, which prints to
    stderr (pytest's collects instead), none of attnjax's quieting installed yet; orbax's
    and asyncio's log records are collected (``caplog``) to check none reaches a user."""
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    monkeypatch.setattr(checkpoint, "_dropping_abandoned", False)
    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])
    caplog.set_level(logging.WARNING)
    return caplog


def cli_settled(capfd, *args: str) -> tuple[int, str, str]:
    """``run_cli`` with stdout and stderr read at the file descriptors, and read again after
    what a failed restore abandoned has had time to end and be collected."""
    code, out, err = run_cli(capfd, *args)
    gc.collect()
    time.sleep(0.5)
    gc.collect()
    later_out, later_err = capfd.readouterr()
    return code, out + later_out, err + later_err


def orbax_records(caplog) -> list[str]:
    """The records orbax (absl) and asyncio logged at WARNING or above, shortened."""
    return [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records
            if r.name in ("asyncio", "absl")]


def test_a_truncated_checkpoint_is_one_line_and_the_one_before_is_used(finished, tmp_path,  # noqa: F811
                                                                        as_a_process, capfd):
    run = damaged(finished, tmp_path)
    code, out, err = cli_settled(capfd, "eval", str(run), "--checkpoint", "latest")
    assert code == 0, err[-3000:]
    assert f"latest checkpoint (step 10) of {run}" in out, out
    line = one_line(err)
    assert line.startswith(f"attnjax: checkpoint 20 in {run / 'ckpt'} is unusable ("), line
    assert line.endswith("; trying an earlier one"), line
    assert orbax_records(as_a_process) == []


def test_a_run_whose_checkpoints_are_all_truncated_says_so_once_each(finished, tmp_path,  # noqa: F811
                                                                      as_a_process, capfd):
    run = damaged(finished, tmp_path, steps=(10, 20))
    code, out, err = cli_settled(capfd, "eval", str(run), "--checkpoint", "latest")
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 3, err[-3000:]
    assert [line.split(" is unusable")[0] for line in lines[:2]] == [
        f"attnjax: checkpoint {step} in {run / 'ckpt'}" for step in (20, 10)], lines
    assert lines[2] == f"attnjax: error: {str(run)!r} has no usable checkpoint"
    assert orbax_records(as_a_process) == []


def test_a_checkpoint_with_truncated_orbax_metadata_is_read_without_orbax_logs(
        finished, tmp_path, as_a_process, capfd):  # noqa: F811
    """orbax logs each unparsable ``_CHECKPOINT_METADATA`` it lists, with the file's content;
    the state itself reads and matches its digest, so nothing is said."""
    run = damaged(finished, tmp_path, files=lambda p: p.name == "_CHECKPOINT_METADATA")
    code, out, err = cli_settled(capfd, "eval", str(run), "--checkpoint", "latest")
    assert code == 0 and "(step 20)" in out, err[-3000:]
    assert err == ""
    assert orbax_records(as_a_process) == []


class Finalised:
    """An object whose finaliser raises ``error``: an error Python cannot raise anywhere, which
    goes to ``sys.unraisablehook``, as tensorstore's callbacks into a closed loop do."""

    def __init__(self, error: Exception):
        self.error = error

    def __del__(self):
        raise self.error


def test_after_a_failed_restore_only_what_abandoned_reads_leave_is_dropped(as_a_process,
                                                                          capfd):
    """What the other tests meet by chance (which reads are in flight when orbax gives up
    decides it), made to happen: the errors of callbacks into orbax's closed loop and
    asyncio's reports of abandoned tasks are dropped, other errors and other asyncio records
    are not."""
    checkpoint._quiet_abandoned_reads()
    Finalised(RuntimeError("Event loop is closed"))
    Finalised(RuntimeError("an error of someone else's"))
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished>")
    asyncio_log.error("Exception in callback of someone else's")
    _, err = capfd.readouterr()
    assert "Event loop is closed" not in err and "RuntimeError: an error of someone else's" in err
    assert [r.getMessage() for r in as_a_process.records if r.name == "asyncio"] == [
        "Exception in callback of someone else's"]
