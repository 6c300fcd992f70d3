"""``attnjax bench WHAT``: one benchmark of ``attnjax.bench`` per WHAT, its JSON to ``--out``."""

from __future__ import annotations

from pathlib import Path

from attnjax.cli.arguments import RegistryNames, add_command
from attnjax.experiment import config_from_arguments
from attnjax.registry import KERNELS, LAUNCHERS


def _attention(args) -> None:
    from attnjax.bench.attention import run_attention_benchmark
    run_attention_benchmark(lengths=args.lengths or (1024, 4096), kernels=args.kernels,
                            out=args.out, python=args.python, batch=args.batch, heads=args.heads,
                            head_dim=args.head_dim, dtype=args.dtype)


def _train(args) -> None:
    from attnjax.bench.train import run_train_benchmark
    run_train_benchmark(steps=args.steps or 50, out=args.out)


def _sweep(args) -> None:
    from attnjax.bench.sweep import SWEEP_LAUNCHERS, run_sweep_benchmark
    run_sweep_benchmark(*args.overrides, seeds=args.seeds, steps=args.steps or 300,
                        launchers=args.launchers or SWEEP_LAUNCHERS, out=args.out)


def _memory(args) -> None:
    from attnjax.bench.memory import run_memory_benchmark
    run_memory_benchmark(config_from_arguments(args.overrides), out=args.out)


def _mesh(args) -> None:
    from attnjax.bench.mesh import LLAMA_110M, MESHES, run_mesh_benchmark
    from attnjax.config import Config, apply_overrides
    config = config_from_arguments(args.overrides, apply_overrides(Config(), LLAMA_110M))
    run_mesh_benchmark(config, args.meshes or MESHES, run_steps=args.steps or 0, out=args.out)


def _context(args) -> None:
    from attnjax.bench.context import LENGTHS, run_context_benchmark
    run_context_benchmark(tuple(args.lengths or LENGTHS), out=args.out)


def _torch(args) -> None:
    from attnjax.bench.torch_peer import run_torch_benchmark
    if args.python is None:
        raise ValueError("bench torch needs --python PYTHON, an interpreter that has torch")
    run_torch_benchmark(args.python, steps=args.steps or 50, out=args.out)


def _generate(args) -> None:
    from attnjax.bench.generate import run_generate_benchmark
    from attnjax.bench.translate import run_translation_benchmark
    from attnjax.models import family
    config = config_from_arguments(args.overrides)
    if family(config.model).objective(config.model) == "seq2seq":
        run_translation_benchmark(config, args.lengths or (64, 256, 1024), batch=args.batch,
                                  out=args.out)
        return
    run_generate_benchmark(config, args.lengths or (128, 256, 512, 1024), args.fills,
                           batch=args.batch, out=args.out)


def _eval(args) -> None:
    from attnjax.bench.eval import run_eval_benchmark
    run_eval_benchmark(config_from_arguments(args.overrides), out=args.out)


def _startup(args) -> None:
    from attnjax.bench.startup import run_startup_benchmark
    experiment = next((o for o in args.overrides if o.endswith(".py")),
                      "experiments/baseline.py")
    run_startup_benchmark(experiment, [o for o in args.overrides if o != experiment],
                          out=args.out)


def _warm(args) -> None:
    from attnjax.bench.warm import run_warm_benchmark
    if len(args.overrides) != 1:
        raise ValueError("bench warm takes one RUN_DIR, a run that generates text")
    run_warm_benchmark(args.overrides[0], args.python, out=args.out)


def _patch(args) -> None:
    from attnjax.bench.patch import run_patch_benchmark
    run_patch_benchmark(config_from_arguments(args.overrides), out=args.out)


def _report(args) -> None:
    from attnjax.bench.report import performance_markdown
    performance_markdown(out=Path(args.out or "docs/PERFORMANCE.md"))


BENCHMARKS = {"attention": _attention, "train": _train, "sweep": _sweep, "memory": _memory,
              "mesh": _mesh, "context": _context, "torch": _torch, "generate": _generate,
              "eval": _eval, "startup": _startup, "warm": _warm, "patch": _patch,
              "report": _report}


def _takes_config(args) -> bool:
    """Whether ``bench WHAT`` reads the positional CONFIG arguments: memory, generate, eval and
    startup a config, sweep one EXPERIMENT.py; report accepts and ignores them."""
    if args.what == "sweep":
        return len(args.overrides) <= 1 and all(o.endswith(".py") for o in args.overrides)
    return args.what in ("memory", "mesh", "generate", "eval", "startup", "warm", "patch",
                         "report")


