"""Command line: ``attnjax train | eval | generate | sweep | audit | sweep-status | report |
attention | heads | recall | compare | info | bench``. The only module that parses
argv. Bad input (a misspelled override, a wrong type, a missing file, an unwritable workdir) is
one line on stderr and exit status 2, raised before anything compiles."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from attnjax.registry import KERNELS, LAUNCHERS


def _info(args) -> int:
    import jax

    from attnjax.parity import parity_table
    from attnjax.registry import KERNELS, POSITIONS

    print(f"attnjax on jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{jax.device_count()} device(s)\n")
    print("Attention kernels (attention.kernel):")
    for name, spec in KERNELS.items():
        kind = ("softmax, parity-checked" if spec.exact else
                "different function" if spec.safe else "unsafe on purpose")
        print(f"  {name:<11} {kind:<24} supports: {', '.join(sorted(spec.supports))}")
    print("\nPosition encodings (position.kind):")
    for name, entry in POSITIONS.items():
        acts = [hook for hook in ("embed", "rotate", "bias") if getattr(entry, hook)] or ["-"]
        print(f"  {name:<11} acts at: {', '.join(acts)}")
    print("\nParity vs a float64 NumPy oracle (outputs and d/dq,k,v; max abs / max rel):")
    header = (f"  {'kernel':<10} {'setting':<12} {'out abs':>9} {'out rel':>9} "
              f"{'grad abs':>9} {'grad rel':>9}")
    print(header)
    for row in parity_table(with_grads=not args.no_grads):
        grads = (f"{row['grad_abs']:9.1e} {row['grad_rel']:9.1e}" if "grad_abs" in row else "")
        print(f"  {row['kernel']:<10} {row['setting']:<12} {row['out_abs']:9.1e} "
              f"{row['out_rel']:9.1e} {grads}", flush=True)
    return 0


def _train(args) -> int:
    from attnjax import distributed
    cluster = distributed.cluster_from(args.coordinator, args.num_processes, args.process_id,
                                       detect=args.distributed)
    from attnjax.experiment import experiment_config
    from attnjax.train import format_summary, train
    from attnjax.sweep.launch import enable_compile_cache
    config = experiment_config(args.experiment, args.overrides)   # bad input fails first
    distributed.initialize(cluster)
    enable_compile_cache()
    summary = train(config, args.workdir, progress=not args.no_progress)
    if distributed.is_primary():
        print(format_summary(summary))
    return 0


def _eval(args) -> int:
    from attnjax.config import apply_overrides
    from attnjax.data import Dataset
    from attnjax.rundir import RunDir
    from attnjax.train import evaluate
    from attnjax.train.strided import strided_options
    run_dir = RunDir(args.workdir)
    config, params, step = run_dir.params(args.checkpoint)
    if args.overrides:
        config = apply_overrides(config, args.overrides)
    lengths = args.lengths or [config.data.length, *config.data.eval_lengths]
    strided = strided_options(config.data.length, args.window, args.stride, args.score_last)
    windows = dict(zip(("window", "stride", "score_last"), strided or ()))
    results = evaluate(config, params, Dataset(config.data), lengths, train_mode=args.train_mode,
                       **windows)
    mode = ", dropout on (--train-mode)" if args.train_mode else ""
    if windows:
        mode += (f", windows of {windows['window']} tokens every {windows['stride']}, each "
                 f"after the first scoring its last {windows['score_last']} targets")
    print(f"{args.checkpoint} checkpoint (step {step}) of {args.workdir}{mode}")
    print(f"{'length':>8} {'val loss':>10} {'accuracy':>10}")
    for length, r in results.items():
        print(f"{length:>8} {r['loss']:>10.4f} {r['accuracy']:>10.4f}")
    run_dir.write_eval({"checkpoint": args.checkpoint, "step": step,
                        "overrides": args.overrides, "train_mode": args.train_mode,
                        **({"strided": windows} if windows else {}),
                        "results": {str(k): v for k, v in results.items()}})
    return 0


def _generate(args) -> int:
    from attnjax.generate import sample
    from attnjax.rundir import RunDir
    config, params, _ = RunDir(args.workdir).params(args.checkpoint)
    if config.data.task != "text":
        raise ValueError("generate needs a byte-level text run (data.task='text')")
    prompt = list(args.prompt.encode("utf-8"))
    tokens = sample(config, params, prompt, args.tokens, temperature=args.temperature,
                    top_k=args.top_k, seed=args.seed)
    print(args.prompt + bytes(tokens).decode("utf-8", errors="replace"))
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _sweep(args) -> int:
    from attnjax.sweep.launch import enable_compile_cache, run_sweep
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


def _audit(args) -> int:
    from attnjax.audit.runner import run_audit
    from attnjax.sweep.launch import enable_compile_cache
    enable_compile_cache()
    only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else None
    result = run_audit(args.claims, args.workdir, only=only, launcher=args.launcher,
                       jobs=args.jobs, progress=not args.no_progress, publish_to=args.publish)
    return 1 if result["errors"] else 0


def _sweep_status(args) -> int:
    from attnjax.analysis.report import sweep_status_table
    print(sweep_status_table(args.workdir))
    return 0


def _report(args) -> int:
    from attnjax.analysis.report import write_report
    print(write_report(args.workdir, args.out))
    return 0


def _attention(args) -> int:
    from attnjax.analysis.heatmaps import write_attention_report
    if args.text is not None and args.batch is not None:
        raise ValueError("give --text or --batch, not both")
    if args.draws is not None and not args.occlusion:
        raise ValueError("--draws is read only with --occlusion")
    print(write_attention_report(args.workdir, args.out, text=args.text, batch=args.batch,
                                 length=args.length, which=args.checkpoint,
                                 overrides=args.overrides, occlusion=args.occlusion,
                                 draws=8 if args.draws is None else args.draws))
    extra = ", occlusion.png" if args.occlusion else ""
    print(f"wrote heatmaps, grid.png{extra} and head_stats.md to {args.out}")
    return 0


def _heads(args) -> int:
    from attnjax.analysis.heads import write_head_report
    print(write_head_report(args.workdir, args.out, which=args.checkpoint, steps=args.steps))
    print(f"wrote knockout, importance, pruning and head-similarity tables and plots to "
          f"{args.out}")
    return 0


def _recall(args) -> int:
    from attnjax.analysis.recall import write_recall_report
    print(write_recall_report(args.workdir, args.out, which=args.checkpoint,
                              buckets=args.buckets, batches=args.batches))
    print(f"wrote recall.md, recall.csv and recall.png to {args.out}")
    return 0


def _compare(args) -> int:
    from attnjax.analysis.compare import compare_runs, compare_sweep
    if args.baseline is not None:
        if args.run_b is not None:
            raise ValueError("compare takes RUN_A RUN_B, or SWEEP_DIR --baseline RUN, not both")
        print(compare_sweep(args.run_a, args.baseline, args.out, which=args.checkpoint))
    elif args.run_b is None:
        raise ValueError("compare needs RUN_A RUN_B, or SWEEP_DIR --baseline RUN")
    else:
        print(compare_runs(args.run_a, args.run_b, args.out, which=args.checkpoint))
    return 0


def _bench_config(overrides: list[str]):
    """The config of ``bench memory|generate|eval``: an experiment file's, or the default
    ``Config()``, with KEY=VALUE overrides."""
    from attnjax.config import Config, apply_overrides
    from attnjax.experiment import experiment_config
    if overrides and "=" not in overrides[0]:
        return experiment_config(overrides[0], overrides[1:])
    return apply_overrides(Config(), overrides)


def _bench(args) -> int:
    from attnjax import bench
    if args.what == "report":
        from pathlib import Path

        from attnjax.bench_report import performance_markdown
        performance_markdown(out=Path(args.out or "docs/PERFORMANCE.md"))
        return 0
    if args.what == "memory":
        from attnjax.bench_memory import run_memory_benchmark
        run_memory_benchmark(_bench_config(args.overrides), out=args.out)
        return 0
    if args.what == "generate":
        from attnjax.bench_generate import run_generate_benchmark
        run_generate_benchmark(_bench_config(args.overrides), args.lengths or (128, 256, 512, 1024),
                               args.fills, batch=args.batch, out=args.out)
        return 0
    if args.what == "eval":
        from attnjax.bench_eval import run_eval_benchmark
        run_eval_benchmark(_bench_config(args.overrides), out=args.out)
        return 0
    if args.what == "startup":
        from attnjax.bench_startup import run_startup_benchmark
        experiment = next((o for o in args.overrides if o.endswith(".py")),
                          "experiments/baseline.py")
        run_startup_benchmark(experiment, [o for o in args.overrides if o != experiment],
                              out=args.out)
        return 0
    if args.what == "sweep" and len(args.overrides) <= 1 and all(
            o.endswith(".py") for o in args.overrides):
        bench.run_sweep_benchmark(*args.overrides, seeds=args.seeds, steps=args.steps or 300,
                                  launchers=args.launchers or bench.SWEEP_LAUNCHERS,
                                  out=args.out)
        return 0
    if args.overrides:
        raise ValueError(f"bench {args.what} takes no config ({' '.join(args.overrides)}); "
                         "bench memory, generate and eval do, bench sweep an EXPERIMENT.py")
    if args.what == "train":
        bench.run_train_benchmark(steps=args.steps or 50, out=args.out)
    else:
        bench.run(lengths=args.lengths or (1024, 4096), kernels=args.kernels, out=args.out,
                  batch=args.batch, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype)
    return 0


_DESCRIPTION = """\
attnjax trains and analyses attention variants in JAX/Flax: pick attention kernels and position
encodings by name in a config, train small decoder models, run ablation sweeps, and inspect what
the trained heads do."""

_EPILOG = """\
examples:
  attnjax train experiments/baseline.py --workdir runs/base
  attnjax eval runs/base --lengths 64 128 256
  attnjax sweep experiments/heads.py --workdir runs/heads --launcher vmap
  attnjax report runs/heads

