"""Training: exact accumulation, skipped non-finite updates, dispatch grouping, device-count
equivalence, SIGKILL/SIGTERM resume, checkpoint corruption, run-directory rules."""

import functools
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.cli import main
from attnjax.config import Config, apply_overrides
from attnjax.data import Dataset, load_dataset
from attnjax.models.decoder import DecoderLM
from attnjax.rundir import RunDir
from attnjax.checkpoint import Checkpoints
from attnjax.train import hyper, loop, train
from attnjax.train.parallel import Runner
from attnjax.train.loop import evaluate
from attnjax.train.state import init_params, init_state
from attnjax.train.step import make_train_step
from helpers import TINY_MQAR, TINY_TEXT, deterministic, run_cli, subprocess_env, tiny_config

# 200 steps, a checkpoint every 50: long enough to be killed between two checkpoints
TINY = {**TINY_MQAR, "train.steps": 200, "train.eval_every": 50, "train.checkpoint_every": 50}


def tiny(**overrides) -> Config:
    return tiny_config(TINY, **overrides)


def train_batch(config):
    """The batch of step 0 of seed 0, at the configured size and length."""
    return Dataset(config.data).batch(0, 0, config.train.batch_size, config.data.length, "train")


@functools.cache
def compiled_step(config):
    return jax.jit(make_train_step(config))


def one_step(config, batch):
    return compiled_step(config)(init_state(config), batch)


def test_gradient_norms_per_parameter_group_add_up_to_the_global_norm():
    from attnjax.train.step import parameter_group
    config = tiny()
    _, metrics = one_step(config, train_batch(config))
    groups = {k.split("/", 1)[1]: float(v) for k, v in metrics.items()
              if k.startswith("grad_norm/")}
    layers = config.model.num_layers
    assert set(groups) == {"embed", "final_norm"} | {
        f"block_{i}/{part}" for i in range(layers)
        for part in ("attention", "attention_norm", "mlp", "mlp_norm")}
    np.testing.assert_allclose(np.sqrt(sum(g * g for g in groups.values())),
                               float(metrics["grad_norm"]), rtol=1e-5)
    assert all(g > 0 for g in groups.values())
    path = [jax.tree_util.DictKey(k) for k in ("block_3", "attention", "qkv", "kernel")]
    assert parameter_group(path) == "block_3/attention"
    assert parameter_group(path[:1]) == "block_3"


def test_gradient_accumulation_equals_one_big_batch():
    config = tiny()
    batch = train_batch(config)
    full_state, full = one_step(config, batch)
    acc_state, acc = one_step(apply_overrides(config, {"train.grad_accum": 4}), batch)
    np.testing.assert_allclose(acc["loss"], full["loss"], rtol=1e-6)
    # sums in another order: float32 rounding of the gradient, relative to its scale
    np.testing.assert_allclose(acc["grad_norm"], full["grad_norm"], rtol=1e-5)
    # Compare the accumulated gradients through Adam's first moment (mu = (1 - b1) g after one
    # step). Parameters after one Adam step are not a fair check: the update is
    # g / (|g| + eps), which turns last-bit differences of near-zero gradients into large ones.
    import optax
    mu_acc = optax.tree_utils.tree_get(acc_state.opt_state, "mu")
    mu_full = optax.tree_utils.tree_get(full_state.opt_state, "mu")
    scale = max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(mu_full))
    chex.assert_trees_all_close(mu_acc, mu_full, rtol=1e-5, atol=1e-6 * scale)


def test_non_finite_update_is_skipped_and_counted():
    config = tiny()
    batch = train_batch(config)
    batch = {**batch, "weights": batch["weights"].at[0, 0].set(jnp.nan)}
    state = init_state(config)
    new_state, metrics = compiled_step(config)(state, batch)
    assert int(new_state.skipped) == 1 and int(new_state.step) == 1
    assert not np.isfinite(metrics["loss"])
    chex.assert_trees_all_equal(new_state.params, state.params)
    chex.assert_trees_all_equal(new_state.opt_state, state.opt_state)


