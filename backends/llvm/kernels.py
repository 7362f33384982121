"""Loop nests for the LLVM backend, each in an internal function: the :class:`Kernel`, and the
reductions and the accumulation built on it.

Every loop nest lives in its own internal function whose pointer arguments are all ``noalias``
(a node's buffer never overlaps another node's), so the loop vectorizer needs no runtime alias
checks; LLVM inlines the function into ``rnnc_run`` and keeps the no-alias facts as metadata.
A kernel takes ``(i64 T, i64 B, ptr...)`` so that symbolic dims resolve inside it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from llvmlite import ir

from rnnc.backends.llvm.context import I64, Buffer, Context, Shape, dim_value


def strides(shape: Shape, dim: Callable[[Any], ir.Value], builder: ir.IRBuilder) -> list:
    """Row-major strides in elements, as i64 values."""
    out: list[ir.Value] = []
    step: ir.Value = ir.Constant(I64, 1)
    for d in reversed(shape):
        out.append(step)
        step = builder.mul(step, dim(d))
    return out[::-1]


def emit_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int,
              body: Callable[[ir.Value], None],
              labels: tuple[str, str, str] = ("head", "body", "done")) -> ir.Value:
    """``for i in range(start, stop - step + 1, step): body(i)`` at ``b``'s position (only
    whole blocks of ``step``); return ``i``, which after the loop is the first index left."""
    pre = b.block
    head, inner, done = (b.append_basic_block(label) for label in labels)
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64, "i")
    i.add_incoming(start, pre)
    last = i if step == 1 else b.add(i, ir.Constant(I64, step - 1))
    b.cbranch(b.icmp_signed("<", last, stop), inner, done)
    b.position_at_end(inner)
    body(i)
    i.add_incoming(b.add(i, ir.Constant(I64, step)), b.block)
    b.branch(head)
    b.position_at_end(done)
    return i


_counter = itertools.count()


class Kernel:
    """One internal function holding a loop nest over its buffers, and ``scalars`` more
    ``i64`` arguments after them (:attr:`scalars`; the caller's values go to :meth:`finish`)."""

    def __init__(self, ctx: Context, name: str, buffers: Sequence[Buffer], scalars: int = 0
                 ) -> None:
        self.ctx = ctx
        self.outer = list(buffers)
        ptr = ctx.scalar.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64] + [ptr] * len(buffers) + [I64] * scalars)
        self.fn = ir.Function(ctx.module, fnty, f"{name}.{next(_counter)}")
        self.fn.linkage = "internal"
        self.fn.attributes.add("nounwind")
        pointers = self.fn.args[2:2 + len(buffers)]
        for arg in pointers:
            arg.add_attribute("noalias")
        self.scalars = self.fn.args[2 + len(buffers):]
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.T, self.B = self.fn.args[0], self.fn.args[1]
        self.buffers = [Buffer(a, b.shape) for a, b in zip(pointers, buffers, strict=True)]
        self._strides: dict[int, list] = {}

    def dim(self, d: Any) -> ir.Value:
        return dim_value(d, self.T, self.B)

    def address(self, k: int, index: Sequence[ir.Value]) -> ir.Value:
        """The element pointer of buffer ``k`` at ``index``."""
        buf = self.buffers[k]
        if k not in self._strides:
            entry = ir.IRBuilder(self.fn.entry_basic_block)
            entry.position_at_start(self.fn.entry_basic_block)
            self._strides[k] = strides(buf.shape, self.dim, entry)
        offset: ir.Value = ir.Constant(I64, 0)
        for i, s in zip(index, self._strides[k], strict=True):
            if not (isinstance(i, ir.Constant) and i.constant == 0):
                offset = self.builder.add(offset, self.builder.mul(i, s))
        return self.builder.gep(buf.ptr, [offset], inbounds=True)

    def load(self, k: int, index: Sequence[ir.Value]) -> ir.Value:
        return self.builder.load(self.address(k, index))

    def store(self, k: int, index: Sequence[ir.Value], value: ir.Value) -> None:
        self.builder.store(value, self.address(k, index))

    def loop(self, extent: ir.Value, body: Callable[[ir.Value], None]) -> None:
        """``for i in range(extent): body(i)`` at the current position."""
        emit_loop(self.builder, ir.Constant(I64, 0), extent, 1, body)

    def nest(self, shape: Shape, body: Callable[[tuple], None], index: tuple = ()) -> None:
        """Nested loops over every axis of ``shape``; the last axis is innermost."""
        if len(index) == len(shape):
            body(index)
            return
        self.loop(self.dim(shape[len(index)]),
                  lambda i: self.nest(shape, body, index + (i,)))

    def finish(self, dims: tuple[ir.Value, ir.Value] | None = None,
               scalars: Sequence[ir.Value] = ()) -> None:
        """Close the function and call it from the program at the context's position.

        ``dims`` replaces the program's (T, B) as the kernel's two size arguments; ``scalars``
        are the values of its :attr:`scalars`.
        """
        self.builder.ret_void()
        ctx = self.ctx
        ctx.builder.call(self.fn, list(dims or (ctx.T, ctx.B)) + [b.ptr for b in self.outer]
                         + list(scalars))


