"""The bfloat16 GEMM on Intel AMX tiles: ``ldtilecfg``, ``tileloadd``, ``tdpbf16ps``,
``tilestored``.

``out[:rows, panels] = abuf @ packed`` in the formats of :mod:`rnnc.backends.llvm.bf16`. The
eight tile registers hold a 2 x 2 block of float32 accumulators (tiles 0-3, 16 rows x 16
columns each: 32 rows x one panel), two A tiles (4, 5: 16 rows x 32 bf16 of ``abuf``) and
two B tiles (6, 7: 16 pair rows x 16 columns of the panel). Per block of 32 K values, four
``tdpbf16ps`` (16 x 16 x 32 multiply-adds each) follow four loads.

The tiles are named by number through LLVM's ``llvm.x86.tileloadd64``, ``tdpbf16ps``,
``tilestored64``, ``tilezero``, ``ldtilecfg`` and ``tilerelease`` intrinsics, which take the
tile as an immediate; the configuration (64 bytes: palette 1, each tile's bytes per row and
rows) is written on the stack. The rows left after whole 16-row tiles run under a second
configuration whose A and C tiles have only those rows, so no load reads past ``abuf`` and
no store writes past ``out``; the columns of a last, partial panel go through a scratch tile
on the stack.

The functions carry the AMX target features (:func:`rnnc.backends.llvm.bf16.
with_target_features`), and run only where :func:`rnnc.backends.llvm.bf16.host_tier` says
``"amx"``: the CPU has the tiles and the Linux kernel granted the process their state.
"""

from __future__ import annotations

from llvmlite import ir

from rnnc.backends.llvm.bf16 import BF16P, F32, PANEL, internal_function
from rnnc.backends.llvm.context import I8, I64
from rnnc.backends.llvm.dpbf16 import depth_values
from rnnc.backends.llvm.kernels import emit_loop

TILE_ROWS = 16
TILE_BYTES = 64  # bytes per tile row: 16 float32 or 32 bf16
ROW_BLOCK = 64  # rows of abuf multiplied by each panel of a group in turn (in L2)
GROUP = 8  # panels of a group: their packed weights stay in L2
C_TILES, A_TILES, B_TILES = (0, 1, 2, 3), (4, 5), (6, 7)
I16 = ir.IntType(16)
I8P = I8.as_pointer()


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _t(v: int) -> ir.Constant:
    return ir.Constant(I8, v)


def _intrinsic(module: ir.Module, name: str, args: list[ir.Type]) -> ir.Function:
    full = f"llvm.x86.{name}"
    return module.globals.get(full) or ir.Function(
        module, ir.FunctionType(ir.VoidType(), args), full)


def gemm_function(module: ir.Module, k: int | None, n: int) -> ir.Function:
    """``rnnc.amx.gemm.KxN``, built once per module: see
    :func:`rnnc.backends.llvm.bf16.gemm_function`; ``k=None``: the depth is the call's
    (``rnnc.amx.gemm.dynxN``, its last argument ``i64 k``)."""
    name = f"rnnc.amx.gemm.{'dyn' if k is None else k}x{n}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return _Builder(module, name, k, n).fn


