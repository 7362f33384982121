"""The register-tiled bfloat16 GEMM on AVX-512: ``vdpbf16ps``, or its exact emulation.

``out[:rows, panels] = abuf @ packed`` in the formats of :mod:`rnnc.backends.llvm.bf16`. A tile
of ``rows`` x :data:`~rnnc.backends.llvm.bf16.PANEL` results stays in vector registers over
the whole K loop: per pair of K rows it loads the panel's two vectors of 16 interleaved pairs
and, per row, broadcasts the row's pair of bf16 values as one 32-bit word.

- ``native``: one ``vdpbf16ps`` per row and vector adds both products of the pair into the
  float32 accumulator (the instruction treats subnormal inputs and results as zero).
- emulation: the pair's values widened to float32 (exact) and two FMAs, first the even then
  the odd K row: the float32 GEMM of the rounded operands, on any AVX-512 or AVX2 core.

The loops are blocked for the caches: groups of :data:`GROUP` panels, and within a group,
blocks of :data:`ROW_BLOCK` rows of ``abuf`` (in L2) multiplied by each panel of the group in
turn (the panel is read by every tile of the block, from L2 after the first). A group holds
the 2048 columns of a C1 LSTM's gates: the hoisted projection then reads each block of rows
from memory once, and streams the packed weights (2 MB, from L3) once per block, which
measured faster (211 against 205 GFLOP/s at 6400 x 512 x 2048 on one Zen 4 core) than groups
of 8 panels whose weights stay in L2 while the block of rows is read from memory once per
group. A per-step product (one block of rows) reads the weights once either way.
"""

from __future__ import annotations

from llvmlite import ir

from rnnc.backends.llvm.bf16 import (
    BF16,
    BF16P,
    F32,
    I16,
    K_BLOCK,
    PANEL,
    from_bf16,
    internal_function,
    padded_k,
)
from rnnc.backends.llvm.context import I32, I64
from rnnc.backends.llvm.kernels import emit_loop

LANES = 16  # float32 lanes of a zmm register: half a panel
NATIVE_ROWS = 8  # 16 accumulators + 2 panel vectors + broadcasts fit in 32 zmm
EMULATED_ROWS = 6  # 12 accumulators + 4 widened panel vectors + broadcasts
ROW_BLOCK = 64
GROUP = 64


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def gemm_function(module: ir.Module, k: int | None, n: int, native: bool) -> ir.Function:
    """``rnnc.dpbf16.gemm.KxN`` (``rnnc.bf16emu.gemm.KxN`` when not ``native``), built once
    per module: see :func:`rnnc.backends.llvm.bf16.gemm_function`; ``k=None``: the depth is
    the call's (``...gemm.dynxN``, its last argument ``i64 k``)."""
    name = f"rnnc.{'dpbf16' if native else 'bf16emu'}.gemm.{'dyn' if k is None else k}x{n}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return _Builder(module, name, k, n, native).fn