def _bench(args) -> int:
    from attnjax.outputs import output_file
    if args.overrides and not _takes_config(args):
        raise ValueError(f"bench {args.what} takes no config ({' '.join(args.overrides)}); "
                         "bench memory, generate and eval do, bench sweep an EXPERIMENT.py")
    if args.out is not None:                 # before the benchmark, not after it
        output_file(args.out, "--out")
    BENCHMARKS[args.what](args)
    return 0


DESCRIPTION = (
    "Benchmark one of: attention (compiled memory and time of each kernel's gradient), train "
    "(tokens/s and model-FLOPs utilisation), sweep (wall time of one sweep with each "
    "launcher), memory (compiled memory of a config's training step, not run), mesh "
    "(per-device memory and collective bytes of a training step on each of several meshes; a "
    "Llama-shaped 110M model by default), context (per-device memory and bytes sent of a "
    "training step split along its length by the ring and allgather kernels, against one "
    "device, and the causal balance), torch (training tokens/s and causal attention against "
    "PyTorch with fused SDPA, run by --python), generate (a cached decoding step at several "
    "cache fills, full forwards without a cache, and whole generations), eval (forward "
    "tokens/s of an evaluation against tokens per pass), startup (the phases of one run "
    "trained twice in new processes sharing a compilation cache), warm (attnjax generate on "
    "a run twice in new processes sharing a compilation cache, and with --python "
    "transformers generating from its export), patch (capturing named "
    "points against nothing, and 64 interventions batched against a loop) or report "
    "(docs/PERFORMANCE.md from benchmarks/results/*.json).")


def add_bench(commands) -> None:
    bench = add_command(commands, "bench", "benchmark attention kernels (memory, time), training "
                        "throughput (tokens/s, MFU), vmap vs sequential sweeps, training-step "
                        "memory or generation with and without the KV cache",
                        DESCRIPTION)
    bench.add_argument("what", choices=list(BENCHMARKS), metavar="WHAT",
                       help="what to benchmark: %(choices)s")
    bench.add_argument("overrides", nargs="*", metavar="CONFIG",
                       help="sweep, startup: the experiment (EXPERIMENT.py; startup also "
                       "takes KEY=VALUE overrides); warm: a RUN_DIR; memory, generate, eval: "
                       "the model and training config, an experiment file EXPERIMENT.py "
                       "and/or KEY=VALUE "
                       "overrides (default: the default config, a width-128, 4-layer "
                       "byte-level model); mesh: the same (default: a Llama-shaped 110M "
                       "model)")
    bench.add_argument("--steps", type=int, default=None, metavar="N",
                       help="train: timed steps per setting (default 50); sweep: steps per "
                       "run (default 300); mesh: dispatches run on each mesh after it is "
                       "measured (default 0: compiled, not run)")
    bench.add_argument("--python", default=None, metavar="PYTHON",
                       help="torch, attention: an interpreter with torch, running PyTorch in "
                       "its own process (attention: default this one if it has torch); warm: "
                       "one with torch and transformers (transformers generates from the run's "
                       "export)")
    bench.add_argument("--meshes", nargs="+", default=None, metavar="MESH",
                       help="mesh: the meshes, each AXIS=SIZE[,AXIS=SIZE] over data, fsdp, "
                       "tensor, data taking the devices left (default: fsdp=1 fsdp=2 fsdp=4 "
                       "fsdp=8 tensor=2 tensor=4 tensor=8)")
    bench.add_argument("--seeds", type=int, default=8, metavar="N",
                       help="sweep: number of seeds of the experiment (default: "
                       "%(default)s of experiments/baseline.py)")
    bench.add_argument("--launchers", nargs="+", choices=RegistryNames(LAUNCHERS),
                       default=None, metavar="LAUNCHER",
                       help="sweep: the launchers to time (default: all of %(choices)s)")
    bench.add_argument("--lengths", type=int, nargs="+", default=None, metavar="N",
                       help="attention: sequence lengths to measure (default: 1024 4096); "
                       "context: sequence lengths (default: 4096 to 65536); "
                       "generate: tokens n of the full forwards (default: 128 256 512 1024), "
                       "or with a seq2seq config the source lengths (default: 64 256 1024)")
    bench.add_argument("--fills", type=int, nargs="+", default=[16, 64, 256, 1024],
                       metavar="T", help="generate: time the cached step of token t (t - 1 "
                       "cached) at each T, with model.max_length the largest T and equal to "
                       "T (default: 16 64 256 1024)")
    bench.add_argument("--kernels", nargs="+", default=None, metavar="KERNEL",
                       choices=RegistryNames(KERNELS),
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
