"""The training loop and evaluation.

``train(config, workdir)`` fills a run directory (``attnjax.rundir``): the config, metrics,
TensorBoard events, checkpoints and, when finished, the summary. Called again with the same
config it resumes from the newest good checkpoint and continues exactly as if never stopped
(batches and dropout are functions of (seed, step)); with a finished run it just returns the
summary. SIGTERM saves a checkpoint and returns cleanly.

The summary (``summary.json``): ``status``, ``step``, ``skipped_updates``, ``train_loss``,
``best_step``, ``tokens_per_s`` (training throughput after compilation), ``eval`` (loss and
accuracy per length), ``initial_loss`` (see ``_initial_losses``) and ``seconds``: the wall
seconds of the invocation that finished the run, per phase (``setup``: data, program and
checkpoint restore; ``first dispatch``: compilation and the first steps; ``training``,
``logging``, ``evaluation``, ``checkpoints``) and in ``total``.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from attnjax import distributed, sharding
from attnjax.config import Config
from attnjax.data import Dataset, load_dataset
from attnjax.models import family
from attnjax.rundir import RunDir
from attnjax.train import hyper
from attnjax.train.logging import MetricsWriter, Phases, Progress
from attnjax.train.parallel import Runner
from attnjax.train.state import start_state
from attnjax.train.step import make_diagnostics, make_eval_step
from attnjax.train.strided import make_strided_eval_step, strided_options, windows


def evaluate(config: Config, params, dataset: Dataset, lengths=None, *,
             train_mode: bool = False, window: int | None = None, stride: int | None = None,
             score_last: int | None = None) -> dict:
    """Validation loss and accuracy at each length (default: the training length plus
    ``data.eval_lengths``), over ``train.eval_batches`` fixed batches; ``train_mode``: with
    dropout on, as the model trains.

    Given ``window``, ``stride`` or ``score_last``, strided evaluation
    (``attnjax.train.strided``): each sequence is scored by windows of ``window`` tokens
    (default: the training length) starting every ``stride`` tokens (default: the window,
    disjoint segments), each window after the first scoring its last ``score_last`` targets
    (default: the stride); the same targets as the ordinary evaluation. Combinations that
    would leave a target unscored or score one twice are refused before anything compiles."""
    check_scored(config)
    strided = strided_options(config.data.length, window, stride, score_last,
                              causal=config.model.causal)
    if strided is not None:
        for length in lengths or config.data.lengths:
            windows(length, *strided)
        config.model.check_lengths(strided[:1])
    return _evaluate_group([config], params, dataset, lengths, group=None,
                           train_mode=train_mode, strided=strided)[0]


def check_scored(config: Config) -> None:
    """Refuse, in one line, a model with no loss to train or evaluate: an encoder that
    outputs its hidden states (``model.classifier='hidden'``)."""
    if family(config.model).objective(config.model) == "embedding":
        raise ValueError("model.classifier='hidden' outputs hidden states, with no loss to "
                         "train or evaluate; give it a head (model.classifier=none, cls or "
                         "mean) and start from it with train.init_from=RUN")


def _stack(trees: list):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def _per_run_batches(configs: list[Config], dataset: Dataset, step: int, size: int, length: int,
                     split: str, group):
    batches = [dataset.batch(c.seed, step, size, length, split) for c in configs]
    return _stack(batches) if group else batches[0]


EVAL_CHUNK_TOKENS = 1024


def eval_chunk_rows(batch_size: int, length: int) -> int:
    """Sequences per forward pass of an evaluation: the largest divisor of ``batch_size``
    whose rows hold at most ``EVAL_CHUNK_TOKENS`` tokens (one row at least). A fixed rule,
    not a per-host one, so a config evaluates the same on every machine; passes of this size
    are faster per token than larger ones (``attnjax bench eval``, docs/PERFORMANCE.md)."""
    return max(r for r in range(1, batch_size + 1)
               if batch_size % r == 0 and (r * length <= EVAL_CHUNK_TOKENS or r == 1))


def _eval_chunks(configs: list[Config], dataset: Dataset, length: int, group) -> dict:
    """Every evaluation batch at ``length`` (``train.eval_batches`` of them), cut into forward
    passes of ``eval_chunk_rows`` rows: leaves ``[(runs,) chunks, rows, ...]``, where chunk
    ``i * per_batch + c`` is part ``c`` of batch ``i``."""
    cfg = configs[0].train
    rows, axis = eval_chunk_rows(cfg.eval_batch_size, length), 1 if group else 0
    batches = [_per_run_batches(configs, dataset, i, cfg.eval_batch_size, length, "val", group)
               for i in range(cfg.eval_batches)]

    def cut(*xs):
        x = jnp.stack(xs, axis)                   # [(runs,) batches, batch_size, ...]
        return x.reshape(*x.shape[:axis], -1, rows, *x.shape[axis + 2:])

    return jax.tree_util.tree_map(cut, *batches)


def _evaluate_group(configs: list[Config], params, dataset: Dataset, lengths, group,
                    train_mode: bool = False, strided: tuple | None = None) -> list:
    """``evaluate`` for runs in lockstep (``params`` stacked when ``group``): one dispatch per
    length, its per-chunk sums added on the host in float64."""
    config = configs[0]
    lengths = lengths or (config.data.length,) + tuple(config.data.eval_lengths)
    structure = hyper.structure(config.evaluated())
    mesh = _split_over(structure, params)
    step = (compiled_eval_step(structure, group, train_mode, mesh) if strided is None
            else _compiled_strided_step(structure, group, train_mode, strided, mesh))
    values = hyper.as_arrays(configs, stacked=bool(group))
    results = [{} for _ in configs]
    ratios = family(config.model).ratios
    for length in lengths:
        sums = jax.device_get(step(values, params, _eval_chunks(configs, dataset, length, group)))
        total = {k: np.asarray(v, np.float64).reshape(
            len(configs), -1, *np.shape(v)[2 if group else 1:]).sum(1) for k, v in sums.items()}
        for r in range(len(configs)):
            weight = max(total["weight"][r], 1.0)
            results[r][length] = {"loss": float(total["ce"][r] / weight),
                                  "accuracy": float(total["correct"][r] / weight)}
            for name, numerator, denominator in ratios:    # the best entry (e.g. head)
                results[r][length][name] = float(np.max(
                    total[numerator][r] / max(total[denominator][r], 1.0)))
    return results


def _split_over(structure: Config, params):
    """The mesh a run's ``params`` are split over when its mesh splits it (``train.mesh``:
    fsdp, sequence or tensor), so its evaluations are laid out as its training is (a long
    evaluation split along its length); ``None`` otherwise."""
    placed = getattr(jax.tree_util.tree_leaves(params)[0], "sharding", None)
    if not structure.train.mesh.splits_a_run() or not isinstance(placed, NamedSharding):
        return None
    return placed.mesh


def _with_values(make_fn, structure: Config, group, mesh=None):
    """``make_fn(config)`` as a jitted ``fn(values, *args)`` over the structure, vmapped over
    runs (every argument's leading axis) when ``group``, traced in the structure's layout on
    ``mesh`` when given."""
    @sharding.traced_on(structure, mesh)
    def fn(values, *args):
        return make_fn(hyper.inject(structure, values))(*args)
    return jax.jit(jax.vmap(fn) if group else fn)


def _over_chunks(eval_step):
    """``eval_step(params, batch, index) -> sums`` as ``fn(params, chunks) -> sums per chunk``:
    one program that runs the forward passes one after another (``lax.map``), chunk ``n``
    with ``index = n`` (the dropout masks' counter in train mode)."""
    def fn(params, chunks):
        count = jax.tree_util.tree_leaves(chunks)[0].shape[0]
        return jax.lax.map(lambda xs: eval_step(params, *xs), (chunks, jnp.arange(count)))
    return fn


@functools.lru_cache(maxsize=16)
def compiled_eval_step(structure: Config, group, train_mode: bool, mesh=None):
    """One jitted evaluation (``_over_chunks`` of ``make_eval_step``) per structure (and
    mesh, ``_split_over``), so evaluations do not recompile (one executable per length)."""
    return _with_values(lambda config: _over_chunks(make_eval_step(config, train_mode)),
                        structure, group, mesh)


@functools.lru_cache(maxsize=16)
def _compiled_strided_step(structure: Config, group, train_mode: bool, strided: tuple,
                           mesh=None):
    """``compiled_eval_step`` over windows: ``strided`` = ``(window, stride, score_last)``
    of ``make_strided_eval_step``."""
    make = lambda config: _over_chunks(make_strided_eval_step(config, *strided,
                                                              train_mode=train_mode))
    return _with_values(make, structure, group, mesh)


DIAGNOSTIC_EXAMPLES = 4


def _diagnose(configs: list[Config], params, dataset: Dataset, step: int, group) -> list:
    """Diagnostics on the first examples of the batch of ``step`` (regenerated, not stored)."""
    config = configs[0]
    batch = _per_run_batches(configs, dataset, step, config.train.batch_size, config.data.length,
                             "train", group)
    first = (slice(None),) * bool(group) + (slice(0, DIAGNOSTIC_EXAMPLES),)   # the batch axis
    batch = jax.tree_util.tree_map(lambda x: x[first], batch)
    structure = hyper.structure(config)
    fn = _compiled_diagnostics(structure, group, _split_over(structure, params))
    out = jax.device_get(fn(hyper.as_arrays(configs, stacked=bool(group)), params, batch))
    return [{k: float(np.atleast_1d(v)[r]) for k, v in out.items()} for r in range(len(configs))]


@functools.lru_cache(maxsize=16)
def _compiled_diagnostics(structure: Config, group, mesh=None):
    return _with_values(make_diagnostics, structure, group, mesh)


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
    """``val_<metric>`` at the training length and ``val_<metric>@<length>`` at the others, for
    loss, accuracy and the family's own ratios (e.g. ``val_exact_match``)."""
    return {f"val_{name}" + ("" if length == train_length else f"@{length}"): value
            for length, r in results.items() for name, value in r.items()}


def train(config: Config, workdir: str | Path, *, devices=None, progress: bool = True) -> dict:
    """Train (or resume, or return the finished run's summary). Returns the summary dict."""
    return train_group([config], [workdir], devices=devices, progress=progress)[0]


def train_group(configs: list[Config], workdirs: list, *, devices=None,
                progress: bool = True) -> list[dict]:
    """Train runs of one structure (``hyper.structure``) in lockstep as one vmapped program;
    each run's directory ends up as if it had been trained alone by ``train``. Finished runs
    return their summary; runs resuming from different steps are trained as separate groups."""
    entered = time.perf_counter()
    configs, runs = list(configs), [RunDir(w) for w in workdirs]
    if len({hyper.structure(c) for c in configs}) > 1:
        raise ValueError("runs trained as one group must differ only in "
                         f"{', '.join(hyper.VALUES)}")
    for config, run in zip(configs, runs):
        _check_not_inside_data(config, run)
        _check_start(config, run)
    dataset = load_dataset(configs[0].data)   # bad data or devices fail before anything is written
    group = len(configs) if len(configs) > 1 else None
    runner = Runner(configs[0], dataset, devices, group)
    with contextlib.ExitStack() as held:       # one writer per run: the primary process
        if distributed.is_primary():
            for run in runs:
                held.enter_context(run.writing())
        return _train_prepared(configs, runs, dataset, runner, group, devices, progress,
                               entered)


def _check_not_inside_data(config: Config, run: RunDir) -> None:
    """Refuse a run directory inside its own corpus directory: it would train on its own
    checkpoints and metrics."""
    path = config.data.path
    if path is not None and Path(path).is_dir() and (
            run.path.resolve().is_relative_to(Path(path).resolve())):
        raise ValueError(f"data.path={path!r} contains the run directory {str(run.path)!r}: "
                         "the run would train on its own files; use a --workdir outside it")


def _check_start(config: Config, run: RunDir) -> None:
    """Refuse to train into an imported model's run directory (it holds parameters, not a
    training state), and a ``train.init_from`` without a checkpoint, before anything is
    written."""
    check_scored(config)
    if run.imported() is not None:
        raise ValueError(f"workdir {str(run.path)!r} holds an imported model; fine-tune it into "
                         f"a new run directory with train.init_from={str(run.path)!r}")
    start = config.train.init_from
    if start is not None:
        if not RunDir(start).has_checkpoint():
            raise ValueError(f"train.init_from={start!r} is not a run directory with a "
                             "checkpoint")
        start_state(config, quiet=True)        # its parameters fit the model


def _train_prepared(configs, runs, dataset, runner, group, devices, progress, entered):
    """``train_group`` once its run directories are locked."""
    for config, run in zip(configs, runs):     # a wrong workdir fails in every process
        run.prepare(config, store=distributed.is_primary())
    distributed.barrier("attnjax: run directories prepared")
    summaries = [run.summary() for run in runs]
    todo = [i for i, s in enumerate(summaries) if s is None]
    if len(todo) < len(configs):
        if todo:
            done = train_group([configs[i] for i in todo], [runs[i].path for i in todo],
                               devices=devices, progress=progress)
            for i, summary in zip(todo, done):
                summaries[i] = summary
        return summaries
    with contextlib.ExitStack() as cleanup:    # the managers are closed on every way out
        checkpoints = [cleanup.enter_context(contextlib.closing(run.checkpoints(c.train.keep_best)))
                       for c, run in zip(configs, runs)]
        restored = [ckpt.restore(runner.template(c)) for ckpt, c in zip(checkpoints, configs)]
        starts = [start or 0 for _, start in restored]
        if len(set(starts)) == 1:
            states = [state if state is not None else runner.start(c)
                      for (state, _), c in zip(restored, configs)]
            return _run_lockstep(configs, runs, checkpoints, states, starts[0], runner, dataset,
                                 group, progress, entered)
    for start in sorted(set(starts)):
        members = [i for i, s in enumerate(starts) if s == start]
        done = train_group([configs[i] for i in members], [runs[i].path for i in members],
                           devices=devices, progress=progress)
        for i, summary in zip(members, done):
            summaries[i] = summary
    return summaries


def _unstack(state, r: int, group):
    return jax.tree_util.tree_map(lambda x: x[r], state) if group else state


def _run_lockstep(configs, run_dirs, checkpoints, states, start, runner, dataset, group,
                  progress, entered: float) -> list[dict]:
    config, cfg = configs[0], configs[0].train
    phases = Phases()
    phases.add("setup", time.perf_counter() - entered)
    runs = range(len(configs))
    state = runner.place(_stack(states) if group else states[0])
    values = hyper.as_arrays(configs, stacked=bool(group))
    tokens_per_step = cfg.batch_size * config.data.length
    step, records, results = start, [{} for _ in runs], None
    # Training seconds only: each dispatch is timed up to the next sync point (a log), so
    # evaluation and checkpoint time is left out; the first dispatch (compilation) is timed
    # apart.
    compiled, train_seconds, timed_steps, interval_seconds, interval_steps = False, 0.0, 0, 0.0, 0
    with _StopFlag() as stop, contextlib.ExitStack() as cleanup:   # writers closed on every exit
        primary, stopping = distributed.is_primary(), False
        writers = [cleanup.enter_context(contextlib.closing(
            MetricsWriter(run_dir, start, enabled=primary))) for run_dir in run_dirs]
        bar = cleanup.enter_context(contextlib.closing(Progress(
            cfg.steps, start, enabled=progress and primary)))
        while step < cfg.steps and not stopping:
            host_batch = (None if dataset.on_device else _per_run_batches(
                configs, dataset, step, cfg.batch_size, config.data.length, "train", group))
            began = time.perf_counter()
            state, metrics = runner.run(state, values, host_batch)
            step += runner.steps_per_call
            due_checkpoint = step % cfg.checkpoint_every == 0 or step == cfg.steps
            due_eval = step % cfg.eval_every == 0 or due_checkpoint
            due_log = step % cfg.log_every == 0 or due_eval
            if due_log or not compiled:
                jax.block_until_ready(metrics)
            if compiled:
                interval_seconds += time.perf_counter() - began
                interval_steps += runner.steps_per_call
            else:
                phases.add("first dispatch", time.perf_counter() - began)
            compiled = True
            if due_log:
                with phases("logging"):
                    host = jax.device_get(metrics)
                    params = runner.unplace(state).params
                    diagnostics = _diagnose(configs, params, dataset, step - 1, group)
                    records = [{k: float(np.asarray(v).reshape(len(configs), -1)[r, -1])
                                for k, v in host.items()} for r in runs]
                    if due_eval:
                        with phases("evaluation"):
                            results = _evaluate_group(configs, params, dataset, None, group)
                    for r in runs:
                        if interval_steps:
                            records[r]["tokens_per_s"] = (
                                interval_steps * tokens_per_step * len(configs) / interval_seconds)
                        records[r].update(diagnostics[r])
                        if due_eval:
                            records[r].update(_eval_record(results[r], config.data.length))
                        writers[r].write(step, records[r])
                    train_seconds += interval_seconds
                    timed_steps += interval_steps
                    interval_seconds, interval_steps = 0.0, 0
                    shown = {"val": records[0]["val_loss"]} if "val_loss" in records[0] else {}
                    bar.update(step - bar.bar.n, loss=records[0]["loss"], **shown)
            if due_log or jax.process_count() == 1:     # several processes agree at a log
                stopping = distributed.any_process(stop.raised)
            if due_checkpoint or stopping:
                if not due_eval:
                    with phases("evaluation"):
                        results = _evaluate_group(configs, runner.unplace(state).params, dataset,
                                                  None, group)
                    for r in runs:
                        records[r].update(_eval_record(results[r], config.data.length))
                with phases("checkpoints"):
                    for r in runs:
                        checkpoints[r].save(step, _unstack(runner.unplace(state), r, group),
                                            run_dirs[r].stored(configs[r]),
                                            records[r]["val_loss"])
    with phases("checkpoints"):
        for ckpt in checkpoints:
            ckpt.wait()
    if step < cfg.steps:
        return [{"status": "interrupted", "step": step} for _ in runs]
    final_state = runner.unplace(state)
    with phases("evaluation"):
        final = results or _evaluate_group(configs, final_state.params, dataset, None, group)
        initial = _initial_losses(configs, runner, dataset, group)
    phases.add("training", train_seconds)
    phases.add("total", time.perf_counter() - entered)
    summaries = []
    for r in runs:
        # a run killed after its last checkpoint but before its summary logs nothing when rerun
        logged = run_dirs[r].metrics()
        summary = {
            "status": "finished", "step": step,
            "skipped_updates": int(_unstack(final_state, r, group).skipped),
            "train_loss": records[r].get("loss", logged[-1]["loss"] if logged else None),
            "best_step": checkpoints[r].best_step(),
            "tokens_per_s": (timed_steps * tokens_per_step * len(configs) / train_seconds
                             if train_seconds else None),
            "eval": {str(length): v for length, v in final[r].items()},
            "initial_loss": initial[r],
            "seconds": {name: round(value, 3) for name, value in phases.seconds.items()},
        }
        if distributed.is_primary():
            run_dirs[r].write_summary(summary)
        summaries.append(summary)
    return summaries


def _initial_losses(configs: list[Config], runner: Runner, dataset: Dataset,
                    group) -> list[float]:
    """Each run's validation loss at the training length before its first update (its
    parameters at initialisation, a pure function of its seed, or ``train.init_from``'s): the
    reference by which a run that ends no better than it started is seen to have diverged. The
    parameters are placed as the trained ones are, so the evaluation step is not traced
    again."""
    states = [runner.start(c, quiet=True) for c in configs]
    params = runner.unplace(runner.place(_stack(states) if group else states[0])).params
    length = configs[0].data.length
    return [r[length]["loss"] for r in _evaluate_group(configs, params, dataset, [length], group)]


def format_summary(summary: dict) -> str:
    """One screen of text for a run's summary."""
    if summary.get("status") != "finished":
        return (f"stopped at step {summary.get('step')}; checkpoint saved; rerun the same "
                "command to resume")
    lines = [f"finished {summary['step']} steps  (skipped updates: {summary['skipped_updates']}, "
             f"best checkpoint: step {summary['best_step']})"]
    if summary.get("tokens_per_s"):
        lines.append(f"throughput after compilation: {summary['tokens_per_s']:,.0f} tokens/s")
    if summary.get("seconds"):
        lines.append(time_line(summary["seconds"]))
    if summary.get("train_loss") is not None:
        lines.append(f"final train loss: {summary['train_loss']:.4f}")
    lines.append(f"{'eval length':>12} {'val loss':>10} {'accuracy':>10}")
    for length, r in summary["eval"].items():
        lines.append(f"{length:>12} {r['loss']:>10.4f} {r['accuracy']:>10.4f}")
    return "\n".join(lines)


PHASES = ("setup", "first dispatch", "training", "logging", "evaluation", "checkpoints")


def time_line(seconds: dict) -> str:
    """``summary["seconds"]`` in one line: the total, then each phase and its share (the
    rest: what no phase covers, such as the summary and the progress bar)."""
    total = seconds["total"]
    parts = {name: seconds[name] for name in PHASES if name in seconds}
    parts["rest"] = max(total - sum(parts.values()), 0.0)
    return f"{total:.1f} s: " + ", ".join(f"{name} {value:.1f} s ({value / total:.0%})"
                                          for name, value in parts.items())
