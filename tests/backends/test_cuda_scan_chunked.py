"""The chunked CUDA ``linear_scan`` kernel (backends/cuda/scan.py), in emulation and as PTX.

A block takes ``COLUMNS`` columns and ``CHUNKS`` chunks of the steps: each chunk composes its
aggregate, the first warp turns the aggregates into carry-ins, each chunk rescans from its
carry-in. The oracles are float64 loops written here, element by element, and for whole cells
the unoptimized traced program on the NumPy backend. The sizes put steps in uneven chunks (T not
a multiple of CHUNKS, fewer steps than chunks, one step) and columns in a partial block; the
host's choice between this kernel and the one-thread-per-column one is checked on the plan
(which kernels it launches), and forced where a test wants the chunked kernel below its step
threshold.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import backends
from rnnc.backends.cuda import codegen, scan
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx
from rnnc.backends.schedule import CudaSchedule
from tests.backends import scan_cells
from tests.backends.test_linear_scan_backends import ATTRS, SHAPES, environment, loop, program

# (T, B): fewer steps than chunks, one step, uneven chunks, and more columns than one block
# (B * N columns, never a whole number of blocks of COLUMNS).
CHUNKS, COLUMNS = CudaSchedule().scan_chunks, CudaSchedule().scan_columns
SIZES = [(1, 3), (7, 3), (CHUNKS + 1, 3), (3 * CHUNKS - 5, 9)]


def launched(runner) -> set[str]:
    """The names of the kernels the runner's plans launch."""
    return {func.name for plan in runner.plans.plans.values() for func in plan.functions()
            if hasattr(func, "name")}


def scan_names(runner) -> set[str]:
    """Both kernels of every linear_scan launch of the runner: one thread per column and
    chunked."""
    return {name for where in runner.host.work.values() for work in where.values()
            if getattr(work, "chunked", "") for name in (work.kernel, work.chunked)}


def chunked_names(runner) -> set[str]:
    """The chunked kernels of the runner's linear_scan launches."""
    return {work.chunked for where in runner.host.work.values() for work in where.values()
            if getattr(work, "chunked", "")}


# The host chooses the chunked kernel whatever the number of steps.
CHUNKED_FROM_ONE_STEP = CudaSchedule(scan_chunked_min_steps=1)
MIN_STEPS = CudaSchedule().scan_chunked_min_steps
MAX_COLUMNS = CudaSchedule().scan_chunked_max_columns


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row", sorted(SHAPES))
def test_chunked_kernel_matches_the_loop(row: str, dtype) -> None:
    name = "f64" if dtype == np.float64 else "f32"
    runner = backends.get("cuda", emulate=True, schedule=CHUNKED_FROM_ONE_STEP).build(
        program(row, name), "inference")
    tol = 1e-10 if dtype == np.float64 else 1e-5
    for steps, batch in SIZES:
        env = environment(row, dtype, steps, batch)
        got = runner(env, {"T": steps, "B": batch})
        a, b = (np.float64(s) if isinstance(s, float) else env[n].astype(np.float64)
                for n, s in zip(("A", "Bv"), SHAPES[row], strict=True))
        for k, attrs in enumerate(ATTRS):
            want = loop(a, b, env["h"].astype(np.float64), steps=steps, **attrs)
            np.testing.assert_allclose(got[f"C{k}"], want, rtol=tol, atol=tol,
                                       err_msg=f"{attrs} T={steps} B={batch}")
    # Every scan took the chunked kernel (the rest are the last_step copies).
    names = chunked_names(runner)
    assert len(names) == len(ATTRS) and launched(runner) & scan_names(runner) == names


