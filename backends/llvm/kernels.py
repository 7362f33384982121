"""Loop nests for the LLVM backend: elementwise regions, reductions, copies and GEMM calls.

Every loop nest lives in its own internal function whose pointer arguments are all ``noalias``
(a node's buffer never overlaps another node's), so the loop vectorizer needs no runtime alias
checks; LLVM inlines the function into ``rnnc_run`` and keeps the no-alias facts as metadata.
A kernel takes ``(i64 T, i64 B, ptr...)`` so that symbolic dims resolve inside it.

A region (a fused node's graph, or a single elementwise/layout node of an outer graph) is
evaluated per element, operands before users, with an index per axis of the value being read
(an explicit stack, so a chain of thousands of ops needs no deep recursion): an operand
of a smaller shape is read with broadcast axes pinned to 0, ``slice`` shifts the column,
``expand`` reads column 0, ``pad`` and ``concat`` select by column range with clamped indices so
that every load stays inside its buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import blas
from rnnc.ir import Graph

I32 = ir.IntType(32)
I64 = ir.IntType(64)
I8P = ir.IntType(8).as_pointer()
Shape = tuple[Any, ...]


@dataclass(frozen=True)
class Buffer:
    """A contiguous array: an element pointer in the current function and a symbolic shape."""

    ptr: ir.Value
    shape: Shape


def strides(shape: Shape, dim: Callable[[Any], ir.Value], builder: ir.IRBuilder) -> list:
    """Row-major strides in elements, as i64 values."""
    out: list[ir.Value] = []
    step: ir.Value = ir.Constant(I64, 1)
    for d in reversed(shape):
        out.append(step)
        step = builder.mul(step, dim(d))
    return out[::-1]


def numel(shape: Shape, dim: Callable[[Any], ir.Value], builder: ir.IRBuilder) -> ir.Value:
    """The element count of ``shape`` as an i64 value."""
    n: ir.Value = ir.Constant(I64, 1)
    for d in shape:
        n = builder.mul(n, dim(d))
    return n


def broadcast_index(index: Sequence[ir.Value], out: Shape, src: Shape) -> tuple:
    """The index into a ``src``-shaped operand of an element at ``index`` of ``out``."""
    zero = ir.Constant(I64, 0)
    lead = len(out) - len(src)
    return tuple(zero if s == 1 and out[lead + ax] != 1 else index[lead + ax]
                 for ax, s in enumerate(src))


_counter = itertools.count()


class Kernel:
    """One internal function holding a loop nest over its buffers."""

    def __init__(self, ctx: Any, name: str, buffers: Sequence[Buffer]) -> None:
        self.ctx = ctx
        self.outer = list(buffers)
        ptr = ctx.scalar.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [I64, I64] + [ptr] * len(buffers))
        self.fn = ir.Function(ctx.module, fnty, f"{name}.{next(_counter)}")
        self.fn.linkage = "internal"
        self.fn.attributes.add("nounwind")
        for arg in self.fn.args[2:]:
            arg.add_attribute("noalias")
        self.builder = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.T, self.B = self.fn.args[0], self.fn.args[1]
        self.buffers = [Buffer(a, b.shape) for a, b in zip(self.fn.args[2:], buffers, strict=True)]
        self._strides: dict[int, list] = {}

    def dim(self, d: Any) -> ir.Value:
        if d == "T":
            return self.T
        if d == "B":
            return self.B
        return ir.Constant(I64, d)

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
        b = self.builder
        pre = b.block
        head = b.append_basic_block("head")
        inner = b.append_basic_block("body")
        done = b.append_basic_block("done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, "i")
        i.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, extent), inner, done)
        b.position_at_end(inner)
        body(i)
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def nest(self, shape: Shape, body: Callable[[tuple], None], index: tuple = ()) -> None:
        """Nested loops over every axis of ``shape``; the last axis is innermost."""
        if len(index) == len(shape):
            body(index)
            return
        self.loop(self.dim(shape[len(index)]),
                  lambda i: self.nest(shape, body, index + (i,)))

    def finish(self, dims: tuple[ir.Value, ir.Value] | None = None) -> None:
        """Close the function and call it from the program at the context's position.

        ``dims`` replaces the program's (T, B) as the kernel's two size arguments.
        """
        self.builder.ret_void()
        ctx = self.ctx
        ctx.builder.call(self.fn, list(dims or (ctx.T, ctx.B)) + [b.ptr for b in self.outer])


class Region:
    """Per-element evaluation of a graph region whose leaves are kernel buffers.

    A value is computed after its operands with an explicit stack, not by recursion: a chain of
    thousands of elementwise ops is as deep as it is long.
    """

    def __init__(self, kernel: Kernel, graph: Graph, leaves: dict[int, int]) -> None:
        self.k = kernel
        self.g = graph
        self.leaves = leaves  # node id -> kernel buffer number
        # (node, ids of index values) -> (value, index); the index is kept so that no id is
        # reused by a new index value while its key is in the memo.
        self.memo: dict[tuple, tuple[ir.Value, tuple]] = {}

    @staticmethod
    def _key(nid: int, index: tuple) -> tuple:
        return (nid,) + tuple(id(i) for i in index)

    def value(self, nid: int, index: tuple) -> ir.Value:
        """Node ``nid`` at element ``index``, emitting what it needs that is not yet emitted."""
        pending: dict[tuple, tuple[list, Callable[[list], ir.Value]]] = {}
        stack = [(nid, index)]
        while stack:
            top, at = stack[-1]
            key = self._key(top, at)
            if key in self.memo:
                stack.pop()
                continue
            if key not in pending:
                pending[key] = self._operands(top, at)
            reads, finish = pending[key]
            missing = [r for r in reads if self._key(*r) not in self.memo]
            if missing:
                stack.extend(reversed(missing))
                continue
            stack.pop()
            self.memo[key] = (finish([self.memo[self._key(*r)][0] for r in reads]), at)
        return self.memo[self._key(nid, index)][0]

    def _operands(self, nid: int, index: tuple
                  ) -> tuple[list[tuple[int, tuple]], Callable[[list], ir.Value]]:
        """The (operand, index) elements node ``nid`` reads at ``index``, and the function
        combining their values into its own."""
        from rnnc.backends.llvm.rules import SCALAR

        if nid in self.leaves:
            return [], lambda _: self.k.load(self.leaves[nid], index)
        node = self.g.node(nid)
        b = self.k.builder
        scalar = self.k.ctx.scalar
        if node.op is ops.constant:
            return [], lambda _: ir.Constant(scalar, float(node.attrs["value"]))
        if node.op in SCALAR:
            reads = [(src, broadcast_index(index, node.shape, self.g.node(src).shape))
                     for src in node.inputs]
            return reads, lambda args: SCALAR[node.op](b, *args)
        lead, j = index[:-1], index[-1]
        src = node.inputs[0] if node.inputs else None
        if node.op is ops.slice_:
            return ([(src, lead + (b.add(j, ir.Constant(I64, node.attrs["start"])),))],
                    lambda args: args[0])
        if node.op is ops.expand:
            return [(src, lead + (ir.Constant(I64, 0),))], lambda args: args[0]
        if node.op is ops.pad:
            n = self.g.node(src).shape[-1]
            inside = self._inside(j, node.attrs["before"], n)
            zero = ir.Constant(scalar, 0.0)
            return ([(src, lead + (self._clamped(j, node.attrs["before"], n),))],
                    lambda args: b.select(inside, args[0], zero))
        if node.op is ops.concat:
            reads, insides = [], []
            start = 0
            for part in node.inputs:
                n = self.g.node(part).shape[-1]
                full = node.shape[:-1] + (n,)
                part_lead = broadcast_index(lead + (j,), full, self.g.node(part).shape)[:-1]
                insides.append(self._inside(j, start, n) if reads else None)
                reads.append((part, part_lead + (self._clamped(j, start, n),)))
                start += n

            def select(args: list) -> ir.Value:
                result = args[0]
                for inside, arg in zip(insides[1:], args[1:], strict=True):
                    result = b.select(inside, arg, result)
                return result

            return reads, select
        raise NotImplementedError(f"{node.op.name} cannot be evaluated per element")

    def _clamped(self, j: ir.Value, start: int, n: int) -> ir.Value:
        """Column ``j - start`` clamped into ``[0, n)``: the load is always valid."""
        b = self.k.builder
        col = b.sub(j, ir.Constant(I64, start))
        col = b.select(b.icmp_signed("<", col, ir.Constant(I64, 0)), ir.Constant(I64, 0), col)
        return b.select(b.icmp_signed(">", col, ir.Constant(I64, n - 1)),
                        ir.Constant(I64, n - 1), col)

    def _inside(self, j: ir.Value, start: int, n: int) -> ir.Value:
        """Whether ``start <= j < start + n``."""
        b = self.k.builder
        return b.and_(b.icmp_signed(">=", j, ir.Constant(I64, start)),
                      b.icmp_signed("<", j, ir.Constant(I64, start + n)))


def emit_region(ctx: Any, graph: Graph, leaves: dict[int, Buffer], outputs: dict[int, Buffer],
                name: str) -> None:
    """Compute ``outputs`` (node id -> destination) of ``graph`` from its ``leaves``.

    Outputs of the same shape share one loop nest.
    """
    groups: dict[Shape, list[int]] = {}
    for nid, buf in outputs.items():
        groups.setdefault(tuple(buf.shape), []).append(nid)
    leaf_ids = list(leaves)
    for shape, nids in groups.items():
        kernel = Kernel(ctx, name, [leaves[n] for n in leaf_ids] + [outputs[n] for n in nids])
        region = Region(kernel, graph, {n: k for k, n in enumerate(leaf_ids)})

        def body(index: tuple, nids: list[int] = nids, region: Region = region,
                 kernel: Kernel = kernel) -> None:
            region.memo.clear()
            for pos, nid in enumerate(nids):
                kernel.store(len(leaf_ids) + pos, index, region.value(nid, index))

        kernel.nest(shape, body)
        kernel.finish()


def emit_reduce(ctx: Any, src: Buffer, out: Buffer, mean: bool) -> None:
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


def emit_sum_rows(ctx: Any, src: Buffer, out: Buffer) -> None:
    """``out[j] = sum over rows of src[..., j]``, accumulating row after row like NumPy."""
    kernel = Kernel(ctx, "sum_rows", [src, out])
    b = kernel.builder
    n = kernel.dim(src.shape[-1])
    kernel.loop(n, lambda j: kernel.store(1, (j,), ir.Constant(ctx.scalar, 0.0)))
    kernel.nest(src.shape[:-1], lambda index: kernel.loop(n, lambda j: kernel.store(
        1, (j,), b.fadd(kernel.load(1, (j,)), kernel.load(0, index + (j,))))))
    kernel.finish()


def emit_accumulate(ctx: Any, dst: Buffer, src: Buffer) -> None:
    """``dst += src`` elementwise (same shapes)."""
    kernel = Kernel(ctx, "accumulate", [dst, src])
    b = kernel.builder
    kernel.nest(dst.shape, lambda i: kernel.store(
        0, i, b.fadd(kernel.load(0, i), kernel.load(1, i))))
    kernel.finish()


# Up to this many rows, a GEMM runs in the kernel below instead of the BLAS: at batch 1 and 2
# the BLAS call overhead and its small-M path cost more than streaming the weights once.
SMALL_ROWS = 2


def emit_small_gemm(ctx: Any, rows: ir.Value, a: Buffer, w: Buffer, out: Buffer) -> None:
    """``out[r, :] = sum_k a[r, k] * w[k, :]`` for few rows: axpy form, four k at a time.

    The j loop is contiguous in ``w`` and ``out`` and vectorizes; ``rows`` travels in the
    kernel's T argument.
    """
    k_size, n = w.shape
    kernel = Kernel(ctx, "small_gemm", [Buffer(a.ptr, ("T", k_size)), w,
                                        Buffer(out.ptr, ("T", n))])
    b = kernel.builder
    name = "llvm.fmuladd." + ("f32" if ctx.np_dtype().itemsize == 4 else "f64")
    fma = ctx.module.globals.get(name) or ir.Function(
        ctx.module, ir.FunctionType(ctx.scalar, [ctx.scalar] * 3), name)
    zero = ir.Constant(ctx.scalar, 0.0)
    unroll = 4
    whole = k_size - k_size % unroll

    def row(r: ir.Value) -> None:
        kernel.loop(kernel.dim(n), lambda j: kernel.store(2, (r, j), zero))

        def block(k0: ir.Value, count: int) -> None:
            coefs = [kernel.load(0, (r, b.add(k0, ir.Constant(I64, d)))) for d in range(count)]

            def column(j: ir.Value) -> None:
                acc = kernel.load(2, (r, j))
                for d, coef in enumerate(coefs):
                    acc = b.call(fma, [coef, kernel.load(1, (b.add(k0, ir.Constant(I64, d)), j)),
                                       acc])
                kernel.store(2, (r, j), acc)

            kernel.loop(kernel.dim(n), column)

        if whole:
            kernel.loop(ir.Constant(I64, whole // unroll),
                        lambda q: block(b.mul(q, ir.Constant(I64, unroll)), unroll))
        if k_size % unroll:
            block(ir.Constant(I64, whole), k_size % unroll)

    kernel.loop(kernel.T, row)
    kernel.finish((rows, ctx.B))


GEMM_ENTRY = 3  # uint64 words per GEMM site in the table the runner passes


def _set_threads(ctx: Any, setter: ir.Value, threads: ir.Value) -> None:
    """Call the library's ``set_num_threads(threads)`` unless it is what was last set.

    Small GEMMs (a recurrent step at small batch) run faster on one thread than split over
    several, big ones (the hoisted projection) the other way round: each site gets its own
    count, and the call is made only when the count changes along the program.
    """
    b = ctx.builder
    if not hasattr(ctx, "threads_state"):
        ctx.threads_state = (ctx.entry_alloca(I64), ctx.entry_alloca(I64))
        for slot in ctx.threads_state:
            ctx.entry.store(ir.Constant(I64, 0), slot)
    last_setter, last_threads = ctx.threads_state
    changed = b.or_(b.icmp_unsigned("!=", b.load(last_setter), setter),
                    b.icmp_unsigned("!=", b.load(last_threads), threads))
    needed = b.and_(b.icmp_unsigned("!=", setter, ir.Constant(I64, 0)), changed)
    with b.if_then(needed):
        fnty = ir.FunctionType(ir.VoidType(), [I32])
        b.call(b.inttoptr(setter, fnty.as_pointer()), [b.trunc(threads, I32)])
        b.store(setter, last_setter)
        b.store(threads, last_threads)


def emit_gemm(ctx: Any, transa: bool, transb: bool, sizes: tuple, m: ir.Value, n: Any, k: Any,
              a: ir.Value, lda: Any, b_: ir.Value, ldb: Any, c: ir.Value, ldc: Any) -> None:
    """Row-major ``C = op(A) @ op(B)`` through the BLAS the runner chose for this call site.

    ``ctx.gemm`` points to a table with one GEMM address per site, filled by the runner for
    each (T, B) (``sizes`` are the site's symbolic m, n, k): so each shape can use the fastest
    installed library, and cached object code stays valid in another process, where the
    libraries load elsewhere.
    """
    b = ctx.builder
    site = len(ctx.plan.gemms)
    ctx.plan.gemms.append((transa, transb, sizes))
    fnty = blas.gemm_function_type(ctx.blas.convention, ctx.np_dtype)
    # Each site's entry is (GEMM address, set_num_threads address or 0, thread count).
    table = b.bitcast(ctx.gemm, I64.as_pointer())
    entry = [b.load(b.gep(table, [ir.Constant(I64, GEMM_ENTRY * site + i)])) for i in range(3)]
    _set_threads(ctx, entry[1], entry[2])
    fn = b.inttoptr(entry[0], fnty.as_pointer())
    ptr = ctx.scalar.as_pointer()

    def i32(v: Any) -> ir.Value:
        return ir.Constant(I32, v) if isinstance(v, int) else b.trunc(v, I32)

    alpha, beta = ir.Constant(ctx.scalar, 1.0), ir.Constant(ctx.scalar, 0.0)
    a, b_, c = (b.bitcast(p, ptr) for p in (a, b_, c))
    if ctx.blas.convention == "cblas":
        b.call(fn, [i32(blas.CBLAS_ROW_MAJOR), i32(blas.CBLAS_TRANS if transa else
                                                 blas.CBLAS_NO_TRANS),
                    i32(blas.CBLAS_TRANS if transb else blas.CBLAS_NO_TRANS),
                    i32(m), i32(n), i32(k), alpha, a, i32(lda), b_, i32(ldb), beta, c, i32(ldc)])
        return
    # Fortran: every argument by address, and column-major C^T = op(B)^T op(A)^T.
    char = ir.IntType(8)
    args = [ir.Constant(char, ord("T" if transb else "N")),
            ir.Constant(char, ord("T" if transa else "N")),
            i32(n), i32(m), i32(k), alpha, b_, i32(ldb), a, i32(lda), beta, c, i32(ldc)]
    slots = []
    for pos, v in enumerate(args):
        if pos in (6, 8, 11):
            slots.append(b.bitcast(v, I8P))
            continue
        slot = ctx.entry_alloca(v.type)
        b.store(v, slot)
        slots.append(b.bitcast(slot, I8P))
    b.call(fn, slots)
