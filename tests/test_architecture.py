"""The shape of the code base: import layers, file and function sizes.

rnnc's core (ops, IR, names, DSL, printer, layout, ...) is imported by the passes and the
backends and imports neither; the API and the layers drive passes and backends; interop (torch,
weights) and tools (CLI, demo, bench) sit on top and nothing below imports them at module level.
Imports inside functions are not counted: they are how a lower layer offers an optional bridge
upward without loading it. No modules import each other at module level, directly or around a
loop: a helper split out of a module takes what it needs of it as a protocol.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for d in ("rnnc", "passes", "backends") for p in (ROOT / d).rglob("*.py"))

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in ("passes", "backends"):
        parts.insert(0, "rnnc")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    """0 core, 1 passes and backends, 2 API and layers, 3 interop and tools."""
    parts = module.split(".")
    if len(parts) < 2:
        return 2  # the package itself re-exports the public API
    top = parts[1]
    if top in ("interop", "tools", "torch"):  # rnnc.torch: the public face of rnnc.interop
        return 3
    if top in ("passes", "backends"):
        return 1
    if top in ("api", "check", "layers", "second_order"):
        return 2
    return 0


def top_level_imports(path: Path, module: str) -> set[str]:
    """rnnc modules imported by statements that run when the module is imported."""
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("rnnc"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.startswith("rnnc"):
                    out.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, getattr(node, "orelse", []),
                              *[h.body for h in getattr(node, "handlers", [])],
                              getattr(node, "finalbody", [])):
                    visit(block)

    visit(tree.body)
    return out


def _violations_of_layers() -> list[str]:
    bad = []
    for path in SOURCES:
        mod = module_name(path)
        if mod == "rnnc":
            continue
        for imported in sorted(top_level_imports(path, mod)):
            # "rnnc.api.compile" names a module or an object in one; judge by the module part.
            if layer(imported) > layer(mod):
                bad.append(f"{mod} (layer {layer(mod)}) imports {imported} "
                           f"(layer {layer(imported)}) at module level")
    return bad


def test_lower_layers_never_import_higher_ones():
    assert _violations_of_layers() == []


def test_files_are_short():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in SOURCES
            if (n := len(p.read_text().splitlines())) >= MAX_FILE_LINES]
    assert long == []


def test_functions_are_short():
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n >= MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert long == []


def import_graph() -> nx.DiGraph:
    """Module -> module edges of the imports that run (or are typed) at module level.

    ``from rnnc.api import compile`` names an object: the edge goes to the longest prefix that is
    a module. Imports under ``if TYPE_CHECKING:`` count too: a cycle of types is still two modules
    that each need the other to be understood."""
    modules = {module_name(p): p for p in SOURCES}
    graph = nx.DiGraph()
    for mod, path in modules.items():
        graph.add_node(mod)
        for imported in top_level_imports(path, mod):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != mod:
                graph.add_edge(mod, target)
    return graph


def test_no_module_level_import_cycles():
    cycles = sorted(" -> ".join(c + c[:1]) for c in nx.simple_cycles(import_graph()))
    assert cycles == [], "module-level import cycles:\n" + "\n".join(cycles)


def test_import_graph_sees_a_cycle():
    """The cycle check can fail: the graph has module-level edges, typed ones included, and no
    edge of an import inside a function."""
    graph = import_graph()
    assert graph.has_edge("rnnc.ops", "rnnc.op_types")
    assert graph.has_edge("rnnc.tools.bench.peers", "rnnc.tools.bench.configs")  # TYPE_CHECKING
    assert not graph.has_edge("rnnc.layout", "rnnc.validate")  # inside device_params
    graph.add_edge("rnnc.op_types", "rnnc.ops")
    assert nx.find_cycle(graph, "rnnc.ops")


@pytest.mark.parametrize("module,expected", [("rnnc.ops", 0), ("rnnc.passes.autodiff", 1),
                                             ("rnnc.backends.llvm.runtime", 1), ("rnnc.api", 2),
                                             ("rnnc.interop.torch", 3), ("rnnc.tools.cli", 3)])
def test_layer_table(module, expected):
    assert layer(module) == expected


# Modules that use a compiled Function from outside rnnc.api: only through its public hooks.
FUNCTION_CLIENTS = ("rnnc/second_order.py", "rnnc/check.py")


def private_attributes(text: str) -> list[str]:
    """``value._name`` reads in ``text`` (dunders aside): a reach past a public interface."""
    return sorted({f"{node.lineno}: .{node.attr}" for node in ast.walk(ast.parse(text))
                   if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                   and not node.attr.startswith("__")})


def test_function_clients_use_only_public_hooks():
    assert private_attributes("fn._runner('forward')") == ["1: ._runner"]  # the check can fail
    reaches = {path: private_attributes((ROOT / path).read_text()) for path in FUNCTION_CLIENTS}
    assert reaches == {path: [] for path in FUNCTION_CLIENTS}
