"""LLVM rules of the tensor ops (``rnnc/ops_tensor.py``): each one loop nest over letters.

Every tensor op is a contraction: the result at an index of its letters is the sum, over the
letters it lacks, of the product of its operands at theirs. ``reshape`` reads its operand as
the same flat features (layouts are row-major), ``sum_axis`` and ``sum_lead`` read one operand
with more letters than the result, ``einsum`` spells its spec's letters (its rows ``...`` as
letters of their own). A buffer is viewed with one axis per letter; the result's letters are
the outer loops, the summed letters the inner ones, accumulated in a register.

A head-wise product ``"...hd,hde->...he"`` whose operands are laid out as per-head matrices
runs as one BLAS GEMM per head inside the same generated function (:mod:`.gemm`), in a loop
over the heads: one batched product per step, never one rnnc call per head. A thread team
splits the loop's heads between its threads (:mod:`.team`), so each thread reads only its
heads' weights, and counts the product's multiply-adds as team work (:mod:`.split`).
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import gemm
from rnnc.backends.llvm.context import I64, Buffer, Context
from rnnc.backends.llvm.kernels import Kernel, emit_loop, emit_sum_rows
from rnnc.ir import Node
from rnnc.ops_tensor import explicit


def _contract(ctx: Context, name: str, out: Buffer, out_letters: str,
              operands: list[tuple[Buffer, str]], sizes: dict[str, object]) -> None:
    """``out[out_letters] = sum over the other letters of prod operand[letters]``."""
    kernel = Kernel(ctx, name, [out] + [buf for buf, _ in operands])
    b = kernel.builder
    summed = "".join(dict.fromkeys(c for _, ls in operands for c in ls if c not in out_letters))
    acc = b.alloca(ctx.scalar)  # in the entry block: one register, not one slot per element

    def product(at: dict) -> ir.Value:
        value = None
        for k, (_, letters) in enumerate(operands, start=1):
            x = kernel.load(k, tuple(at[c] for c in letters))
            value = x if value is None else b.fmul(value, x)
        return value

    def element(index: tuple) -> None:
        at = dict(zip(out_letters, index, strict=True))
        if not summed:
            kernel.store(0, index, product(at))
            return
        b.store(ir.Constant(ctx.scalar, 0.0), acc)
        kernel.nest(tuple(sizes[c] for c in summed), lambda inner: b.store(
            b.fadd(b.load(acc), product({**at, **dict(zip(summed, inner, strict=True))})), acc))
        kernel.store(0, index, b.load(acc))

    kernel.nest(tuple(sizes[c] for c in out_letters), element)
    kernel.finish()


def _letters(n: int) -> str:
    return string.ascii_letters[:n]


def _reshape(ctx: Context, node: Node, out: Buffer, a: Buffer) -> None:
    lead = a.shape[:len(a.shape) - node.attrs["rank"]]
    flat = lead + (math.prod(node.attrs["shape"]),)
    letters = _letters(len(flat))
    _contract(ctx, "reshape", Buffer(out.ptr, flat), letters, [(Buffer(a.ptr, flat), letters)],
              dict(zip(letters, flat, strict=True)))


def _sum_axis(ctx: Context, node: Node, out: Buffer, a: Buffer) -> None:
    axis = len(a.shape) + node.attrs["axis"]
    inner = math.prod(a.shape[axis + 1:])  # feature axes: sizes known at compile time
    _sum_middle(ctx, Buffer(a.ptr, a.shape[:axis + 1] + (inner,)),
                Buffer(out.ptr, a.shape[:axis] + (inner,)))


def _sum_middle(ctx: Context, a: Buffer, out: Buffer) -> None:
    """``out[o, j] = sum over k of a[o, k, j]``, ``a`` viewed as ``(outer..., K, inner)``.

    The inner axis is the innermost loop, so that the adds of contiguous elements vectorize
    (each element still adds its ``K`` terms in order: the sums are those of a loop nest that
    runs ``k`` innermost, bit for bit); with ``k`` innermost, a sum over an axis other than
    the last read one element per row of ``inner`` and did not vectorize."""
    kernel = Kernel(ctx, "sum_axis", [out, a])
    b = kernel.builder
    inner = kernel.dim(a.shape[-1])

    def outer(index: tuple) -> None:
        kernel.loop(inner, lambda j: kernel.store(0, index + (j,), ir.Constant(ctx.scalar, 0.0)))
        kernel.loop(kernel.dim(a.shape[-2]), lambda k: kernel.loop(inner, lambda j: kernel.store(
            0, index + (j,), b.fadd(kernel.load(0, index + (j,)), kernel.load(1, index + (k, j))))))

    kernel.nest(a.shape[:-2], outer)
    kernel.finish()


def _sum_lead(ctx: Context, node: Node, out: Buffer, a: Buffer) -> None:
    # A sum over the rows of ``a`` viewed as (leading axes..., the kept axes flattened), row
    # after row: the kept axes are the innermost, contiguous loop (see _sum_middle).
    lead = a.shape[:len(a.shape) - node.attrs["rank"]]
    width = math.prod(a.shape[len(lead):])
    emit_sum_rows(ctx, Buffer(a.ptr, lead + (width,)), Buffer(out.ptr, (width,)))


def _einsum(ctx: Context, node: Node, out: Buffer, *operands: Buffer) -> None:
    terms, out_term, sizes = _einsum_letters(node, operands)
    if _headwise(ctx, terms, out_term, out, operands, sizes):
        return
    _contract(ctx, "einsum", out, out_term, list(zip(operands, terms, strict=True)), sizes)


def _einsum_letters(node: Node, operands: Sequence[Buffer | tuple]
                    ) -> tuple[list[str], str, dict[str, object]]:
    """An einsum's operand terms and output term, explicit (rows as letters), and each
    letter's size, from its operands (buffers or shapes)."""
    shapes = [o if isinstance(o, tuple) else o.shape for o in operands]
    terms, out_term, _ = explicit(node.attrs["spec"], shapes)
    sizes: dict[str, object] = {}
    for shape, term in zip(shapes, terms, strict=True):
        sizes.update(zip(term, shape, strict=True))
    return terms, out_term, sizes


