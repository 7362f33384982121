"""The CUDA backend's fused recurrent step, in emulation: one kernel for a step's product and the
region reading it (``backends/cuda/fused_step.py``, ``fused_tile.py``).

Every result is compared with the unoptimized traced program on the NumPy backend (the oracle),
with batch sizes and hidden sizes that are not multiples of the tile (B=3, H=5 and B=37, H=70:
edge tiles along the rows, the units and the contraction axis), variable lengths, float32 and
float64, inference and training (the forward's outputs and the backward's gradients). The
plan's per-step counts show which path ran; every fused kernel compiles to PTX for sm_80 and
sm_90 where nvcc or NVRTC exists.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.fused_step import FusedStep
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx
from rnnc.tools.bench.configs import ln_lstm

CELLS = ("lstm", "gru", "peephole_lstm", "mgu", "rnn")
# Products per step: MGU's second product reads the first region's result, so it has two.
PRODUCTS = {"mgu": 2}
INPUT = 4
T = 4
SIZES = [(3, 5), (37, 70)]  # (B, H)
TOLERANCE = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}


def tied_lstm(input_size: int, hidden_size: int) -> rnnc.Cell:
    """An LSTM whose recurrent matrix is stored transposed, (4H, H): ``h @ U.T``."""
    c = rnnc.Cell("tied_lstm")
    x, h, cs = c.input("x", input_size), c.state("h", hidden_size), c.state("c", hidden_size)
    W = c.param("W", (input_size, 4 * hidden_size))
    U = c.param("U", (4 * hidden_size, hidden_size))
    b = c.param("b", (4 * hidden_size,))
    z = x @ W + h @ U.T + b
    H = hidden_size
    i, f = rnnc.sigmoid(z[:, :H]), rnnc.sigmoid(z[:, H:2 * H])
    g, o = rnnc.tanh(z[:, 2 * H:3 * H]), rnnc.sigmoid(z[:, 3 * H:])
    c_new = f * cs + i * g
    h_new = o * rnnc.tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


def make(name: str, H: int, input_size: int = INPUT) -> rnnc.Cell:
    if name == "tied_lstm":
        return tied_lstm(input_size, H)
    return getattr(rnnc.cells, name)(input_size, H)


def case(cell: rnnc.Cell, B: int, dtype: type, seed: int = 0, input_size: int = INPUT
         ) -> tuple:
    """Inputs, parameters, initial states and lengths (one sequence ends after one step)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, input_size)).astype(dtype)
    params = {k: v.astype(dtype) for k, v in cell.init_params(seed=seed).items()}
    fn = rnnc.compile(cell, optimize=False)
    _, finals = fn(x, params)
    states = {k: (0.5 * rng.standard_normal(v.shape)).astype(dtype) for k, v in finals.items()}
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = 1
    return x, params, states, lengths


def only_plan(fn: rnnc.Function, mode: str, dtype: type, masked: bool):
    plans = fn._runners[(mode, "f32" if dtype is np.float32 else "f64", masked)].plans.plans
    assert len(plans) == 1, len(plans)
    return next(iter(plans.values()))


def assert_close(got: dict, want: dict, dtype: type) -> None:
    for key in want:
        np.testing.assert_allclose(got[key], want[key], err_msg=key, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("B, H", SIZES, ids=["3x5", "37x70"])
@pytest.mark.parametrize("name", CELLS + ("tied_lstm",))
def test_inference_matches_the_oracle(name: str, B: int, H: int, dtype: type) -> None:
    cell = make(name, H)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="always")
    oracle = rnnc.compile(cell, optimize=False)
    x, params, states, lengths = case(cell, B, dtype)
    for given in (None, lengths):
        ys, finals = fn(x, params, states=states, lengths=given)
        want, want_finals = oracle(x, params, states=states, lengths=given)
        assert_close(ys, want, dtype)
        assert_close(finals, want_finals, dtype)
        plan = only_plan(fn, "inference", dtype, given is not None)
        for step in range(T):
            assert plan.per_step(step) == {"kernel": PRODUCTS.get(name, 1)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("B, H", SIZES, ids=["3x5", "37x70"])
@pytest.mark.parametrize("name", CELLS)
def test_training_matches_the_oracle(name: str, B: int, H: int, dtype: type) -> None:
    """The forward runs fused steps; the backward keeps its GEMMs; both match the oracle."""
    cell = make(name, H)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="always")
    oracle = rnnc.compile(cell, optimize=False)
    x, params, states, lengths = case(cell, B, dtype, seed=1)
    got, got_finals, tape = fn.forward(x, params, states=states, lengths=lengths)
    want, want_finals, want_tape = oracle.forward(x, params, states=states, lengths=lengths)
    assert_close(got, want, dtype)
    assert_close(got_finals, want_finals, dtype)
    rng = np.random.default_rng(2)
    d_outputs = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in want.items()}
    grads = fn.backward(tape, d_outputs=d_outputs)
    want_grads = oracle.backward(want_tape, d_outputs=d_outputs)
    gradient_tolerance = dict(rtol=2e-3, atol=2e-4) if dtype is np.float32 else \
        TOLERANCE[dtype]
    for key in want_grads.params:
        np.testing.assert_allclose(grads.params[key], want_grads.params[key], err_msg=key,
                                   **gradient_tolerance)
    np.testing.assert_allclose(grads.x, want_grads.x, **gradient_tolerance)
    for key in want_grads.states:
        np.testing.assert_allclose(grads.states[key], want_grads.states[key], err_msg=key,
                                   **gradient_tolerance)
    forward = only_plan(fn, "forward", dtype, True)
    assert forward.per_step(T - 1) == {"kernel": PRODUCTS.get(name, 1)}
    assert "gemm" in only_plan(fn, "backward", dtype, True).per_step(0)