def emit_reduce(ctx: Context, src: Buffer, out: Buffer, mean: bool) -> None:
    """``out[..., 0] = sum (or mean) of src[..., :]`` over the feature axis."""
    kernel = Kernel(ctx, "reduce", [src, out])
    n = src.shape[-1]
    zero = ir.Constant(ctx.scalar, 0.0)

    def row(index: tuple) -> None:
        b = kernel.builder
        acc = b.alloca(ctx.scalar)
        b.store(zero, acc)
        kernel.loop(kernel.dim(n), lambda j: b.store(
            b.fadd(b.load(acc), kernel.load(0, index + (j,))), acc))
        total = b.load(acc)
        if mean:
            total = b.fdiv(total, ir.Constant(ctx.scalar, float(n)))
        kernel.store(1, index + (ir.Constant(I64, 0),), total)

    kernel.nest(src.shape[:-1], row)
    kernel.finish()


def emit_sum_rows(ctx: Context, src: Buffer, out: Buffer) -> None:
    """``out[j] = sum over rows of src[..., j]``, accumulating row after row like NumPy."""
    kernel = Kernel(ctx, "sum_rows", [src, out])
    b = kernel.builder
    n = kernel.dim(src.shape[-1])
    kernel.loop(n, lambda j: kernel.store(1, (j,), ir.Constant(ctx.scalar, 0.0)))
    kernel.nest(src.shape[:-1], lambda index: kernel.loop(n, lambda j: kernel.store(
        1, (j,), b.fadd(kernel.load(1, (j,)), kernel.load(0, index + (j,))))))
    kernel.finish()


def emit_accumulate(ctx: Context, dst: Buffer, src: Buffer) -> None:
    """``dst += src`` elementwise (same shapes)."""
    kernel = Kernel(ctx, "accumulate", [dst, src])
    b = kernel.builder
    kernel.nest(dst.shape, lambda i: kernel.store(
        0, i, b.fadd(kernel.load(0, i), kernel.load(1, i))))
    kernel.finish()


def share_identical_functions(module: ir.Module, entry: ir.Function) -> int:
    """Make ``entry`` call one copy of each set of identical internal functions (the kernels
    of the same loop at different call sites), delete the others, and return how many calls
    ``entry`` makes to internal functions."""
    canonical: dict[str, ir.Function] = {}
    same: dict[str, ir.Function] = {}
    for fn in module.functions:
        if fn is entry or fn.is_declaration:
            continue
        head, _, body = str(fn).partition("\n")
        text = head.replace(f'@"{fn.name}"', "@", 1) + "\n" + body
        first = canonical.setdefault(text, fn)
        if first is not fn:
            same[fn.name] = first
    calls = 0
    for fn in module.functions:
        for block in fn.blocks:
            for instr in block.instructions:
                if not (isinstance(instr, ir.CallInstr) and isinstance(instr.callee, ir.Function)
                        and not instr.callee.is_declaration):
                    continue
                calls += fn is entry
                if instr.callee.name in same:
                    instr.replace_callee(same[instr.callee.name])
    for name in same:
        del module.globals[name]
    return calls
