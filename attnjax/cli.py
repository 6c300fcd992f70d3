"""Command line: ``attnjax info | bench``. The only module that parses argv."""

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


def _bench(args) -> int:
    from attnjax import bench
    bench.run(lengths=args.lengths, kernels=args.kernels, out=args.out, batch=args.batch,
              heads=args.heads, head_dim=args.head_dim)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnjax", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="registered kernels and position encodings, "
                               "and a parity table of the kernels")
    info.add_argument("--no-grads", action="store_true", help="parity of outputs only")
    info.set_defaults(run=_info)
    bench = commands.add_parser("bench", help="memory and time of the attention kernels")
    bench.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    bench.add_argument("--kernels", nargs="+", default=None)
    bench.add_argument("--batch", type=int, default=1)
    bench.add_argument("--heads", type=int, default=4)
    bench.add_argument("--head-dim", type=int, default=32)
    bench.add_argument("--out", default=None, help="write the rows as JSON here")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ValueError as error:  # bad input: one line, no traceback
        print(f"attnjax: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
