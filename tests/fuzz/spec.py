"""Cell specs: random cells as data that prints as Python source and builds as an rnnc.Cell.

A :class:`CellSpec` is a list of named temporaries (``let``s) whose values are expression
trees (:class:`Expr`) over the cell's inputs, states, parameters and earlier temporaries, plus
the state updates and the outputs. ``source(spec)`` writes it as the Python a user would type
(``rnnc.tanh(x0 @ W0 + b1 + b1)``) and ``build(spec)`` makes the ``rnnc.Cell`` by running
exactly that source, so a printed reproducer is the cell that was tested. ``prune`` drops what
no update or output reaches; ``bundle`` puts independent cells side by side in one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

import rnnc

BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "matmul": "@"}
# Python precedence of the rendered forms (higher binds tighter).
_PRECEDENCE = {"add": 1, "sub": 1, "mul": 2, "div": 2, "matmul": 2, "neg": 3}


@dataclass(frozen=True)
class Expr:
    """A node of an expression: an op name, operand expressions and fixed attributes."""

    op: str
    args: tuple[Expr, ...] = ()
    attr: tuple = ()

    def __add__(self, o: Expr) -> Expr: return Expr("add", (self, _lift(o)))
    def __radd__(self, o: float) -> Expr: return Expr("add", (_lift(o), self))
    def __sub__(self, o: Expr) -> Expr: return Expr("sub", (self, _lift(o)))
    def __rsub__(self, o: float) -> Expr: return Expr("sub", (_lift(o), self))
    def __mul__(self, o: Expr) -> Expr: return Expr("mul", (self, _lift(o)))
    def __rmul__(self, o: float) -> Expr: return Expr("mul", (_lift(o), self))
    def __truediv__(self, o: Expr) -> Expr: return Expr("div", (self, _lift(o)))
    def __rtruediv__(self, o: float) -> Expr: return Expr("div", (_lift(o), self))
    def __neg__(self) -> Expr: return Expr("neg", (self,))
    def __matmul__(self, o: Expr) -> Expr: return Expr("matmul", (self, o))


def var(name: str) -> Expr:
    """A reference to an input, state, parameter or earlier temporary."""
    return Expr("var", (), (name,))


def const(value: float) -> Expr:
    return Expr("const", (), (float(value),))


def _lift(v: Expr | float) -> Expr:
    return v if isinstance(v, Expr) else const(v)


def fn(name: str, *args: Expr, attr: tuple = ()) -> Expr:
    """``rnnc.<name>(*args)``: a function of the DSL (``tanh``, ``where``, ``concat``,
    ``mean``, ``layer_norm``, ...)."""
    return Expr(name, tuple(args), attr)


def slice_(e: Expr, start: int, stop: int) -> Expr:
    return Expr("slice", (e,), (start, stop))


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of ``e``, parents first."""
    yield e
    for a in e.args:
        yield from walk(a)


@dataclass(frozen=True)
class CellSpec:
    """A whole cell: declarations, temporaries, state updates and outputs, in order."""

    inputs: tuple[tuple[str, int], ...]
    states: tuple[tuple[str, int], ...]
    params: tuple[tuple[str, tuple[int, ...]], ...]
    lets: tuple[tuple[str, Expr], ...]
    updates: tuple[tuple[str, Expr], ...]
    outputs: tuple[tuple[str, Expr], ...]
    name: str = "fuzz"

    def exprs(self) -> Iterator[Expr]:
        for _, e in self.lets + self.updates + self.outputs:
            yield from walk(e)

    def size(self) -> int:
        """Expression nodes that reach an update or output (what a shrinker minimizes)."""
        live = prune(self)
        return sum(1 for e in live.exprs() if e.op != "var") + len(live.states) + \
            len(live.outputs) + len(live.inputs)


# ---------------------------------------------------------------- rendering and building


def render(e: Expr, parent: int = 0, right: bool = False) -> str:
    """``e`` as Python, parenthesized only where precedence needs it."""
    if e.op == "var":
        return e.attr[0]
    if e.op == "const":
        return repr(e.attr[0]) if e.attr[0] >= 0 or parent == 0 else f"({e.attr[0]!r})"
    if e.op == "slice":
        return f"{render(e.args[0], 4)}[:, {e.attr[0]}:{e.attr[1]}]"
    if e.op == "neg":  # -(-v), not --v
        text = f"-{render(e.args[0], 4 if e.args[0].op == 'neg' else 3)}"
    elif e.op in BINARY:
        p = _PRECEDENCE[e.op]
        text = f"{render(e.args[0], p)} {BINARY[e.op]} {render(e.args[1], p, right=True)}"
    elif e.op == "concat":
        return f"rnnc.concat([{', '.join(render(a) for a in e.args)}])"
    elif e.op == "layer_norm":
        args = ", ".join(render(a) for a in e.args)
        return f"rnnc.layer_norm({args}, eps={e.attr[0]!r})"
    else:
        return f"rnnc.{e.op}({', '.join(render(a) for a in e.args)})"
    p = _PRECEDENCE[e.op]
    return f"({text})" if p < parent or (right and p == parent) else text


