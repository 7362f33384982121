"""The arguments rnnc gives cublasGemmEx and cublasGemmStridedBatchedEx (backends/cuda/blas.py)
for row-major views, checked on the CPU: the operands are read back as column-major memory with
those arguments, as cuBLAS reads them (each matrix of a batch one stride further on), and the
product compared with NumPy's. A GPU runs the calls themselves (test_cuda_on_gpu.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from rnnc.backends.cuda.blas import (
    OP_N,
    OP_T,
    gemm_arguments,
    operand,
    strided_batched_arguments,
)

SIZE = 4096


def view(flat: np.ndarray, shape: tuple[int, int], strides: tuple[int, int]) -> np.ndarray:
    """A view of ``flat`` with element strides ``strides``."""
    return as_strided(flat, shape, tuple(s * flat.itemsize for s in strides))


def column_major(flat: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """The ``rows x cols`` column-major matrix at ``flat`` with leading dimension ``ld``."""
    return np.array([[flat[i + j * ld] for j in range(cols)] for i in range(rows)])


def as_cublas_reads(op: int, flat: np.ndarray, rows: int, cols: int, ld: int) -> np.ndarray:
    """op(X) where X is the column-major matrix cuBLAS reads: ``rows x cols`` after op."""
    if op == OP_N:
        return column_major(flat, rows, cols, ld)
    return column_major(flat, cols, rows, ld).T


def layouts(rows: int, cols: int) -> dict[str, tuple[int, int]]:
    """Element strides of views of a (rows, cols) matrix: every layout a plan makes."""
    return {"c-order": (cols, 1), "padded rows": (cols + 3, 1), "transposed": (1, rows),
            "padded transposed": (1, rows + 2)}


SHAPES = [(3, 4, 5), (1, 4, 5), (3, 1, 5), (3, 4, 1), (1, 1, 1), (6, 2, 7)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_gemm_arguments_read_the_product_numpy_computes(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(0)
    for (la, sa), (lb, sb) in itertools.product(layouts(m, k).items(), layouts(k, n).items()):
        fa, fb = rng.standard_normal(SIZE), rng.standard_normal(SIZE)
        a, b = view(fa, (m, k), sa), view(fb, (k, n), sb)
        out = np.zeros((m, n))
        arguments = gemm_arguments(a, b, out)
        assert arguments is not None, (la, lb)
        op_b, op_a, n_, m_, k_, ld_b, ld_a, ld_out = arguments
        assert (n_, m_, k_, ld_out) == (n, m, k, n)
        # out^T (n x m, column-major, ld n) = op(b') (n x k) @ op(a') (k x m)
        product_t = (as_cublas_reads(op_b, fb, n, k, ld_b)
                     @ as_cublas_reads(op_a, fa, k, m, ld_a))
        np.testing.assert_allclose(product_t.T, a @ b, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{la} @ {lb}")
        # cuBLAS requires each leading dimension to cover the rows of its stored matrix.
        assert ld_b >= max(1, n if op_b == OP_N else k)
        assert ld_a >= max(1, k if op_a == OP_N else m)


def test_a_view_with_neither_order_contiguous_is_refused() -> None:
    flat = np.zeros(SIZE)
    assert operand(view(flat, (3, 4), (8, 2))) is None
    assert gemm_arguments(view(flat, (3, 4), (8, 2)), np.zeros((4, 2)), np.zeros((3, 2))) is None


def test_the_result_must_be_row_major() -> None:
    a, b = np.zeros((3, 4)), np.zeros((4, 2))
    assert gemm_arguments(a, b, np.zeros((2, 3)).T) is None
    assert gemm_arguments(a, b, np.zeros((3, 2))) is not None


def test_operand_of_each_layout() -> None:
    flat = np.zeros(SIZE, np.float32)
    assert operand(view(flat, (3, 4), (4, 1))) == (OP_N, 4)
    assert operand(view(flat, (3, 4), (9, 1))) == (OP_N, 9)
    assert operand(view(flat, (3, 4), (1, 3))) == (OP_T, 3)
    assert operand(view(flat, (1, 4), (0, 1))) == (OP_N, 4)  # one row: ld is its width


def memory(x: np.ndarray) -> tuple[np.ndarray, int]:
    """The flat memory under the view ``x`` (its owner's, every element) and the element
    offset at which ``x`` starts: what a device pointer to ``x`` gives cuBLAS."""
    owner = x
    while owner.base is not None:
        owner = owner.base
    flat = owner.reshape(-1)
    assert flat.base is owner or flat is owner, "the owner of a view is contiguous"
    start = x.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    return flat, start // x.itemsize


def simulate_strided_batched(a: np.ndarray, b: np.ndarray, out: np.ndarray,
                             arguments: tuple) -> None:
    """cublasGemmStridedBatchedEx with ``arguments`` on the memory of the 3-D views ``a``,
    ``b``, ``out`` as cuBLAS sees it: for each i, the column-major ``C_i = op(B_i) op(A_i)``
    (``n x m``, ld_out) written ``stride_out`` elements after ``C_{i-1}``; an element read
    or written outside the arrays' memory raises IndexError."""
    op_b, op_a, n, m, k, ld_b, stride_b, ld_a, stride_a, ld_out, stride_out, batch = arguments
    (fa, oa), (fb, ob), (fc, oc) = memory(a), memory(b), memory(out)
    for i in range(batch):
        product = (as_cublas_reads(op_b, fb[ob + i * stride_b:], n, k, ld_b)
                   @ as_cublas_reads(op_a, fa[oa + i * stride_a:], k, m, ld_a))
        for r in range(n):
            for c in range(m):
                fc[oc + i * stride_out + r + c * ld_out] = product[r, c]


def layouts3(batch: int, rows: int, cols: int) -> dict[str, tuple[int, int, int]]:
    """Element strides of 3-D views (batch, rows, cols): the layouts a batched einsum makes
    (batch outermost, or heads interleaved in the rows, each read as is or transposed)."""
    return {"stacked": (rows * cols, cols, 1),
            "stacked, padded": (rows * (cols + 2) + 5, cols + 2, 1),
            "heads in rows": (cols, batch * cols, 1),  # (rows, H, cols) read per head
            "stacked transposed": (rows * cols, 1, rows),  # a weight read transposed
            "heads in columns": (rows, 1, batch * rows)}  # (cols, H, rows): a gradient's x^T


def results3(batch: int, rows: int, cols: int) -> dict[str, tuple[int, int, int]]:
    """The row-major result layouts: whole matrices, or heads interleaved in the rows."""
    return {"stacked": (rows * cols, cols, 1), "heads in rows": (cols, batch * cols, 1)}


@pytest.mark.parametrize("h,m,k,n", [(3, 4, 2, 5), (1, 3, 4, 2), (4, 1, 3, 2), (2, 3, 1, 4),
                                     (2, 5, 3, 1)])
def test_strided_batched_arguments_read_the_product_numpy_computes(h: int, m: int, k: int,
                                                                   n: int) -> None:
    rng = np.random.default_rng(1)
    for (la, sa), (lb, sb), (lc, sc) in itertools.product(
            layouts3(h, m, k).items(), layouts3(h, k, n).items(), results3(h, m, n).items()):
        fa, fb = rng.standard_normal(SIZE), rng.standard_normal(SIZE)
        a, b = view(fa, (h, m, k), sa), view(fb, (h, k, n), sb)
        out = view(np.zeros(SIZE), (h, m, n), sc)
        arguments = strided_batched_arguments(a, b, out)
        assert arguments is not None, (la, lb, lc)
        assert arguments[2:5] == (n, m, k) and arguments[-1] == h
        simulate_strided_batched(a, b, out, arguments)
        np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12,
                                   err_msg=f"{la} @ {lb} -> {lc}")


def test_strided_batched_arguments_refuse_a_copy_and_a_transposed_result() -> None:
    flat = np.zeros(SIZE)
    a, b, out = np.zeros((2, 3, 4)), np.zeros((2, 4, 5)), np.zeros((2, 3, 5))
    assert strided_batched_arguments(a, b, out) is not None
    assert strided_batched_arguments(view(flat, (2, 3, 4), (40, 8, 2)), b, out) is None
    assert strided_batched_arguments(a, b, np.zeros((2, 5, 3)).transpose(0, 2, 1)) is None