class _Builder:
    def __init__(self, module: ir.Module, name: str, k: int | None, n: int) -> None:
        self.n = n
        args = [I64, BF16P, BF16P, F32.as_pointer(), I64, I64] + ([I64] if k is None else [])
        self.fn, _ = internal_function(module, name, args)
        self.rows, self.abuf, self.packed, self.out, first, stop = self.fn.args[:6]
        self.load = _intrinsic(module, "tileloadd64", [I8, I8P, I64])
        self.store = _intrinsic(module, "tilestored64", [I8, I8P, I64])
        self.dot = _intrinsic(module, "tdpbf16ps", [I8, I8, I8])
        self.zero = _intrinsic(module, "tilezero", [I8])
        self.ldtilecfg = _intrinsic(module, "ldtilecfg", [I8P])
        self.release = _intrinsic(module, "tilerelease", [])
        b = self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        self.kp = depth_values(b, self.fn.args[6] if k is None else k)[0]
        self.config = b.alloca(ir.ArrayType(I8, 64))
        self.config.align = 64
        self.scratch = b.alloca(ir.ArrayType(F32, TILE_ROWS * TILE_ROWS))
        self.scratch.align = 64
        b.call(module.declare_intrinsic("llvm.memset", [I8P, I64]),
               [b.bitcast(self.config, I8P), _t(0), _c(64), ir.Constant(ir.IntType(1), 0)])
        self.configure(_c(TILE_ROWS))
        self.body(first, stop)
        b.call(self.release, [])
        b.ret_void()

    def configure(self, rows: ir.Value) -> None:
        """Load the tile configuration with ``rows`` rows in the A and C tiles."""
        b = self.b
        base = b.bitcast(self.config, I8P)
        b.store(_t(1), base)  # palette 1
        count = b.trunc(rows, I8)
        for tile in C_TILES + A_TILES + B_TILES:
            colsb = b.bitcast(b.gep(base, [_c(16 + 2 * tile)]), I16.as_pointer())
            b.store(ir.Constant(I16, TILE_BYTES), colsb)
            b.store(_t(TILE_ROWS) if tile in B_TILES else count, b.gep(base, [_c(48 + tile)]))
        b.call(self.ldtilecfg, [base])

    def body(self, first: ir.Value, stop: ir.Value) -> None:
        b = self.b

        def group(g: ir.Value) -> None:
            start = b.add(first, b.mul(g, _c(GROUP)))
            end = _min(b, b.add(start, _c(GROUP)), stop)

            # Whole 16-row tiles; the rows after them go last, under their own configuration.
            whole = b.mul(b.sdiv(self.rows, _c(TILE_ROWS)), _c(TILE_ROWS))
            emit_loop(b, _c(0), b.sdiv(b.add(whole, _c(ROW_BLOCK - 1)), _c(ROW_BLOCK)), 1,
                      lambda blk: self.blocked(blk, whole, start, end))
            left = b.sub(self.rows, whole)
            with b.if_then(b.icmp_signed(">", left, _c(0))):
                self.configure(left)
                emit_loop(b, start, end, 1, lambda p: self.block(p, whole, 1, left))
                self.configure(_c(TILE_ROWS))

        emit_loop(b, _c(0), b.sdiv(b.add(b.sub(stop, first), _c(GROUP - 1)), _c(GROUP)), 1,
                  group)

    def blocked(self, blk: ir.Value, whole: ir.Value, start: ir.Value, end: ir.Value) -> None:
        """Rows ``blk * ROW_BLOCK ..`` (whole tiles, up to ``whole``) of panels ``start ..
        end``: two row tiles at a time, then one."""
        b = self.b
        r0 = b.mul(blk, _c(ROW_BLOCK))
        r1 = _min(b, b.add(r0, _c(ROW_BLOCK)), whole)

        def panel(p: ir.Value) -> None:
            after = emit_loop(b, r0, r1, 2 * TILE_ROWS,
                              lambda r: self.block(p, r, 2, _c(TILE_ROWS)))
            with b.if_then(b.icmp_signed("<", after, r1)):
                self.block(p, after, 1, _c(TILE_ROWS))

        emit_loop(b, start, end, 1, panel)

    def block(self, p: ir.Value, r0: ir.Value, row_tiles: int, height: ir.Value) -> None:
        """Rows ``r0 ..`` (``row_tiles`` tiles of ``height`` rows) x panel ``p``."""
        b, kp = self.b, self.kp
        blocks = b.sdiv(kp, _c(32))
        accumulators = [[C_TILES[2 * i + h] for h in range(2)] for i in range(row_tiles)]
        for tile in sum(accumulators, []):
            b.call(self.zero, [_t(tile)])
        a_rows = [b.bitcast(b.gep(self.abuf, [b.mul(b.add(r0, _c(TILE_ROWS * i)), kp)]),
                            I8P) for i in range(row_tiles)]
        panel = b.bitcast(b.gep(self.packed, [b.mul(p, b.mul(kp, _c(PANEL)))]), I8P)

        def depth(kb: ir.Value) -> None:
            # A: 32 bf16 of K from each row; B: 16 pair rows of 2 * PANEL bf16 (128 bytes).
            offset = b.mul(kb, _c(2 * 32))
            for i in range(row_tiles):
                b.call(self.load, [_t(A_TILES[i]), b.gep(a_rows[i], [offset]), b.mul(kp, _c(2))])
            rows = b.gep(panel, [b.mul(kb, _c(16 * 4 * PANEL))])
            for h in range(2):
                b.call(self.load, [_t(B_TILES[h]), b.gep(rows, [_c(TILE_BYTES * h)]),
                                   _c(4 * PANEL)])
            for i in range(row_tiles):
                for h in range(2):
                    b.call(self.dot, [_t(accumulators[i][h]), _t(A_TILES[i]), _t(B_TILES[h])])

        emit_loop(b, _c(0), blocks, 1, depth)
        for i in range(row_tiles):
            for h in range(2):
                self.store_tile(accumulators[i][h], b.add(r0, _c(TILE_ROWS * i)),
                                b.add(b.mul(p, _c(PANEL)), _c(16 * h)), height)

    def store_tile(self, tile: int, row: ir.Value, column: ir.Value, height: ir.Value) -> None:
        """Accumulator ``tile`` to ``out[row:, column:]``: straight where its 16 columns are in
        ``out``, else through the scratch tile, ``height`` rows of its columns inside."""
        b = self.b
        dst = b.gep(self.out, [b.add(b.mul(row, _c(self.n)), column)])
        if self.n % PANEL == 0:
            b.call(self.store, [_t(tile), b.bitcast(dst, I8P), _c(4 * self.n)])
            return
        whole = b.icmp_signed("<=", b.add(column, _c(16)), _c(self.n))
        with b.if_else(whole) as (inside, edge):
            with inside:
                b.call(self.store, [_t(tile), b.bitcast(dst, I8P), _c(4 * self.n)])
            with edge:
                b.call(self.store, [_t(tile), b.bitcast(self.scratch, I8P), _c(TILE_BYTES)])
                width = _min(b, b.sub(_c(self.n), column), _c(16))
                width = b.select(b.icmp_signed("<", width, _c(0)), _c(0), width)
                scratch = b.bitcast(self.scratch, F32.as_pointer())

                def copy_row(r: ir.Value) -> None:
                    emit_loop(b, _c(0), width, 1, lambda j: b.store(
                        b.load(b.gep(scratch, [b.add(b.mul(r, _c(16)), j)])),
                        b.gep(dst, [b.add(b.mul(r, _c(self.n)), j)])))

                emit_loop(b, _c(0), height, 1, copy_row)


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)
