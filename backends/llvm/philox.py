"""Philox4x32-10 in LLVM IR: the per-element rule of ``bernoulli`` (``rnnc.philox``).

An element of a mask reads the four 16-bit halves of ``rng.key`` and the four of its row of
``rng.counter`` (exact small integers in the program's float type), joins them into 32-bit
words, and runs ten Philox rounds on the counter ``(b * size + j, t or 0, stream, 0)``; the
32x32 -> 64-bit products are ``i64`` multiplies, whose high and low halves are the round's
``mulhi`` and ``mullo``. The loop vectorizer turns them into vector integer multiplies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from rnnc import philox
from rnnc.backends.llvm.context import I32, I64
from rnnc.ir import Node

# The elements a node reads, as (operand id, index), and the function combining their values.
Reads = tuple[list[tuple[int, tuple]], Callable[[list], ir.Value]]


def _i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v & philox.MASK32)


def _word(b: ir.IRBuilder, low: ir.Value, high: ir.Value) -> ir.Value:
    """A 32-bit word from its 16-bit halves held as floats."""
    return b.or_(b.fptoui(low, I32), b.shl(b.fptoui(high, I32), _i32(16)))


def _mulhilo(b: ir.IRBuilder, m: int, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    product = b.mul(b.zext(x, I64), ir.Constant(I64, m))
    return b.trunc(b.lshr(product, ir.Constant(I64, 32)), I32), b.trunc(product, I32)


def rounds(b: ir.IRBuilder, counter: Sequence[ir.Value], key: Sequence[ir.Value]
           ) -> list[ir.Value]:
    """The four output words of Philox4x32-10 for i32 ``counter`` and ``key`` values."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(philox.ROUNDS):
        if r:
            k0, k1 = b.add(k0, _i32(philox.W0)), b.add(k1, _i32(philox.W1))
        hi0, lo0 = _mulhilo(b, philox.M0, c0)
        hi1, lo1 = _mulhilo(b, philox.M1, c2)
        c0, c1, c2, c3 = b.xor(b.xor(hi1, c1), k0), lo1, b.xor(b.xor(hi0, c3), k1), lo0
    return [c0, c1, c2, c3]


def bernoulli_reads(b: ir.IRBuilder, node: Node, index: tuple) -> Reads:
    """``bernoulli`` at ``index`` of its result: it reads the key and its counter row, and
    its column ``index[-1]`` is part of the Philox counter."""
    key, counter = node.inputs
    reads = [(key, (ir.Constant(I64, k),)) for k in range(4)]
    reads += [(counter, tuple(index[:-1]) + (ir.Constant(I64, k),)) for k in range(4)]
    attrs = node.attrs
    limit = philox.threshold(attrs["p"])

    def finish(values: list) -> ir.Value:
        k0, k1, t, row = (_word(b, values[i], values[i + 1]) for i in range(0, 8, 2))
        column = b.trunc(index[-1], I32)
        element = b.add(b.mul(row, _i32(attrs["size"])), column)
        step = t if attrs["per"] == "step" else _i32(0)
        first = rounds(b, [element, step, _i32(attrs["stream"]), _i32(0)], [k0, k1])[0]
        keep = b.icmp_unsigned("<", b.zext(first, I64), ir.Constant(I64, limit))
        return b.uitofp(keep, values[0].type)

    return reads, finish
