"""Every Python block of README.md and docs/*.md runs as a reader would paste it, so a moved or
renamed name cannot break the documentation unseen. A block runs whole, in a fresh namespace,
unless the line before its fence is an HTML comment ``<!-- fragment: ... -->`` saying what it
leaves undefined: a fragment is compiled and its import statements are run."""

from __future__ import annotations

import ast
import re

import pytest

from helpers import REPO

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^(<!-- fragment:[^\n]*-->\n)?```python\n(.*?)^```", re.M | re.S)


def python_blocks() -> list[tuple[str, bool, str]]:
    """``(file:line, is a fragment, code)`` of every Python block of the documents."""
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start(2)) + 1
            found.append((f"{path.relative_to(REPO)}:{line}", bool(match[1]), match[2]))
    return found


BLOCKS = python_blocks()


def test_the_documents_have_python_blocks_and_say_which_are_fragments():
    assert {where.split(":")[0] for where, _, _ in BLOCKS} >= {"README.md"}
    assert [fragment for _, fragment, _ in BLOCKS].count(False) >= 1


@pytest.mark.parametrize("where, fragment, code", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_a_documented_python_block_runs(where, fragment, code):
    program = compile(code, where, "exec")
    if fragment:
        imports = [s for s in ast.parse(code).body if isinstance(s, ast.Import | ast.ImportFrom)]
        program = compile(ast.Module(body=imports, type_ignores=[]), where, "exec")
    exec(program, {"__name__": "documented"})
