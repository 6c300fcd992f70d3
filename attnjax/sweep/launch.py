"""Launching a sweep's runs: ``sequential`` (one process, one compiled program per structure),
``processes`` (N worker processes, each pinned to its share of the cores; see
``attnjax.sweep.workers``), ``vmap`` (runs that differ only in the seed or scalar
hyperparameters train as one vmapped program; see ``attnjax.train.hyper``) or
``vmap-processes`` (such vmapped groups, side by side in pinned worker processes), ``ray``
(such groups as Ray tasks on a cluster; see ``attnjax.sweep.ray_launcher``) or ``auto`` (the
default: one of them by a measured rule, ``choose_launcher``).

Every launcher skips finished runs and resumes interrupted ones from their checkpoints (the
run directory is the truth), and isolates failures: a run that raises or diverges is recorded
as failed, with its error in the sweep's record and its traceback in the run directory, and the
other runs go on. A vmapped group that fails is retried run by run to find the culprit.
"""

from __future__ import annotations

import inspect
import math
import os
import traceback
from pathlib import Path

import jax

from attnjax.config import Config
from attnjax.registry import LAUNCHERS
from attnjax.rundir import RunDir, SweepDir
from attnjax.sweep.record import entry, open_record
from attnjax.sweep.spec import Run, expand
from attnjax.sweep.variants import eval_variants, evaluate_variants
from attnjax.sweep.headline import headline_metrics
from attnjax.sweep.ray_launcher import run_on_ray
from attnjax.sweep.workers import run_tasks
from attnjax.train import hyper
from attnjax.train.loop import train, train_group

DIVERGED_FRACTION = 0.1    # a run that skipped more than this fraction of its updates diverged


def divergence(summary: dict, config: Config) -> str | None:
    """Why a finished run counts as diverged, or None: a non-finite final loss, or more than
    ``DIVERGED_FRACTION`` of its updates skipped as non-finite."""
    losses = [r["loss"] for r in summary["eval"].values()] + [summary.get("train_loss")]
    if any(loss is None or not math.isfinite(loss) for loss in losses):
        return f"diverged: final loss is not finite ({losses})"
    skipped, steps = summary["skipped_updates"], config.train.steps
    if skipped > DIVERGED_FRACTION * steps:
        return (f"diverged: {skipped} of {steps} updates had a non-finite loss or gradient "
                "and were skipped")
    return None


class _Sweep:
    """The record and the bookkeeping every launcher shares."""

    def __init__(self, sweep_dir: SweepDir, record: dict, log, total: int = 0):
        self.sweep_dir, self.record, self.log = sweep_dir, record, log
        self.total, self.done = total, 0        # runs to launch, and ended so far

    def run_dir(self, run: Run) -> RunDir:
        return self.sweep_dir.run(run.name)

    def save(self):
        self.sweep_dir.save(self.record)

    def finish(self, run: Run, summary: dict | None = None, error: str | None = None,
               trace: str | None = None, quiet: bool = False):
        item = entry(self.record, run.name)
        item.pop("pid", None)
        if error is None and summary["status"] != "finished":
            item.update(status="interrupted", error=None)
        else:
            error = error or divergence(summary, run.config)
            item.update(status="failed" if error else "finished", error=error, summary=summary)
            if trace:
                self.run_dir(run).write_error(trace)
        self.save()
        if quiet:
            return
        self.done += 1
        shown = error or (f"val loss {summary['eval'][str(run.config.data.length)]['loss']:.4f}"
                          if item["status"] == "finished" else item["status"])
        self.log(f"  [{self.done}/{self.total}] {run.name}: {item['status']} ({shown})")

    def mark_running(self, runs: list[Run], pid: int | None = None):
        """``runs`` are being trained now (by the process ``pid``, where it is known)."""
        for run in runs:
            entry(self.record, run.name).update(status="running",
                                                **({"pid": pid} if pid else {}))
        self.save()

    def train_one(self, run: Run, progress: bool) -> dict | None:
        """Train one run in this process; returns its summary, or None if it failed."""
        self.mark_running([run], os.getpid())
        try:
            summary = train(run.config, self.run_dir(run).path, progress=progress)
        except KeyboardInterrupt:
            self.finish(run, {"status": "interrupted"})
            raise
        except Exception as error:  # noqa: BLE001  (isolate any failure of one run)
            self.finish(run, error=f"{type(error).__name__}: {error}",
                        trace=traceback.format_exc())
            return None
        self.finish(run, summary)
        return summary


