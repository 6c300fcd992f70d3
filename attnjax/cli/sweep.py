"""``attnjax sweep | sweep-status | report``: run an experiment's sweep, list its runs, write its
report."""

from __future__ import annotations

from attnjax.cli.arguments import RegistryNames, add_command, non_negative, positive
from attnjax.registry import LAUNCHERS


def _sweep(args) -> int:
    from attnjax.compilation import enable_compile_cache
    from attnjax.outputs import output_directory
    from attnjax.sweep.launch import run_sweep
    output_directory(args.workdir, "--workdir", create=False)    # before anything is written
    enable_compile_cache()
    options = {name: getattr(args, name) for name in ("address", "cpus_per_run", "gpus_per_run")
               if getattr(args, name) is not None}
    record = run_sweep(args.experiment, args.workdir, launcher=args.launcher, jobs=args.jobs,
                       overrides=args.overrides, progress=not args.no_progress,
                       retry_failed=args.retry_failed, options=options)
    from attnjax.analysis.report import sweep_status_table
    print(sweep_status_table(args.workdir))
    failed = [run["name"] for run in record["runs"] if run["status"] == "failed"]
    print(f"next: attnjax report {args.workdir}")
    return 1 if failed else 0


def add_sweep(commands) -> None:
    sweep = add_command(commands, "sweep", "run every run of an experiment's get_sweep() into a "
                        "directory (rerun to resume)", "Expand EXPERIMENT.py's get_sweep() into "
                        "named runs and train them into --workdir/<run name>. Rerunning skips "
                        "finished runs and resumes interrupted ones; failed runs are recorded in "
                        "sweep.json and the command exits 1.")
    sweep.add_argument("experiment", metavar="EXPERIMENT.py",
                       help="experiment file defining get_config() and get_sweep(), e.g. "
                       "experiments/heads.py")
    sweep.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="config overrides applied to every run, e.g. train.steps=100")
    sweep.add_argument("--workdir", required=True, metavar="DIR",
                       help="sweep directory: sweep.json plus one run directory per run")
    sweep.add_argument("--launcher", choices=RegistryNames(LAUNCHERS), default="auto",
                       metavar="LAUNCHER",
                       help="how to run the runs, one of %(choices)s (default: %(default)s, "
                       "which picks processes on a multi-core CPU, vmap on an accelerator, "
                       "sequential for one run): "
                       "sequential trains them one after another in this process, processes "
                       "in --jobs worker processes pinned to their share of the cores, vmap "
                       "trains runs differing only in seed or scalar hyperparameters as one "
                       "vmapped program, vmap-processes trains such vmapped groups side by "
                       "side in --jobs pinned worker processes")
    sweep.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="processes: number of worker processes (default 2; auto: one per "
                       "core); vmap: most "
                       "runs in one vmapped program (default: all); vmap-processes: number "
                       "of worker processes (default: one per core); ray: most runs in one "
                       "task (default: all of a structure)")
    sweep.add_argument("--address", default=None, metavar="ADDR",
                       help="ray: the cluster to join (default: $RAY_ADDRESS, else a local "
                       "instance started for the sweep; 'auto': a running local one)")
    sweep.add_argument("--cpus-per-run", type=positive, default=None, metavar="N",
                       help="ray: CPUs reserved per task, a run or a vmapped group (default 1)")
    sweep.add_argument("--gpus-per-run", type=non_negative, default=None, metavar="N",
                       help="ray: GPUs reserved per task (default 0)")
    sweep.add_argument("--retry-failed", action="store_true",
                       help="train runs recorded as failed again")
    sweep.add_argument("--no-progress", action="store_true",
                       help="do not show progress bars (for logs and batch jobs)")
    sweep.set_defaults(run=_sweep)


def _sweep_status(args) -> int:
    from attnjax.analysis.report import sweep_status_table
    print(sweep_status_table(args.workdir))
    return 0


def add_sweep_status(commands) -> None:
    status = add_command(commands, "sweep-status", "one line per run of a sweep: status, steps "
                         "done, validation loss, error")
    status.add_argument("workdir", metavar="SWEEP_DIR",
                        help="sweep directory written by 'attnjax sweep'")
    status.set_defaults(run=_sweep_status)


def _report(args) -> int:
    from attnjax.analysis.report import write_report
    print(write_report(args.workdir, args.out))
    return 0


def add_report(commands) -> None:
    report = add_command(commands, "report", "write a sweep's report: report.md, results.csv and "
                         "plots", "Write report.md, results.csv, loss curves and "
                         "final-metric-vs-axis plots of a sweep, and print its results table.")
    report.add_argument("workdir", metavar="SWEEP_DIR",
                        help="sweep directory written by 'attnjax sweep'")
    report.add_argument("--out", default=None, metavar="DIR",
                        help="directory to write the report into (default: SWEEP_DIR)")
    report.set_defaults(run=_report)