def test_a_schedule_sets_the_chunked_block() -> None:
    """Blocks of 8 columns x 4 chunks (the schedule's scan_columns, scan_chunks): the kernel
    is written for them, the host launches them, and the results match the float64 loop."""
    small = CudaSchedule(scan_chunked_min_steps=1, scan_columns=8, scan_chunks=4)
    runner = backends.get("cuda", emulate=True, schedule=small).build(
        program("sequences", "f64"), "inference")
    assert "blocks of 8 columns x 4 chunks" in runner.source
    steps, batch = 11, 5  # uneven chunks of 3 steps; 5 x N columns, a partial block of 8
    env = environment("sequences", np.float64, steps, batch)
    got = runner(env, {"T": steps, "B": batch})
    for k, attrs in enumerate(ATTRS):
        want = loop(env["A"].astype(np.float64), env["Bv"].astype(np.float64),
                    env["h"].astype(np.float64), steps=steps, **attrs)
        np.testing.assert_allclose(got[f"C{k}"], want, rtol=1e-10, atol=1e-12, err_msg=attrs)
    assert scan.chunked_geometry(steps, 70, small) == (9, 32)
    assert launched(runner) & scan_names(runner) == chunked_names(runner)


def test_the_host_chooses_by_steps_and_columns() -> None:
    runner = backends.get("cuda", emulate=True).build(program("sequences", "f64"), "inference")
    for steps in (MIN_STEPS - 1, MIN_STEPS):
        runner(environment("sequences", np.float64, steps, 2), {"T": steps, "B": 2})
    plans = list(runner.plans.plans.values())
    few, many = ({func.name for func in plan.functions() if hasattr(func, "name")}
                 for plan in plans)
    assert few & scan_names(runner) and not few & chunked_names(runner)
    assert many & scan_names(runner) == chunked_names(runner)
    assert scan.chunked_geometry(MIN_STEPS, 70) == (3, COLUMNS * CHUNKS)
    assert scan.chunked_geometry(MIN_STEPS - 1, 70) is None
    assert scan.chunked_geometry(4096, MAX_COLUMNS) is None
    assert scan.chunked_geometry(4096, MAX_COLUMNS - 1) is not None
    # A schedule moves both thresholds.
    moved = CudaSchedule(scan_chunked_min_steps=3, scan_chunked_max_columns=71)
    assert scan.chunked_geometry(3, 70, moved) is not None
    assert scan.chunked_geometry(2, 70, moved) is None
    assert scan.chunked_geometry(3, 71, moved) is None


# ------------------------------------------------------------------ whole cells

STEPS = 2 * MIN_STEPS + 3  # chosen by the host, uneven chunks
CELLS = {
    "min_gru": lambda: rnnc.cells.min_gru(3, 6),
    "min_lstm": lambda: rnnc.cells.min_lstm(3, 6),
    "sru": lambda: rnnc.cells.sru(6, 6),
    "diag_linear": lambda: rnnc.cells.diag_linear(3, 6),
}


def everything(fn: rnnc.Function, cell: rnnc.Cell, lengths) -> dict[str, np.ndarray]:
    """Inference, the training forward's outputs and every gradient, at B = 1 in float64."""
    return scan_cells.everything(fn, cell, STEPS, 1, lengths)


@pytest.mark.parametrize("lengths,reverse", [(None, False), (np.array([STEPS - 40]), False),
                                             (None, True), (np.array([37]), True)],
                         ids=["full-forward", "lengths-forward", "full-reverse",
                              "lengths-reverse"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_cells_through_the_chunked_kernel(name: str, lengths, reverse: bool) -> None:
    cell = CELLS[name]()
    want = everything(rnnc.compile(cell, backend="numpy", optimize=False, reverse=reverse),
                      cell, lengths)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, parallel_scan=True, reverse=reverse)
    got = everything(fn, cell, lengths)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name} {key}")
    masked = lengths is not None
    for mode in ("inference", "forward", "backward"):
        runner = fn._runners[(mode, "f64", masked)]
        assert chunked_names(runner) and chunked_names(runner) <= launched(runner), mode


# ------------------------------------------------------------------ PTX


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_chunked_kernels_compile_to_ptx(arch: str, dtype: str) -> None:
    modules = [codegen.render(program(row, dtype), prefix=f"k{j}_")
               for j, row in enumerate(sorted(SHAPES))]
    names = [launch.chunked for m in modules for launch in m.steps["pre"] if launch.chunked]
    assert len(set(names)) == len(modules) * len(ATTRS)
    assert all(name in m.barriers for m in modules for name in m.kernels if name in names)
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), arch)
    for name in names:
        assert f".entry {name}(" in ptx
