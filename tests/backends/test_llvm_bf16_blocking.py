"""The cache blocking of the AVX-512 bf16 kernels (:mod:`rnnc.backends.llvm.dpbf16`): products
wider than one group of panels and taller than one block of rows, against a float64 NumPy
product of the operands rounded to bf16 by hand."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from rnnc.backends.llvm import bf16, dpbf16  # noqa: E402
from rnnc.backends.llvm.bf16_jit import Bf16Gemm  # noqa: E402
from tests.backends.test_llvm_amx import assert_fp32_accumulation  # noqa: E402

HOST = bf16.host_tier()
# Two groups of panels, the second of two panels, the last of them partial; an odd depth.
K, N = 37, dpbf16.GROUP * bf16.PANEL + 45


@pytest.mark.parametrize("tier", ["avx512bf16", "emulate"])
def test_products_span_groups_and_row_blocks(tier) -> None:
    if tier == "avx512bf16" and HOST not in ("amx", "avx512bf16"):
        pytest.skip(f"this CPU has no vdpbf16ps (host tier {HOST})")
    assert bf16.panel_count(N) > dpbf16.GROUP
    rng = np.random.default_rng(31)
    w = rng.standard_normal((K, N)).astype(np.float32)
    gemm = Bf16Gemm(tier, K, N)
    # A batch of 1, 15 and 33 (tiles shorter than the kernel's), and two blocks of rows, the
    # second ending in a short tile.
    for rows in (1, 15, 33, dpbf16.ROW_BLOCK + 6):
        a = rng.standard_normal((rows, K)).astype(np.float32)
        gemm.new_run()
        alone = gemm(a, w)
        assert_fp32_accumulation(alone, a, w)
        # A team of two splits the panels: each thread's share starts its own groups.
        np.testing.assert_array_equal(gemm(a, w, threads=2), alone)


@pytest.mark.parametrize("tier", ["avx512bf16", "emulate"])
def test_each_thread_packs_its_own_panels(tier) -> None:
    # Three panels for three threads: the packing runs pair row by pair row across a share's
    # whole panels, and the last share holds only the partial panel (and the pair row half
    # outside w: K odd).
    if tier == "avx512bf16" and HOST not in ("amx", "avx512bf16"):
        pytest.skip(f"this CPU has no vdpbf16ps (host tier {HOST})")
    rng = np.random.default_rng(32)
    w = rng.standard_normal((45, 70)).astype(np.float32)
    a = rng.standard_normal((9, 45)).astype(np.float32)
    gemm = Bf16Gemm(tier, 45, 70)
    gemm.new_run()
    shared = gemm(a, w, threads=3)
    assert_fp32_accumulation(shared, a, w)
    gemm.new_run()
    np.testing.assert_array_equal(gemm(a, w), shared)
