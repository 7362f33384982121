"""Tests force a backend's path with a Schedule, never by monkeypatching a backend constant.

How a program runs is a :class:`rnnc.backends.schedule.Schedule` value that a test constructs
and passes (``schedule=``). A test that instead rebinds an upper-case name of a module under
``rnnc.backends`` (``monkeypatch.setattr(runtime, "TEAM_MIN_WORK", 0)``) tests a path no user
can ask for, and breaks silently when the constant moves. Environment variables, fault
injection and stand-ins for timers or libraries (lower-case names) are not schedule choices.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Upper-case names a test may still rebind, and why they are not a choice of how to run.
ALLOWED = {
    ("rnnc.backends.cuda.plan", "MAX_PLANS"): "the bound of a runner's plan cache",
    ("rnnc.backends.llvm.isolated", "AVAILABLE"): "fakes a platform without fork",
    ("rnnc.backends.cuda.emulate", "CXX_FLAGS"): "the emulator's compiler input, keyed",
    ("rnnc.backends.cuda.emulate", "SHIM_PATH"): "the emulator's compiler input, keyed",
}


def _backend_modules(tree: ast.AST) -> dict[str, str]:
    """Names bound to modules of rnnc.backends by any import in ``tree``, to the module."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rnnc.backends"):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("rnnc.backends") and alias.asname:
                    bound[alias.asname] = alias.name
    return bound


def forced_constants(source: str, where: str = "<test>") -> list[str]:
    """Each ``*.setattr`` in ``source`` that rebinds a public upper-case name of a backend
    module and is not in :data:`ALLOWED`, as ``where:line module.NAME``."""
    tree = ast.parse(source)
    modules = _backend_modules(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr" and node.args):
            continue
        target, name = node.args[0], node.args[1] if len(node.args) > 1 else None
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            module, _, name_text = target.value.rpartition(".")  # "pkg.module.NAME" form
        elif isinstance(target, ast.Name) and target.id in modules:
            module = modules[target.id]
            name_text = name.value if isinstance(name, ast.Constant) else None
        else:
            continue
        if not module.startswith("rnnc.backends"):
            continue
        if not isinstance(name_text, str):  # a name computed at run time: cannot be cleared
            found.append((node.lineno, f"{where}:{node.lineno} {module}.<computed name>"))
        elif name_text.isupper() and not name_text.startswith("_") \
                and (module, name_text) not in ALLOWED:  # "_CACHE": private state, reset
            found.append((node.lineno, f"{where}:{node.lineno} {module}.{name_text}"))
    return [hit for _, hit in sorted(found)]


def test_no_test_monkeypatches_a_backend_constant() -> None:
    found = [hit for path in sorted((ROOT / "tests").rglob("test_*.py"))
             for hit in forced_constants(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], ("force a path with a Schedule (rnnc.backends.schedule), not by "
                         "rebinding a backend constant:\n" + "\n".join(found))


def test_the_scan_finds_every_form() -> None:
    """The check can fail: module objects, aliases, local imports, dotted strings and
    computed names are found; lower-case stand-ins, the environment and ALLOWED are not."""
    source = '''
from rnnc.backends.llvm import runtime
from rnnc.backends.cuda import scan as scan_module, plan as plan_module

def test_a(monkeypatch):
    monkeypatch.setattr(runtime, "TEAM_MIN_WORK", 0)
    monkeypatch.setattr(scan_module, "CHUNKED_MIN_STEPS", 1)
    monkeypatch.setattr("rnnc.backends.llvm.gemm.ONE_CORE_MAX_WORK", 0)
    for name in ("A", "B"):
        monkeypatch.setattr(runtime, name, 0)

def test_b(mp):
    from rnnc.backends.cuda import cooperative
    mp.setattr(cooperative, "MAX_COOPERATIVE_BLOCKS", 1)
    mp.setattr(runtime, "_time_gemm", None)
    mp.setattr(runtime, "_CHOICES", {})
    mp.setattr(plan_module, "MAX_PLANS", 3)
    mp.setenv("RNNC_TEAM", "0")
'''
    assert [hit.split(" ", 1)[1] for hit in forced_constants(source)] == [
        "rnnc.backends.llvm.runtime.TEAM_MIN_WORK",
        "rnnc.backends.cuda.scan.CHUNKED_MIN_STEPS",
        "rnnc.backends.llvm.gemm.ONE_CORE_MAX_WORK",
        "rnnc.backends.llvm.runtime.<computed name>",
        "rnnc.backends.cuda.cooperative.MAX_COOPERATIVE_BLOCKS",
    ]
