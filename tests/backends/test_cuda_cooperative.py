"""CUDA emulation of shared memory, block barriers and grid barriers, against NumPy."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from rnnc.backends.cuda import cooperative
from rnnc.backends.cuda.cooperative import (
    CUDA_PRELUDE,
    MAX_COOPERATIVE_BLOCKS,
    CooperativeModule,
    EmulationFault,
)
from rnnc.backends.cuda.ptx import available_compiler, compile_ptx
from rnnc.errors import RnncError

# A block-wide tree reduction in static shared memory: each block sums its blockDim.x
# elements of x (zeros past n). blockDim.x must be a power of two.
BLOCK_SUMS = r"""
extern "C" __global__ void block_sums(const float* __restrict__ x, float* __restrict__ sums,
                                      int n) {
    __shared__ float partial[1024];
    unsigned t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    partial[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) partial[t] += partial[t + half];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}
"""

# Each block stages its tile of x in dynamic shared memory and writes it back reversed
# (the last block's tile is shorter when n is not a multiple of the block).
REVERSE_TILES = r"""
extern "C" __global__ void reverse_tiles(const double* __restrict__ x, double* __restrict__ y,
                                         int n) {
    double* tile = rnnc_shared<double>();
    unsigned t = threadIdx.x;
    int base = blockIdx.x * blockDim.x;
    int count = min((int)blockDim.x, n - base);
    if ((int)t < count) tile[t] = x[base + t];
    cooperative_groups::this_thread_block().sync();
    if ((int)t < count) y[base + t] = tile[count - 1 - t];
}
"""

# A persistent kernel's pattern: one launch loops over steps; in each, every block writes the
# partial sum of its grid-stride share of v, grid barrier, block 0 sums the partials, grid
# barrier, every thread updates its elements from the total.
ITERATE_SUMS = r"""
namespace cg = cooperative_groups;

