"""The CUDA backend's persistent kernel, in emulation: the whole time loop of a small cell as one
cooperative launch with a grid barrier per step (``backends/cuda/persistent.py``).

Every result is compared with the unoptimized traced program on the NumPy backend (the oracle):
LSTM, GRU and Elman cells, float32 and float64, forward and reverse scans, with and without
lengths, batch and hidden sizes that are not multiples of the tile (B=3, H=5), inference and
training (the forward's outputs and saved values through the backward's gradients). The plan
shows one persistent launch and no per-step work; shapes whose grid does not fit fall back to the
per-step fused kernels and stay correct; every persistent kernel compiles to PTX for sm_80 and
sm_90. Sizes are tiny: the emulator runs one fiber per CUDA thread.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import rnnc
from rnnc.backends.cuda import autotune, codegen, cooperative
from rnnc.backends.cuda.persistent import persistent_tile, resident_blocks
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx
from rnnc.backends.schedule import CudaSchedule
from tests.backends import test_cuda_fused_step as fused_step_tests
from tests.backends.test_cuda_autotune import FakeStream

CELLS = ("lstm", "gru", "rnn")
INPUT = 3
T = 4
TOLERANCE = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}
GRADIENT_TOLERANCE = {np.float32: dict(rtol=2e-3, atol=2e-4),
                      np.float64: dict(rtol=1e-9, atol=1e-11)}


# The fused step's tests' cells and data, at this file's input size.
make = partial(fused_step_tests.make, input_size=INPUT)
case = partial(fused_step_tests.case, input_size=INPUT)


def plans(fn: rnnc.Function, mode: str) -> list:
    """The plans of every runner of ``mode`` (one per dtype and masking)."""
    return [plan for key, runner in fn._runners.items() if key[0] == mode
            for plan in runner.plans.plans.values()]


def assert_close(got: dict, want: dict, tolerance: dict) -> None:
    for key in want:
        np.testing.assert_allclose(got[key], want[key], err_msg=key, **tolerance)


def assert_persistent(plan) -> None:
    """The loop is one persistent launch: no step records anything of its own."""
    assert plan.count("body") == {"persistent": 1}
    assert all(plan.per_step(step) == {} for step in range(T))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", CELLS + ("tied_lstm",))
def test_inference_matches_the_oracle(name: str, dtype: type, reverse: bool) -> None:
    cell = make(name, 5)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="persistent",
                      reverse=reverse)
    oracle = rnnc.compile(cell, optimize=False, reverse=reverse)
    x, params, states, lengths = case(cell, 3, dtype)
    for given in (None, lengths):
        ys, finals = fn(x, params, states=states, lengths=given)
        want, want_finals = oracle(x, params, states=states, lengths=given)
        assert_close(ys, want, TOLERANCE[dtype])
        assert_close(finals, want_finals, TOLERANCE[dtype])
    for plan in plans(fn, "inference"):
        assert_persistent(plan)


@pytest.mark.parametrize("name, dtype, reverse", [
    ("lstm", np.float32, False), ("gru", np.float64, True), ("rnn", np.float32, True),
    ("lstm", np.float64, True), ("gru", np.float32, False), ("rnn", np.float64, False)])
def test_training_matches_the_oracle(name: str, dtype: type, reverse: bool) -> None:
    """The forward is one persistent launch, its saved values feed the backward (GEMMs) and
    the gradients match the oracle's."""
    cell = make(name, 5)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="persistent",
                      reverse=reverse)
    oracle = rnnc.compile(cell, optimize=False, reverse=reverse)
    x, params, states, lengths = case(cell, 3, dtype, seed=1)
    got, got_finals, tape = fn.forward(x, params, states=states, lengths=lengths)
    want, want_finals, want_tape = oracle.forward(x, params, states=states, lengths=lengths)
    assert_close(got, want, TOLERANCE[dtype])
    assert_close(got_finals, want_finals, TOLERANCE[dtype])
    rng = np.random.default_rng(2)
    d_outputs = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in want.items()}
    grads = fn.backward(tape, d_outputs=d_outputs)
    want_grads = oracle.backward(want_tape, d_outputs=d_outputs)
    assert_close(grads.params, want_grads.params, GRADIENT_TOLERANCE[dtype])
    assert_close(grads.states, want_grads.states, GRADIENT_TOLERANCE[dtype])
    np.testing.assert_allclose(grads.x, want_grads.x, **GRADIENT_TOLERANCE[dtype])
    (forward,) = plans(fn, "forward")
    assert_persistent(forward)
    assert "gemm" in plans(fn, "backward")[0].per_step(0)


