"""bfloat16 GEMMs of the CUDA backend: emulation against the bf16 oracle (optimize=False),
the rounding kernel of the cuBLAS path run in emulation, and compiled to PTX for sm_80/sm_90."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_cuda_ptx import ARCHS, compilers

import rnnc
from rnnc.backends.cuda.bf16 import ROUND_KERNEL, ROUND_SOURCE
from rnnc.backends.cuda.ptx import compile_ptx
from rnnc.tools.bench.configs import ln_lstm

CELLS = {"lstm": lambda: rnnc.cells.lstm(8, 16), "gru": lambda: rnnc.cells.gru(8, 16),
         "ln_lstm": lambda: ln_lstm(8, 16)}


@pytest.mark.parametrize("name", ["lstm", pytest.param("gru", marks=pytest.mark.slow),
                                  pytest.param("ln_lstm", marks=pytest.mark.slow)])
def test_emulated_bf16_agrees_with_the_oracle(name: str) -> None:
    cell = CELLS[name]()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 8)).astype(np.float32)
    p = cell.init_params(seed=0)
    oracle = rnnc.compile(cell, optimize=False, precision="bf16")
    fn = rnnc.compile(cell, backend="cuda", emulate=True, precision="bf16")
    want, _, tape = oracle.forward(x, p)
    got, _, gtape = fn.forward(x, p)
    d = {k: np.ones_like(v) for k, v in want.items()}
    want_g, got_g = oracle.backward(tape, d), fn.backward(gtape, d)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
    for k in want_g.params:
        np.testing.assert_allclose(got_g.params[k], want_g.params[k], rtol=1e-4, atol=2e-5)
    fp32, _ = rnnc.compile(cell, optimize=False)(x, p)
    assert max(np.abs(fp32[k] - want[k]).max() for k in want) > 1e-4  # the rounding shows


def test_bf16_takes_the_fused_path() -> None:
    """The fused-step kernels read bfloat16 weights (test_cuda_bf16_kernels.py): a bf16
    program's loop runs them where its cell fuses."""
    cell = rnnc.cells.lstm(8, 16)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, precision="bf16", fused_step="always")
    fn(np.zeros((2, 2, 8), np.float32), cell.init_params(seed=0))
    runner = fn.runner("inference", "f32", False)
    assert "fused" in runner.hosts and "gemm" not in runner.hosts


def test_rounding_kernel_in_emulation_matches_ml_dtypes() -> None:
    from rnnc.backends.cuda.emulate import EmulatedModule

    kernel = EmulatedModule(ROUND_SOURCE, [ROUND_KERNEL]).get_function(ROUND_KERNEL)
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(4099).astype(np.float32) * 1e3,
                        np.array([np.inf, -np.inf, 0.0, 1 + 2.0 ** -8], np.float32)])
    y = np.zeros(x.shape, np.uint16)
    kernel((4,), (256,), (x, y, np.int64(x.size)))
    np.testing.assert_array_equal(y, x.astype(ml_dtypes.bfloat16).view(np.uint16))
    nan = np.zeros(1, np.uint16)
    kernel((1,), (1,), (np.array([np.nan], np.float32), nan, np.int64(1)))
    assert np.isnan(nan.view(ml_dtypes.bfloat16).astype(np.float32))[0]


@pytest.mark.parametrize("compiler", compilers())
@pytest.mark.parametrize("arch", ARCHS)
def test_rounding_kernel_compiles_to_ptx(compiler: str, arch: str) -> None:
    ptx = compile_ptx(ROUND_SOURCE, arch, compiler=compiler)
    assert f".target {arch}" in ptx and f".entry {ROUND_KERNEL}(" in ptx
