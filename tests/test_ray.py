"""The ``ray`` launcher on real local Ray instances: one started by the sweep itself and
stopped after it (as on a laptop: the refusal test, run in this process), and one started
once for this file that sweeps join with ``--address`` (as on a cluster), among them a
2-run encoder sweep in which one run's Ray worker is killed mid-run (its ``--retry-failed``
rerun runs in this process, which is connected to that instance already). Starting an
instance takes seconds; the file's sweeps share one instead of starting their own."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from attnjax.rundir import RunDir
from attnjax.sweep import expand
from attnjax.sweep.ray_launcher import connect
from attnjax.train import train
from helpers import deterministic, run_cli, subprocess_env
from test_encoder_commands import write_experiment as write_encoder_experiment
from test_seq2seq_commands import write_experiment as write_seq2seq_experiment
from test_sweep import KILLED, write_experiment


def _ray_workers() -> list[int]:
    """PIDs of Ray workers running an attnjax task (Ray titles them ``ray::<task>``) of this
    process's Ray instance (its descendants: not another session's workers on the machine)."""
    out = subprocess.run(["pgrep", "-f", "ray::_train_on_ray"], capture_output=True, text=True)
    ours = []
    for pid in map(int, out.stdout.split()):
        try:
            if any(p.pid == os.getpid() for p in psutil.Process(pid).parents()):
                ours.append(pid)
        except psutil.NoSuchProcess:
            pass
    return ours


@pytest.fixture(scope="module")
def ray_instance():
    """The address of a real local Ray instance started in this process (as a sweep starts
    one), for sweeps to join with ``--address``; stopped after the file's tests. Its Ray
    workers inherit the environment of the processes tests start (``subprocess_env``)."""
    import ray
    with pytest.MonkeyPatch.context() as patch:
        for key, value in subprocess_env().items():
            patch.setenv(key, value)
        patch.delenv("RAY_ADDRESS", raising=False)
        assert connect(ray, None)                   # started here, as a sweep starts one
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_a_request_no_node_can_grant_is_refused_before_anything_runs(tmp_path, capsys,
                                                                    monkeypatch):
    """Ray would queue a task asking for more CPUs than any node has forever. The sweep starts
    its own local instance here (first in this file: before ``ray_instance`` is up) and
    stops it."""
    import ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized(), "defined first in this file: runs before ray_instance"
    path = write_experiment(tmp_path, '[{"seed": 0}, {"seed": 1}]')
    code, out, err = run_cli(capsys, "sweep", str(path), "--workdir", str(tmp_path / "s"),
                             "--launcher", "ray", "--cpus-per-run", "1000", "--no-progress")
    errors = [line for line in err.splitlines() if line.startswith("attnjax: error:")]
    assert code == 2 and len(errors) == 1, err             # (Ray adds notes of its own)
    assert "--cpus-per-run=1000 but the largest node of the Ray cluster has" in errors[0]
    assert not ray.is_initialized()                        # the instance it started is stopped


def _wait_for_a_logging_run(sweep: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(RunDir(d).metrics() for d in sweep.glob("seed=*")) and _ray_workers():
            return
        time.sleep(0.1)
    raise AssertionError("no Ray task ever started logging")


def test_ray_sweep_survives_a_killed_worker_and_resumes_it(tmp_path, ray_instance, capsys):
    """Two seeds of the tiny encoder (a model family reaches Ray workers like any config),
    one Ray task each, one at a time: the first is killed, the other finishes in a new
    worker; the killed one, retried, equals its run trained alone."""
    path = write_encoder_experiment(tmp_path / "encoder.py", range(2))
    sweep = tmp_path / "s"
    overrides = [f"{k}={v}" for k, v in KILLED.items()]
    args = ["sweep", str(path), *overrides, "--workdir", str(sweep), "--launcher", "ray",
            "--jobs", "1", "--cpus-per-run", "1", "--no-progress", "--address", ray_instance]
    env = subprocess_env()                       # the cluster is --address, not RAY_ADDRESS
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-m", "attnjax.cli", *args], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_a_logging_run(sweep)
    os.kill(_ray_workers()[0], signal.SIGKILL)
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 1, err[-3000:]
    runs = json.loads((sweep / "sweep.json").read_text())["runs"]
    failed = [r for r in runs if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"].startswith("WorkerCrashedError: the Ray")
    assert sorted(r["status"] for r in runs) == ["failed", "finished"]
    assert "[2/2]" in out
    code, _, err = run_cli(capsys, *args, "--retry-failed")   # joins from this process
    assert code == 0, err[-3000:]
    assert {r["status"] for r in json.loads((sweep / "sweep.json").read_text())["runs"]} == {
        "finished"}
    name = failed[0]["name"]
    run = next(r for r in expand(path, overrides) if r.name == name)
    train(run.config, tmp_path / "alone", progress=False)
    for a, b in zip(deterministic(RunDir(sweep / name).metrics()),
                    deterministic(RunDir(tmp_path / "alone").metrics()), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=2e-6, atol=1e-7, err_msg=key)


def test_ray_options_are_refused_for_other_launchers(tmp_path, capsys):
    path = write_experiment(tmp_path, '[{"seed": 0}]')
    code, out, err = run_cli(capsys, "sweep", str(path), "--workdir", str(tmp_path / "s"),
                             "--launcher", "vmap", "--address", "auto")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--address applies to --launcher ray, not vmap" in err
    assert not (tmp_path / "s").exists()


def test_a_seq2seq_sweep_runs_on_the_ray_instance(tmp_path, ray_instance):
    """Two seeds of the tiny encoder-decoder, Ray tasks joining the file's instance: the
    family reaches Ray workers like any config and reports its own metrics."""
    path = write_seq2seq_experiment(tmp_path / "seq2seq.py")
    env = subprocess_env()
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "attnjax.cli", "sweep", str(path),
                           "--workdir", str(tmp_path / "s"), "--launcher", "ray",
                           "--cpus-per-run", "1", "--no-progress", "--address", ray_instance],
                          env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((tmp_path / "s" / "sweep.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["finished", "finished"]
    summary = RunDir(tmp_path / "s" / runs[0]["name"]).summary()["eval"]["12"]
    assert 0 < summary["alignment"] <= 1
