"""bfloat16 GEMMs (``matmul[precision=bf16]``) on any x86 CPU: the exact emulation.

A bfloat16 GEMM rounds both operands to bfloat16 (round to nearest, ties to even; NaN stays
NaN) and sums the products in float32 (:mod:`rnnc.precision`). The product of two bfloat16
values is exact in float32, so rounding the operands into workspace buffers and running the
float32 GEMM of the same node gives exactly that, whichever float32 kernel then runs (the
axpy-form one, the panel kernel or the BLAS); only the order of the float32 sums differs from
the reference's, as it does for float32 GEMMs.

A weight matrix (a loop constant: an argument of the graph with no ``T`` or ``B`` axis) is
rounded once per call: a marker in the entry block remembers which matrix the workspace
holds, as the panel kernel remembers what it packed. Activations are rounded at every use.

:func:`emit_matmul` is the one entry point of the LLVM lowering (``rules._matmul``), the place
native bfloat16 kernels (AMX ``tdpbf16ps``, AVX512-BF16 ``vdpbf16ps``) take over.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from rnnc.backends.llvm.context import I8P, I32, I64, Buffer, Context
from rnnc.backends.llvm.kernels import emit_loop
from rnnc.ir import ARG, Node

_HALF_MINUS_ONE = 0x7FFF  # half a bfloat16 unit in the last place, less one
_KEEP = -0x10000  # 0xFFFF0000 as i32: the bits bfloat16 keeps (sign, exponent, 7 mantissa)

# The float32 lowering of a matmul node: (ctx, node, out, a, b).
Lowering = Callable[[Context, Node, Buffer, Buffer, Buffer], None]


def emit_matmul(ctx: Context, node: Node, out: Buffer, a: Buffer, b: Buffer,
                fp32: Lowering) -> None:
    """``out = a @ b`` with bfloat16 operands and float32 sums: ``fp32`` (the float32
    lowering of the node) on operands rounded to bfloat16."""
    rounded_a = ctx.slot(a.shape)
    emit_round(ctx, a, rounded_a)
    rounded_b = ctx.slot(b.shape)
    if _is_constant(ctx, node.inputs[1], b):
        _round_once(ctx, b, rounded_b)
    else:
        emit_round(ctx, b, rounded_b)
    fp32(ctx, node, out, rounded_a, rounded_b)


def _is_constant(ctx: Context, nid: int, buffer: Buffer) -> bool:
    """Whether the operand holds one value for the whole call: a graph argument (a parameter
    or a loop constant) without a ``T`` or ``B`` axis."""
    node = ctx.nodes.get(nid)
    return node is not None and node.op is ARG and not any(
        isinstance(d, str) for d in buffer.shape)


def _round_once(ctx: Context, src: Buffer, dst: Buffer) -> None:
    """``dst = round(src)`` on the first use in a call: later uses find the marker set."""
    marker = ctx.entry.alloca(I8P)
    ctx.entry.store(ir.Constant(I8P, None), marker)
    b = ctx.builder
    source = b.bitcast(src.ptr, I8P)
    with b.if_then(b.icmp_unsigned("!=", b.load(marker), source)):
        emit_round(ctx, src, dst)
        b.store(source, marker)


def emit_round(ctx: Context, src: Buffer, dst: Buffer) -> None:
    """``dst = src`` rounded to bfloat16 (kept as float32), element by element."""
    b = ctx.builder
    src_bits = b.bitcast(src.ptr, I32.as_pointer())
    dst_bits = b.bitcast(dst.ptr, I32.as_pointer())

    def element(i: ir.Value) -> None:
        bits = b.load(b.gep(src_bits, [i]))
        b.store(round_bits(b, bits), b.gep(dst_bits, [i]))

    emit_loop(b, ir.Constant(I64, 0), ctx.numel(src.shape), 1, element,
              ("bf16.head", "bf16.body", "bf16.done"))


def round_bits(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The float32 bits ``bits`` rounded to bfloat16, ties to even; a NaN is kept as it is."""
    odd = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    up = b.add(b.add(bits, ir.Constant(I32, _HALF_MINUS_ONE)), odd)
    rounded = b.and_(up, ir.Constant(I32, _KEEP))
    magnitude = b.and_(bits, ir.Constant(I32, 0x7FFFFFFF))
    nan = b.icmp_unsigned(">", magnitude, ir.Constant(I32, 0x7F800000))
    return b.select(nan, bits, rounded)