def run_limited(blocks: int, B: int, H: int) -> dict:
    """An LSTM inference of B rows and H units with room for ``blocks`` resident blocks: the
    last step's work, after checking the results against the oracle."""
    cell = make("lstm", H)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="persistent",
                      schedule=CudaSchedule(persistent_max_blocks=blocks))
    x, params, states, lengths = case(cell, B, np.float32, seed=3)
    ys, finals = fn(x, params, states=states, lengths=lengths)
    want, want_finals = rnnc.compile(cell, optimize=False)(x, params, states=states,
                                                           lengths=lengths)
    assert_close(ys, want, TOLERANCE[np.float32])
    assert_close(finals, want_finals, TOLERANCE[np.float32])
    (plan,) = plans(fn, "inference")
    return plan


def test_a_grid_of_fewer_blocks_than_row_tiles_loops_over_them() -> None:
    """B = 70 is three tiles of 32 rows; one resident block computes them all each step."""
    plan = run_limited(1, 70, 5)
    assert_persistent(plan)
    assert plan.path == "persistent"  # what Function.launch_report() names
    (launch,) = [call for call, entry in zip(plan.calls, plan.entries, strict=True)
                 if entry.kind == "persistent"]
    assert launch.args[0] == (1,)  # the grid


def test_a_grid_that_does_not_fit_falls_back_to_fused_steps() -> None:
    """H = 40 needs two blocks of 32 units; with room for one the steps run one by one."""
    plan = run_limited(1, 3, 40)
    assert "persistent" not in plan.count("body")
    assert plan.path == "fused"  # the report names the path that runs, not the one asked for
    assert all(plan.per_step(step) == {"kernel": 1} for step in range(T))


def test_where_the_persistent_kernel_applies() -> None:
    """MGU's two dependent products per step, a backward program, and recurrent weights too
    large for shared memory even one unit per block leave no persistent kernel."""
    def module(name: str, mode: str, fused_step: str = "persistent", H: int = 5):
        program = rnnc.compile(make(name, H), backend="numpy").program(mode, "f32")
        return codegen.render(program, fused_step=fused_step)

    assert module("lstm", "inference").persistent is not None
    assert module("lstm", "inference", "auto").persistent is not None
    assert module("lstm", "inference", "always").persistent is None
    assert module("mgu", "inference").persistent is None
    assert module("gru", "backward").persistent is None
    assert persistent_tile(3100, 4, 3100, 4) is None  # 4 gates x 3100 rows: 49.6 KB per unit
    tile = persistent_tile(256, 4, 256, 4)  # a float32 LSTM's H = 256: 8 units per block
    assert tile is not None and tile.units == 8


def test_auto_in_emulation_keeps_the_fused_steps() -> None:
    cell = make("gru", 5)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    x, params, _, _ = case(cell, 2, np.float32)
    fn(x, params)
    runner = fn._runners[("inference", "f32", False)]
    assert "persistent" not in runner.hosts
    assert plans(fn, "inference")[0].per_step(0) == {"kernel": 1}