KEY=VALUE overrides set dotted config fields, e.g. model.position.kind=alibi.
"attnjax COMMAND --help" shows a command's options."""

_OVERRIDES = "config overrides as dotted KEY=VALUE pairs, e.g. model.position.kind=alibi"
_CHECKPOINT = ("which checkpoint to load: best (lowest validation loss) or latest "
               "(default: %(default)s)")


def _version() -> str:
    """The installed distribution's version, or the package's own if it is not installed."""
    from importlib import metadata
    try:
        return metadata.version("attnjax")
    except metadata.PackageNotFoundError:
        import attnjax
        return attnjax.__version__


class _RegistryNames(Sequence):
    """A registry's names, read the first time argparse looks at them (checking a value, or
    formatting --help): the registry then imports its provider, so building the parser does
    not."""

    def __init__(self, registry):
        self._registry = registry

    def __getitem__(self, index):
        return self._registry.names()[index]

    def __len__(self) -> int:
        return len(self._registry.names())


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="attnjax", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"attnjax {_version()}",
                        help="print the attnjax version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     title="commands", help="what to do; 'attnjax COMMAND "
                                     "--help' shows its options")

    def command(name: str, summary: str, description: str | None = None):
        return commands.add_parser(name, help=summary,
                                   description=description or summary[0].upper() + summary[1:]
                                   + ".")

    train = command("train", "train an experiment's config into a run directory (rerun to "
                    "resume)", "Train the config returned by EXPERIMENT.py's get_config() into "
                    "--workdir. Rerunning the same command resumes from the latest checkpoint; "
                    "a finished run is not trained again.")
    train.add_argument("experiment", metavar="EXPERIMENT.py",
                       help="experiment file defining get_config(), e.g. experiments/baseline.py")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=_OVERRIDES)
    train.add_argument("--workdir", required=True, metavar="DIR",
                       help="run directory for config.json, metrics.jsonl, TensorBoard events "
                       "and checkpoints")
    train.add_argument("--no-progress", action="store_true",
                       help="do not show a progress bar (for logs and batch jobs)")
    train.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="multi-process run: process 0's address, which every process "
                       "names (or $ATTNJAX_COORDINATOR); see docs/CLUSTER.md")
    train.add_argument("--num-processes", type=int, default=None, metavar="N",
                       help="multi-process run: how many processes train the run together "
                       "(or $ATTNJAX_NUM_PROCESSES)")
    train.add_argument("--process-id", type=int, default=None, metavar="I",
                       help="multi-process run: this process's index, 0 to N-1 (or "
                       "$ATTNJAX_PROCESS_ID); process 0 writes the run directory")
    train.add_argument("--distributed", action="store_true",
                       help="multi-process run in a cluster JAX detects (SLURM's srun, Open "
                       "MPI, a Cloud TPU pod slice, Kubernetes) instead of the three flags")
    train.set_defaults(run=_train)

    evaluate = command("eval", "evaluate a trained run's checkpoint, e.g. at other lengths or "
                       "with a RoPE scaling override", "Evaluate a run's checkpoint on "
                       "validation data at one or more sequence lengths, optionally with config "
                       "overrides (e.g. model.position.rope_scaling=yarn). Writes eval.json into "
                       "the run directory.")
    evaluate.add_argument("workdir", metavar="RUN_DIR", help="run directory written by "
                          "'attnjax train'")
    evaluate.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                          help="config overrides for evaluation only, e.g. "
                          "model.position.rope_scale=4")
    evaluate.add_argument("--lengths", type=int, nargs="+", default=None, metavar="N",
                          help="sequence lengths to evaluate at (default: the training length "
                          "and data.eval_lengths)")
    evaluate.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                          help=_CHECKPOINT)
    evaluate.add_argument("--train-mode", action="store_true",
                          help="evaluate with dropout on, as the model trains (the gap to the "
                          "default shows what dropout costs at evaluation)")
    evaluate.add_argument("--stride", type=int, default=None, metavar="N",
                          help="strided evaluation: score each sequence by windows of --window "
                          "tokens starting every N tokens (default: the window, disjoint "
                          "segments); N must divide length - window")
    evaluate.add_argument("--window", type=int, default=None, metavar="W",
                          help="strided evaluation: the tokens each window encodes, at "
                          "positions 0..W-1 (default: the training length data.length)")
    evaluate.add_argument("--score-last", type=int, default=None, metavar="K",
                          help="strided evaluation: each window after the first scores its "
                          "last K targets, the first all; K must equal --stride (default), "
                          "so every target is scored once, as without windows")
    evaluate.set_defaults(run=_eval)

    generate = command("generate", "sample text from a byte-level text run with the KV cache",
                       "Continue a prompt with a trained byte-level text run (data.task=text), "
                       "decoding token by token with the KV cache. Prompt plus tokens must fit "
                       "in model.max_length.")
    generate.add_argument("workdir", metavar="RUN_DIR",
                          help="run directory of a byte-level text run")
    generate.add_argument("--prompt", required=True, metavar="TEXT",
                          help="text to continue, e.g. \"def main(\"")
    generate.add_argument("--tokens", type=int, default=100, metavar="N",
                          help="number of bytes to generate after the prompt "
                          "(default: %(default)s)")
    generate.add_argument("--temperature", type=float, default=0.8, metavar="T",
                          help="sampling temperature; 0 is greedy (default: %(default)s)")
    generate.add_argument("--top-k", type=int, default=None, metavar="K",
                          help="sample only among the K most likely tokens (default: all)")
    generate.add_argument("--seed", type=int, default=0,
                          help="random seed of the sampler (default: %(default)s)")
    generate.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                          help=_CHECKPOINT)
    generate.set_defaults(run=_generate)

    sweep = command("sweep", "run every run of an experiment's get_sweep() into a directory "
                    "(rerun to resume)", "Expand EXPERIMENT.py's get_sweep() into named runs "
                    "and train them into --workdir/<run name>. Rerunning skips finished runs and "
                    "resumes interrupted ones; failed runs are recorded in sweep.json and the "
                    "command exits 1.")
    sweep.add_argument("experiment", metavar="EXPERIMENT.py",
                       help="experiment file defining get_config() and get_sweep(), e.g. "
                       "experiments/heads.py")
    sweep.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="config overrides applied to every run, e.g. train.steps=100")
    sweep.add_argument("--workdir", required=True, metavar="DIR",
                       help="sweep directory: sweep.json plus one run directory per run")
    sweep.add_argument("--launcher", choices=_RegistryNames(LAUNCHERS), default="auto",
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
    sweep.add_argument("--cpus-per-run", type=_positive, default=None, metavar="N",
                       help="ray: CPUs reserved per task, a run or a vmapped group (default 1)")
    sweep.add_argument("--gpus-per-run", type=_non_negative, default=None, metavar="N",
                       help="ray: GPUs reserved per task (default 0)")
    sweep.add_argument("--retry-failed", action="store_true",
                       help="train runs recorded as failed again")
    sweep.add_argument("--no-progress", action="store_true",
                       help="do not show progress bars (for logs and batch jobs)")
    sweep.set_defaults(run=_sweep)

    audit = command("audit", "the claims audit: train each claim's runs once, judge every "
                    "claim, write AUDIT.md (rerun to resume)", "Load the claim files "
                    "CLAIMS_DIR/<group>/<ID>.py, train every run they need once (shared runs "
                    "once) into --workdir/runs, measure each claim, apply its criterion and "
                    "write --workdir/AUDIT.md. Rerunning skips finished runs and measurements; "
                    "a claim whose measurement fails is reported and the command exits 1.")
    audit.add_argument("claims", metavar="CLAIMS_DIR", help="directory of claim files, e.g. "
                       "experiments/claims")
    audit.add_argument("--workdir", required=True, metavar="DIR",
                       help="audit directory: runs/, results/, plots/ and AUDIT.md")
    audit.add_argument("--only", default=None, metavar="ID,ID",
                       help="only these claims, e.g. PE4,MK2")
    audit.add_argument("--launcher", choices=_RegistryNames(LAUNCHERS),
                       default="vmap-processes", metavar="LAUNCHER",
                       help="how to train the runs, one of %(choices)s (default: %(default)s: "
                       "the audit's small runs train fastest single-threaded side by side, "
                       "and a vmapped group compiles once for its seeds)")
    audit.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="as for 'attnjax sweep'")
    audit.add_argument("--publish", default=None, metavar="FILE.md",
                       help="also write the report to FILE.md with its plots beside it, e.g. "
                       "docs/CLAIMS_AUDIT.md")
    audit.add_argument("--no-progress", action="store_true",
                       help="do not show progress bars (for logs and batch jobs)")
    audit.set_defaults(run=_audit)

    status = command("sweep-status", "one line per run of a sweep: status, steps done, "
                     "validation loss, error")
    status.add_argument("workdir", metavar="SWEEP_DIR",
                        help="sweep directory written by 'attnjax sweep'")
    status.set_defaults(run=_sweep_status)

    report = command("report", "write a sweep's report: report.md, results.csv and plots",
                     "Write report.md, results.csv, loss curves and final-metric-vs-axis plots "
                     "of a sweep, and print its results table.")
    report.add_argument("workdir", metavar="SWEEP_DIR",
                        help="sweep directory written by 'attnjax sweep'")
    report.add_argument("--out", default=None, metavar="DIR",
                        help="directory to write the report into (default: SWEEP_DIR)")
    report.set_defaults(run=_report)

    attention = command("attention", "attention heatmaps of every layer and head on a probe "
                        "input, a grid of all heads, and per-head statistics",
                        "Run a trained model on a probe input and write one heatmap per layer "
                        "and head, grid.png with every head, and head_stats.md/.csv (entropy, "
                        "sink mass, previous-token and induction scores, ...).")
    attention.add_argument("workdir", metavar="RUN_DIR", help="run directory written by "
                           "'attnjax train'")
    attention.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                           help="config overrides for this evaluation only, e.g. "
                           "model.attention.scale_multiplier=1e-6")
    attention.add_argument("--text", default=None,
                           help="probe text for byte-level text runs, e.g. \"def main(argv):\"")
    attention.add_argument("--batch", type=int, default=None, metavar="N",
                           help="probe with N validation examples of the run's own data "
                           "(default 4 if no --text)")
    attention.add_argument("--length", type=int, default=None, metavar="N",
                           help="probe length in tokens (default: the training length); "
                           "longer shows the heads past it")
    attention.add_argument("--out", required=True, metavar="DIR",
                           help="directory to write the heatmaps and statistics into")
    attention.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                           help=_CHECKPOINT)
    attention.add_argument("--occlusion", action="store_true",
                           help="also rank the keys by occlusion (loss rise when a key token "
                           "is replaced at random), plot it beside the last layer's weights in "
                           "occlusion.png and print the median Spearman rho")
    attention.add_argument("--draws", type=int, default=None, metavar="N",
                           help="with --occlusion: random replacements per key (default: 8)")
    attention.set_defaults(run=_attention)

    heads = command("heads", "head knockout, gradient importance (Michel et al.) and the "
                    "pruning curve", "Knock out one head at a time (loss change per head), "
                    "compute gradient head importance (Michel et al.) and plot iterative "
                    "pruning: loss against the fraction of heads removed.")
    heads.add_argument("workdir", metavar="RUN_DIR", help="run directory written by "
                       "'attnjax train'")
    heads.add_argument("--out", required=True, metavar="DIR",
                       help="directory to write the tables and plots into")
    heads.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                       help=_CHECKPOINT)
    heads.add_argument("--steps", type=int, default=None, metavar="N",
                       help="points on the pruning curve (default: one per head, at most 10)")
    heads.set_defaults(run=_heads)

    recall = command("recall", "accuracy of a recall run (induction, mqar) by the distance "
                     "between each query and the key it recalls", "Score a recall run's "
                     "validation batches and bucket the scored targets by query-key distance "
                     "(the query's position minus that of the earlier occurrence of its token "
                     "that is followed by the answer): recall.md, recall.csv, recall.png.")
    recall.add_argument("workdir", metavar="RUN_DIR", help="run directory of an induction or "
                        "mqar run")
    recall.add_argument("--out", required=True, metavar="DIR",
                        help="directory to write the table and plot into")
    recall.add_argument("--buckets", default="pow2", metavar="SPEC",
                        help="distance buckets: pow2 (1, 2-3, 4-7, ...), a number N of "
                        "equal-width buckets, or increasing edges e.g. 1,8,32,128 "
                        "(default: %(default)s)")
    recall.add_argument("--batches", type=int, default=None, metavar="N",
                        help="validation batches to score (default: train.eval_batches)")
    recall.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                        help=_CHECKPOINT)
    recall.set_defaults(run=_recall)

    compare = command("compare", "compare two runs, or every run of a sweep with a baseline: "
                      "config, parameters, attention, losses",
                      "Compare RUN_A with RUN_B, or every run of SWEEP_DIR with --baseline: "
                      "config difference, per-parameter relative L2 and cosine, Jensen-Shannon "
                      "divergence of attention per layer and head, validation losses.")
    compare.add_argument("run_a", metavar="RUN_A|SWEEP_DIR",
                         help="first run directory, or a sweep directory (with --baseline)")
    compare.add_argument("run_b", metavar="RUN_B", nargs="?", default=None,
                         help="second run directory (omit with --baseline)")
    compare.add_argument("--baseline", default=None, metavar="RUN",
                         help="with SWEEP_DIR: the run every other run is compared with, a "
                         "run name of the sweep (e.g. num_heads=4,seed=0) or a run directory")
    compare.add_argument("--out", required=True, metavar="DIR",
                         help="directory to write the comparison into")
    compare.add_argument("--checkpoint", choices=["best", "latest"], default="best",
                         help=_CHECKPOINT)
    compare.set_defaults(run=_compare)

    info = command("info", "list the registered attention kernels and position encodings, "
                   "with a parity table of the kernels", "Show the JAX backend, every "
                   "registered attention kernel and position encoding, and each kernel's "
                   "error against a float64 NumPy oracle (outputs and gradients).")
    info.add_argument("--no-grads", action="store_true",
                      help="check the parity of outputs only, not of gradients (faster)")
    info.set_defaults(run=_info)

    bench = command("bench", "benchmark attention kernels (memory, time), training throughput "
                    "(tokens/s, MFU), vmap vs sequential sweeps, training-step memory or "
                    "generation with and without the KV cache", "Benchmark one of: "
                    "attention (compiled memory and time of each kernel's gradient), train "
                    "(tokens/s and model-FLOPs utilisation), sweep (wall time of one sweep "
                    "with each launcher), memory (compiled memory of a config's training step, "
                    "not run), generate (a cached decoding step at several cache fills, full "
                    "forwards without a cache, and whole generations), eval (forward tokens/s of "
                    "an evaluation against tokens per pass), startup (the phases of one run "
                    "trained twice in new processes sharing a compilation cache) or "
                    "report (docs/PERFORMANCE.md from benchmarks/results/*.json).")
    bench.add_argument("what", choices=["attention", "train", "sweep", "memory", "generate",
                                        "eval", "startup", "report"],
                       metavar="WHAT", help="what to benchmark: %(choices)s")
    bench.add_argument("overrides", nargs="*", metavar="CONFIG",
                       help="sweep, startup: the experiment (EXPERIMENT.py; startup also "
                       "takes KEY=VALUE overrides); memory, generate, eval: the model and training "
                       "config, an experiment "
                       "file EXPERIMENT.py and/or KEY=VALUE overrides (default: the default "
                       "config, a width-128, 4-layer byte-level model)")
    bench.add_argument("--steps", type=int, default=None, metavar="N",
                       help="train: timed steps per setting (default 50); sweep: steps per "
                       "run (default 300)")
    bench.add_argument("--seeds", type=int, default=8, metavar="N",
                       help="sweep: number of seeds of the experiment (default: "
                       "%(default)s of experiments/baseline.py)")
    bench.add_argument("--launchers", nargs="+", choices=_RegistryNames(LAUNCHERS),
                       default=None, metavar="LAUNCHER",
                       help="sweep: the launchers to time (default: all of %(choices)s)")
    bench.add_argument("--lengths", type=int, nargs="+", default=None, metavar="N",
                       help="attention: sequence lengths to measure (default: 1024 4096); "
                       "generate: tokens n of the full forwards (default: 128 256 512 1024)")
    bench.add_argument("--fills", type=int, nargs="+", default=[16, 64, 256, 1024],
                       metavar="T", help="generate: time the cached step of token t (t - 1 "
                       "cached) at each T, with model.max_length the largest T and equal to "
                       "T (default: 16 64 256 1024)")
    bench.add_argument("--kernels", nargs="+", default=None, metavar="KERNEL",
                       choices=_RegistryNames(KERNELS),
                       help="attention: kernels to measure, from %(choices)s (default: every "
                       "exact kernel available on this backend)")
    bench.add_argument("--batch", type=int, default=1, metavar="N",
                       help="attention, generate: batch size (default: %(default)s)")
    bench.add_argument("--heads", type=int, default=4, metavar="N",
                       help="attention: number of heads (default: %(default)s)")
    bench.add_argument("--head-dim", type=int, default=32, metavar="N",
                       help="attention: features per head (default: %(default)s)")
    bench.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                       help="attention: dtype of q, k and v (logits stay float32 or wider in "
                       "the exact kernels; default: %(default)s)")
    bench.add_argument("--out", default=None, metavar="FILE.json",
                       help="also write the results as JSON to this file (report: the page "
                       "to write, default docs/PERFORMANCE.md)")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides may also come after the options (``--workdir DIR k=v``)
    if extra and hasattr(args, "overrides") and all("=" in a and not a.startswith("-")
                                                    for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as error:  # bad input: one line, no traceback
        print(f"attnjax: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:      # Ctrl-C, or SIGTERM to a sweep or audit driver
        print(f"attnjax: interrupted{f' ({stop})' if str(stop) else ''}; what was running "
              "saved a checkpoint: rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
