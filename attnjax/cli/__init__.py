"""Command line: ``attnjax train | eval | generate | import | export | sweep | audit |
sweep-status | report | attention | explore | heads | lens | patch | recall | compare | info |
bench``. The only package that parses argv: each module owns a group of commands, their parsers
(``add_<command>``) and handlers, and this one assembles the top-level parser
(``build_parser``) and dispatches (``main``; the program ``attnjax`` is ``entry``). Bad input
(a misspelled override, a wrong type, a missing, hostile or unwritable file) is one line on
stderr and exit status 2, raised before anything compiles: the library raises ``ValueError``
(``attnjax.userfiles`` turns a parser's errors into one) or an ``OSError``, and ``main``
prints it. Anything else is a bug in attnjax, and says so.

Handlers import what they run (training, analysis, benchmarks) inside their bodies, so that
building the parser for ``attnjax --help`` or a bad argument imports none of it
(``tests/test_cli.py`` checks; ``attnjax bench startup`` measures the start-up): that is the
only reason an import sits inside a function here.

- ``arguments``: what the parsers share (``add_command``, ``--checkpoint``, registry choices)
- ``train``: train, eval, generate
- ``pretrained``: import, export
- ``sweep``: sweep, sweep-status, report
- ``audit``: audit
- ``analysis``: attention, explore, heads, lens, patch, recall, compare
- ``info``: info
- ``bench``: bench
"""

from __future__ import annotations

import argparse
import sys
import traceback

from attnjax.allocator import keep_freed_memory
from attnjax.cli import analysis, audit, bench, info, pretrained, sweep, train

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

# the commands in the order ``attnjax --help`` lists them
COMMANDS = (train.add_train, train.add_eval, train.add_generate, pretrained.add_import,
            pretrained.add_export, sweep.add_sweep, audit.add_audit, sweep.add_sweep_status,
            sweep.add_report, analysis.add_attention, analysis.add_explore, analysis.add_heads,
            analysis.add_lens, analysis.add_patch, analysis.add_recall, analysis.add_compare,
            info.add_info, bench.add_bench)


# the commands that compile a run's programs to read it; train, sweep and audit turn on JAX's
# persistent compilation cache themselves, bench measures compilation and leaves it off
READ_RUNS = ("eval", "generate", "attention", "explore", "heads", "lens", "patch", "recall",
             "compare")


def _version() -> str:
    """The installed distribution's version, or the package's own if it is not installed."""
    from importlib import metadata
    try:
        return metadata.version("attnjax")
    except metadata.PackageNotFoundError:
        import attnjax
        return attnjax.__version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnjax", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"attnjax {_version()}",
                        help="print the attnjax version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     title="commands", help="what to do; 'attnjax COMMAND "
                                     "--help' shows its options")
    for add in COMMANDS:
        add(commands)
    return parser


def entry() -> int:
    """The ``attnjax`` program: ``main`` in a process whose allocator keeps freed memory for
    the next call (``attnjax.allocator``)."""
    keep_freed_memory()
    return main()


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
        if args.command in READ_RUNS:  # a second call on the run loads what the first compiled
            from attnjax.compilation import enable_compile_cache
            enable_compile_cache()
        return args.run(args)
    except (ValueError, OSError) as error:   # bad input, or a file it names: one line
        print(f"attnjax: error: {error_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:      # Ctrl-C, or SIGTERM where a command turns it into one
        print(f"attnjax: interrupted{f' ({stop})' if str(stop) else ''}; nothing half-written "
              "is kept: rerun the same command to go on (a run resumes from its last "
              "checkpoint)", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print("attnjax: internal error: the traceback above is a bug in attnjax, not in the "
              "input; please report it with the command that caused it", file=sys.stderr)
        return 1


def error_line(error: Exception) -> str:
    """The one line the command line prints for ``error``: its message, or for an operating
    system error without one, what failed on which path (``Permission denied: 'RUN/x'``)."""
    if isinstance(error, OSError) and error.strerror:
        paths = " -> ".join(repr(str(p)) for p in (error.filename, error.filename2)
                            if p is not None)
        message = f"{error.strerror}: {paths}" if paths else error.strerror
    else:
        message = str(error)
    return " ".join(message.split()) or type(error).__name__