def _sequential(sweep: _Sweep, runs: list[Run], jobs, progress):
    for run in runs:
        summary = sweep.train_one(run, progress)
        if summary is not None and summary["status"] == "interrupted":
            return  # SIGTERM: the run saved a checkpoint; stop launching


def work(config: Config) -> float:
    """A run's compute, up to a constant: its training and evaluation FLOPs with the
    parameters taken as ``N = 12 L d^2`` (L layers of width d; PaLM, appendix B):
    ``6 N + 12 L d T`` per trained token at context T, a third of it per evaluated token.
    It orders tasks, longest first; it does not predict seconds."""
    m, t, d = config.model, config.train, config.data
    per_token = lambda length: m.num_layers * m.d_model * (6 * m.d_model + length)
    evaluations = t.steps // t.eval_every + (t.steps % t.eval_every > 0) + 1   # + initial loss
    evaluated = sum(per_token(n) * n for n in d.lengths) * t.eval_batches * t.eval_batch_size
    return 3 * per_token(d.length) * d.length * t.batch_size * t.steps + evaluations * evaluated


def longest_first(tasks: list[list[Run]]) -> list[list[Run]]:
    """Tasks (lists of runs trained together) in decreasing ``work``: handed to a pool of
    workers in this order, the last task to start is a short one, so no worker idles long
    while another finishes (the longest-processing-time rule)."""
    return sorted(tasks, key=lambda task: -sum(work(run.config) for run in task))


def _processes(sweep: _Sweep, runs: list[Run], jobs, progress):
    run_tasks(sweep, longest_first([[run] for run in runs]), jobs or 2)


def _vmap_processes(sweep: _Sweep, runs: list[Run], jobs, progress):
    """Vmapped groups of at most ``ceil(runs / jobs)`` runs, so that a few runs still use
    every worker; the longest first."""
    jobs = jobs or len(os.sched_getaffinity(0))
    run_tasks(sweep, longest_first(vmap_groups(runs, math.ceil(len(runs) / jobs) or 1)), jobs)


def vmap_groups(runs: list[Run], max_size: int | None = None) -> list[list[Run]]:
    """Runs grouped by structure (in order of first appearance), at most ``max_size`` each."""
    groups: dict = {}
    for run in runs:
        groups.setdefault(hyper.structure(run.config), []).append(run)
    size = max_size or max(len(g) for g in groups.values()) if groups else 1
    return [group[i:i + size] for group in groups.values() for i in range(0, len(group), size)]


def _vmap(sweep: _Sweep, runs: list[Run], jobs, progress):
    for group in vmap_groups(runs, jobs):
        if len(group) == 1:
            if not _keep_going(sweep.train_one(group[0], progress)):
                return
            continue
        sweep.log(f"training {len(group)} runs as one vmapped program: "
                  f"{', '.join(r.name for r in group)}")
        sweep.mark_running(group, os.getpid())
        try:
            summaries = train_group([r.config for r in group],
                                    [sweep.run_dir(r).path for r in group], progress=progress)
        except KeyboardInterrupt:
            for run in group:
                sweep.finish(run, {"status": "interrupted"})
            raise
        except Exception as error:  # noqa: BLE001
            sweep.log(f"  the group failed ({type(error).__name__}: {error}); "
                      "running its runs one by one to isolate the failure")
            _sequential(sweep, group, None, progress)
            continue
        for run, summary in zip(group, summaries):
            sweep.finish(run, summary)
        if not _keep_going(summaries[0]):
            return


def _keep_going(summary: dict | None) -> bool:
    return summary is None or summary["status"] != "interrupted"


def _ray(sweep: _Sweep, runs: list[Run], jobs, progress, *, address: str | None = None,
         cpus_per_run: float = 1.0, gpus_per_run: float = 0.0):
    run_on_ray(sweep, longest_first(vmap_groups(runs, jobs)), address=address,
               cpus_per_run=cpus_per_run, gpus_per_run=gpus_per_run)


def choose_launcher(runs: int, cores: int, backend: str) -> tuple[str, str]:
    """The launcher ``auto`` picks for ``runs`` runs, and why. The rule follows ``attnjax
    bench sweep``, which times one sweep with every launcher against its arithmetic floor (the
    sweep's model FLOPs at the matmul peak measured in the same run; figures in
    docs/PERFORMANCE.md):

    - a single run, or a single core: ``sequential``, every core for the run;
    - a CPU with several cores: ``processes``, one single-core worker per core (up to one per
      run), which gains where a run cannot keep every core busy;
    - an accelerator: ``vmap``, its groups keeping the one device busy (worker processes would
      split its memory).
    """
    if backend != "cpu":
        return "vmap", f"one {backend} device: vmapped groups keep it busy"
    if runs <= 1 or cores <= 1:
        return "sequential", f"{runs} run(s) on {cores} core(s)"
    return "processes", f"{runs} runs on {cores} CPU cores: one single-core worker per core"


