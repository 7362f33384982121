"""Recognizers of the stress patterns in a cell spec, so a test can count what the fuzzer draws.

Each recognizer looks at the live part of a spec (what reaches an update or an output), so a
pattern the generator drew but left dead does not count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from tests.fuzz.spec import CellSpec, Expr, prune, walk


def sum_terms(e: Expr) -> list[Expr]:
    """The terms of a chain of ``+`` and ``-`` (``a + b - c`` -> ``[a, b, c]``)."""
    if e.op in ("add", "sub"):
        return sum_terms(e.args[0]) + sum_terms(e.args[1])
    return [e]


def _chains(spec: CellSpec) -> list[list[Expr]]:
    """The terms of every maximal sum chain."""
    out, inner = [], set()
    for e in spec.exprs():
        if e.op in ("add", "sub") and id(e) not in inner:
            out.append(sum_terms(e))
            inner.update(id(n) for n in walk(e) if n.op in ("add", "sub"))
    return out


def _repeated(chain: list[Expr], want: Callable[[Expr], bool]) -> bool:
    counts = Counter(t for t in chain if want(t))
    return any(c >= 2 for c in counts.values())


def _lets(spec: CellSpec) -> dict[str, Expr]:
    return dict(spec.lets)


def _resolve(spec: CellSpec, e: Expr) -> Expr:
    """Follow references to temporaries."""
    lets = _lets(spec)
    while e.op == "var" and e.attr[0] in lets:
        e = lets[e.attr[0]]
    return e


def _references(spec: CellSpec) -> Counter:
    """How many places refer to each name."""
    return Counter(e.attr[0] for e in spec.exprs() if e.op == "var")


def _param_only(spec: CellSpec, e: Expr) -> bool:
    params = {n for n, _ in spec.params}
    names = [n.attr[0] for n in walk(e) if n.op == "var"]
    return e.op not in ("var", "const") and bool(names) and all(n in params for n in names)


PATTERNS: dict[str, Callable[[CellSpec], bool]] = {
    "bias added twice": lambda s: any(
        _repeated(c, lambda t: t.op == "var" and t.attr[0] in dict(s.params)) for c in _chains(s)),
    "same matmul twice in a sum": lambda s: any(
        _repeated(c, lambda t: t.op == "matmul") for c in _chains(s)),
    "sum of 5+ terms": lambda s: any(len(c) >= 5 for c in _chains(s)),
    "matmuls sharing a left operand": lambda s: any(
        n >= 2 for n in Counter(e.args[0] for e in set(s.exprs()) if e.op == "matmul").values()),
    "parameter used twice": lambda s: any(
        _references(s)[p] >= 2 for p, _ in s.params),
    "temporary shared by two uses": lambda s: any(
        _references(s)[t] >= 2 for t, _ in s.lets),
    "slice of a concatenation": lambda s: any(
        e.op == "slice" and _resolve(s, e.args[0]).op == "concat" for e in s.exprs()),
    "slices of one matmul (gate split)": lambda s: any(
        e.op == "slice" and any(n.op == "matmul" for n in walk(_resolve(s, e.args[0])))
        for e in s.exprs()),
    "matmul of a concatenation": lambda s: any(
        e.op == "matmul" and _resolve(s, e.args[0]).op == "concat" for e in s.exprs()),
    "matmul of an expression": lambda s: any(
        e.op == "matmul" and e.args[0].op not in ("var", "concat") for e in s.exprs()),
    "mean or sum": lambda s: any(e.op in ("mean", "sum") for e in s.exprs()),
    "layer_norm": lambda s: any(e.op == "layer_norm" for e in s.exprs()),
    "where": lambda s: any(e.op == "where" for e in s.exprs()),
    "constant on the left": lambda s: any(
        e.op in ("sub", "mul", "div") and e.args[0].op == "const" for e in s.exprs()),
    "constant on the right": lambda s: any(
        e.op in ("add", "sub", "mul", "div") and e.args[1].op == "const" for e in s.exprs()),
    "1 - (1 - v)": lambda s: any(
        e.op == "sub" and e.args[0].op == "const" and e.args[1].op == "sub"
        and e.args[1].args[0].op == "const" for e in s.exprs()),
    "negation": lambda s: any(e.op == "neg" for e in s.exprs()),
    "division": lambda s: any(e.op == "div" and e.args[1].op != "const" for e in s.exprs()),
    "exp, log, sqrt or rsqrt": lambda s: any(
        e.op in ("exp", "log", "sqrt", "rsqrt") for e in s.exprs()),
    "parameter-only expression": lambda s: any(_param_only(s, e) for e in s.exprs()),
    "two or more states": lambda s: len(s.states) >= 2,
    "three states": lambda s: len(s.states) >= 3,
    "two or more inputs": lambda s: len(s.inputs) >= 2,
    "output that is not a new state": lambda s: any(
        e not in {u for _, u in s.updates} for _, e in s.outputs),
    "two or more outputs": lambda s: len(s.outputs) >= 2,
    "state kept or swapped": lambda s: any(
        e.op == "var" and e.attr[0] in dict(s.states) for _, e in s.updates),
    "state wide enough for the LLVM small-batch GEMM": lambda s: any(
        w >= 16 for _, w in s.states),
}


def patterns(spec: CellSpec) -> set[str]:
    """The names of the patterns the live part of ``spec`` contains."""
    live = prune(spec)
    return {name for name, test in PATTERNS.items() if test(live)}
