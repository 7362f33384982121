"""Differential fuzzing: random cells on every backend and pipeline against the oracle.

Default run: 300 cells (seeds 0-299) on the optimizing NumPy backend, each in float64 with or
without lengths (alternating) and every tenth also in float32, through inference, training
forward and backward. LLVM (8 cells, and 8 more with parallel-scan on, which LLVM leaves off
by default) and the CUDA emulation (24 cells, six per compiled program) see fewer, since
compiling costs ~0.4 s and ~1 s per program there; each of their cells runs in one (dtype,
lengths) combination, taken in turn so that every combination is covered. ``pytest -m slow``
runs 5,000 more cells (seeds 300-5299): every cell on NumPy in all four combinations, and on
LLVM (with and without parallel-scan) and the CUDA emulation in one combination each, in turn:
50 chunks of 100 cells per target, each chunk about 1 minute on NumPy, 1.3 on the CUDA
emulation and 3.3 on LLVM on one core (7 hours in all; chunks are independent tests, so they
can be spread over processes or machines). A failure prints a shrunk reproducer
(tests/fuzz/shrink.py).

Second order (tests/fuzz/second_order.py): the double backward against central differences of
the first-order gradient, in float64. Default run: four cells on NumPy, two of which read a
per-step sum over the batch rows in their backward's backward. ``pytest -m slow`` runs it on
the same 5,000 cells on NumPy, with lengths every other cell (50 chunks of 100, about a minute
each); on LLVM (with and without parallel-scan) every tenth of them (1 to 2 minutes per chunk:
each cell compiles six programs) and on the CUDA emulation every fifth, six cells to a program
(about 1.5 minutes per chunk).

The padding target (tests/fuzz/padding.py) fills the inputs past the lengths with NaN or Inf
and compares with the oracle on zero padding: by default 6 cells on NumPy and a small one on
LLVM; ``pytest -m slow`` runs seeds 300-1299 on NumPy, LLVM and the CUDA emulation (10 chunks
of 100 per target; the emulation compiles 5 cells as one bundle).
"""

from __future__ import annotations

import pytest

import rnnc
from tests.fuzz.campaign import fuzz
from tests.fuzz.differential import COMBOS, TARGETS, Stats, case
from tests.fuzz.padding import fuzz_padding
from tests.fuzz.second_order import fuzz_second_order
from tests.fuzz.spec import build

SLOW_SEEDS = range(300, 5300)
SLOW_CHUNKS = 50
PADDING_SLOW_SEEDS = range(300, 1300)
PADDING_SLOW_CHUNKS = 10


def _numpy_combos(seed: int) -> tuple[tuple[str, bool], ...]:
    combos = (("float64", seed % 2 == 1),)
    return combos + ((("float32", seed % 4 >= 2),) if seed % 10 == 0 else ())


def _in_turn(k: int) -> tuple[tuple[str, bool], ...]:
    return (COMBOS[k % len(COMBOS)],)


def _run(seeds, target_name: str, combos, bundle_size: int = 1) -> Stats:
    target = TARGETS[target_name]
    why = target.available()
    if why is not None:
        pytest.skip(why)
    reports, stats = fuzz(list(seeds), target, combos, bundle_size, shrink_budget_s=120,
                          max_shrunk=2)
    print(f"{target_name}: {stats.cells} cells, {stats.runs} runs, {stats.comparisons} arrays "
          f"compared, worst error float32 {stats.worst['float32']:.2g} float64 "
          f"{stats.worst['float64']:.2g}, {stats.skipped_float32} of {stats.float32_cells} "
          f"float32 cell runs not compared for a near tie")
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)
    # Not vacuous: every cell ran and compared arrays; cells not compared in float32 for a
    # near tie (a where/relu switch within 1e-4 of its input) stay rare.
    assert stats.cells == len(seeds)
    assert stats.comparisons >= 3 * stats.runs
    assert stats.skipped_float32 <= max(2, stats.float32_cells // 10)
    return stats


@pytest.mark.parametrize("chunk", range(3))
def test_numpy_matches_oracle(chunk: int) -> None:
    seeds = range(100 * chunk, 100 * chunk + 100)
    _run(seeds, "numpy", lambda k: _numpy_combos(seeds[k]))


def test_llvm_matches_oracle() -> None:
    _run(range(0, 300, 38), "llvm", _in_turn)


# Cells in which parallel-scan finds a carry linear in itself (about a quarter of all cells);
# the test checks that it still does, so the list cannot go stale as the generator changes.
SCAN_SEEDS = (2, 3, 13, 14, 15, 16, 18, 20)


def test_llvm_parallel_scan_matches_oracle() -> None:
    for seed in SCAN_SEEDS:
        fn = rnnc.compile(build(case(seed).spec), backend="llvm", cache_dir=False,
                          parallel_scan=True)
        assert any("linear_scan" in counts for counts in fn.op_counts().values()), seed
    _run(SCAN_SEEDS, "llvm-scan", _in_turn)


def test_cuda_emulation_matches_oracle() -> None:
    # Six cells per compiled program: g++ costs the same for one cell or six.
    _run(range(5, 293, 12), "cuda-emulate", _in_turn, bundle_size=6)


@pytest.mark.cuda
def test_cuda_gpu_matches_oracle() -> None:
    _run(range(7, 295, 12), "cuda", _in_turn, bundle_size=6)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["numpy", "llvm", "llvm-scan", "cuda-emulate", "cuda"])