def _auto(sweep: _Sweep, runs: list[Run], jobs, progress):
    cores = len(os.sched_getaffinity(0))
    choice, why = choose_launcher(len(runs), cores, jax.default_backend())
    sweep.log(f"auto launcher: {choice} ({why})")
    if choice == "processes":
        jobs = jobs or min(cores, len(runs))
    LAUNCHERS.get(choice, "--launcher")(sweep, runs, jobs, progress)


# A launcher is ``fn(sweep, runs, jobs, progress, **options)``: train ``runs`` (a list of
# ``Run``), report each through ``sweep.finish``, and stop launching after a run that was
# interrupted; ``options`` are its own keyword arguments (``--address`` and the like).
LAUNCHERS.register("sequential", _sequential)
LAUNCHERS.register("processes", _processes)
LAUNCHERS.register("vmap", _vmap)
LAUNCHERS.register("vmap-processes", _vmap_processes)
LAUNCHERS.register("ray", _ray)
LAUNCHERS.register("auto", _auto)


def _check_options(launcher: str, launch, options: dict) -> None:
    """Refuse launcher options the chosen launcher does not take, before anything runs."""
    takes = {name for name, p in inspect.signature(launch).parameters.items()
             if p.kind is p.KEYWORD_ONLY}
    for name in options:
        if name not in takes:
            owners = [n for n in LAUNCHERS.names()
                      if name in inspect.signature(LAUNCHERS.get(n, "--launcher")).parameters]
            raise ValueError(f"--{name.replace('_', '-')} applies to --launcher "
                             f"{' or '.join(owners) or 'none'}, not {launcher}")


def run_sweep(experiment: str | Path, directory: str | Path, *, launcher: str = "auto",
              jobs: int | None = None, overrides: list[str] = (), progress: bool = True,
              retry_failed: bool = False, log=print, options: dict | None = None) -> dict:
    """Run (or resume) every run of an experiment's sweep into ``directory``; returns the
    record (see ``attnjax.sweep.record``). ``jobs``: worker processes for ``processes`` and
    ``vmap-processes``, the largest vmapped group for ``vmap`` and ``ray``; ``options``: the
    launcher's own (``ray``: ``address``, ``cpus_per_run``, ``gpus_per_run``)."""
    _check_options(launcher, LAUNCHERS.get(launcher, "--launcher"), options or {})
    runs = expand(experiment, overrides)
    variants = eval_variants(experiment, runs)
    return launch_runs(runs, directory, label=str(experiment), overrides=overrides,
                       launcher=launcher, jobs=jobs, progress=progress,
                       retry_failed=retry_failed, log=log, variants=variants, options=options,
                       headline=headline_metrics(experiment))


def launch_runs(runs: list[Run], directory: str | Path, *, label: str, overrides: list[str] = (),
                launcher: str = "sequential", jobs: int | None = None, progress: bool = True,
                retry_failed: bool = False, log=print, variants=None,
                options: dict | None = None, headline: list[str] = ()) -> dict:
    """Run (or resume) ``runs`` into the sweep directory ``directory`` (recorded as sweep
    ``label``, with its ``headline`` metrics): finished runs are skipped, interrupted ones
    resume, failed ones are retried only with ``retry_failed``; then the evaluation
    ``variants`` of finished runs."""
    launch = LAUNCHERS.get(launcher, "--launcher")
    _check_options(launcher, launch, options or {})
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    sweep_dir = SweepDir(directory)
    with sweep_dir.writing():          # one driver per sweep directory
        record = open_record(sweep_dir, label, list(overrides), launcher, runs,
                             list(headline))
        sweep = _Sweep(sweep_dir, record, log)
        todo = []
        for run in runs:
            item, summary = entry(record, run.name), sweep.run_dir(run).summary()
            if summary is not None:
                if item["summary"] is None or item["status"] not in ("finished", "failed"):
                    sweep.finish(run, summary, quiet=True)
            elif item["status"] != "failed" or retry_failed:
                todo.append(run)
        finished = sum(entry(record, r.name)["status"] == "finished" for r in runs)
        log(f"sweep of {len(runs)} runs: {finished} finished, {len(todo)} to run "
            f"({launcher} launcher)")
        sweep.total = len(todo)
        launch(sweep, todo, jobs, progress, **(options or {}))
        evaluate_variants(sweep, runs, variants or [])
        return record