extern "C" __global__ void iterate_sums(float* __restrict__ v, float* __restrict__ partials,
                                        float* __restrict__ totals, int n, int steps) {
    cg::grid_group grid = cg::this_grid();
    float* scratch = rnnc_shared<float>();
    unsigned t = threadIdx.x;
    int first = blockIdx.x * blockDim.x + t, stride = gridDim.x * blockDim.x;
    for (int step = 0; step < steps; ++step) {
        float mine = 0.0f;
        for (int i = first; i < n; i += stride) mine += v[i];
        scratch[t] = mine;
        __syncthreads();
        if (t == 0) {
            float sum = 0.0f;
            for (unsigned k = 0; k < blockDim.x; ++k) sum += scratch[k];
            partials[blockIdx.x] = sum;
        }
        grid.sync();
        if (blockIdx.x == 0 && t == 0) {
            float total = 0.0f;
            for (unsigned b = 0; b < gridDim.x; ++b) total += partials[b];
            totals[step] = total;
        }
        grid.sync();
        for (int i = first; i < n; i += stride) v[i] = 0.5f * v[i] + totals[step] / n;
        __syncthreads();  // scratch is rewritten next step
    }
}
"""

# Threads at or past n return before the barrier the others wait at.
EARLY_EXIT = r"""
extern "C" __global__ void early_exit(float* y, int n) {
    __shared__ float s[64];
    int t = threadIdx.x;
    if (t >= n) return;
    s[t] = (float)t;
    __syncthreads();
    y[t] = s[(t + 1) % n];
}
"""

# Thread 0 of each block waits at the grid barrier, the others at the block barrier.
MIXED_BARRIERS = r"""
extern "C" __global__ void mixed_barriers(float* y) {
    if (threadIdx.x == 0) cooperative_groups::this_grid().sync();
    else __syncthreads();
    y[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
"""

# Block 1 returns before the grid barrier every other block waits at.
GRID_EXIT = r"""
extern "C" __global__ void grid_exit(float* y) {
    if (blockIdx.x == 1) return;
    cooperative_groups::this_grid().sync();
    y[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}
"""

# Reads shared memory nobody wrote: undefined on a GPU, NaN in emulation.
UNWRITTEN = r"""
extern "C" __global__ void unwritten(float* y) {
    __shared__ float s[32];
    float* d = rnnc_shared<float>();
    y[2 * threadIdx.x] = s[threadIdx.x];
    y[2 * threadIdx.x + 1] = d[threadIdx.x];
}
"""

# Thread 1 needs more than its 64 KiB stack (thread 0 has returned: only its dead stack is hit).
DEEP_STACK = r"""
extern "C" __global__ void deep_stack(float* y) {
    if (threadIdx.x == 1) {
        volatile char big[80 * 1024];
        for (int i = 0; i < (int)sizeof big; ++i) big[i] = (char)i;
        y[1] = big[7];
    }
}
"""

KERNELS = {
    "block_sums": BLOCK_SUMS,
    "reverse_tiles": REVERSE_TILES,
    "iterate_sums": ITERATE_SUMS,
    "early_exit": EARLY_EXIT,
    "mixed_barriers": MIXED_BARRIERS,
    "grid_exit": GRID_EXIT,
    "unwritten": UNWRITTEN,
    "deep_stack": DEEP_STACK,
}
# Exactly the text nvcc compiles; the include is blanked in emulation.
SOURCE = "#include <cooperative_groups.h>\n" + CUDA_PRELUDE + "".join(KERNELS.values())


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda-cooperative")


@pytest.fixture(scope="module")
def normal(cache_dir: Path) -> CooperativeModule:
    return CooperativeModule(SOURCE, list(KERNELS), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def coop(cache_dir: Path) -> CooperativeModule:
    """The same library (one build, cached), every launch cooperative."""
    return CooperativeModule(SOURCE, list(KERNELS), cache_dir=cache_dir,
                             enable_cooperative_groups=True)


@pytest.mark.parametrize("mode", ["normal", "coop"])
@pytest.mark.parametrize("block, n", [(32, 100), (64, 64), (256, 1000), (1024, 2500)])
def test_block_tree_reduction_in_static_shared_memory(
    request: pytest.FixtureRequest, mode: str, block: int, n: int
) -> None:
    # Cooperatively, all blocks' threads interleave: each block must still see its own copy.
    module = request.getfixturevalue(mode)
    x = np.random.default_rng(block).standard_normal(n).astype(np.float32)
    grid = -(-n // block)
    sums = np.full(grid, np.nan, np.float32)
    module.get_function("block_sums")((grid,), (block,), (x, sums, np.int32(n)))
    padded = np.zeros(grid * block)
    padded[:n] = x
    np.testing.assert_allclose(sums, padded.reshape(grid, block).sum(axis=1), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("mode", ["normal", "coop"])
def test_dynamic_shared_memory_reverses_tiles(request: pytest.FixtureRequest, mode: str) -> None:
    module = request.getfixturevalue(mode)
    block, n = 96, 500
    x = np.random.default_rng(2).standard_normal(n)
    y = np.full(n, np.nan)
    grid = -(-n // block)
    module.get_function("reverse_tiles")(grid, block, (x, y, np.int32(n)), shared_mem=block * 8)
    expected = np.concatenate([x[s : s + block][::-1] for s in range(0, n, block)])
    np.testing.assert_array_equal(y, expected)


def test_grid_barrier_in_a_persistent_loop(coop: CooperativeModule) -> None:
    grid, block, n, steps = 5, 64, 1001, 6
    v0 = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    v = v0.copy()
    partials = np.full(grid, np.nan, np.float32)
    totals = np.full(steps, np.nan, np.float32)
    coop.get_function("iterate_sums")(grid, block, (v, partials, totals, np.int32(n),
                                                    np.int32(steps)), shared_mem=block * 4)
    expected_v, expected_totals = v0.astype(np.float64), []
    for _ in range(steps):
        expected_totals.append(expected_v.sum())
        expected_v = 0.5 * expected_v + expected_totals[-1] / n
    np.testing.assert_allclose(totals, expected_totals, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(v, expected_v, rtol=1e-4, atol=1e-4)


def test_launches_from_several_threads_take_turns(normal: CooperativeModule) -> None:
    # One module's static shared memory exists once: concurrent launches must not mix it.
    kernel, block, n = normal.get_function("block_sums"), 128, 1000
    grid = -(-n // block)
    inputs = [np.random.default_rng(seed).standard_normal(n).astype(np.float32)
              for seed in range(8)]

    def run(x: np.ndarray) -> np.ndarray:
        sums = np.full(grid, np.nan, np.float32)
        kernel(grid, block, (x, sums, np.int32(n)))
        return sums

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, inputs))
    for x, sums in zip(inputs, results, strict=True):
        padded = np.zeros(grid * block)
        padded[:n] = x
        np.testing.assert_allclose(sums, padded.reshape(grid, block).sum(axis=1), rtol=1e-5,
                                   atol=1e-5)


def test_shared_memory_starts_undefined(normal: CooperativeModule) -> None:
    y = np.zeros(64, np.float32)
    normal.get_function("unwritten")(1, 32, (y,), shared_mem=32 * 4)
    assert np.isnan(y).all()


def test_divergent_block_barrier_raises_instead_of_hanging(normal: CooperativeModule) -> None:
    kernel = normal.get_function("early_exit")
    y = np.zeros(64, np.float32)
    kernel(1, 64, (y, np.int32(64)))  # every thread reaches the barrier
    np.testing.assert_array_equal(y, (np.arange(64) + 1) % 64)
    with pytest.raises(EmulationFault, match=r"'early_exit': divergent barrier in block 0: "
                       r"40 threads wait at __syncthreads\(\).*24 returned \(first: thread 40\)"):
        kernel(1, 64, (y, np.int32(40)))
    kernel(1, 64, (y, np.int32(64)))  # the module still works after a fault


def test_different_barrier_kinds_in_one_block_raise(coop: CooperativeModule) -> None:
    y = np.zeros(2 * 32, np.float32)
    with pytest.raises(EmulationFault, match=r"'mixed_barriers': divergent barrier in block 0: "
                       r"31 threads wait at __syncthreads\(\) \(first: thread 1\), 1 wait at "
                       r"this_grid\(\).sync\(\)"):
        coop.get_function("mixed_barriers")(2, 32, (y,))


def test_grid_barrier_a_block_skips_raises(coop: CooperativeModule) -> None:
    y = np.zeros(3 * 32, np.float32)
    with pytest.raises(EmulationFault, match=r"'grid_exit': divergent grid barrier: 64 threads "
                       r"wait .* while 32 returned \(first: block 1 thread 0\)"):
        coop.get_function("grid_exit")(3, 32, (y,))


def test_grid_barrier_outside_a_cooperative_launch_raises(normal: CooperativeModule) -> None:
    v = np.zeros(10, np.float32)
    partials, totals = np.zeros(2, np.float32), np.zeros(1, np.float32)
    with pytest.raises(EmulationFault, match=r"'iterate_sums': block 0 thread 0 called "
                       r"this_grid\(\).sync\(\) in a launch that is not cooperative"):
        normal.get_function("iterate_sums")(2, 32, (v, partials, totals, np.int32(10),
                                                    np.int32(1)), shared_mem=128)


def test_stack_overflow_is_reported(normal: CooperativeModule) -> None:
    with pytest.raises(EmulationFault, match="'deep_stack': block 0 thread 1 overflowed its "
                       "64 KiB stack"):
        normal.get_function("deep_stack")(1, 2, (np.zeros(2, np.float32),))


def test_launch_limits_are_checked_before_running(coop: CooperativeModule) -> None:
    kernel = coop.get_function("block_sums")
    x, sums = np.zeros(8, np.float32), np.zeros(2000, np.float32)
    with pytest.raises(RnncError, match="at most 1024 blocks and 65536 threads"):
        kernel(MAX_COOPERATIVE_BLOCKS + 1, 32, (x, sums, np.int32(8)))
    with pytest.raises(RnncError, match="at most 1024 blocks and 65536 threads"):
        kernel(65, 1024, (x, sums, np.int32(8)))
    with pytest.raises(RnncError, match=r"shared_mem must be in 0..49152, got 49156 \(set"):
        kernel(1, 32, (x, sums, np.int32(8)), shared_mem=49156)
    with pytest.raises(RnncError, match="shared_mem must be an int number of bytes"):
        kernel(1, 32, (x, sums, np.int32(8)), shared_mem=4.0)
    with pytest.raises(RnncError, match=r"shared_mem must be in 0..49152, got -4"):
        kernel(1, 32, (x, sums, np.int32(8)), shared_mem=-4)
    with pytest.raises(RnncError, match=r"max_dynamic_shared_size_bytes must be in 0..232448"):
        kernel.max_dynamic_shared_size_bytes = 300 * 1024
    with pytest.raises(ValueError, match=r"block x must be in 1..1024"):
        kernel(1, 2048, (x, sums, np.int32(8)))
    with pytest.raises(TypeError, match="expected dtype float32, got float64"):
        kernel(1, 32, (x.astype(np.float64), sums, np.int32(8)))
    with pytest.raises(RnncError, match=r"kernels \['absent'\] not found"):
        CooperativeModule(SOURCE, ["absent"])
    with pytest.raises(RnncError, match="no kernel 'absent'"):
        coop.get_function("absent")


def test_raised_shared_memory_limit_allows_a_larger_launch(cache_dir: Path) -> None:
    kernel = CooperativeModule(SOURCE, list(KERNELS), cache_dir=cache_dir).get_function(
        "reverse_tiles")
    kernel.max_dynamic_shared_size_bytes = 64 * 1024
    x = np.arange(8.0)
    y = np.zeros(8)
    kernel(1, 8, (x, y, np.int32(8)), shared_mem=64 * 1024)
    np.testing.assert_array_equal(y, x[::-1])


def test_extern_shared_fails_to_compile_rather_than_run(cache_dir: Path) -> None:
    # C++ has no extern __shared__; emulated kernels reach dynamic shared memory through
    # rnnc_shared<T>(), so the CUDA spelling must fail loudly, not run with other semantics.
    source = CUDA_PRELUDE + r"""
extern "C" __global__ void extern_shared(float* y) {
    extern __shared__ float buffer[];
    buffer[threadIdx.x] = 1.0f;
    y[threadIdx.x] = buffer[threadIdx.x];
}
"""
    with pytest.raises(RuntimeError, match=r"failed to compile(.|\n)*extern __shared__ float"):
        CooperativeModule(source, ["extern_shared"], cache_dir=cache_dir)


def test_cache_key_covers_shim_sync_and_blanks_the_include() -> None:
    cpp = cooperative.library_source(SOURCE, {"early_exit": []})
    assert cooperative.SYNC_SHIM_PATH.read_text() in cpp
    assert "<cooperative_groups.h>" not in cooperative.emulated_source(SOURCE)
    assert cooperative.emulated_source(SOURCE).count("\n") == SOURCE.count("\n")


@pytest.mark.skipif(available_compiler() != "nvcc", reason="nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_to_ptx_with_nvcc(arch: str) -> None:
    ptx = compile_ptx(SOURCE, arch, compiler="nvcc")
    assert f".target {arch}" in ptx
    for name in KERNELS:
        assert f".entry {name}(" in ptx
