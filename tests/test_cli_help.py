"""The command line's help is a contract: ``attnjax --help`` and every command's ``--help``
read exactly as ``tests/data/cli_help.txt`` records, at a fixed width of ``COLUMNS`` columns
(argparse wraps to the terminal's width).

To regenerate the file after changing a help text on purpose:
``.venv/bin/python tests/test_cli_help.py > tests/data/cli_help.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys

from helpers import REPO

GOLDEN = REPO / "tests" / "data" / "cli_help.txt"
COLUMNS = 100


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def help_text(parser: argparse.ArgumentParser) -> str:
    """``parser``'s help, then each command's under a ``==== attnjax COMMAND --help`` line, in
    the order the commands were added, formatted ``COLUMNS`` columns wide."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)
    try:
        parts = [f"==== {parser.prog} --help\n", parser.format_help()]
        for name, sub in subcommands(parser).items():
            parts += [f"\n==== {parser.prog} {name} --help\n", sub.format_help()]
    finally:
        if saved is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = saved
    return "".join(parts)


def test_every_help_text_reads_as_recorded():
    from attnjax.cli import build_parser
    assert help_text(build_parser()) == GOLDEN.read_text()


if __name__ == "__main__":
    from attnjax.cli import build_parser
    sys.stdout.write(help_text(build_parser()))
