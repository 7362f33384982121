"""What only a real GPU can check of the CUDA backend's newer paths: bfloat16 GEMMs (cuBLAS
GemmEx and the fused kernels reading bf16 weights), the cells with tensor-valued states (a
head-wise einsum as one strided-batched GEMM per step), and a sequence longer than one CUDA
graph span. Each compares with the unoptimized traced program
(the NumPy oracle). Without CuPy and a CUDA device these tests skip, saying so; their kernels
are checked in emulation by test_cuda_bf16.py and test_cells_tensor.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_backend import gpu_reason

import rnnc
from rnnc.tools.bench.configs import ln_lstm

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(gpu_reason() is not None, reason=f"GPU: {gpu_reason()}")]

TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}
# A float32 difference in a cotangent can move its bfloat16 rounding by one step (2**-8)
BF16_GRAD = 4e-3


def compare(cell: rnnc.Cell, T: int, B: int, dtype=np.float32, precision: str = "fp32",
            **options) -> None:
    """Forward (with lengths) and backward of ``cell`` on the GPU against the oracle."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, *cell.sizes("input")["x"][1:])).astype(dtype)
    p = cell.init_params(seed=0, dtype=dtype)
    lengths = np.maximum(1, T - np.arange(B) % max(1, T // 2)).astype(np.int64)
    oracle = rnnc.compile(cell, optimize=False, precision=precision)
    fn = rnnc.compile(cell, backend="cuda", precision=precision, **options)
    want, wstates, wtape = oracle.forward(x, p, lengths=lengths)
    got, gstates, gtape = fn.forward(x, p, lengths=lengths)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], err_msg=k, **TOL[dtype])
    for k in wstates:
        np.testing.assert_allclose(gstates[k], wstates[k], err_msg=k, **TOL[dtype])
    d = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in want.items()}
    want_g, got_g = oracle.backward(wtape, d), fn.backward(gtape, d)
    for k in want_g.params:
        scale = 1 + np.abs(want_g.params[k]).max()
        bound = BF16_GRAD if precision == "bf16" else TOL[dtype]["rtol"] * 5
        assert np.abs(got_g.params[k] - want_g.params[k]).max() <= scale * bound, k


@pytest.mark.parametrize("fused", ["never", "auto"])
@pytest.mark.parametrize("name", ["lstm", "gru", "ln_lstm"])
def test_bf16_on_the_gpu_agrees_with_the_bf16_oracle(name: str, fused: str) -> None:
    make = {"lstm": rnnc.cells.lstm, "gru": rnnc.cells.gru, "ln_lstm": ln_lstm}[name]
    compare(make(24, 32), T=7, B=5, precision="bf16", fused_step=fused)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["slstm", "selective_ssm", "rg_lru"])
def test_tensor_state_cells_on_the_gpu(name: str, dtype) -> None:
    cell = {"slstm": lambda: rnnc.cells.slstm(6, 8, heads=2),
            "selective_ssm": lambda: rnnc.cells.selective_ssm(5, 4),
            "rg_lru": lambda: rnnc.cells.rg_lru(6)}[name]()
    compare(cell, T=6, B=3, dtype=dtype)


def test_a_sequence_longer_than_one_graph_span() -> None:
    compare(rnnc.cells.gru(8, 16), T=600, B=3, graph=True)


@pytest.mark.parametrize("fused", ["never", "always", "persistent"])
def test_plans_are_captured_as_cuda_graphs(fused: str) -> None:
    """A call after a shape's first replays CUDA graphs: launch_report says why where not."""
    cupy = pytest.importorskip("cupy")
    cell = rnnc.cells.lstm(16, 32)
    fn = rnnc.compile(cell, backend="cuda", fused_step=fused, graph=True)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((300, 4, 16)).astype(np.float32))
    flat = cupy.asarray(fn.pack(cell.init_params(seed=0)))
    want = rnnc.compile(cell, optimize=False)(x.get(), cell.init_params(seed=0))[0]["y"]
    for _ in range(3):
        got = fn(x, flat)[0]["y"]
    np.testing.assert_allclose(got.get(), want, rtol=2e-4, atol=2e-5)
    for row in fn.launch_report():
        assert row["graph"], row["capture_error"]


def test_a_step_of_the_slstm_is_one_strided_batched_gemm(monkeypatch) -> None:
    """sLSTM with 4 heads: every step's recurrent product is one cublasGemmStridedBatchedEx
    over the heads (counted), the results agree with the oracle, and the plan (batched GEMMs
    included) is captured as CUDA graphs."""
    from rnnc.backends.cuda.blas import Cublas

    calls: list[int] = []
    original = Cublas.gemm_batched

    def counted(self, a, b, out, arguments, data, compute):
        calls.append(arguments[-1])
        return original(self, a, b, out, arguments, data, compute)

    monkeypatch.setattr(Cublas, "gemm_batched", counted)
    T, B, heads = 7, 5, 4
    cell = rnnc.cells.slstm(16, 32, heads=heads)
    x = np.random.default_rng(0).standard_normal((T, B, 16)).astype(np.float32)
    p = cell.init_params(seed=0)
    want = rnnc.compile(cell, optimize=False)(x, p)[0]["y"]
    got = rnnc.compile(cell, backend="cuda", graph=False)(x, p)[0]["y"]
    np.testing.assert_allclose(got, want, **TOL[np.float32])
    assert calls == [heads] * T, calls
    fn = rnnc.compile(cell, backend="cuda", graph=True)
    for _ in range(2):  # the first call runs its plan call by call and captures it
        np.testing.assert_allclose(fn(x, p)[0]["y"], want, **TOL[np.float32])
    for row in fn.launch_report():
        assert row["graph"], row["capture_error"]