def _row_form(terms: list[str], out_term: str) -> tuple[str, str, str, str, bool] | None:
    """(rows, heads, k, n, transposed weight) of a head-wise product with rows,
    ``rows h k, h k n -> rows h n`` (``h n k`` transposed: the input's gradient)."""
    if len(terms) != 2 or len(terms[1]) != 3:
        return None
    x, w = terms
    rows, heads, k, n = x[:-2], x[-2:-1], x[-1:], out_term[-1:]
    if not rows or out_term != rows + heads + n or w[0] != heads or w[1:] not in (k + n, n + k):
        return None
    return rows, heads, k, n, w[1:] == n + k


def heads_of(node: Node, operands: Sequence[Buffer | tuple]) -> int | None:
    """The number of heads of a head-wise product with rows (``"...hd,hde->...he"`` and the
    input-gradient form), which a team splits by heads; None for other einsums."""
    if node.op is not ops.einsum:
        return None
    terms, out_term, sizes = _einsum_letters(node, operands)
    form = _row_form(terms, out_term)
    return None if form is None else int(sizes[form[1]])  # type: ignore[call-overload]


def head_work(node: Node, operands: Sequence[tuple]) -> int:
    """The multiply-adds per batch row of a head-wise product a team splits by heads (more
    than one head, rows ``(B,)``), else 0."""
    heads = heads_of(node, operands)
    if heads is None or heads < 2 or tuple(operands[0][:-2]) != ("B",):
        return 0
    return math.prod(int(d) for d in operands[1])


def emit_heads(ctx: Context, terms: list[str], out_term: str, sizes: dict, out: Buffer,
               operands: list[Buffer], span: tuple[ir.Value, ir.Value]) -> None:
    """The heads ``span`` (``[first, stop)``) of a head-wise product with rows
    (:func:`_row_form`), over every row: one BLAS GEMM per head, in a loop over the heads (in
    a team's step, each thread its own heads, so each reads only its heads' weights)."""
    form = _row_form(terms, out_term)
    assert form is not None, (terms, out_term)
    rows, heads, k, n, transb = form
    H, K, N = sizes[heads], sizes[k], sizes[n]
    dims = tuple(sizes[c] for c in rows)
    count, b = ctx.numel(dims), ctx.builder
    left, right = operands

    def at(buf: Buffer, h: ir.Value, stride: int) -> ir.Value:
        return b.gep(buf.ptr, [b.mul(h, ir.Constant(I64, stride))], inbounds=True)

    def head(h: ir.Value) -> None:
        gemm.emit_blas_gemm(ctx, False, transb, (dims, (N,), (K,)), count, N, K,
                            at(left, h, K), H * K, at(right, h, K * N), K if transb else N,
                            at(out, h, N), H * N)

    emit_loop(b, span[0], span[1], 1, head, ("heads", "head", "heads_done"))


def emit_heads_of(ctx: Context, node: Node, out: Buffer, operands: list[Buffer],
                  span: tuple[ir.Value, ir.Value]) -> None:
    """:func:`emit_heads` for the einsum ``node`` that :func:`heads_of` accepts."""
    terms, out_term, sizes = _einsum_letters(node, operands)
    emit_heads(ctx, terms, out_term, sizes, out, operands, span)


def _headwise(ctx: Context, terms: list[str], out_term: str, out: Buffer,
              operands: tuple[Buffer, ...], sizes: dict) -> bool:
    """A head-wise product as one GEMM per head ``h``, each head's rows a strided matrix of
    the batched operands: ``rows h k, h k n -> rows h n`` (``h n k`` for the product with the
    transpose, the input's gradient; :func:`emit_heads`) or ``rows h n, rows h k -> h k n``
    (the weight's gradient, a sum over the rows). False when the spec has another form."""
    if _row_form(terms, out_term) is not None:
        heads = ir.Constant(I64, int(sizes[_row_form(terms, out_term)[1]]))
        emit_heads(ctx, terms, out_term, sizes, out, list(operands), (ir.Constant(I64, 0), heads))
        return True
    if len(terms) != 2 or len(terms[0]) != len(terms[1]):
        return False
    (x, w), b = terms, ctx.builder
    if not (len(out_term) == 3 and x[:-2] == w[:-2] and len(x) > 2):
        return False
    rows, heads, n, k = x[:-2], x[-2], x[-1], w[-1]
    if w[-2] != heads or out_term != heads + k + n:
        return False
    H, K, N = sizes[heads], sizes[k], sizes[n]
    dims = tuple(sizes[c] for c in rows)
    count = ctx.numel(dims)
    right, left = operands

    def at(buf: Buffer, offset: int) -> ir.Value:
        return b.gep(buf.ptr, [ir.Constant(I64, offset)], inbounds=True)

    for h in range(H):  # H is a compile-time size: the per-head offsets are constants
        # (K, rows) @ (rows, N) into head h's (K, N) block
        gemm.emit_blas_gemm(ctx, True, False, ((K,), (N,), dims), ctx.dim(K), N, count,
                            at(left, h * K), H * K, at(right, h * N), H * N,
                            at(out, h * K * N), N)
    return True


RULES = {
    ops.reshape: _reshape,
    ops.sum_axis: _sum_axis,
    ops.sum_lead: _sum_lead,
    ops.einsum: _einsum,
}
