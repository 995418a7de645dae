"""The package's layers, as docs/design.md draws them: each module imports only its own
layer and the ones below, and no modules import each other in a cycle."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxrunner"

# Bottom up. A module belongs to the layer of the longest prefix that names it.
LAYERS: list[tuple[str, ...]] = [
    (
        "jaxrunner.errors",
        "jaxrunner._src",
        "jaxrunner._src.cpu_dispatch",
        "jaxrunner._src.space_arrays",
        "jaxrunner._src.core",
        "jaxrunner.models",
    ),
    ("jaxrunner._src.connectors", "jaxrunner._src.backends"),
    ("jaxrunner._src.samplers",),
    ("jaxrunner._src.checkpoints",),
    ("jaxrunner._src.runner",),
    ("jaxrunner._src.services", "jaxrunner._src.testing"),
    ("jaxrunner", "jaxrunner._src.bench", "jaxrunner._src.cli"),
]


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), i
    return layer


def imports_of(module: str) -> dict[str, int]:
    """The package's modules ``module`` imports (lazy and TYPE_CHECKING ones too), with a
    line number for each."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            # `from pkg import submodule` imports the submodule, not the package's names.
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.setdefault(name, node.lineno)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) < 0] == []


def test_imports_go_down_the_layers():
    upward = [
        f"{m}:{line} imports {target} (layer {layer_of(target)} above {layer_of(m)})"
        for m, targets in sorted(GRAPH.items())
        for target, line in sorted(targets.items())
        if layer_of(target) > layer_of(m)
        # A package's __init__ re-exporting from its own modules is not an upward import.
        and not target.startswith(m + ".")
    ]
    assert upward == []


def test_no_import_cycles():
    """Tarjan's strongly connected components; a package and its own children re-exporting
    each other is not a cycle of design."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 and not any(
                all(x == c or x.startswith(c + ".") for x in component) for c in component
            ):
                cycles.append(sorted(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    assert cycles == []


@pytest.mark.parametrize("module", ["jaxrunner._src.core", "jaxrunner._src.backends"])
def test_the_check_sees_imports(module):
    """The graph is not empty where imports exist (the checks above could not fail
    otherwise)."""
    assert any(GRAPH[m] for m in MODULES if m.startswith(module + "."))
