"""The Schedule value (backends/schedule.py): how a backend runs a program, as data.

Each backend derives one from its options; a schedule given as ``schedule=`` forces a path;
its key is what the code cache hashes. Paths are checked against the unoptimized program on
the NumPy backend; the rest checks the value itself and its errors.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rnnc
from rnnc import backends
from rnnc.backends.schedule import CudaSchedule, LlvmSchedule, Schedule
from rnnc.errors import RnncTypeError, RnncValueError


def test_every_backend_derives_a_schedule_from_its_options() -> None:
    program = rnnc.compile(rnnc.cells.gru(3, 4), backend="numpy").program("inference", "f32")
    assert backends.get("numpy").schedule(program, "inference") == Schedule("highest")
    cuda = backends.get("cuda", emulate=True, fused_step="always")
    assert cuda.schedule(program, "inference") == CudaSchedule("highest", "always")
    assert cuda.schedule(program, "backward").fused_step == "never"  # keeps its GEMMs
    pytest.importorskip("llvmlite")
    llvm = backends.get("llvm", threads=3, team=False, cache_dir=False)
    assert llvm.schedule(program, "inference") == LlvmSchedule(
        "highest", threads=3, team=False, team_split="columns")


def test_key_names_the_compiled_fields_only() -> None:
    schedule = LlvmSchedule(threads=2)
    assert schedule.key() == LlvmSchedule(threads=2).key()  # stable text
    assert "threads=2" in schedule.key() and "team_min_work" not in schedule.key()
    assert "team_min_work=4194304" in schedule.key(per_call=True)
    # A per-call threshold changes no code; a compiled field does.
    assert dataclasses.replace(schedule, team_min_work=0).key() == schedule.key()
    assert dataclasses.replace(schedule, panel_max_work=0).key() != schedule.key()
    assert CudaSchedule().key() != LlvmSchedule().key()


def test_a_build_reads_only_its_fields() -> None:
    """Backends of 2 and 4 threads share the one-thread build; the team build ignores the
    thread count and the one-thread build the team's split."""
    two, four = LlvmSchedule(threads=2), LlvmSchedule(threads=4)
    assert two.for_build(False) == four.for_build(False) != LlvmSchedule(threads=1).for_build(
        False)
    assert two.for_build(True) == four.for_build(True)
    units = dataclasses.replace(two, team_split="units")
    assert units.for_build(False) == two.for_build(False)
    assert units.for_build(True) != two.for_build(True)


@pytest.mark.parametrize("make, message", [
    (lambda: LlvmSchedule(team_split="gates"), "team_split must be one of 'columns', 'units'"),
    (lambda: LlvmSchedule(threads=0), "threads must be a whole number"),
    (lambda: LlvmSchedule(team_min_work=-1), "team_min_work must be a whole number >= 0"),
    (lambda: LlvmSchedule(scan_chunk_min_steps=1.5), "scan_chunk_min_steps must be a whole"),
    (lambda: LlvmSchedule(precision="tf32"), "precision must be one of 'fp32', 'bf16', got"),
    (lambda: CudaSchedule(fused_step="sometimes"), "fused_step must be one of 'auto'"),
    (lambda: CudaSchedule(persistent_max_blocks=True), "persistent_max_blocks must be"),
    (lambda: CudaSchedule(scan_columns=64, scan_chunks=32), "at most 1024 threads"),
    (lambda: CudaSchedule(block_threads=2048), "block_threads must be from 1 to 1024"),
    (lambda: LlvmSchedule(gemm_row_block=0), "gemm_row_block must be at least 1"),
    (lambda: LlvmSchedule(kernel_nodes=0), "kernel_nodes must be at least 1"),
    (lambda: LlvmSchedule(scan_workspace_bytes=-1), "scan_workspace_bytes must be a whole"),
    (lambda: LlvmSchedule(blas_one_thread_max_work=None), "blas_one_thread_max_work must be"),
    (lambda: CudaSchedule(graph_steps=0), "graph_steps must be at least 1"),
    (lambda: CudaSchedule(tile_depths=(8, 16, 1)), "tile_depths must be a tuple of whole"),
    (lambda: CudaSchedule(tile_depths=(4, 2)), "deepest first, ending in 1"),
    (lambda: CudaSchedule(tile_max_units=24), "tile_max_units \\(a power of two\\)"),
    (lambda: CudaSchedule(tile_row_threads=64, tile_max_units=32), "make 1 to 1024 threads"),
])
def test_bad_fields_are_named(make, message) -> None:
    with pytest.raises(RnncValueError, match=message):
        make()


def test_team_must_be_a_bool() -> None:
    with pytest.raises(RnncTypeError, match="team must be True or False"):
        LlvmSchedule(team="yes")


def test_a_schedule_of_another_backend_or_a_field_given_twice_is_refused() -> None:
    with pytest.raises(RnncTypeError, match=r"takes schedule=CudaSchedule\(...\)"):
        backends.get("cuda", emulate=True, schedule=LlvmSchedule())
    with pytest.raises(RnncValueError, match="fused_step is given both"):
        backends.get("cuda", emulate=True, fused_step="never",
                      schedule=CudaSchedule(fused_step="always"))
    pytest.importorskip("llvmlite")
    with pytest.raises(RnncTypeError, match=r"takes schedule=LlvmSchedule\(...\)"):
        backends.get("llvm", cache_dir=False, schedule={"threads": 2})
    with pytest.raises(RnncValueError, match="threads is given both"):
        backends.get("llvm", cache_dir=False, threads=2, schedule=LlvmSchedule(threads=2))


def test_a_forced_path_matches_the_oracle_and_is_its_own_code(tmp_path) -> None:
    """panel_max_work=0 sends every product of a backend of two threads to the BLAS instead
    of the panel kernel: the same results (to rounding), code of its own in the cache; a
    per-call threshold reuses the code."""
    pytest.importorskip("llvmlite")
    cell = rnnc.cells.lstm(3, 32)
    x = np.random.default_rng(0).standard_normal((4, 5, 3))  # B = 5: past the axpy kernel
    params = cell.init_params(seed=1, dtype=np.float64)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    entries = []
    for schedule in (LlvmSchedule(), LlvmSchedule(panel_max_work=0),
                     LlvmSchedule(panel_max_work=0, team_min_work=0)):
        fn = rnnc.compile(cell, backend="llvm", threads=2, team=False, cache_dir=tmp_path,
                          schedule=schedule)
        got, _ = fn(x, params)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-10, atol=1e-12)
        entries.append(len(list((tmp_path / "llvm").glob("*.entry"))))
    assert entries == [1, 2, 2]


def test_a_pickled_function_keeps_its_schedule() -> None:
    pytest.importorskip("llvmlite")
    import pickle

    fn = rnnc.compile(rnnc.cells.gru(2, 3), backend="llvm", cache_dir=False,
                      schedule=LlvmSchedule(team_min_work=0))
    again = pickle.loads(pickle.dumps(fn))
    assert again.backend.base_schedule == fn.backend.base_schedule
    assert again.backend.base_schedule.team_min_work == 0
