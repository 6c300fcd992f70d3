"""``attnjax info``: the registered kernels and position encodings, and the kernels' parity
with a float64 NumPy oracle (``attnjax.parity``)."""

from __future__ import annotations

from attnjax.cli.arguments import add_command
from attnjax.config.mesh import MeshConfig
from attnjax.registry import KERNELS, MODELS, POSITIONS


def family_support() -> list[tuple[str, str]]:
    """Per family: its attention, whether it decodes, and the kernels and position encodings
    its config accepts (a kernel also on padded batches or not)."""
    from attnjax.config import AttentionConfig, ModelConfig, PositionConfig
    from attnjax.config.kernel import kernel_request
    from attnjax.models import family

    def accepts(name: str, padded: bool = False, **parts) -> bool:
        try:
            kernel_request(ModelConfig(family=name, **parts), padded=padded)
        except ValueError:
            return False
        return True

    rows = []
    for name in MODELS.names():
        base = ModelConfig(family=name)
        kernels = [k + ("" if accepts(name, True, attention=AttentionConfig(kernel=k))
                        else " (unpadded only)")
                   for k in KERNELS.names() if accepts(name, attention=AttentionConfig(kernel=k))]
        positions = [p for p in POSITIONS.names()
                     if accepts(name, position=PositionConfig(kind=p))]
        rows.append((name, f"{'causal' if base.causal else 'bidirectional'}, "
                     f"{'decodes' if family(base).decodes else 'does not decode'}; kernels: "
                     f"{', '.join(kernels)}; positions: {', '.join(positions)}"))
    return rows


def _info(args) -> int:
    import jax

    from attnjax.parity import parity_table

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
    print("\nModel families (model.family):")
    for name, line in family_support():
        print(f"  {name:<11} {line}")
    print("\nSharding rules (train.mesh.rules first, then these, applied in order: each gives "
          "its mesh axes to a dimension of its logical axis if they are free and divide it):")
    for logical, target in MeshConfig().table():
        print(f"  {logical:<13} -> {target}")
    if args.config:
        from attnjax.experiment import config_from_arguments
        from attnjax.sharding import layout_lines
        print()
        print("\n".join(layout_lines(config_from_arguments(args.config),
                                     args.devices or jax.device_count())))
    print("\nParity vs a float64 NumPy oracle (outputs and d/dq,k,v; max abs / max rel):")
    header = (f"  {'kernel':<10} {'setting':<12} {'out abs':>9} {'out rel':>9} "
              f"{'grad abs':>9} {'grad rel':>9}")
    print(header)
    for row in parity_table(with_grads=not args.no_grads):
        grads = (f"{row['grad_abs']:9.1e} {row['grad_rel']:9.1e}" if "grad_abs" in row else "")
        print(f"  {row['kernel']:<10} {row['setting']:<12} {row['out_abs']:9.1e} "
              f"{row['out_rel']:9.1e} {grads}", flush=True)
    return 0


def add_info(commands) -> None:
    info = add_command(commands, "info", "list the registered attention kernels and position "
                       "encodings, with a parity table of the kernels", "Show the JAX backend, "
                       "every registered attention kernel and position encoding, and each "
                       "kernel's error against a float64 NumPy oracle (outputs and gradients).")
    info.add_argument("config", nargs="*", metavar="CONFIG",
                      help="an experiment file EXPERIMENT.py and/or KEY=VALUE overrides: show "
                      "the mesh it trains on and where each parameter lives on it")
    info.add_argument("--devices", type=int, default=None, metavar="N",
                      help="with CONFIG: lay it out for N devices (default: this machine's)")
    info.add_argument("--no-grads", action="store_true",
                      help="check the parity of outputs only, not of gradients (faster)")
    info.set_defaults(run=_info)
