"""Ops grouped by family: each op is declared once, and an elementwise op is three source files.

An elementwise op is one declaration in its family (``rnnc/ops_elementwise.py`` or
``rnnc/ops_compare.py``), one LLVM rule (``backends/llvm/scalar.py``) and one CUDA rule
(``backends/cuda/rules.py``). Everything else derives from the family's table: ``rnnc.ops``
collects the op, the NumPy backend runs its reference, ``rnnc.dsl`` makes its function with the
family's docstring, and ``rnnc`` exports it. These tests hold that: every member has its two
rules, its docstring and its function, and the ops the family added (issue 30) are named by no
other source file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rnnc
from rnnc import dsl, ops, ops_compare
from rnnc import ops_elementwise as elementwise
from rnnc.backends.cuda import rules as cuda_rules
from rnnc.backends.llvm import rules as llvm_rules
from rnnc.backends.llvm import scalar
from rnnc.backends.numpy import rules as numpy_rules

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("rnnc", "passes", "backends") for p in (ROOT / d).rglob("*.py"))
FAMILY = [pytest.param(m, id=m.op.name) for m in elementwise.FAMILY]

# The ops added to show the three-file rule, and the files they may be named in besides.
ADDED = ("floor", "round", "mod", "floor_divide", "clip", "sin", "cos", "log_sigmoid", "silu",
         "gelu", "erf", "log1p", "expm1")
RULE_FILES = {"backends/llvm/scalar.py", "backends/cuda/rules.py"}
# An operator on traced values, beyond the function: a line of rnnc.dsl.Value (a % b, a // b).
OPERATORS = {"mod": {"rnnc/dsl.py"}, "floor_divide": {"rnnc/dsl.py"}}
# Modules that hold ops: a file names an op as one of their attributes, by importing it from
# them, or by op_named("<name>").
OP_MODULES = {"ops", "ops_elementwise", "ops_compare"}


def test_every_elementwise_op_is_in_the_family_table() -> None:
    """bernoulli, elementwise as backends see it, belongs to the random family."""
    elementwise_ops = {op for op in ops.PRIMITIVES if op.kind is ops.OpKind.ELEMENTWISE}
    assert elementwise_ops - {m.op for m in elementwise.FAMILY} == {ops.bernoulli}
    assert len(elementwise.MEMBERS) == len(elementwise.FAMILY)


@pytest.mark.parametrize("member", FAMILY)
def test_member_has_its_rules_docstring_and_function(member) -> None:
    op = member.op
    assert op in scalar.SCALAR, f"{op.name}: no LLVM rule in backends/llvm/scalar.py"
    assert op in cuda_rules.RULES, f"{op.name}: no CUDA rule in backends/cuda/rules.py"
    assert numpy_rules.RULES[op] is op.ref
    assert op.doc.strip(), f"{op.name}: no docstring in its family declaration"
    if op.dsl_function:
        function = getattr(rnnc, op.name)
        assert function is dsl.FUNCTIONS[op.name] and op.name in rnnc.__all__
        assert function.__doc__ == op.doc and function.__name__ == op.name


def test_every_primitive_has_a_rule_on_every_backend() -> None:
    for op in ops.PRIMITIVES:
        assert numpy_rules.RULES[op] is op.ref, op.name
        assert op in llvm_rules.RULES, f"{op.name}: no LLVM rule"
        assert op in cuda_rules.RULES or op.kind is ops.OpKind.SCAN, f"{op.name}: no CUDA rule"


def test_every_op_is_documented_and_the_dsl_makes_exactly_its_functions() -> None:
    assert all(op.doc.strip() for op in ops.PRIMITIVES if op.dsl_function)
    public = {op.name for op in ops.PRIMITIVES if op.dsl_function}
    # einsum and reshape take a spec or a shape, not operands alone: rnnc.dsl_tensor writes them.
    assert set(dsl.FUNCTIONS) == public | {"einsum", "reshape"}


def _named_ops(path: Path) -> set[str]:
    """The op names a source file refers to: ``ops.floor``, ``elementwise.round_``,
    ``from rnnc.ops import floor`` and ``op_named("floor")``."""
    tree = ast.parse(path.read_text())
    aliases, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "rnnc":
            aliases |= {a.asname or a.name for a in node.names if a.name in OP_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in {f"rnnc.{m}" for m in OP_MODULES}:
            names |= {a.name for a in node.names}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            names.add(node.attr)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "id", getattr(node.func, "attr", None)) == "op_named"):
            names.add(node.args[0].value)
    return names


def _python_name(op: ops.Op) -> str:
    """The name the family gives the op (``round_`` for ``round``)."""
    for family in (elementwise, ops_compare):
        for name, value in vars(family).items():
            if value is op:
                return name
    raise AssertionError(op.name)


def test_an_added_op_is_named_only_by_its_family_and_its_two_rules() -> None:
    """Nothing else has a per-op line: not the NumPy backend, the CUDA prelude's assembly,
    rnnc.ops, rnnc.dsl (beyond an operator) or rnnc/__init__.py. A pass that comes to use one
    of these ops adds its file to the allowed set, as a use and not a registration."""
    named = {path: _named_ops(path) for path in SOURCES}
    for name in ADDED:
        op = ops.REGISTRY[name]
        spellings = {name, _python_name(op)}
        files = {str(p.relative_to(ROOT)) for p, found in named.items() if found & spellings}
        # The positive control: the rules name it, so the search finds names where they are.
        assert RULE_FILES <= files, f"{name}: the rule files do not name it? {sorted(files)}"
        extra = files - RULE_FILES - OPERATORS.get(name, set())
        assert not extra, f"{name} is named outside its family and its two rules: {sorted(extra)}"


def test_the_cuda_helpers_of_the_added_ops_live_with_their_rules() -> None:
    """A C helper rnnc_<name> is written next to the CUDA rule that calls it, and the renderer's
    prelude picks it up from there: no other file of the CUDA backend lists it."""
    helpers = {name for name in ADDED if f"rnnc_{name}(" in (ROOT / "backends/cuda/rules.py")
               .read_text()}
    assert {"mod", "floor_divide", "log_sigmoid", "gelu", "silu"} <= helpers
    prelude = cuda_rules.CudaRenderer("f32").prelude()
    for name in helpers:
        assert f"rnnc_{name}(" in prelude
        others = [path for p in SOURCES if f"rnnc_{name}" in p.read_text()
                  and (path := str(p.relative_to(ROOT))) != "backends/cuda/rules.py"]
        assert not others, f"rnnc_{name} is named in {others}"
