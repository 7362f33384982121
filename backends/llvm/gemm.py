"""GEMMs in generated code: calls into a BLAS by address, and rnnc's own kernels for per-step
products.

A BLAS routine is reached through ``inttoptr`` of its address, so the JIT resolves no symbols;
the argument order of each calling convention is :func:`rnnc.backends.llvm.blas.gemm_arguments`.
In ``rnnc_run`` each call site reads its address from the table the runner passes, so each
shape can use the fastest installed library (:mod:`rnnc.backends.llvm.autotune`) and cached
object code stays valid in another process, where the libraries load elsewhere.

rnnc's own kernels serve the recurrent step, ``out = a @ w`` with few rows, on one core:

- up to ``LlvmSchedule.gemm_small_rows`` rows, an axpy-form loop (the BLAS call overhead and
  its small-M path cost more than streaming the weights once);
- at small and moderate batch the panel kernel: a threaded BLAS spends more time meeting than
  multiplying, and re-packs ``w`` on every call. The panel kernel packs ``w`` once per sequence
  (at the first step of each call) into column panels of ``2 * lanes`` columns stored
  contiguously, so a panel streams through L1 without the 4 KiB-stride set conflicts of
  reading a row-major matrix down a column; it then keeps a tile of ``gemm_row_block`` x
  ``2 * lanes`` results in vector registers over the whole ``k`` loop, loading two vectors of
  the panel and broadcasting ``gemm_row_block`` entries of ``a`` per ``k``. It needs ``n`` to
  be a multiple of ``2 * lanes``; other shapes use the BLAS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir

from rnnc.backends.llvm import blas, mathlib
from rnnc.backends.llvm.context import I8, I8P, I32, I64, Buffer, Context
from rnnc.backends.llvm.kernels import Kernel, emit_loop
from rnnc.backends.steps import NUMPY_DTYPES

# How many rows run in the axpy-form kernel, the panel kernel's row block and chunk of panel
# rows, and how many multiply-adds per step it takes before the BLAS does are the schedule's
# (LlvmSchedule.gemm_small_rows, .gemm_row_block, .gemm_k_chunk, .panel_max_work; a build
# reads them from Context.schedule and Context.own_max_work).
# uint64 words per GEMM site in the table the runner passes: a fact of its layout.
GEMM_ENTRY = 3


def _scalar_type(dtype: np.dtype | type) -> ir.Type:
    return ir.FloatType() if np.dtype(dtype) == np.float32 else ir.DoubleType()


def gemm_function_type(convention: blas.Convention, dtype: np.dtype | type) -> ir.FunctionType:
    """Return the LLVM type of a GEMM routine in the given convention and dtype."""
    kinds = [kind for kind, _ in blas.gemm_arguments(convention, False, False, *[0] * 11)]
    if convention == "fortran":  # every argument by address
        return ir.FunctionType(ir.VoidType(), [I8P] * len(kinds))
    types = {"i": I32, "s": _scalar_type(dtype), "m": _scalar_type(dtype).as_pointer()}
    return ir.FunctionType(ir.VoidType(), [types[kind] for kind in kinds])


def emit_gemm_call(builder: ir.IRBuilder, address: int | ir.Value, convention: blas.Convention,
                   dtype: np.dtype | type, transa: bool, transb: bool, m: Any, n: Any, k: Any,
                   alpha: Any, a: ir.Value, lda: Any, b: ir.Value, ldb: Any, beta: Any,
                   c: ir.Value, ldc: Any, entry: ir.IRBuilder | None = None) -> ir.Instruction:
    """Emit a call computing row-major ``C = alpha * op(A) @ op(B) + beta * C``.

    ``address`` is the routine's address, a Python int or an i64 value. Sizes are Python ints
    or integer values (wider ones are truncated to i32), alpha and beta Python floats or
    scalars of the dtype, and the matrices any pointer values. ``entry`` is the builder that
    owns the function's entry block, if one does; the Fortran convention's argument slots go
    there.
    """
    scalar = _scalar_type(dtype)
    if isinstance(address, int):
        address = ir.Constant(I64, address)
    function = builder.inttoptr(address, gemm_function_type(convention, dtype).as_pointer())
    arguments = blas.gemm_arguments(convention, transa, transb, m, n, k, alpha, a, lda, b, ldb,
                                    beta, c, ldc)
    values = [_argument(builder, kind, value, scalar) for kind, value in arguments]
    if convention == "fortran":  # every argument by address, the matrices as they are
        slots = entry or _entry_builder(builder)
        values = [builder.bitcast(v, I8P) if kind == "m" else _by_address(builder, slots, v)
                  for (kind, _), v in zip(arguments, values, strict=True)]
    return builder.call(function, values)


def _argument(builder: ir.IRBuilder, kind: str, value: Any, scalar: ir.Type) -> ir.Value:
    """One GEMM argument of ``kind`` (see ``gemm_arguments``) as a value of its LLVM type."""
    if not isinstance(value, ir.Value):
        return ir.Constant({"i": I32, "c": I8, "s": scalar}[kind], value)
    if kind == "m":
        return builder.bitcast(value, scalar.as_pointer())
    if kind == "i" and value.type.width > 32:
        return builder.trunc(value, I32)
    return value


def _entry_builder(builder: ir.IRBuilder) -> ir.IRBuilder:
    """A builder in the entry block of ``builder``'s function: ``builder`` itself when it is
    there, else a new one at the block's start (so that a terminator stays last)."""
    block = builder.function.entry_basic_block
    if builder.block is block:
        return builder
    entry = ir.IRBuilder(block)
    entry.position_at_start(block)
    return entry


