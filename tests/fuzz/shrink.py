"""Shrink a failing cell to a minimal one that still fails, and print it as a reproducer.

Greedy delta debugging over the spec: try candidates from the biggest cut to the smallest, keep
the first that still fails (the same target, combination and kind of failure) and start over,
until no candidate fails. Candidates: drop an output; drop a state or an input (its uses
replaced by another leaf of the same width, or a constant); replace any subexpression by one of
its operands, by an input or state, or by a constant; then fewer steps and a smaller batch.
A candidate the DSL refuses (a shape error) is simply not a candidate.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from tests.fuzz.differential import (
    PIPELINES,
    Mismatch,
    Target,
    check_cell,
)
from tests.fuzz.spec import CellSpec, Expr, build, const, prune, source, substitute, var

Fails = Callable[[CellSpec, int, int], bool]


# ---------------------------------------------------------------- candidates


def _replace_at(e: Expr, path: tuple[int, ...], new: Expr) -> Expr:
    if not path:
        return new
    args = list(e.args)
    args[path[0]] = _replace_at(args[path[0]], path[1:], new)
    return replace(e, args=tuple(args))


def _positions(e: Expr, path: tuple[int, ...] = ()) -> Iterator[tuple[tuple[int, ...], Expr]]:
    """Every node of ``e`` with its path, parents first."""
    yield path, e
    for i, a in enumerate(e.args):
        yield from _positions(a, path + (i,))


def _roots(spec: CellSpec) -> list[tuple[str, int]]:
    return [(kind, i) for kind in ("outputs", "updates", "lets")
            for i in range(len(getattr(spec, kind)))]


def _set_root(spec: CellSpec, kind: str, i: int, e: Expr) -> CellSpec:
    items = list(getattr(spec, kind))
    items[i] = (items[i][0], e)
    return replace(spec, **{kind: tuple(items)})


def _leaves(spec: CellSpec, width: int, other_than: str) -> list[Expr]:
    """Inputs and states of ``width`` (other than ``other_than``), then a constant."""
    same = [var(n) for n, w in spec.inputs + spec.states if w == width and n != other_than]
    return same + [const(0.5)]


def candidates(spec: CellSpec) -> Iterator[CellSpec]:
    """Smaller variants of ``spec``, the biggest cuts first."""
    for i in range(len(spec.outputs)):
        yield replace(spec, outputs=spec.outputs[:i] + spec.outputs[i + 1:])
    if len(spec.states) > 1:
        for i, (name, width) in enumerate(spec.states):
            smaller = replace(spec, states=spec.states[:i] + spec.states[i + 1:],
                              updates=tuple(u for u in spec.updates if u[0] != name))
            for leaf in _leaves(spec, width, name):
                yield substitute(smaller, {name: leaf})
    if len(spec.inputs) > 1:
        for i, (name, width) in enumerate(spec.inputs):
            smaller = replace(spec, inputs=spec.inputs[:i] + spec.inputs[i + 1:])
            for leaf in _leaves(smaller, width, name):
                yield substitute(smaller, {name: leaf})
    leaves = [var(n) for n, _ in spec.inputs + spec.states] + [const(0.5)]
    for kind, i in _roots(spec):
        root = getattr(spec, kind)[i][1]
        for path, node in _positions(root):
            if node in leaves:
                continue
            options = list(node.args) + [leaf for leaf in leaves if leaf != node]
            for new in options:
                if node.op == "const" and new.op == "const":
                    continue
                yield _set_root(spec, kind, i, _replace_at(root, path, new))


def shrink(spec: CellSpec, T: int, B: int, fails: Fails, budget_s: float = 300.0
           ) -> tuple[CellSpec, int, int]:
    """The smallest ``(spec, T, B)`` found for which ``fails`` holds (it holds for the input)."""
    deadline = time.monotonic() + budget_s
    current = prune(spec)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        size = current.size()
        for candidate in candidates(current):
            if time.monotonic() > deadline:
                break
            candidate = prune(candidate)
            if candidate.size() < size and fails(candidate, T, B):
                current, improved = candidate, True
                break
    for t in range(1, T):
        if fails(current, t, B):
            T = t
            break
    for b in range(1, B):
        if fails(current, T, b):
            B = b
            break
    return current, T, B


# ---------------------------------------------------------------- the failure predicate


def _kind(m: Mismatch) -> str:
    """What must stay the same while shrinking: the target and the kind of failure."""
    raised = re.search(r"raised (\w+)", m.quantity)
    what = raised.group(1) if raised else m.pipeline if np.isfinite(m.error) else "non-finite"
    return f"{m.target}:{m.dtype}:{m.masked}:{what}"


def _pipelines(m: Mismatch) -> tuple[str, ...]:
    return (m.pipeline,) if m.pipeline in PIPELINES else PIPELINES


def predicate(target: Target, mismatch: Mismatch, seed: int) -> Fails:
    """``fails(spec, T, B)``: the cell still fails on ``target`` the way ``mismatch`` did."""
    combos = ((mismatch.dtype, mismatch.masked),) if mismatch.dtype != "-" else \
        (("float64", False),)
    want = _kind(mismatch)

    def fails(spec: CellSpec, T: int, B: int) -> bool:
        try:
            cell = build(spec)
        except Exception:  # the DSL refuses it: not a cell
            return False
        found = check_cell(cell, T, B, seed, target, combos, pipelines=_pipelines(mismatch),
                           spec=spec)
        return any(_kind(m) == want for m in found)

    return fails


def reproducer(spec: CellSpec, T: int, B: int, seed: int, mismatch: Mismatch) -> str:
    """The Python source of the cell and the line that reruns the failing comparison."""
    return (source(spec) + "\n\n"
            f"# {mismatch.describe()}\n"
            f"# (oracle: rnnc.compile(make_cell(), backend='numpy', optimize=False), float64)\n"
            "# From the repository root, this reruns the comparison and prints what disagrees:\n"
            "from tests.fuzz.differential import replay\n\n"
            f"replay(make_cell(), {mismatch.target!r}, T={T}, B={B}, seed={seed}, "
            f"dtype={mismatch.dtype!r}, masked={mismatch.masked})\n")


def report(spec: CellSpec, T: int, B: int, seed: int, target: Target,
           found: list[Mismatch], budget_s: float = 300.0) -> str:
    """Shrink ``spec`` for the first of ``found`` and describe the failure with a reproducer."""
    first = found[0]
    fails = predicate(target, first, seed)
    if not fails(spec, T, B):
        small, t, b = prune(spec), T, B  # not reproducible alone (e.g. only in a bundle)
        note = "could not be reproduced in isolation; unshrunk cell:"
    else:
        small, t, b = shrink(spec, T, B, fails, budget_s)
        note = f"shrunk from size {prune(spec).size()} to {small.size()}:"
    lines = [f"{target.name} disagrees with the oracle on fuzz seed {seed} "
             f"({len(found)} mismatching arrays):"]
    lines += ["  " + m.describe() for m in found[:8]]
    shrunk = check_cell(build(small), t, b, seed, target,
                        ((first.dtype, first.masked),) if first.dtype != "-" else
                        (("float64", False),), spec=small)
    same = [m for m in shrunk if _kind(m) == _kind(first)]
    if same:
        first = max(same, key=lambda m: m.error)
    lines += [f"Minimal reproducer ({note} {first.describe()}):", "",
              reproducer(small, t, b, seed, first)]
    return "\n".join(lines)

