"""Command line: ``attnjax train | eval | generate | sweep | sweep-status | report | attention |
heads | compare | info | bench``. The only module that parses
argv. Bad input (a misspelled override, a wrong type, a missing file, an unwritable workdir) is
one line on stderr and exit status 2, raised before anything compiles."""

from __future__ import annotations

import argparse
import sys


def _info(args) -> int:
    import jax

    from attnjax.parity import parity_table
    from attnjax.registry import KERNELS, POSITIONS

    print(f"attnjax on jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{jax.device_count()} device(s)\n")
    print("Attention kernels (attention.kernel):")
    for name, spec in KERNELS.items():
        kind = "softmax, parity-checked" if spec.exact else "different function"
        print(f"  {name:<10} {kind:<24} supports: {', '.join(sorted(spec.supports))}")
    print("\nPosition encodings (position.kind):")
    for name, entry in POSITIONS.items():
        acts = [hook for hook in ("embed", "rotate", "bias") if getattr(entry, hook)] or ["-"]
        print(f"  {name:<10} acts at: {', '.join(acts)}")
    print("\nParity vs a float64 NumPy oracle (outputs and d/dq,k,v; max abs / max rel):")
    header = f"  {'kernel':<10} {'setting':<12} {'out abs':>9} {'out rel':>9} {'grad abs':>9} {'grad rel':>9}"
    print(header)
    for row in parity_table(with_grads=not args.no_grads):
        grads = (f"{row['grad_abs']:9.1e} {row['grad_rel']:9.1e}" if "grad_abs" in row else "")
        print(f"  {row['kernel']:<10} {row['setting']:<12} {row['out_abs']:9.1e} "
              f"{row['out_rel']:9.1e} {grads}", flush=True)
    return 0


def _train(args) -> int:
    from attnjax.experiment import experiment_config
    from attnjax.train import format_summary, train
    config = experiment_config(args.experiment, args.overrides)
    summary = train(config, args.workdir, progress=not args.no_progress)
    print(format_summary(summary))
    return 0


def _eval(args) -> int:
    import json
    from pathlib import Path

    from attnjax.config import apply_overrides
    from attnjax.data import Dataset
    from attnjax.generate import load_params
    from attnjax.train import evaluate
    config, params, step = load_params(args.workdir, args.checkpoint)
    if args.overrides:
        config = apply_overrides(config, args.overrides)
    lengths = args.lengths or [config.data.length, *config.data.eval_lengths]
    results = evaluate(config, params, Dataset(config.data), lengths)
    print(f"{args.checkpoint} checkpoint (step {step}) of {args.workdir}")
    print(f"{'length':>8} {'val loss':>10} {'accuracy':>10}")
    for length, r in results.items():
        print(f"{length:>8} {r['loss']:>10.4f} {r['accuracy']:>10.4f}")
    out = Path(args.workdir) / "eval.json"
    out.write_text(json.dumps({"checkpoint": args.checkpoint, "step": step,
                               "overrides": args.overrides,
                               "results": {str(k): v for k, v in results.items()}}, indent=2))
    return 0


def _generate(args) -> int:
    from attnjax.generate import load_params, sample
    config, params, _ = load_params(args.workdir, args.checkpoint)
    if config.data.task != "text":
        raise ValueError("generate needs a byte-level text run (data.task='text')")
    prompt = list(args.prompt.encode("utf-8"))
    tokens = sample(config, params, prompt, args.tokens, temperature=args.temperature,
                    top_k=args.top_k, seed=args.seed)
    print(args.prompt + bytes(tokens).decode("utf-8", errors="replace"))
    return 0


def _sweep(args) -> int:
    from attnjax.sweep.launch import enable_compile_cache, run_sweep
    enable_compile_cache()
    record = run_sweep(args.experiment, args.workdir, launcher=args.launcher, jobs=args.jobs,
                       overrides=args.overrides, progress=not args.no_progress,
                       retry_failed=args.retry_failed)
    from attnjax.analysis.report import sweep_status_table
    print(sweep_status_table(args.workdir))
    failed = [run["name"] for run in record["runs"] if run["status"] == "failed"]
    print(f"next: attnjax report {args.workdir}")
    return 1 if failed else 0


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
    print(write_attention_report(args.workdir, args.out, text=args.text, batch=args.batch,
                                 which=args.checkpoint))
    print(f"wrote heatmaps, grid.png and head_stats.md to {args.out}")
    return 0


def _heads(args) -> int:
    from attnjax.analysis.heads import write_head_report
    print(write_head_report(args.workdir, args.out, which=args.checkpoint, steps=args.steps))
    print(f"wrote knockout, importance and pruning tables and plots to {args.out}")
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


