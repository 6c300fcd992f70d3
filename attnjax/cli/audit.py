"""``attnjax audit``: the claims audit (``attnjax.audit``)."""

from __future__ import annotations

from attnjax.cli.arguments import RegistryNames, add_command
from attnjax.registry import LAUNCHERS


def _audit(args) -> int:
    from attnjax.audit.runner import run_audit
    from attnjax.compilation import enable_compile_cache
    from attnjax.outputs import output_directory, output_file
    output_directory(args.workdir, "--workdir", create=False)    # before hours of training
    if args.publish is not None:
        output_file(args.publish, "--publish")
    enable_compile_cache()
    only = [i.strip() for i in args.only.split(",") if i.strip()] if args.only else None
    result = run_audit(args.claims, args.workdir, only=only, launcher=args.launcher,
                       jobs=args.jobs, progress=not args.no_progress, publish_to=args.publish)
    return 1 if result["errors"] else 0


def add_audit(commands) -> None:
    audit = add_command(commands, "audit", "the claims audit: train each claim's runs once, "
                        "judge every claim, write AUDIT.md (rerun to resume)", "Load the claim "
                        "files CLAIMS_DIR/<group>/<ID>.py, train every run they need once "
                        "(shared runs once) into --workdir/runs, measure each claim, apply its "
                        "criterion and write --workdir/AUDIT.md. Rerunning skips finished runs "
                        "and measurements; a claim whose measurement fails is reported and the "
                        "command exits 1.")
    audit.add_argument("claims", metavar="CLAIMS_DIR", help="directory of claim files, e.g. "
                       "experiments/claims")
    audit.add_argument("--workdir", required=True, metavar="DIR",
                       help="audit directory: runs/, results/, plots/ and AUDIT.md")
    audit.add_argument("--only", default=None, metavar="ID,ID",
                       help="only these claims, e.g. PE4,MK2")
    audit.add_argument("--launcher", choices=RegistryNames(LAUNCHERS),
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