def _by_address(builder: ir.IRBuilder, entry: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """``value`` stored in a stack slot of the entry block, as an ``i8*``."""
    # The entry block runs once, so a call inside the time loop does not grow the stack on
    # every step.
    slot = entry.alloca(value.type)
    builder.store(value, slot)
    return builder.bitcast(slot, I8P)


def emit_blas_gemm(ctx: Context, transa: bool, transb: bool, sizes: tuple, m: Any, n: Any,
                   k: Any, a: ir.Value, lda: Any, b: ir.Value, ldb: Any, c: ir.Value,
                   ldc: Any) -> None:
    """Row-major ``C = op(A) @ op(B)`` through the BLAS the runner chose for this call site.

    ``sizes`` are the site's symbolic (m, n, k), each a tuple of dims whose product it is; the
    runner resolves them for each (T, B) and fills the site's entry of the table: (GEMM
    address, ``set_num_threads`` address or 0, thread count).
    """
    address, setter, threads = _site(ctx, transa, transb, sizes)
    _set_threads(ctx, setter, _c(1) if ctx.one_thread else threads)
    emit_gemm_call(ctx.builder, address, ctx.convention, NUMPY_DTYPES[ctx.dtype], transa,
                   transb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc, entry=ctx.entry)


def _site(ctx: Context, transa: bool, transb: bool, sizes: tuple) -> tuple[ir.Value, ...]:
    """A new GEMM call site: its (address, setter, thread count) loaded from the table."""
    builder = ctx.builder
    site = len(ctx.plan.gemms)
    ctx.plan.gemms.append((transa, transb, sizes))
    table = builder.bitcast(ctx.gemm_table, I64.as_pointer())
    return tuple(builder.load(builder.gep(table, [ir.Constant(I64, GEMM_ENTRY * site + i)]))
                 for i in range(GEMM_ENTRY))


def emit_blas_columns(ctx: Context, a: Buffer, w: Buffer, out: Buffer, transposed: bool,
                      span: tuple[ir.Value, ir.Value],
                      set_once: Callable[[Callable[[], None]], None]) -> None:
    """``out[:, cols] = a @ w[:, cols]`` (``a @ w[cols, :].T`` when ``transposed``) for the
    column panels ``span`` of the panel kernel, through the site's BLAS on the calling thread.

    ``set_once(emit)`` places the code that sets the library to one thread (a team runs it on
    one thread before any thread's first call, :mod:`rnnc.backends.llvm.team`).
    """
    b = ctx.builder
    k_size, n = w.shape[::-1] if transposed else w.shape
    address, setter, _ = _site(ctx, False, transposed, (a.shape[:-1], (n,), (k_size,)))
    set_once(lambda: _set_threads(ctx, setter, _c(1)))
    width = 2 * lanes(ctx)
    first = b.mul(span[0], _c(width))
    count = b.mul(b.sub(span[1], span[0]), _c(width))
    weights = b.gep(w.ptr, [b.mul(first, _c(k_size)) if transposed else first], inbounds=True)
    results = b.gep(out.ptr, [first], inbounds=True)
    with b.if_then(b.icmp_signed(">", count, _c(0))):
        emit_gemm_call(b, address, ctx.convention, NUMPY_DTYPES[ctx.dtype], False, transposed,
                       ctx.B, count, k_size, 1.0, a.ptr, k_size, weights,
                       k_size if transposed else n, 0.0, results, n, entry=ctx.entry)


def _set_threads(ctx: Context, setter: ir.Value, threads: ir.Value) -> None:
    """Call the library's ``set_num_threads(threads)`` unless it is what was last set.

    Small GEMMs (a recurrent step at small batch) run faster on one thread than split over
    several, big ones (the hoisted projection) the other way round: each site gets its own
    count, and the call is made only when the count changes along the program.
    """
    b = ctx.builder
    if ctx.threads_state is None:
        ctx.threads_state = (ctx.entry.alloca(I64), ctx.entry.alloca(I64))
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


def emit_small_gemm(ctx: Context, rows: ir.Value, a: Buffer, w: Buffer, out: Buffer) -> None:
    """``out[r, :] = sum_k a[r, k] * w[k, :]`` for few rows: axpy form, four k at a time.

    The j loop is contiguous in ``w`` and ``out`` and vectorizes; ``rows`` travels in the
    kernel's T argument.
    """
    k_size, n = w.shape
    kernel = Kernel(ctx, "small_gemm", [Buffer(a.ptr, ("T", k_size)), w,
                                        Buffer(out.ptr, ("T", n))])
    b = kernel.builder
    fma = mathlib.intrinsic(ctx.module, "fmuladd", ctx.scalar, 3)
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


def lanes(ctx: Context) -> int:
    """Vector width in elements: one 512-bit register."""
    return mathlib.vector_width(8 * ctx.itemsize)


def fits(ctx: Context, n: int) -> bool:
    """Whether the panel kernel takes an ``n``-column product: whole panels only."""
    return isinstance(n, int) and n % (2 * lanes(ctx)) == 0


def panels(ctx: Context, w: Buffer, transposed: bool) -> int:
    """How many column panels the panel kernel splits ``a @ w`` (``a @ w.T``) into."""
    return (w.shape[0] if transposed else w.shape[1]) // (2 * lanes(ctx))


def emit_panel_gemm(ctx: Context, rows: ir.Value, a: Buffer, w: Buffer, out: Buffer,
                    transposed: bool = False,
                    span: tuple[ir.Value, ir.Value] | None = None, gates: int = 1) -> None:
    """Call (building it once per shape) the kernel computing ``out[:rows] = a @ w``
    (``a @ w.T`` when ``transposed``: backward's ``dG @ U^T``); with ``span``, only the
    column panels ``span[0] .. span[1]`` (packing only those) of each of ``gates`` equal
    blocks of columns (the gates of a gated cell's product: a team's split by hidden
    units)."""
    k_size, n = w.shape[::-1] if transposed else w.shape
    key = (k_size, n, transposed)
    if key not in ctx.own_gemms:
        ctx.own_gemms[key] = _PanelKernel(ctx, k_size, n, transposed).build()
    ptr = ctx.scalar.as_pointer()
    # Each call site packs into its own workspace; the marker (null at the start of every
    # run) remembers which matrix is packed there, so packing happens once per sequence.
    # The gates' calls pack disjoint panels of one workspace, each with its own marker.
    packed = ctx.slot((k_size, n))
    args = [ctx.builder.bitcast(x.ptr, ptr) for x in (a, w, out, packed)]
    width = 2 * lanes(ctx)
    per_gate = n // width // gates
    first, stop = span or (_c(0), _c(per_gate))
    for gate in range(gates):
        marker = ctx.entry.alloca(ptr)
        ctx.entry.store(ir.Constant(ptr, None), marker)
        columns = [ctx.builder.mul(ctx.builder.add(end, _c(gate * per_gate)), _c(width))
                   for end in (first, stop)]
        ctx.builder.call(ctx.own_gemms[key], [rows] + args + [marker] + columns)


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


class _PanelKernel:
    """Builds ``panel_gemm(i64 rows, a, w, out, packed, marker, i64 first, i64 stop)`` for one
    shape of ``w``: output columns ``first .. stop`` (whole panels)."""

    def __init__(self, ctx: Context, k_size: int, n: int, transposed: bool) -> None:
        self.k_size, self.n, self.transposed = k_size, n, transposed
        self.L = lanes(ctx)
        self.row_block, self.k_chunk = ctx.schedule.gemm_row_block, ctx.schedule.gemm_k_chunk
        self.vec = ir.VectorType(ctx.scalar, self.L)
        self.vptr = self.vec.as_pointer()
        ptr = ctx.scalar.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [I64, ptr, ptr, ptr, ptr, ptr.as_pointer(),
                                               I64, I64])
        self.fn = ir.Function(ctx.module, fnty,
                              f"panel_gemm.{k_size}x{n}{'t' if transposed else ''}")
        self.fn.linkage = "internal"
        self.fn.attributes.add("nounwind")
        (self.rows, self.a, self.w, self.out, self.packed, self.marker, self.first,
         self.stop) = self.fn.args
        for arg in (self.a, self.w, self.out, self.packed):
            arg.add_attribute("noalias")
        self.entry = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.b = ir.IRBuilder(self.fn.append_basic_block("start"))
        self.fma = mathlib.intrinsic(ctx.module, "fmuladd", self.vec, 3)

    def build(self) -> ir.Function:
        b, panel_width = self.b, 2 * self.L
        with b.if_then(b.icmp_unsigned("!=", b.load(self.marker), self.w)):
            emit_loop(b, self.first, self.stop, panel_width, self.pack_panel)
            b.store(self.w, self.marker)
        emit_loop(b, self.first, self.stop, panel_width, self.panel)
        b.ret_void()
        self.entry.branch(self.fn.blocks[1])
        return self.fn

    def pack_panel(self, col: ir.Value) -> None:
        """Copy columns ``col .. col + 2L`` of ``w`` into their panel: ``k_size`` rows of
        ``2L`` contiguous values."""
        b, L, k_size = self.b, self.L, self.k_size

        def row(k: ir.Value) -> None:
            dst = b.add(b.mul(col, _c(k_size)), b.mul(k, _c(2 * L)))
            if self.transposed:  # w is (n, k): column k of the panel's rows, gathered
                for j in range(2 * L):
                    src = b.add(b.mul(b.add(col, _c(j)), _c(k_size)), k)
                    b.store(b.load(b.gep(self.w, [src])), b.gep(self.packed, [b.add(dst, _c(j))]))
                return
            src = b.add(b.mul(k, _c(self.n)), col)
            for h in range(2):
                v = b.load(b.bitcast(b.gep(self.w, [b.add(src, _c(h * L))]), self.vptr), align=4)
                b.store(v, b.bitcast(b.gep(self.packed, [b.add(dst, _c(h * L))]), self.vptr),
                        align=4)

        emit_loop(b, _c(0), _c(k_size), 1, row)

    def panel(self, col: ir.Value) -> None:
        """Every row of the output's columns ``col .. col + 2L``, by chunks of
        ``gemm_k_chunk`` rows of the panel (one chunk stays in L1 while every row tile reads
        it); the sums go on in the same order as with one chunk."""
        b, k_size, chunk = self.b, self.k_size, self.k_chunk
        if k_size <= chunk:
            self.chunk(col, _c(0), k_size, True)
            return
        self.chunk(col, _c(0), chunk, True)
        emit_loop(b, _c(chunk), _c(k_size), chunk,
                  lambda k0: self.chunk(col, k0, chunk, False))
        if k_size % chunk:
            self.chunk(col, _c(k_size - k_size % chunk), k_size % chunk, False)

    def chunk(self, col: ir.Value, k0: ir.Value, kc: int, first: bool) -> None:
        """Panel rows ``k0 .. k0 + kc`` for every row, in tiles of ``gemm_row_block`` rows."""
        b, rows = self.b, self.row_block
        end = emit_loop(b, _c(0), self.rows, rows,
                        lambda r0: self.tile(r0, rows, col, k0, kc, first))
        # The rows left over (fewer than a row block) as one tile of their own height.
        left = b.sub(self.rows, end)
        for height in range(1, rows):
            with b.if_then(b.icmp_signed("==", left, _c(height))):
                self.tile(end, height, col, k0, kc, first)

    def tile(self, r0: ir.Value, nrows: int, col: ir.Value, k0: ir.Value, kc: int,
             first: bool) -> None:
        """Rows ``r0 .. r0 + nrows``, columns ``col .. col + 2L``, accumulated in registers
        over ``k0 .. k0 + kc`` (starting from zero on the first chunk, else from ``out``)."""
        b, L, k_size, vec = self.b, self.L, self.k_size, self.vec
        accs = [[self.entry.alloca(vec) for _ in range(2)] for _ in range(nrows)]
        for i, pair in enumerate(accs):
            base = b.add(b.mul(b.add(r0, _c(i)), _c(self.n)), col)
            for h, acc in enumerate(pair):
                start = ir.Constant(vec, [0.0] * L) if first else b.load(
                    b.bitcast(b.gep(self.out, [b.add(base, _c(h * L))]), self.vptr), align=4)
                b.store(start, acc)
        mask = ir.Constant(ir.VectorType(I32, L), [0] * L)

        def step(k: ir.Value) -> None:
            # Panel col / 2L holds k_size rows of 2L contiguous values.
            row = b.add(b.mul(col, _c(k_size)), b.mul(k, _c(2 * L)))
            ws = [b.load(b.bitcast(b.gep(self.packed, [b.add(row, _c(h * L))]), self.vptr),
                         align=4) for h in range(2)]
            for i in range(nrows):
                s = b.load(b.gep(self.a, [b.add(b.mul(b.add(r0, _c(i)), _c(k_size)), k)]))
                v = b.shuffle_vector(b.insert_element(ir.Constant(vec, None), s, _c(0)),
                                     ir.Constant(vec, None), mask)
                for h in range(2):
                    b.store(b.call(self.fma, [v, ws[h], b.load(accs[i][h])]), accs[i][h])

        emit_loop(b, k0, b.add(k0, _c(kc)), 1, step)
        for i in range(nrows):
            base = b.add(b.mul(b.add(r0, _c(i)), _c(self.n)), col)
            for h in range(2):
                dst = b.bitcast(b.gep(self.out, [b.add(base, _c(h * L))]), self.vptr)
                b.store(b.load(accs[i][h]), dst, align=4)