def _bench(args) -> int:
    from attnjax import bench
    if args.what == "train":
        bench.run_train_benchmark(steps=args.steps or 50, out=args.out)
    elif args.what == "sweep":
        bench.run_sweep_benchmark(seeds=args.seeds, steps=args.steps or 1000, out=args.out)
    else:
        bench.run(lengths=args.lengths, kernels=args.kernels, out=args.out, batch=args.batch,
                  heads=args.heads, head_dim=args.head_dim)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnjax", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train EXPERIMENT.py into --workdir (resumes)")
    train.add_argument("experiment", help="experiments/<name>.py defining get_config()")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="config overrides, e.g. model.attention.num_heads=8")
    train.add_argument("--workdir", required=True)
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(run=_train)
    evaluate = commands.add_parser("eval", help="evaluate a run's checkpoint, e.g. at other "
                                   "lengths or with a RoPE scaling override")
    evaluate.add_argument("workdir")
    evaluate.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    evaluate.add_argument("--lengths", type=int, nargs="+", default=None)
    evaluate.add_argument("--checkpoint", choices=["best", "latest"], default="best")
    evaluate.set_defaults(run=_eval)
    generate = commands.add_parser("generate", help="sample text with the KV cache")
    generate.add_argument("workdir")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--tokens", type=int, default=100)
    generate.add_argument("--temperature", type=float, default=0.8)
    generate.add_argument("--top-k", type=int, default=None)
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--checkpoint", choices=["best", "latest"], default="best")
    generate.set_defaults(run=_generate)
    sweep = commands.add_parser("sweep", help="run every run of EXPERIMENT.py's get_sweep() "
                                "into --workdir (rerun to resume)")
    sweep.add_argument("experiment", help="experiments/<name>.py defining get_config() and "
                       "get_sweep()")
    sweep.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="overrides applied to every run, e.g. train.steps=100")
    sweep.add_argument("--workdir", required=True)
    sweep.add_argument("--launcher", choices=["sequential", "processes", "vmap"],
                       default="sequential")
    sweep.add_argument("--jobs", type=int, default=None, help="processes: worker processes "
                       "(default 2); vmap: most runs in one vmapped program (default all)")
    sweep.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bars")
    sweep.set_defaults(run=_sweep)
    status = commands.add_parser("sweep-status", help="one line per run of a sweep directory")
    status.add_argument("workdir")
    status.set_defaults(run=_sweep_status)
    report = commands.add_parser("report", help="report.md, results.csv and plots of a sweep")
    report.add_argument("workdir")
    report.add_argument("--out", default=None, help="where to write (default: the sweep dir)")
    report.set_defaults(run=_report)
    attention = commands.add_parser("attention", help="attention heatmaps of every layer and "
                                    "head on a probe input, a grid of all heads, per-head stats")
    attention.add_argument("workdir", metavar="RUN_DIR")
    attention.add_argument("--text", default=None, help="probe text (byte-level runs)")
    attention.add_argument("--batch", type=int, default=None, help="probe with N validation "
                           "examples of the run's own data (default 4 if no --text)")
    attention.add_argument("--out", required=True)
    attention.add_argument("--checkpoint", choices=["best", "latest"], default="best")
    attention.set_defaults(run=_attention)
    heads = commands.add_parser("heads", help="head knockout, gradient importance (Michel et al.) "
                                "and the pruning curve")
    heads.add_argument("workdir", metavar="RUN_DIR")
    heads.add_argument("--out", required=True)
    heads.add_argument("--checkpoint", choices=["best", "latest"], default="best")
    heads.add_argument("--steps", type=int, default=None, help="points on the pruning curve "
                       "(default: one per head, at most 10)")
    heads.set_defaults(run=_heads)
    compare = commands.add_parser("compare", help="compare two runs, or every run of a sweep "
                                  "with a baseline: config, parameters, attention, losses")
    compare.add_argument("run_a", metavar="RUN_A|SWEEP_DIR")
    compare.add_argument("run_b", metavar="RUN_B", nargs="?", default=None)
    compare.add_argument("--baseline", default=None, help="with SWEEP_DIR: a run name of the "
                         "sweep or a run directory")
    compare.add_argument("--out", required=True)
    compare.add_argument("--checkpoint", choices=["best", "latest"], default="best")
    compare.set_defaults(run=_compare)
    info = commands.add_parser("info", help="registered kernels and position encodings, "
                               "and a parity table of the kernels")
    info.add_argument("--no-grads", action="store_true", help="parity of outputs only")
    info.set_defaults(run=_info)
    bench = commands.add_parser("bench", help="attention kernels (memory, time), training "
                                "throughput (tokens/s, MFU), or vmap vs sequential sweeps")
    bench.add_argument("what", choices=["attention", "train", "sweep"])
    bench.add_argument("--steps", type=int, default=None, help="train: timed steps per "
                       "setting (default 50); sweep: steps per run (default 1000)")
    bench.add_argument("--seeds", type=int, default=8, help="sweep: seeds of experiments/mqar.py")
    bench.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    bench.add_argument("--kernels", nargs="+", default=None)
    bench.add_argument("--batch", type=int, default=1)
    bench.add_argument("--heads", type=int, default=4)
    bench.add_argument("--head-dim", type=int, default=32)
    bench.add_argument("--out", default=None, help="write the rows as JSON here")
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


if __name__ == "__main__":
    sys.exit(main())
