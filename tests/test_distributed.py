"""Multi-process training (``attnjax.distributed``): real ``jax.distributed`` processes on
localhost, one CPU device each, gloo collectives; and the one-line refusals of a cluster
described wrongly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from attnjax.config import Config, apply_overrides
from attnjax.distributed import Cluster, cluster_from
from attnjax.rundir import RunDir
from attnjax.train import train
from helpers import TINY_MLM, TINY_SEQ2SEQ, TINY_TEXT, deterministic, run_cli, subprocess_env

# 60 steps, a log (and a sync of the two processes) every dispatch of 10, an evaluation and a
# checkpoint at 30 and 60: every logged loss and the evaluation are compared with one
# process's, and the killed run has a checkpoint behind it (30) and one ahead (60). Each
# step is a gloo all-reduce between the two processes, so the steps are kept to what these
# comparisons need.
LONG = {"train.steps": 60, "train.eval_every": 30, "train.checkpoint_every": 30,
        "train.log_every": 10, "train.steps_per_dispatch": 10}
# Both data paths and the model families: the encoder's masked-language batches are made on
# the device, the decoder's token file is read on the host, the encoder-decoder's reversal
# batches (source and target) are made on the device. Evaluations and checkpoints synchronise
# both processes: host data has two, seq2seq one, at its end.
SETTINGS = {
    "device data": {**TINY_MLM, **LONG},
    "host data": {**TINY_TEXT, "data.task": "tokens", "data.vocab_size": 64,
                  "model.vocab_size": 64, "train.steps": 40, "train.eval_every": 20,
                  "train.checkpoint_every": 20},
    # two processes of 2 devices each on a data=1 x fsdp=4 mesh: fsdp spans both processes
    # (devices 0-1 are process 0's), so every parameter is split over them and gathered
    # through gloo; the one-process reference trains on one device
    "seq2seq, fsdp across processes": {**TINY_SEQ2SEQ, "train.steps": 20,
                                       "train.eval_every": 20, "train.checkpoint_every": 20,
                                       "train.mesh.data": 1, "train.mesh.fsdp": 4},
}
DEVICES_PER_PROCESS = {"seq2seq, fsdp across processes": 2}
ONE_DEVICE = {"train.mesh.data": -1, "train.mesh.fsdp": 1}


SLURM_PORTS = 65535 - 2**12 + 1       # JAX's SLURM coordinator port: this + job id % 4096


def write_experiment(path, overrides: dict):
    path.write_text(textwrap.dedent(f"""
        from attnjax.config import Config, apply_overrides
        def get_config():
            return apply_overrides(Config(), {overrides!r})
    """))
    return path


def free_port(low: int = 0, high: int = 0) -> int:
    """A TCP port nothing listens on (any, or the first free one in ``[low, high]``)."""
    for port in range(low, high + 1) if low else [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError(f"no free port in [{low}, {high}]")


def start(experiment, workdir, processes: int = 2, slurm: bool = False,
          devices: int = 1) -> list[subprocess.Popen]:
    """``attnjax train`` as ``processes`` cooperating processes on localhost of ``devices``
    CPU devices each, told who they are by the flags, or (``slurm``) found by
    ``--distributed`` in the variables SLURM's ``srun`` sets (JAX derives the coordinator's
    port from the job id)."""
    flags = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    command = [sys.executable, "-m", "attnjax.cli", "train", str(experiment), "--workdir",
               str(workdir), "--no-progress"]
    if slurm:
        job = free_port(SLURM_PORTS, SLURM_PORTS + 4095) - SLURM_PORTS
        envs = [subprocess_env(**flags, SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="localhost",
                               SLURM_NTASKS=str(processes), SLURM_PROCID=str(i),
                               SLURM_LOCALID=str(i)) for i in range(processes)]
        commands = [command + ["--distributed"]] * processes
    else:
        port = free_port()
        envs = [subprocess_env(**flags)] * processes
        commands = [command + ["--coordinator", f"127.0.0.1:{port}", "--num-processes",
                               str(processes), "--process-id", str(i)]
                    for i in range(processes)]
    return [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for c, e in zip(commands, envs)]


def finish(processes: list[subprocess.Popen]) -> list[str]:
    outputs = [p.communicate(timeout=600) for p in processes]
    for p, (_, err) in zip(processes, outputs):
        assert p.returncode == 0, err[-3000:]
    return [out for out, _ in outputs]


def overrides(name: str, tmp_path) -> dict:
    setting = dict(SETTINGS[name])
    if setting["data.task"] == "tokens":
        path = tmp_path / "tokens.bin"
        np.random.default_rng(0).integers(0, 64, 20_000).astype(np.uint16).tofile(path)
        setting["data.path"] = str(path)
    return setting


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """The device-data setting trained by two processes, undisturbed."""
    root = tmp_path_factory.mktemp("two")
    experiment = write_experiment(root / "exp.py", SETTINGS["device data"])
    outputs = finish(start(experiment, root / "run"))
    return experiment, root / "run", outputs


@pytest.mark.parametrize("name", list(SETTINGS))
def test_two_processes_train_like_one(name, two_process_run, tmp_path):
    """Same global batch, one mesh over both processes' devices: the logged losses and the
    evaluation equal one process's up to the order of the all-reduce's float32 sums (the
    tolerance of the in-process mesh test); only process 0 writes or prints. Host data runs
    under SLURM's variables (``--distributed``), device data under the flags. The one-process
    run trains here while the two processes train (they wait on each other's compilation)."""
    setting = overrides(name, tmp_path)
    if name == "device data":
        _, workdir, outputs = two_process_run
        single = train(apply_overrides(Config(), setting), tmp_path / "one", progress=False)
    else:                                    # as srun starts them: --distributed finds them
        workdir = tmp_path / "two"
        processes = start(write_experiment(tmp_path / "exp.py", setting), workdir, slurm=True,
                          devices=DEVICES_PER_PROCESS.get(name, 1))
        single = train(apply_overrides(Config(), {**setting, **ONE_DEVICE}), tmp_path / "one",
                       progress=False)
        outputs = finish(processes)
    many, one = RunDir(workdir).metrics(), RunDir(tmp_path / "one").metrics()
    assert [r["step"] for r in many] == [r["step"] for r in one]
    np.testing.assert_allclose([r["loss"] for r in many], [r["loss"] for r in one], rtol=2e-6)
    summary = RunDir(workdir).summary()
    for length, result in single["eval"].items():
        np.testing.assert_allclose(summary["eval"][length]["loss"], result["loss"], rtol=2e-6)
    assert "finished" in outputs[0] and "finished" not in outputs[1]   # process 0 reports


def test_two_processes_killed_and_restarted_resume_exactly(two_process_run, tmp_path):
    """SIGKILL of both processes (a job killed by its scheduler) past a checkpoint; the same
    two commands again resume from it and end with the undisturbed run's metrics, bit for
    bit."""
    experiment, reference, _ = two_process_run
    workdir = tmp_path / "run"
    processes = start(experiment, workdir)
    deadline = time.time() + 300
    while not (records := RunDir(workdir).metrics()) or records[-1]["step"] < 40:
        assert time.time() < deadline and all(p.poll() is None for p in processes), \
            processes[0].communicate()[1][-2000:]
        time.sleep(0.02)
    for p in processes:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert RunDir(workdir).summary() is None, "the run finished before it was killed"
    finish(start(experiment, workdir))
    assert deterministic(RunDir(workdir).metrics()) == deterministic(RunDir(reference).metrics())
    assert RunDir(workdir).summary()["eval"] == RunDir(reference).summary()["eval"]


def test_a_cluster_comes_from_the_flags_or_the_environment():
    assert cluster_from() is None and cluster_from(environ={}) is None
    assert cluster_from("h:1", 2, 1, environ={}) == Cluster("h:1", 2, 1)
    environ = {"ATTNJAX_COORDINATOR": "10.0.0.1:12355", "ATTNJAX_NUM_PROCESSES": "4",
               "ATTNJAX_PROCESS_ID": "3"}
    assert cluster_from(environ=environ) == Cluster("10.0.0.1:12355", 4, 3)
    assert cluster_from(detect=True, environ={}) == Cluster(detect=True)


@pytest.mark.parametrize("args, message", [
    (("h:1", 2, None), "missing: --process-id"),
    ((None, 2, None), "missing: --coordinator, --process-id"),
    (("h", 2, 0), "--coordinator must be HOST:PORT"),
    (("h:1", 2, 2), "--process-id must be in [0, 1] for --num-processes 2, got 2"),
    (("h:1", 0, 0), "--num-processes must be >= 1, got 0"),
])
def test_a_cluster_described_wrongly_is_refused_in_one_line(args, message):
    with pytest.raises(ValueError) as error:
        cluster_from(*args, environ={})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_cli_refuses_a_bad_cluster_before_anything_starts(capsys, tmp_path):
    experiment = write_experiment(tmp_path / "exp.py", SETTINGS["device data"])
    code, _, err = run_cli(capsys, "train", str(experiment), "--workdir", str(tmp_path / "r"),
                           "--num-processes", "2", "--process-id", "0")
    assert code == 2 and "missing: --coordinator" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "train", str(experiment), "--workdir", str(tmp_path / "r"),
                           "--distributed", "--process-id", "0")
    assert code == 2 and "does not combine with --process-id" in err
    assert not (tmp_path / "r").exists() and not jax.distributed.is_initialized()