class _Builder:
    def __init__(self, module: ir.Module, name: str, k: int | None, n: int,
                 native: bool) -> None:
        self.n, self.native = n, native
        self.height = NATIVE_ROWS if native else EMULATED_ROWS
        self.vec = ir.VectorType(F32, LANES)
        args = [I64, BF16P, BF16P, F32.as_pointer(), I64, I64] + ([I64] if k is None else [])
        self.fn, _ = internal_function(module, name, args)
        self.rows, self.abuf, self.packed, self.out, first, stop = self.fn.args[:6]
        for arg in (self.abuf, self.packed, self.out):
            arg.add_attribute("noalias")
        self.entry = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.b = ir.IRBuilder(self.fn.append_basic_block("start"))
        # The padded depth (abuf's row, a panel's pair rows) and the pairs multiplied.
        self.kp, self.pairs = depth_values(self.b, self.fn.args[6] if k is None else k)
        if native:
            self.dot = module.globals.get("llvm.x86.avx512bf16.dpbf16ps.512") or ir.Function(
                module, ir.FunctionType(self.vec, [self.vec, ir.VectorType(BF16, 2 * LANES),
                                                   ir.VectorType(BF16, 2 * LANES)]),
                "llvm.x86.avx512bf16.dpbf16ps.512")
        else:
            fma = f"llvm.fma.v{LANES}f32"
            self.fma = module.globals.get(fma) or ir.Function(
                module, ir.FunctionType(self.vec, [self.vec] * 3), fma)
        self.body(first, stop)
        self.b.ret_void()
        self.entry.branch(self.fn.blocks[1])

    def body(self, first: ir.Value, stop: ir.Value) -> None:
        b = self.b

        def group(g: ir.Value) -> None:
            start = b.add(first, b.mul(g, _c(GROUP)))
            end = _min(b, b.add(start, _c(GROUP)), stop)

            def block(blk: ir.Value) -> None:
                r0 = b.mul(blk, _c(ROW_BLOCK))
                r1 = _min(b, b.add(r0, _c(ROW_BLOCK)), self.rows)
                emit_loop(b, start, end, 1, lambda p: self.panel(p, r0, r1))

            emit_loop(b, _c(0), _ceil_div(b, self.rows, ROW_BLOCK), 1, block)

        emit_loop(b, _c(0), _ceil_div(b, b.sub(stop, first), GROUP), 1, group)

    def panel(self, p: ir.Value, r0: ir.Value, r1: ir.Value) -> None:
        """Rows ``r0 .. r1`` of panel ``p``, in tiles of ``height`` rows and one shorter."""
        b = self.b
        end = emit_loop(b, r0, r1, self.height, lambda r: self.tile(p, r, self.height))
        left = b.sub(r1, end)
        for height in range(1, self.height):
            with b.if_then(b.icmp_signed("==", left, _c(height))):
                self.tile(p, end, height)

    def tile(self, p: ir.Value, r0: ir.Value, height: int) -> None:
        b, vec = self.b, self.vec
        accs = [[self.entry.alloca(vec) for _ in range(2)] for _ in range(height)]
        for pair in accs:
            for acc in pair:
                b.store(ir.Constant(vec, [0.0] * LANES), acc)
        row_pairs = [b.bitcast(b.gep(self.abuf, [b.mul(b.add(r0, _c(i)), self.kp)]),
                               I32.as_pointer()) for i in range(height)]
        panel = b.gep(self.packed, [b.mul(p, b.mul(self.kp, _c(PANEL)))])
        wide, bits = ir.VectorType(BF16, 2 * LANES), ir.VectorType(I16, 2 * LANES)

        def pair(q: ir.Value) -> None:
            row = b.gep(panel, [b.mul(q, _c(2 * PANEL))])
            ws = [b.load(b.bitcast(b.gep(row, [_c(2 * LANES * h)]), bits.as_pointer()), align=2)
                  for h in range(2)]
            if self.native:
                ws = [b.bitcast(w, wide) for w in ws]
            else:
                ws = [[from_bf16(b, b.shuffle_vector(w, w, _lanes(j))) for j in range(2)]
                      for w in ws]
            for i in range(height):
                word = b.load(b.gep(row_pairs[i], [q]), align=4)
                if self.native:
                    both = b.bitcast(_splat(b, word, ir.VectorType(I32, LANES)), wide)
                    for h in range(2):
                        b.store(b.call(self.dot, [b.load(accs[i][h]), both, ws[h]]), accs[i][h])
                    continue
                halves = b.bitcast(word, ir.VectorType(I16, 2))
                scalars = [from_bf16(b, b.extract_element(halves, _c(j))) for j in range(2)]
                for h in range(2):
                    acc = b.load(accs[i][h])
                    for j in range(2):  # the even K row first: the order of a float32 GEMM
                        acc = b.call(self.fma, [_splat(b, scalars[j], vec), ws[h][j], acc])
                    b.store(acc, accs[i][h])

        emit_loop(b, _c(0), self.pairs, 1, pair)
        for i in range(height):
            base = b.gep(self.out, [b.add(b.mul(b.add(r0, _c(i)), _c(self.n)),
                                          b.mul(p, _c(PANEL)))])
            for h in range(2):
                self.store(b.load(accs[i][h]), b.gep(base, [_c(LANES * h)]),
                           b.add(b.mul(p, _c(PANEL)), _c(LANES * h)))

    def store(self, value: ir.Value, dst: ir.Value, column: ir.Value) -> None:
        """The 16 results of ``value`` at ``dst``, those at columns ``column + j >= N`` left
        out (only a last, partial panel has them)."""
        b = self.b
        if self.n % PANEL == 0:
            b.store(value, b.bitcast(dst, self.vec.as_pointer()), align=4)
            return
        # A masked store: lanes j with column + j < N.
        lanes = ir.Constant(ir.VectorType(I64, LANES), list(range(LANES)))
        left = _splat(b, b.sub(_c(self.n), column), ir.VectorType(I64, LANES))
        mask = b.icmp_signed("<", lanes, left)
        name = f"llvm.masked.store.v{LANES}f32.p0"
        module = b.module
        store = module.globals.get(name) or ir.Function(module, ir.FunctionType(
            ir.VoidType(), [self.vec, self.vec.as_pointer(), I32, mask.type]), name)
        b.call(store, [value, b.bitcast(dst, self.vec.as_pointer()), ir.Constant(I32, 4), mask])


def depth_values(b: ir.IRBuilder, k: int | ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(Kp, pairs)`` as i64 values: K padded to :data:`~rnnc.backends.llvm.bf16.K_BLOCK`
    and the pairs of K rows (the last one half zero when K is odd); constants for a fixed
    K, computed from the call's ``k`` for a runtime depth."""
    if isinstance(k, int):
        return _c(padded_k(k)), _c(-(-k // 2))
    return b.mul(b.sdiv(b.add(k, _c(K_BLOCK - 1)), _c(K_BLOCK)), _c(K_BLOCK)), \
        b.sdiv(b.add(k, _c(1)), _c(2))


def _lanes(parity: int) -> ir.Constant:
    """Shuffle mask picking the even (0) or odd (1) lanes of 32."""
    return ir.Constant(ir.VectorType(I32, LANES), [2 * j + parity for j in range(LANES)])


def _splat(b: ir.IRBuilder, value: ir.Value, vec: ir.VectorType) -> ir.Value:
    one = b.insert_element(ir.Constant(vec, None), value, _c(0))
    return b.shuffle_vector(one, ir.Constant(vec, None),
                            ir.Constant(ir.VectorType(I32, vec.count), [0] * vec.count))


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _ceil_div(b: ir.IRBuilder, x: ir.Value, d: int) -> ir.Value:
    return b.sdiv(b.add(x, _c(d - 1)), _c(d))
