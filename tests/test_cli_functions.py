"""The command line stays readable: no function in ``attnjax/cli/`` is longer than
``MAX_LINES`` lines (decorators and docstring included), so each command's parser and handler
read on one screen."""

import ast

from helpers import REPO

MAX_LINES = 60


def function_lengths():
    """``(path:line name, lines)`` of every function and method under ``attnjax/cli/``."""
    for path in sorted((REPO / "attnjax" / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                yield (f"{path.relative_to(REPO)}:{node.lineno} {node.name}",
                       node.end_lineno - first + 1)


def test_no_cli_function_is_longer_than_a_screen():
    lengths = dict(function_lengths())
    assert len(lengths) > 20                  # the walk found the package's functions
    long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not long, f"functions over {MAX_LINES} lines: {long}"
