"""The naming protocol: one constructor per kind of compiler-made name, one parser for all.

The names are part of rnnc's interface (listings, golden files, the environment a backward
program reads), so their text is pinned here; the parser inverts every constructor, and the
rest of the compiler builds such names only through ``rnnc.names``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rnnc
from rnnc import names
from rnnc.names import Name, Role

ROOT = Path(__file__).resolve().parents[2]

MADE = [
    (names.final_state("h"), "h.final", Role.FINAL, "h"),
    (names.cotangent("y"), "d.y", Role.COTANGENT, "y"),
    (names.cotangent(names.final_state("h")), "d.h.final", Role.COTANGENT, "h.final"),
    (names.gradient("W"), "grad.W", Role.GRADIENT, "W"),
    (names.gradient(names.cotangent("y")), "grad.d.y", Role.GRADIENT, "d.y"),
    (names.cotangent(names.gradient("W")), "d.grad.W", Role.COTANGENT, "grad.W"),
    (names.cotangent(names.saved(3)), "d.save.3", Role.COTANGENT, "save.3"),
    (names.saved(0), "save.0", Role.SAVED, "0"),
    (names.saved(12), "save.12", Role.SAVED, "12"),
    (names.hoisted(1), "hoist.1", Role.HOISTED, "1"),
    (names.sunk(0), "sink.0", Role.SUNK, "0"),
    (names.packed(["W_i", "W_f"]), "W_i|W_f", Role.PACKED, "W_i|W_f"),
    (names.MASK, "len.mask", Role.MASK, "len.mask"),
]


@pytest.mark.parametrize("made, text, role, base", MADE, ids=[m[1] for m in MADE])
def test_constructors_make_the_documented_text_and_parse_back(made, text, role, base) -> None:
    assert made == text
    assert names.parse(made) == Name(role, base)
    assert names.role_of(made) is role


@pytest.mark.parametrize("user", ["x", "h", "W_ih", "final", "save", "d", "grad_W", "mask"])
def test_user_names_have_no_role(user: str) -> None:
    assert names.parse(user) is None
    assert names.role_of(user) is None


def test_region_names() -> None:
    assert [names.region_input(k) for k in range(2)] == ["in0", "in1"]
    assert names.region_output(3) == "out3"


def test_roles_are_the_strings_programs_hold() -> None:
    assert Role.INPUT == "input" and str(Role.COTANGENT) == "cotangent"
    program = rnnc.cells.lstm(2, 3).program()
    assert {role for role, _ in program.args.values()} == {Role.INPUT, Role.STATE, Role.PARAM}
    assert program.results == ("y", "h.final", "c.final")


def test_saved_indices_and_fresh_names() -> None:
    taken = {"save.0", "save.4", "d.save.9", "grad.save.7", "x", "save.x"}
    assert names.next_saved(taken) == 5
    assert names.next_saved({"x"}) == 0
    assert names.is_saved("save.4") and not names.is_saved("d.save.4")
    assert not names.is_saved("save.x")
    pool = {"hoist.0", "hoist.2"}
    given = names.fresh(pool, names.hoisted)  # one stream of names: each taken as it is given
    assert next(given) == "hoist.1"
    assert next(given) == "hoist.3"
    assert pool == {"hoist.0", "hoist.1", "hoist.2", "hoist.3"}
    pool.add("hoist.4")  # taken meanwhile by someone else: skipped
    assert next(given) == "hoist.5"


def _by_hand(text: str) -> bool:
    """Whether a string literal (or the start of an f-string) spells a compiler-made name."""
    return (text.startswith(("save.", "d.", "grad.", "hoist.", "sink."))
            or text in ("hoist", "sink", ".final", names.MASK))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            out.add(id(node.body[0].value))
    return out


@pytest.mark.parametrize("folder", ["rnnc", "passes"])
def test_names_are_made_only_in_rnnc_names(folder: str) -> None:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if path == ROOT / "rnnc" / "names.py":
            continue
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "join" and isinstance(node.func.value, ast.Constant) \
                    and node.func.value.value == "|":  # a packed block's name
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: '|'.join")
            if isinstance(node, ast.JoinedStr) and node.values:
                node = node.values[0]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in skip and _by_hand(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []
