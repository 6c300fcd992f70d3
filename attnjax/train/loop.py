"""The training loop, evaluation, and the run directory.

``train(config, workdir)`` writes ``config.json``, ``metrics.jsonl``, TensorBoard events,
``ckpt/`` and, when finished, ``summary.json``. Called again with the same config it resumes
from the newest good checkpoint and continues exactly as if never stopped (batches and dropout
are functions of (seed, step)); with a finished run it just returns the summary. SIGTERM saves
a checkpoint and returns cleanly.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from pathlib import Path

import jax
import numpy as np

from attnjax.config import Config, from_dict, to_dict
from attnjax.data import Dataset
from attnjax.train.checkpoint import Checkpoints
from attnjax.train.logging import MetricsWriter, Progress, read_metrics
from attnjax.train.parallel import Runner
from attnjax.train.state import init_state
from attnjax.train.step import make_diagnostics, make_eval_step


def write_json_atomic(path: Path, data: dict):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def prepare_workdir(workdir: str | Path, config: Config) -> Path:
    """Create ``workdir`` and store the config, or check it matches the stored one."""
    workdir = Path(workdir)
    try:
        (workdir / "ckpt").mkdir(parents=True, exist_ok=True)
        probe = workdir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise ValueError(f"workdir {str(workdir)!r} is not writable ({error.strerror})") from None
    stored = workdir / "config.json"
    if stored.exists():
        as_json = json.loads(json.dumps(to_dict(config)))  # tuples read back as lists
        changed = _differences(json.loads(stored.read_text()), as_json)
        if changed:
            raise ValueError(f"workdir {str(workdir)!r} holds a run with another config "
                             f"({'; '.join(changed[:3])}); use a new --workdir")
    else:
        write_json_atomic(stored, to_dict(config))
    return workdir


def load_config(workdir: str | Path) -> Config:
    path = Path(workdir) / "config.json"
    if not path.exists():
        raise ValueError(f"{str(workdir)!r} is not a run directory (no config.json)")
    return from_dict(Config, json.loads(path.read_text()))


def evaluate(config: Config, params, dataset: Dataset, lengths=None) -> dict:
    """Validation loss and accuracy at each length (default: the training length plus
    ``data.eval_lengths``), over ``train.eval_batches`` fixed batches."""
    lengths = lengths or (config.data.length,) + tuple(config.data.eval_lengths)
    step = _compiled_eval_step(config)
    results = {}
    for length in lengths:
        totals = {"ce": 0.0, "correct": 0.0, "weight": 0.0}
        for i in range(config.train.eval_batches):
            batch = dataset.batch(config.seed, i, config.train.eval_batch_size, length, "val")
            sums = jax.device_get(step(params, batch))
            for key in totals:
                totals[key] += float(sums[key])
        weight = max(totals["weight"], 1.0)
        results[length] = {"loss": totals["ce"] / weight, "accuracy": totals["correct"] / weight}
    return results


@functools.lru_cache(maxsize=8)
def _compiled_eval_step(config: Config):
    """One jitted eval step per config, so periodic evaluations do not recompile."""
    return jax.jit(make_eval_step(config))


DIAGNOSTIC_EXAMPLES = 4


def _diagnose(config: Config, params, dataset: Dataset, step: int) -> dict:
    """Diagnostics on the first examples of the batch of ``step`` (regenerated, not stored)."""
    batch = dataset.batch(config.seed, step, config.train.batch_size, config.data.length, "train")
    batch = jax.tree_util.tree_map(lambda x: x[:DIAGNOSTIC_EXAMPLES], batch)
    return {k: float(v) for k, v in _compiled_diagnostics(config)(params, batch).items()}


@functools.lru_cache(maxsize=8)
def _compiled_diagnostics(config: Config):
    return jax.jit(make_diagnostics(config))


class _StopFlag:
    """Turns SIGTERM into a flag the loop checks between dispatches."""

    def __init__(self):
        self.raised = False
        self._previous = None

    def __enter__(self):
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        self.raised = True

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self._previous)


def _eval_record(results: dict, train_length: int) -> dict:
    record = {"val_loss": results[train_length]["loss"],
              "val_accuracy": results[train_length]["accuracy"]}
    for length, r in results.items():
        if length != train_length:
            record[f"val_loss@{length}"] = r["loss"]
            record[f"val_accuracy@{length}"] = r["accuracy"]
    return record


def train(config: Config, workdir: str | Path, *, devices=None, progress: bool = True) -> dict:
    """Train (or resume, or return the finished run's summary). Returns the summary dict."""
    dataset = Dataset(config.data)          # bad data or devices fail before anything is written
    runner = Runner(config, dataset, devices)
    workdir = prepare_workdir(workdir, config)
    summary_path = workdir / "summary.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    cfg = config.train
    checkpoints = Checkpoints(workdir / "ckpt", cfg.keep_best)
    state = runner.place(init_state(config))
    restored, start = checkpoints.restore(runner.unplace(state))
    if restored is not None:
        state = runner.place(restored)
    start = start or 0
    writer = MetricsWriter(workdir, start)
    bar = Progress(cfg.steps, start, enabled=progress)
    tokens_per_step = cfg.batch_size * config.data.length
    step, record, results = start, {}, None
    # Training seconds only: each dispatch is timed up to the next sync point (a log), so
    # evaluation and checkpoint time is left out; the first dispatch (compilation) is too.
    compiled, train_seconds, timed_steps, interval_seconds, interval_steps = False, 0.0, 0, 0.0, 0
    with _StopFlag() as stop:
        while step < cfg.steps and not stop.raised:
            host_batch = (None if dataset.on_device else dataset.batch(
                config.seed, step, cfg.batch_size, config.data.length, "train"))
            began = time.perf_counter()
            state, metrics = runner.run(state, host_batch)
            step += runner.steps_per_call
            due_checkpoint = step % cfg.checkpoint_every == 0 or step == cfg.steps
            due_eval = step % cfg.eval_every == 0 or due_checkpoint
            due_log = step % cfg.log_every == 0 or due_eval
            if due_log or not compiled:
                jax.block_until_ready(metrics)
            if compiled:
                interval_seconds += time.perf_counter() - began
                interval_steps += runner.steps_per_call
            compiled = True
            if due_log:
                record = {k: float(np.asarray(v)[-1]) for k, v in jax.device_get(metrics).items()}
                if not cfg.entropy_reg:
                    del record["attention_entropy"]
                if interval_steps:
                    record["tokens_per_s"] = interval_steps * tokens_per_step / interval_seconds
                record.update(_diagnose(config, runner.unplace(state).params, dataset, step - 1))
                train_seconds += interval_seconds
                timed_steps += interval_steps
                interval_seconds, interval_steps = 0.0, 0
                if due_eval:
                    results = evaluate(config, runner.unplace(state).params, dataset)
                    record.update(_eval_record(results, config.data.length))
                writer.write(step, record)
                bar.update(step - bar.bar.n, loss=record["loss"],
                           **({"val": record["val_loss"]} if "val_loss" in record else {}))
            if due_checkpoint or stop.raised:
                if not due_eval:
                    results = evaluate(config, runner.unplace(state).params, dataset)
                    record.update(_eval_record(results, config.data.length))
                checkpoints.save(step, runner.unplace(state), to_dict(config), record["val_loss"])
    checkpoints.wait()
    bar.close()
    writer.close()
    if step < cfg.steps:
        checkpoints.close()
        return {"status": "interrupted", "step": step}
    final = results or evaluate(config, runner.unplace(state).params, dataset)
    # a run killed after its last checkpoint but before its summary logs nothing when rerun
    logged = read_metrics(workdir / "metrics.jsonl")
    summary = {
        "status": "finished", "step": step, "skipped_updates": int(runner.unplace(state).skipped),
        "train_loss": record.get("loss", logged[-1]["loss"] if logged else None),
        "best_step": checkpoints.best_step(),
        "tokens_per_s": timed_steps * tokens_per_step / train_seconds if train_seconds else None,
        "eval": {str(length): r for length, r in final.items()},
    }
    checkpoints.close()
    write_json_atomic(summary_path, summary)
    return summary


def format_summary(summary: dict) -> str:
    """One screen of text for a run's summary."""
    if summary.get("status") != "finished":
        return (f"stopped at step {summary.get('step')}; checkpoint saved; rerun the same "
                "command to resume")
    lines = [f"finished {summary['step']} steps  (skipped updates: {summary['skipped_updates']}, "
             f"best checkpoint: step {summary['best_step']})"]
    if summary.get("tokens_per_s"):
        lines.append(f"throughput after compilation: {summary['tokens_per_s']:,.0f} tokens/s")
    if summary.get("train_loss") is not None:
        lines.append(f"final train loss: {summary['train_loss']:.4f}")
    lines.append(f"{'eval length':>12} {'val loss':>10} {'accuracy':>10}")
    for length, r in summary["eval"].items():
        lines.append(f"{length:>12} {r['loss']:>10.4f} {r['accuracy']:>10.4f}")
    return "\n".join(lines)