def body_lines(spec: CellSpec) -> list[str]:
    """The statements of the cell factory after ``c = rnnc.Cell(...)``."""
    spec = prune(spec)
    lines = [f"{n} = c.input({n!r}, {w})" for n, w in spec.inputs]
    lines += [f"{n} = c.state({n!r}, {w})" for n, w in spec.states]
    lines += [f"{n} = c.param({n!r}, {s if len(s) > 1 else s[0]})" for n, s in spec.params]
    lines += [f"{n} = {render(e)}" for n, e in spec.lets]
    updates = ", ".join(f"{n}={render(e)}" for n, e in spec.updates)
    lines.append(f"c.update({updates})")
    lines += [f"c.output({n!r}, {render(e)})" for n, e in spec.outputs]
    return lines


def source(spec: CellSpec, factory: str = "make_cell") -> str:
    """A standalone Python definition of the cell: ``factory()`` returns it."""
    body = "\n".join("    " + line for line in body_lines(spec))
    return (f"import rnnc\n\n\ndef {factory}():\n    c = rnnc.Cell({spec.name!r})\n{body}\n"
            f"    return c\n")


def build(spec: CellSpec) -> rnnc.Cell:
    """The ``rnnc.Cell`` of ``spec``, made by running its source."""
    namespace: dict = {}
    exec(compile(source(spec), f"<fuzz cell {spec.name}>", "exec"), namespace)  # noqa: S102
    return namespace["make_cell"]()


# ---------------------------------------------------------------- liveness and bundles


def references(e: Expr) -> set[str]:
    return {n.attr[0] for n in walk(e) if n.op == "var"}


def substitute(spec: CellSpec, names: dict[str, Expr]) -> CellSpec:
    """Every reference to a name in ``names`` replaced by its expression."""
    def sub(e: Expr) -> Expr:
        if e.op == "var":
            return names.get(e.attr[0], e)
        return replace(e, args=tuple(sub(a) for a in e.args))

    return replace(spec, **{kind: tuple((n, sub(e)) for n, e in getattr(spec, kind))
                            for kind in ("lets", "updates", "outputs")})


def prune(spec: CellSpec) -> CellSpec:
    """``spec`` without temporaries and parameters that no update or output reaches, and with
    temporaries that merely rename another value (``t1 = x0``, left by shrinking) inlined."""
    aliases: dict[str, Expr] = {}
    for name, e in spec.lets:
        if e.op == "var":
            aliases[name] = aliases.get(e.attr[0], e)
    if aliases:
        spec = substitute(replace(spec, lets=tuple(x for x in spec.lets if x[0] not in aliases)),
                          aliases)
    needed: set[str] = set()
    for _, e in spec.updates + spec.outputs:
        needed |= references(e)
    lets = []
    for name, e in reversed(spec.lets):
        if name in needed:
            lets.append((name, e))
            needed |= references(e)
    return replace(spec, lets=tuple(reversed(lets)),
                   params=tuple(p for p in spec.params if p[0] in needed))


def rename(spec: CellSpec, prefix: str) -> CellSpec:
    """Every declared and temporary name of ``spec`` with ``prefix`` in front."""
    def renamed(e: Expr) -> Expr:
        if e.op == "var":
            return var(prefix + e.attr[0])
        return replace(e, args=tuple(renamed(a) for a in e.args))

    def pairs(items: tuple, expr: bool) -> tuple:
        return tuple((prefix + n, renamed(v) if expr else v) for n, v in items)

    return CellSpec(pairs(spec.inputs, False), pairs(spec.states, False),
                    pairs(spec.params, False), pairs(spec.lets, True), pairs(spec.updates, True),
                    pairs(spec.outputs, True), spec.name)


def bundle(specs: list[CellSpec]) -> CellSpec:
    """Independent cells side by side in one cell (names prefixed ``c0_``, ``c1_``, ...), so
    that a compiled backend pays its per-program compile cost once for all of them."""
    parts = [rename(s, f"c{i}_") for i, s in enumerate(specs)]

    def join(attr: str) -> tuple:
        return tuple(itertools.chain.from_iterable(getattr(p, attr) for p in parts))

    return CellSpec(join("inputs"), join("states"), join("params"), join("lets"),
                    join("updates"), join("outputs"), "bundle")