def test_steps_per_dispatch_gives_the_same_losses():
    def losses(per_dispatch):
        config = tiny(**{"train.steps_per_dispatch": per_dispatch})
        runner = Runner(config, Dataset(config.data))
        state, out = runner.place(init_state(config)), []
        for _ in range(10 // per_dispatch):
            state, metrics = runner.run(state, hyper.as_arrays([config], stacked=False))
            out += list(np.asarray(metrics["loss"]))
        return np.array(out)
    np.testing.assert_allclose(losses(5), losses(1), rtol=1e-6)


DEVICE_SCRIPT = """
import re
import jax, numpy as np
from attnjax.config import Config, apply_overrides
from attnjax.data import Dataset, load_dataset
from attnjax.train import hyper
from attnjax.train.parallel import Runner
from attnjax.train.loop import evaluate
from attnjax.train.state import init_params, init_state
TINY = {tiny!r}
def losses(parallel, devices, **overrides):
    config = apply_overrides(Config(), {{**TINY, "train.parallel": parallel,
                                         "train.steps_per_dispatch": 5, **overrides}})
    runner = Runner(config, Dataset(config.data), devices)
    state, out = runner.place(init_state(config)), []
    for _ in range(3):
        state, metrics = runner.run(state, hyper.as_arrays([config], stacked=False))
        out += list(np.asarray(metrics["loss"]))
    params = runner.unplace(state).params
    return np.array(out), params
assert jax.device_count() == 4
one, p1 = losses("mesh", jax.devices()[:1])
for parallel in ("mesh", "pmap"):
    many, p4 = losses(parallel, jax.devices())
    # the all-reduce sums in another order than one device: float32 rounding only
    np.testing.assert_allclose(many, one, rtol=2e-6)
    # Parameters as a whole (relative L2): elementwise, Adam's g / (|g| + eps) magnifies the
    # last-bit differences of near-zero gradients, so single elements are not a fair check.
    diff = sum(float(((np.asarray(a) - np.asarray(b)) ** 2).sum())
               for a, b in zip(jax.tree_util.tree_leaves(p4), jax.tree_util.tree_leaves(p1)))
    norm = sum(float((np.asarray(b) ** 2).sum()) for b in jax.tree_util.tree_leaves(p1))
    assert (diff / norm) ** 0.5 < 1e-5, (diff / norm) ** 0.5
    print(parallel, "OK", many[:3])
# 2 micro-batches on 2 devices: the same losses, and each micro-batch stays spread over both
# devices (the program's only collective is the gradient all-reduce, no all-gather of data).
# The program inspected is the one that just trained (same config, so the compilation cache
# gives its executable back instead of compiling another).
accum, _ = losses("mesh", jax.devices()[:2], **{{"train.grad_accum": 2}})
np.testing.assert_allclose(accum, one, rtol=2e-6)
config = apply_overrides(Config(), {{**TINY, "train.parallel": "mesh",
                                     "train.steps_per_dispatch": 5, "train.grad_accum": 2}})
runner = Runner(config, Dataset(config.data), jax.devices()[:2])
hlo = runner.lower(runner.place(init_state(config)),
                   hyper.as_arrays([config], stacked=False)).compile().as_text()
collectives = re.findall(r" (all-gather|all-to-all|all-reduce|collective-permute|"
                         r"reduce-scatter)(?:-start)?\\(", hlo)
assert set(collectives) == {{"all-reduce"}}, collectives
print("accum OK")
# two seeds as one vmapped program, data sharded over the 4 devices: seed 0 equals its solo run
configs = [apply_overrides(Config(), {{**TINY, "train.steps_per_dispatch": 5, "seed": s}})
           for s in (0, 1)]
runner = Runner(configs[0], Dataset(configs[0].data), jax.devices(), group=2)
state = runner.place(jax.tree_util.tree_map(lambda *x: np.stack(x), *map(init_state, configs)))
group = []
for _ in range(3):
    state, metrics = runner.run(state, hyper.as_arrays(configs, stacked=True))
    group.append(np.asarray(metrics["loss"]))
group = np.concatenate(group, axis=1)
np.testing.assert_allclose(group[0], one, rtol=2e-6)
assert np.abs(group[1] - group[0]).max() > 1e-3
print("vmap OK")
"""


def test_four_devices_mesh_and_pmap_match_one_device():
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    # separate process: the 4 host devices must be requested before JAX starts
    result = subprocess.run([sys.executable, "-c", DEVICE_SCRIPT.format(tiny=TINY)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(f"{name} OK" in result.stdout for name in ("mesh", "pmap", "accum", "vmap"))


# ---------------------------------------------------------------- resume through the CLI

def write_experiment(path: Path, **overrides) -> Path:
    path.write_text(textwrap.dedent(f"""
        from attnjax.config import Config, apply_overrides
        def get_config():
            return apply_overrides(Config(), {{**{TINY!r}, **{overrides!r}}})
    """))
    return path


def cli(*args, **kwargs) -> subprocess.Popen:
    """``attnjax ARGS`` in a subprocess, for the runs that are killed (SIGKILL, SIGTERM). The
    runs share JAX's persistent compilation cache with this process, which trains the
    reference they are compared with bit for bit and resumes them (the same command again,
    through ``run_cli``), so all load the very same executables."""
    return subprocess.Popen([sys.executable, "-m", "attnjax.cli", *args], env=subprocess_env(),
                            text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def final_params(workdir: Path, config: Config):
    checkpoints = Checkpoints(workdir / "ckpt")
    state, step = checkpoints.restore(init_state(config))
    checkpoints.close()
    return state.params, step


def wait_for_step(workdir: Path, step: int, process: subprocess.Popen, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        records = RunDir(workdir).metrics()
        if records and records[-1]["step"] >= step:
            return
        assert process.poll() is None, process.communicate()[1][-2000:]
        time.sleep(0.05)
    raise TimeoutError(f"no step {step} in {workdir}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The experiment and its run trained by ``attnjax train`` in this process, undisturbed."""
    root = tmp_path_factory.mktemp("uninterrupted")
    experiment = write_experiment(root / "exp.py")
    assert main(["train", str(experiment), "--workdir", str(root / "run"), "--no-progress"]) == 0
    return experiment, root / "run"


def test_sigkill_then_rerun_continues_bit_identically(uninterrupted, tmp_path, capsys):
    experiment, reference = uninterrupted
    workdir = tmp_path / "run"
    args = ("train", str(experiment), "--workdir", str(workdir), "--no-progress")
    process = cli(*args)
    wait_for_step(workdir, 60, process)            # past one checkpoint, between saves
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL        # killed mid-run, not finished
    assert not (workdir / "summary.json").exists()
    code, _, err = run_cli(capsys, *args)         # the same command again
    assert code == 0, err[-2000:]
    config = tiny()
    assert deterministic(RunDir(workdir).metrics()) == deterministic(
        RunDir(reference).metrics())
    params, step = final_params(workdir, config)
    expected, expected_step = final_params(reference, config)
    assert step == expected_step == 200
    chex.assert_trees_all_equal(params, expected)     # bit-identical


def test_sigterm_saves_then_exits_cleanly_and_resumes_where_it_was_moved(uninterrupted, tmp_path,
                                                                         capsys):
    experiment, reference = uninterrupted
    workdir = tmp_path / "run"
    args = ("train", str(experiment), "--workdir", str(workdir), "--no-progress")
    process = cli(*args)
    wait_for_step(workdir, 60, process)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    assert "stopped at step" in out
    stopped = int(out.split("stopped at step")[1].split(";")[0])
    listing = Checkpoints(workdir / "ckpt")
    assert 60 <= stopped < 200 and listing.steps()[-1] == stopped
    listing.close()
    moved = tmp_path / "moved" / "elsewhere"          # a run directory moves with its run
    moved.parent.mkdir()
    workdir.rename(moved)
    code, _, err = run_cli(capsys, "train", str(experiment), "--workdir", str(moved),
                           "--no-progress")
    assert code == 0, err[-2000:]
    params, _ = final_params(moved, tiny())
    chex.assert_trees_all_equal(params, final_params(reference, tiny())[0])


def test_corrupted_latest_checkpoint_falls_back_to_the_previous(uninterrupted, tmp_path, capsys):
    import shutil
    _, reference = uninterrupted
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference / "ckpt", ckpt)
    listing = Checkpoints(ckpt)
    steps = listing.steps()
    listing.close()
    latest = ckpt / str(steps[-1]) / "state"
    for f in latest.rglob("*"):
        if f.is_file() and f.stat().st_size > 100 and "metadata" not in f.name.lower():
            f.write_bytes(b"\0" * f.stat().st_size)   # same size, garbage content
    checkpoints = Checkpoints(ckpt)
    state, step = checkpoints.restore(init_state(tiny()))
    checkpoints.close()
    assert step == steps[-2]
    assert "unusable" in capsys.readouterr().err


def test_rerun_of_a_finished_run_returns_its_summary(uninterrupted):
    experiment, reference = uninterrupted
    before = (reference / "metrics.jsonl").read_text()
    summary = train(tiny(), reference, progress=False)
    assert summary["status"] == "finished" and summary["step"] == 200
    assert (reference / "metrics.jsonl").read_text() == before


def test_another_config_in_the_same_workdir_is_refused(uninterrupted):
    _, reference = uninterrupted
    with pytest.raises(ValueError, match=r"model.d_model: 16 -> 64"):
        train(tiny(**{"model.d_model": 64}), reference, progress=False)


@pytest.mark.parametrize("extra, message", [
    (["model.attention.num_head=4"], "num_head"),
    (["model.d_model=abc"], "model.d_model must be int"),
    (["data.task=text", "data.path=/no/such/file.txt", "model.vocab_size=256",
      "data.vocab_size=256"], "data.path"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, extra, message, capsys):
    experiment = write_experiment(tmp_path / "exp.py")
    workdir = tmp_path / "run"
    code, out, err = run_cli(capsys, "train", str(experiment), *extra, "--workdir", str(workdir))
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not workdir.exists()


def test_unwritable_workdir_is_one_line(tmp_path, capsys):
    experiment = write_experiment(tmp_path / "exp.py")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, out, err = run_cli(capsys, "train", str(experiment), "--workdir", str(blocker / "run"))
    assert code == 2 and "not writable" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_run_that_raises_closes_its_tensorboard_writer(tmp_path, monkeypatch):
    """train() failing mid-run leaves no TensorBoard writer thread behind (one would print a
    traceback at exit); the progress bar and checkpoint managers close on the same way out."""
    open_writers = []

    def fail(*args):
        open_writers.extend(t for t in threading.enumerate()
                            if type(t).__module__.startswith("tensorboardX"))
        raise RuntimeError("failed mid-run")

    monkeypatch.setattr(loop, "_diagnose", fail)    # the first log, after the writers opened
    with pytest.raises(RuntimeError, match="failed mid-run"):
        train(tiny(), tmp_path / "run", progress=False)
    assert open_writers                             # the writer was running when it failed
    assert not [t for t in open_writers if t.is_alive()]


def test_eval_and_generate_commands(uninterrupted, capsys):
    _, reference = uninterrupted
    code, out, err = run_cli(capsys, "eval", str(reference), "--lengths", "32", "64")
    assert code == 0, err[-2000:]
    results = json.loads((reference / "eval.json").read_text())["results"]
    assert set(results) == {"32", "64"} and all(np.isfinite(r["loss"]) for r in results.values())
    # no dropout in this model: evaluating with dropout on changes nothing
    code, out, err = run_cli(capsys, "eval", str(reference), "--lengths", "32", "--train-mode")
    assert code == 0 and "dropout on" in out, err[-2000:]
    record = json.loads((reference / "eval.json").read_text())
    assert record["train_mode"] is True and record["results"]["32"] == results["32"]
    code, out, err = run_cli(capsys, "generate", str(reference), "--prompt", "hi")
    assert code == 2 and "data.task='text'" in err


def test_evaluation_in_train_mode_applies_dropout_deterministically():
    from attnjax.train import evaluate
    from attnjax.train.state import init_params
    config = tiny(**{"model.attention.dropout": "output", "model.attention.dropout_rate": 0.5,
                     "model.residual_dropout": 0.2})
    params, dataset = init_params(config), Dataset(config.data)
    plain = evaluate(config, params, dataset)
    noisy = evaluate(config, params, dataset, train_mode=True)
    assert noisy == evaluate(config, params, dataset, train_mode=True)   # same masks again
    assert plain == evaluate(config, params, dataset)
    length = config.data.length
    assert abs(noisy[length]["loss"] - plain[length]["loss"]) > 1e-4      # dropout acted


@pytest.mark.parametrize("batch_size, length, rows", [
    (64, 64, 16), (64, 1024, 1), (64, 4096, 1), (12, 100, 6), (7, 64, 7), (32, 32, 32)])
def test_eval_chunk_rows_by_hand(batch_size, length, rows):
    """The largest divisor of the batch within 1024 tokens, one row at least."""
    assert loop.eval_chunk_rows(batch_size, length) == rows


def test_evaluation_in_chunks_equals_each_batch_scored_alone(monkeypatch):
    """Cut into forward passes of 2 sequences (batches of 4, 3 of them, two lengths), the
    evaluation equals a float64 NumPy scoring of each whole batch's logits, summed over
    batches; and a vmapped group of runs gives each run's own result. The losses agree to
    float32 rounding (rtol 1e-6): the program takes each token's logsumexp in float32 (about
    2^-24 = 6e-8 relative) and adds a pass's 64 losses in float32 by a reduction tree (about
    log2(64) * 2^-24 = 4e-7), where the reference works in float64 from the same logits; the
    group's vmapped matmuls may round the logits differently, by the same order. Correct
    counts are integers, so accuracies are exact."""
    monkeypatch.setattr(loop, "EVAL_CHUNK_TOKENS", 64)            # 2 rows of 32 per pass
    config = tiny_config(TINY_TEXT, **{"model.max_length": 32, "data.length": 32,
                                       "train.eval_batches": 3, "data.eval_lengths": (16,)})
    assert loop.eval_chunk_rows(4, 32) == 2
    params, dataset = init_params(config), Dataset(config.data)
    forward = jax.jit(lambda tokens: DecoderLM(config.model).apply({"params": params}, tokens)[0])
    results = evaluate(config, params, dataset)
    for length in (32, 16):
        ce = correct = weight = 0.0
        for i in range(3):
            batch = jax.tree_util.tree_map(np.asarray, dataset.batch(config.seed, i, 4, length,
                                                                     "val"))
            logits = np.asarray(forward(batch["inputs"]), np.float64)
            top = logits.max(-1)
            logz = np.log(np.exp(logits - top[..., None]).sum(-1)) + top
            target = np.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
            ce += ((logz - target) * batch["weights"]).sum()
            correct += ((logits.argmax(-1) == batch["targets"]) * batch["weights"]).sum()
            weight += batch["weights"].sum()
        np.testing.assert_allclose(results[length]["loss"], ce / weight, rtol=1e-6)
        assert results[length]["accuracy"] == correct / weight
    other = apply_overrides(config, {"train.learning_rate": 3e-3})   # same structure
    grouped = loop._evaluate_group([config, other], loop._stack([params, params]), dataset,
                                   None, group=2)
    assert grouped[0] == grouped[1]
    for length in (32, 16):
        np.testing.assert_allclose(grouped[0][length]["loss"], results[length]["loss"],
                                   rtol=1e-6)
        assert grouped[0][length]["accuracy"] == results[length]["accuracy"]


def test_eval_kernel_evaluates_the_same_function_with_another_kernel():
    """``train.eval_kernel=chunked`` gives the reference kernel's losses at the training length
    and past it (at 1024: four blocks of 256, the six above the diagonal skipped); a kernel that
    is not exact, or cannot evaluate the model, is refused naming the field."""
    config = tiny(**{"data.eval_lengths": [1024], "model.max_length": 1024,
                     "train.eval_batches": 1})
    chunked = apply_overrides(config, {"train.eval_kernel": "chunked"})
    assert chunked.evaluated().model.attention.kernel == "chunked"
    assert config.evaluated() is config
    params, dataset = init_params(config), Dataset(config.data)
    want, got = evaluate(config, params, dataset), evaluate(chunked, params, dataset)
    assert set(want) == set(got) == {32, 1024}
    for length in want:
        np.testing.assert_allclose(got[length]["loss"], want[length]["loss"], rtol=1e-6)
        assert got[length]["accuracy"] == want[length]["accuracy"]
    with pytest.raises(ValueError, match=r"^train.eval_kernel='nope' is not a known .*chunked"):
        apply_overrides(config, {"train.eval_kernel": "nope"})
    with pytest.raises(ValueError, match=r"^train.eval_kernel='linear' needs exact softmax "
                       r"kernels .* and 'linear' is not; exact kernels: reference, chunked"):
        apply_overrides(config, {"train.eval_kernel": "linear"})
    with pytest.raises(ValueError, match=r"^train.eval_kernel='chunked' .* 'linear' is not"):
        apply_overrides(config, {"model.attention.kernel": "linear",
                                 "train.eval_kernel": "chunked"})
    with pytest.raises(ValueError, match=r"^train.eval_kernel='reference' cannot evaluate this "
                       r"model: model.attention.block_q"):
        apply_overrides(config, {"model.attention.kernel": "chunked",
                                 "model.attention.block_q": 8, "train.eval_kernel": "reference"})


def test_max_causal_logit_ignores_future_pairs():
    from attnjax.ops.stats import causal_max_logit
    max_causal_logit = lambda q, k, scale: causal_max_logit(q, k, scale).max()
    q = jnp.zeros((1, 3, 2, 4)).at[0, 0, :, 0].set(1.0).at[0, 2, :, 0].set(2.0)
    k = jnp.zeros((1, 3, 1, 4)).at[0, 2, 0, 0].set(10.0).at[0, 1, 0, 0].set(3.0)
    # causal pairs: (0,0)=0, (1,*)=0, (2,0)=0, (2,1)=2*3, (2,2)=2*10 -> 20 * scale
    np.testing.assert_allclose(max_causal_logit(q, k, 0.5), 10.0)
    # the future pair (0, 2) = 10 would be the max if it were not excluded
    np.testing.assert_allclose(max_causal_logit(q[:, :1], k[:, :1], 0.5), 0.0)


def test_metrics_log_has_the_promised_fields(uninterrupted):
    _, reference = uninterrupted
    records = RunDir(reference).metrics()
    fields = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "max_attn_logit", "skipped",
              "val_loss", "val_accuracy"}
    assert fields <= set().union(*records)
    assert [r["step"] for r in records] == list(range(5, 201, 5))
    assert all(np.isfinite(r["max_attn_logit"]) for r in records)
    assert list((reference / "tensorboard").glob("events.out.tfevents.*"))


def test_summary_has_the_validation_loss_before_the_first_update(uninterrupted):
    """``initial_loss``: the untrained model (its seed's initial parameters) evaluated at the
    training length, the same number ``evaluate`` gives, near ln(vocabulary size)."""
    _, reference = uninterrupted
    config, summary = RunDir(reference).config(), RunDir(reference).summary()
    expected = evaluate(config, init_params(config), load_dataset(config.data),
                        [config.data.length])[config.data.length]["loss"]
    np.testing.assert_allclose(summary["initial_loss"], expected, rtol=1e-6)
    assert abs(summary["initial_loss"] - np.log(config.model.vocab_size)) < 0.5
    assert summary["eval"][str(config.data.length)]["loss"] < summary["initial_loss"]


def test_summary_splits_the_wall_time_into_phases(uninterrupted):
    """``seconds``: every phase of the run is there, none negative, and together they fit in
    the total; the training phase is the time ``tokens_per_s`` was measured over."""
    _, reference = uninterrupted
    config, summary = RunDir(reference).config(), RunDir(reference).summary()
    seconds = summary["seconds"]
    phases = set(loop.PHASES)
    assert set(seconds) == phases | {"total"}
    assert min(seconds.values()) >= 0
    assert sum(seconds[p] for p in phases) <= seconds["total"] + 1e-2
    tokens = config.train.batch_size * config.data.length
    timed_steps = config.train.steps - config.train.dispatch_steps()   # after compilation
    # exact but for the summary's rounding of the seconds to the millisecond
    assert abs(summary["tokens_per_s"] * seconds["training"] - timed_steps * tokens) <= (
        summary["tokens_per_s"] * 5e-4)
    assert loop.time_line(seconds).startswith(f"{seconds['total']:.1f} s: setup ")


def test_phases_count_a_nested_phase_in_the_inner_one_only(monkeypatch):
    from attnjax.train import logging as run_logging
    clock = iter(range(100))
    monkeypatch.setattr(run_logging.time, "perf_counter", lambda: next(clock))
    phases = run_logging.Phases()
    with phases("logging"):              # t 0 .. 3, of which 1 .. 2 evaluating
        with phases("evaluation"):
            pass
    phases.add("training", 5.0)
    assert phases.seconds == {"evaluation": 1, "logging": 2, "training": 5.0}


def test_bfloat16_compute_keeps_float32_parameters():
    config = tiny(**{"model.dtype": "bfloat16"})
    batch = train_batch(config)
    state, metrics = one_step(config, batch)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(state.params))
    assert np.isfinite(metrics["loss"]) and int(state.skipped) == 0
    _, full = one_step(tiny(), batch)
    # same parameters at step 0: bf16 compute changes the loss by bf16 rounding only
    np.testing.assert_allclose(metrics["loss"], full["loss"], rtol=2e-2)


def test_killed_between_last_checkpoint_and_summary_finishes_on_rerun(uninterrupted, tmp_path):
    import shutil
    _, reference = uninterrupted
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    expected = json.loads((workdir / "summary.json").read_text())
    (workdir / "summary.json").unlink()
    summary = train(tiny(), workdir, progress=False)
    assert summary["status"] == "finished" and summary["step"] == 200
    assert summary["train_loss"] == expected["train_loss"]
    assert summary["eval"] == expected["eval"]