@pytest.mark.parametrize("chunk", range(SLOW_CHUNKS))
def test_slow_matches_oracle(target: str, chunk: int) -> None:
    size = len(SLOW_SEEDS) // SLOW_CHUNKS
    seeds = SLOW_SEEDS[chunk * size:(chunk + 1) * size]
    if target == "numpy":
        _run(seeds, target, lambda k: COMBOS)
    elif target.startswith("llvm"):
        _run(seeds, target, lambda k: _in_turn(seeds[k]))
    else:  # the CUDA emulation, or a GPU where there is one
        _run(seeds, target, lambda k: _in_turn(chunk + k), bundle_size=6)


def _run_second_order(seeds, target_name: str, bundle_size: int = 1) -> Stats:
    target = TARGETS[target_name]
    why = target.available()
    if why is not None:
        pytest.skip(why)
    reports, stats = fuzz_second_order(list(seeds), target, lambda k: k % 2 == 1, bundle_size)
    print(f"{target_name} second order: {stats.cells} cells, {stats.runs} runs, "
          f"{stats.comparisons} directions compared, worst error {stats.worst['float64']:.2g}, "
          f"{stats.skipped_float32} runs not compared for a near tie")
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)
    # Not vacuous: five directions (x, params, states and the two cotangents) per run, and
    # runs skipped for a near tie stay rare.
    assert stats.cells == len(seeds)
    assert stats.comparisons >= 3 * stats.runs
    assert stats.skipped_float32 <= max(1, stats.runs // 10)
    return stats


# Cells whose backward's backward reads a per-step sum over the batch rows (a saved [T, n]
# sequence: what made hoist-sequence fail once), and two with a linear carry (parallel-scan);
# the test checks the first two still do, so the list cannot go stale as the generator changes.
SECOND_ORDER_SEEDS = (16, 28, 3, 13)


def test_numpy_second_order_matches_central_differences() -> None:
    for seed in SECOND_ORDER_SEEDS[:2]:
        program = rnnc.compile(build(case(seed).spec)).program("backward.backward", "f64")
        assert any(t.shape[0] == "T" and t.shape[1:2] != ("B",) for _, t in
                   program.args.values()), seed
    _run_second_order(SECOND_ORDER_SEEDS, "numpy")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["numpy", "llvm", "llvm-scan", "cuda-emulate", "cuda"])
@pytest.mark.parametrize("chunk", range(SLOW_CHUNKS))
def test_slow_second_order_matches_central_differences(target: str, chunk: int) -> None:
    size = len(SLOW_SEEDS) // SLOW_CHUNKS
    seeds = SLOW_SEEDS[chunk * size:(chunk + 1) * size]
    if target == "numpy":
        _run_second_order(seeds, target)
    elif target.startswith("llvm"):
        _run_second_order(seeds[::10], target)
    else:  # the CUDA emulation, or a GPU where there is one
        _run_second_order(seeds[::5], target, bundle_size=6)


def _run_padding(seeds, target_name: str, bundle_size: int = 1) -> None:
    target = TARGETS[target_name]
    why = target.available()
    if why is not None:
        pytest.skip(why)
    reports, stats = fuzz_padding(seeds, target, bundle_size)
    print(f"{target_name} with NaN/Inf padding: {stats.cells} cells, {stats.comparisons} "
          f"arrays compared, worst error float32 {stats.worst['float32']:.2g} float64 "
          f"{stats.worst['float64']:.2g}")
    if reports:
        pytest.fail("\n".join(reports), pytrace=False)
    assert stats.cells == len(seeds)
    assert stats.comparisons >= 3 * stats.runs


def test_numpy_ignores_nan_padding() -> None:
    _run_padding(range(6), "numpy")


def test_llvm_ignores_nan_padding() -> None:
    _run_padding(range(1, 2), "llvm")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["numpy", "llvm", "cuda-emulate", "cuda"])
@pytest.mark.parametrize("chunk", range(PADDING_SLOW_CHUNKS))
def test_slow_padding_matches_zero_padding(target: str, chunk: int) -> None:
    size = len(PADDING_SLOW_SEEDS) // PADDING_SLOW_CHUNKS
    seeds = PADDING_SLOW_SEEDS[chunk * size:(chunk + 1) * size]
    _run_padding(seeds, target, bundle_size=5 if target.startswith("cuda") else 1)
