"""The package's imports point one way: each module imports only from its own layer and the
layers below it, in the order docs/ARCHITECTURE.md draws (its ``layers`` block is the one
place that order is written), and no two modules import each other, directly or around a
circle, counting the imports inside functions too (none may dodge a cycle)."""

from __future__ import annotations

import ast
import re

import pytest

from helpers import REPO

PACKAGE = REPO / "attnjax"


def layer_order() -> list[set[str]]:
    """The ``layers`` block of docs/ARCHITECTURE.md, bottom layer first: each line names the
    top-level modules and packages of ``attnjax`` in one layer."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"```text\nlayers, top to bottom.*?\n(.*?)```", text, re.S)
    assert block, "docs/ARCHITECTURE.md has no ```text block starting 'layers, top to bottom'"
    return [set(line.split()) for line in reversed(block.group(1).splitlines()) if line.strip()]


def module_name(path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> list[tuple[str, int]]:
    """``(imported attnjax module, line)`` for every import in module ``name``, at any depth
    (inside functions too); ``from package import module`` counts as the module."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES and target != name and target.startswith("attnjax."):
                found.append((target, node.lineno))
    return found


def unit(name: str) -> str:
    """The top-level module or package of ``attnjax`` that module ``name`` belongs to."""
    return name.split(".")[1]


def test_the_layer_order_names_every_top_level_module_once():
    layers = layer_order()
    named = [u for layer in layers for u in layer]
    assert len(named) == len(set(named)), f"named twice: {named}"
    units = {unit(name) for name in MODULES if name != "attnjax"}
    assert set(named) == units, (f"missing from the layers: {sorted(units - set(named))}; "
                                 f"not in attnjax/: {sorted(set(named) - units)}")


def test_no_import_points_up_a_layer():
    rank = {u: i for i, layer in enumerate(layer_order()) for u in layer}
    upward = [f"{MODULES[name].relative_to(REPO)}:{line} imports {target}"
              for name in MODULES if name != "attnjax"
              for target, line in imports(name)
              if rank[unit(target)] > rank[unit(name)]]
    assert not upward, "imports that point up a layer:\n" + "\n".join(upward)


def circles() -> list[list[str]]:
    """The module import cycles (strongly connected components of more than one module);
    a package's ``__init__`` re-exporting its own modules is not an edge back."""
    graph = {name: {t for t, _ in imports(name) if not t.startswith(name + ".")}
             for name in MODULES}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                found.append(sorted(component + [v]))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def test_no_import_circles():
    assert circles() == []


@pytest.mark.parametrize("source, expected", [
    ("from attnjax.config import Config\n", {"attnjax.config"}),
    ("def f():\n    from attnjax.train import loop\n", {"attnjax.train.loop"}),
    ("from . import fields\n", {"attnjax.config.fields"}),
])
def test_imports_are_read_at_any_depth(tmp_path, monkeypatch, source, expected):
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "attnjax.config.probe", path)
    assert {t for t, _ in imports("attnjax.config.probe")} == expected
