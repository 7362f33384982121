"""rnnc's own GEMM for the recurrent step: ``out = a @ w`` with few rows, on one core.

At small and moderate batch the per-step product ``h @ U`` is too small for a threaded BLAS:
its threads spend more time meeting than multiplying, and it re-packs ``U`` on every call. This
kernel packs ``w`` once per sequence (at the first step of each call) into column panels of
``2 * lanes`` columns stored contiguously, so a panel streams through L1 without the 4 KiB-stride
set conflicts of reading a row-major matrix down a column; it then keeps a tile of ``ROWS`` x
``2 * lanes`` results in vector registers over the whole ``k`` loop, loading two vectors of the
panel and broadcasting ``ROWS`` entries of ``a`` per ``k``.

It needs ``n`` to be a multiple of ``2 * lanes``; other shapes use the BLAS.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from rnnc.backends.llvm.kernels import I64, Buffer

# Up to this many multiply-adds per step (rows * n * k) the kernel beats a threaded BLAS here.
MAX_WORK = 12 << 20
ROWS = 6  # row block: 2 * ROWS accumulators + 2 weight vectors + 1 broadcast fit in 32 zmm


def lanes(ctx: Any) -> int:
    """Vector width in elements: one 512-bit register."""
    return 16 if ctx.np_dtype().itemsize == 4 else 8


def fits(ctx: Any, n: int) -> bool:
    return isinstance(n, int) and n % (2 * lanes(ctx)) == 0


def emit_panel_gemm(ctx: Any, rows: ir.Value, a: Buffer, w: Buffer, out: Buffer,
                    transposed: bool = False) -> None:
    """Call (building it once per shape) the kernel computing ``out[:rows] = a @ w``
    (``a @ w.T`` when ``transposed``: backward's ``dG @ U^T``)."""
    k_size, n = w.shape[::-1] if transposed else w.shape
    key = ("panel_gemm", k_size, n, transposed)
    cache = ctx.__dict__.setdefault("own_kernels", {})
    if key not in cache:
        cache[key] = _build(ctx, k_size, n, transposed)
    ptr = ctx.scalar.as_pointer()
    # Each call site packs into its own workspace; the marker (null at the start of every
    # run) remembers which matrix is packed there, so packing happens once per sequence.
    packed = ctx.slot((k_size, n))
    marker = ctx.entry_alloca(ptr)
    ctx.entry.store(ir.Constant(ptr, None), marker)
    args = [ctx.builder.bitcast(x.ptr, ptr) for x in (a, w, out, packed)]
    ctx.builder.call(cache[key], [rows] + args + [marker])


def _build(ctx: Any, k_size: int, n: int, transposed: bool) -> ir.Function:
    scalar = ctx.scalar
    L = lanes(ctx)
    vec = ir.VectorType(scalar, L)
    ptr = scalar.as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [I64, ptr, ptr, ptr, ptr, ptr.as_pointer()])
    fn = ir.Function(ctx.module, fnty, f"panel_gemm.{k_size}x{n}{'t' if transposed else ''}")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    rows, a, w, out, packed, marker = fn.args
    for arg in (a, w, out, packed):
        arg.add_attribute("noalias")
    entry = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = ctx.module.globals.get(f"llvm.fmuladd.v{L}{_suffix(scalar)}") or ir.Function(
        ctx.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fmuladd.v{L}{_suffix(scalar)}")
    vptr = vec.as_pointer()
    zero = ir.Constant(vec, [0.0] * L)
    mask = ir.Constant(ir.VectorType(ir.IntType(32), L), [0] * L)

    def c(v: int) -> ir.Constant:
        return ir.Constant(I64, v)

    def loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int, body) -> None:
        pre = b.block
        head, inner, done = (fn.append_basic_block(s) for s in ("head", "body", "done"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", b.add(i, c(step - 1)), stop), inner, done)
        b.position_at_end(inner)
        body(b, i)
        i.add_incoming(b.add(i, c(step)), b.block)
        b.branch(head)
        b.position_at_end(done)
        return i

    def block(b: ir.IRBuilder, r0: ir.Value, nrows: int, col: ir.Value) -> None:
        """One tile: rows r0 .. r0+nrows, columns col .. col + 2L."""
        accs = [[entry.alloca(vec) for _ in range(2)] for _ in range(nrows)]
        for pair in accs:
            for acc in pair:
                b.store(zero, acc)

        def step(b: ir.IRBuilder, k: ir.Value) -> None:
            # Panel col / 2L holds k_size rows of 2L contiguous values.
            row = b.add(b.mul(col, c(k_size)), b.mul(k, c(2 * L)))
            ws = [b.load(b.bitcast(b.gep(packed, [b.add(row, c(h * L))]), vptr), align=4)
                  for h in range(2)]
            for i in range(nrows):
                s = b.load(b.gep(a, [b.add(b.mul(b.add(r0, c(i)), c(k_size)), k)]))
                v = b.shuffle_vector(b.insert_element(ir.Constant(vec, None), s, c(0)),
                                     ir.Constant(vec, None), mask)
                for h in range(2):
                    b.store(b.call(fma, [v, ws[h], b.load(accs[i][h])]), accs[i][h])

        loop(b, c(0), c(k_size), 1, step)
        for i in range(nrows):
            base = b.add(b.mul(b.add(r0, c(i)), c(n)), col)
            for h in range(2):
                dst = b.bitcast(b.gep(out, [b.add(base, c(h * L))]), vptr)
                b.store(b.load(accs[i][h]), dst, align=4)

    body = ir.IRBuilder(fn.append_basic_block("start"))

    def pack_panel(b: ir.IRBuilder, col: ir.Value) -> None:
        def row(b: ir.IRBuilder, k: ir.Value) -> None:
            dst = b.add(b.mul(col, c(k_size)), b.mul(k, c(2 * L)))
            if transposed:  # w is (n, k): column k of the panel's rows, gathered
                for j in range(2 * L):
                    src = b.add(b.mul(b.add(col, c(j)), c(k_size)), k)
                    b.store(b.load(b.gep(w, [src])), b.gep(packed, [b.add(dst, c(j))]))
                return
            src = b.add(b.mul(k, c(n)), col)
            for h in range(2):
                v = b.load(b.bitcast(b.gep(w, [b.add(src, c(h * L))]), vptr), align=4)
                b.store(v, b.bitcast(b.gep(packed, [b.add(dst, c(h * L))]), vptr), align=4)
        loop(b, c(0), c(k_size), 1, row)

    with body.if_then(body.icmp_unsigned("!=", body.load(marker), w)):
        loop(body, c(0), c(n), 2 * L, pack_panel)
        body.store(w, marker)

    def panel(b: ir.IRBuilder, col: ir.Value) -> None:
        end = loop(b, c(0), rows, ROWS, lambda b, r0: block(b, r0, ROWS, col))
        # The rows left over (fewer than ROWS) as one block of their own height.
        left = b.sub(rows, end)
        for height in range(1, ROWS):
            with b.if_then(b.icmp_signed("==", left, c(height))):
                block(b, end, height, col)

    loop(body, c(0), c(n), 2 * L, panel)
    body.ret_void()
    entry.branch(fn.blocks[1])
    return fn


def _suffix(scalar: ir.Type) -> str:
    return "f32" if isinstance(scalar, ir.FloatType) else "f64"
