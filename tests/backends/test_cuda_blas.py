"""The arguments rnnc gives cublasGemmEx (backends/cuda/blas.py) for row-major views, checked
on the CPU: the operands are read back as column-major memory with those arguments, as cuBLAS
reads them, and the product compared with NumPy's. A GPU runs the calls themselves
(test_cuda_on_gpu.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from rnnc.backends.cuda.blas import OP_N, OP_T, gemm_arguments, operand

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
