"""The package's import graph, read with `ast`: every import runs downward through the layers,
and no import circle crosses a package boundary.

Every import counts, also those inside functions and `TYPE_CHECKING` blocks: a deferred import
is still a dependency. The root package `einjit` (whose `__getattr__` serves names from every
layer) and `python -m einjit` sit in the top layer with the demos, as do the old names of the
modules that moved (`einjit.train` is `einjit.training.train`).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("einjit", "__main__", "demos", "train", "fit", "data", "checkpoint", "datasets"),
    ("training", "nn", "models", "export"),
    ("tensor", "atl"),
    ("backends",),
    ("shape",),
    ("ir",),
    ("memory", "config", "errors"),
)
"""Top to bottom; a module may import its own layer's packages and every layer below."""

RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "einjit").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def package_of(module: str) -> str:
    """The layer package of an einjit module: `einjit.ir.passes.tracing` -> `ir`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "einjit"


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The einjit modules `module` imports (`from pkg import sub` names the submodule)."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "einjit"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "einjit":
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & known.keys()
            out |= subs or {target}
            if len(subs) < len(node.names):
                out.add(target)
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) - {m} for m, p in known.items()}


def test_every_package_has_a_layer():
    assert {package_of(m) for m in modules()} <= RANK.keys()


def test_imports_run_downward():
    upward = sorted(f"{m} ({package_of(m)}) imports {t} ({package_of(t)})"
                    for m, targets in graph().items() for t in targets
                    if RANK[package_of(t)] < RANK[package_of(m)])
    assert upward == []


def strongly_connected(g: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of `g` with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_crosses_a_package():
    crossing = [sorted(c) for c in strongly_connected(graph()) if len({package_of(m) for m in c}) > 1]
    assert crossing == []


def test_the_checks_see_an_upward_import():
    """The graph reader finds the imports it must judge: `backends/interface.py` imports the
    optimizer (downward) and `nn` sits above `tensor`."""
    g = graph()
    assert "einjit.ir.optimize" in g["einjit.backends.interface"]
    assert RANK["nn"] < RANK["tensor"] and any(package_of(t) == "tensor" for t in g["einjit.nn.layers"])
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": set()}) == [{"a", "b"}]