class FakeCupy:
    """What :func:`resident_blocks` asks of CuPy: the driver's occupancy query and the
    device's multiprocessor count (the query fails for a kernel handle of 0)."""

    def __init__(self) -> None:
        def occupancy(function: int, threads: int, shared: int) -> int:
            if not function:
                raise RuntimeError("CUDA_ERROR_INVALID_HANDLE")
            return 2048 // threads

        device = type("Device", (), {"attributes": {"MultiProcessorCount": 132}})
        self.cuda = type("cuda", (), {"driver": type("driver", (), {
            "occupancyMaxActiveBlocksPerMultiprocessor": staticmethod(occupancy)}),
            "Device": device})


def test_resident_blocks_on_a_gpu_come_from_the_occupancy_query() -> None:
    kernel = type("RawKernel", (), {"kernel": type("Function", (), {"ptr": 1})})
    assert resident_blocks(FakeCupy(), kernel, 256) == 8 * 132
    kernel.kernel.ptr = 0
    assert resident_blocks(FakeCupy(), kernel, 256) == 0  # no query: no persistent launch
    assert resident_blocks(None, kernel, 256) == cooperative.MAX_COOPERATIVE_THREADS // 256


def test_a_timed_choice_can_keep_the_persistent_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a runner does when it times its plans on a GPU, driven in emulation with a stand-in
    for the timing: the persistent plan, timed beside the fused one, is kept when faster."""
    cell = make("lstm", 5)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="persistent")
    x, params, _, _ = case(cell, 2, np.float32)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    fn(x, params)
    runner = fn._runners[("inference", "f32", False)]
    timed: list[str] = []

    def measure(cupy: object, stream: object, plans: dict, env: dict) -> tuple[dict, dict]:
        timed.extend(sorted(plans))
        return {"fused": 2.0, "persistent": 1.0}, {}

    monkeypatch.setattr(autotune, "measure", measure)
    monkeypatch.setattr(runner, "backend", type("Backend", (), {"cupy": object()}))
    runner.timed, runner._stream = True, FakeStream()
    (plan,) = plans(fn, "inference")
    env = {name: array.copy() for name, array in plan.inputs.items()}
    chosen = runner._new_plan(("a new shape",), env, {"T": T, "B": 2})
    assert timed == ["fused", "persistent"]
    assert_persistent(chosen)
    # The search was over schedules: the runner's, with each path's fixed fused_step.
    assert runner.schedule.fused_step == "persistent"
    assert runner.schedules[("a new shape",)] == CudaSchedule(
        precision="highest", fused_step="persistent")
    for name, array in env.items():
        np.copyto(chosen.inputs[name], array)
    chosen.run()
    np.testing.assert_allclose(chosen.results["y"], want["y"], **TOLERANCE[np.float32])


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
# Each arch and each dtype in the default suite (f32 for sm_80, f64 for sm_90); the two other
# pairs with the heavier checks (pytest -m slow).
@pytest.mark.parametrize("arch, dtype", [
    ("sm_80", "f32"), ("sm_90", "f64"),
    pytest.param("sm_80", "f64", marks=pytest.mark.slow),
    pytest.param("sm_90", "f32", marks=pytest.mark.slow)])
def test_persistent_kernels_compile_to_ptx(arch: str, dtype: str) -> None:
    """Every qualifying cell's persistent kernel, inference and training forward, forward and
    reverse, small and large H, as one source (kernels named apart, the prelude once)."""
    kernels = []
    for name in CELLS + ("peephole_lstm", "tied_lstm"):
        for H, reverse in ((5, False), (70, True)):
            fn = rnnc.compile(make(name, H), backend="numpy", reverse=reverse)
            for mode in ("inference", "forward"):
                module = codegen.render(fn.program(mode, dtype, True),
                                        prefix=f"{name}_{H}_{mode}_",
                                        fused_step="persistent")
                assert module.persistent is not None, (name, H, mode)
                kernels.append(module.persistent)
    prelude = kernels[0].source[:-len(kernels[0].text)]
    ptx = compile_ptx(prelude + "".join(kernel.text for kernel in kernels), arch)
    for kernel in kernels:
        assert f".entry {kernel.kernel}(" in ptx