def per_step(cell: rnnc.Cell, mode: str, fused_step: str, masked: bool = False) -> dict:
    """The launches and GEMMs of the last step of a call of ``mode``; copies, which do not
    depend on the path (an Elman forward copies its state into a second stack), left out."""
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step=fused_step)
    x, params, _, lengths = case(cell, 2, np.float32)
    given = lengths if masked else None
    if mode == "inference":
        fn(x, params, lengths=given)
    else:
        fn.forward(x, params, lengths=given)
    counts = only_plan(fn, mode, np.float32, masked).per_step(T - 1)
    return {kind: n for kind, n in counts.items() if kind != "copy"}


@pytest.mark.parametrize("mode", ["inference", "forward"])
@pytest.mark.parametrize("name", CELLS)
def test_a_step_is_one_kernel_per_product_unless_told_never(name: str, mode: str) -> None:
    cell = make(name, 5)
    products = PRODUCTS.get(name, 1)
    assert per_step(cell, mode, "auto") == {"kernel": products}  # emulation: "always"
    assert per_step(cell, mode, "always", masked=True) == {"kernel": products}
    assert per_step(cell, mode, "never") == {"gemm": products, "kernel": products}


def test_a_region_that_is_not_unit_local_keeps_its_gemm() -> None:
    cell = ln_lstm(INPUT, 5)
    assert per_step(cell, "inference", "always") == per_step(cell, "inference", "never")
    assert per_step(cell, "inference", "always")["gemm"] == 1
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="always")
    oracle = rnnc.compile(cell, optimize=False)
    x, params, states, _ = case(cell, 3, np.float32)
    assert_close(fn(x, params, states=states)[0], oracle(x, params, states=states)[0],
                 np.float32)


def test_tf32_keeps_the_gemm_path() -> None:
    cell = make("lstm", 5)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="always", precision="tf32")
    x, params, _, _ = case(cell, 2, np.float32)
    fn(x, params)
    assert only_plan(fn, "inference", np.float32, False).per_step(0) == {"gemm": 1, "kernel": 1}


def test_a_bad_option_value_names_the_choices() -> None:
    with pytest.raises(rnnc.RnncValueError, match="'auto', 'always', 'never'.*'sometimes'"):
        rnnc.compile(make("gru", 5), backend="cuda", emulate=True, fused_step="sometimes")


def test_the_source_holds_the_paths_the_mode_runs() -> None:
    """The fused kernels are part of the module source that is compiled (and cached by it):
    "never" is the GEMM path alone, "always" the fused path alone, "auto" both."""
    program = rnnc.compile(make("lstm", 5), backend="numpy").program("inference", "f32")
    sources = {mode: codegen.render(program, fused_step=mode) for mode in
               ("never", "always", "auto")}
    assert "__syncthreads" not in sources["never"].source
    assert sources["never"].barriers == [] and sources["never"].gemm_body is None
    for mode in ("always", "auto"):
        module = sources[mode]
        assert [type(s) for s in module.steps["body"]] == [FusedStep]
        assert module.barriers == [module.steps["body"][0].kernel]
        assert f"void __launch_bounds__(64) {module.barriers[0]}(" in module.source
    assert sources["always"].gemm_body is None
    assert [type(s).__name__ for s in sources["auto"].gemm_body] == ["Gemm", "Launch"]
    fn = rnnc.compile(make("lstm", 5), backend="cuda", emulate=True)
    fn(*case(make("lstm", 5), 2, np.float32)[:2])
    runner = fn._runners[("inference", "f32", False)]
    assert runner.loaded.source == runner.source == sources["auto"].source


def test_a_backward_program_renders_no_fused_step() -> None:
    program = rnnc.compile(make("gru", 5), backend="numpy").program("backward", "f32")
    module = codegen.render(program, fused_step="always")
    assert module.barriers == [] and not module.fused


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
# Each arch and each dtype in the default suite (f32 for sm_80, f64 for sm_90); the two other
# pairs with the heavier checks (pytest -m slow).
@pytest.mark.parametrize("arch, dtype", [
    ("sm_80", "f32"), ("sm_90", "f64"),
    pytest.param("sm_80", "f64", marks=pytest.mark.slow),
    pytest.param("sm_90", "f32", marks=pytest.mark.slow)])
def test_fused_kernels_compile_to_ptx(arch: str, dtype: str) -> None:
    """Every cell's fused kernels, inference and training forward, at both sizes, as one
    module (kernels prefixed apart, the prelude once)."""
    modules = []
    for name in CELLS + ("tied_lstm",):
        for H in (5, 70):
            fn = rnnc.compile(make(name, H), backend="numpy")
            for mode in ("inference", "forward"):
                prefix = f"{name}_{H}_{mode}_k_"
                modules.append(codegen.render(fn.program(mode, dtype, True), prefix=prefix,
                                              fused_step="always"))
    assert all(module.barriers for module in modules)
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), arch)
    for module in modules:
        for kernel in module.kernels:
            assert f".entry {kernel}(" in ptx
