"""bfloat16 GEMMs of the CUDA loop round each loop constant once per call (cuda/bf16_gemm.py).

The recurrent weight ``U`` of ``h @ U`` (and of the backward's ``dG @ U^T``) is the same array at
every step: the plan rounds it to bfloat16 bits once per call, before the loop, and the per-step
GEMM reads those bits, rounding only the operand that changes from step to step. Counted through
the host's ``Rounder`` (every rounding, one launch of the rounding kernel each on a GPU), in
emulation and on the GPU path with cuBLAS simulated on the CPU (the operands' memory read as
cuBLAS reads it, bfloat16 bits widened) and the rounding kernel emulated. LSTM and GRU, forward
and backward, with lengths and initial states, on the GEMM and fused paths, against the bf16
oracle (``optimize=False, precision="bf16"`` on NumPy); a weight changed between calls is
rounded again (graphs replay the conversion); the kernels of the bf16 GEMM path compile to PTX
for sm_80 and sm_90.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_cuda_blas import as_cublas_reads, memory
from test_cuda_ptx import ARCHS, compilers

import rnnc
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.bf16 import ROUND_KERNEL, ROUND_SOURCE, emulated_matmul, widened
from rnnc.backends.cuda.bf16_gemm import Bf16Gemm, Rounder
from rnnc.backends.cuda.blas import COMPUTE_32F, CUDA_R_16BF
from rnnc.backends.cuda.emulate import EmulatedModule
from rnnc.backends.cuda.plan import Plans
from rnnc.backends.cuda.ptx import compile_ptx
from tests.backends.test_cuda_fused_step import T, case, make

TOLERANCE = dict(rtol=2e-5, atol=2e-6)  # float32 sums in another order than the oracle's
GRADIENT_TOLERANCE = dict(rtol=1e-4, atol=2e-5)
B, H = 3, 5


class SimulatedBf16Cublas:
    """``Cublas.gemm`` on the CPU for bfloat16 operands: the bits' memory read as cuBLAS reads
    it with the call's arguments, widened to float32 (exact), the column-major product
    written into ``out``'s memory; every call counted."""

    def __init__(self) -> None:
        self.calls = 0

    def gemm(self, a, b, out, arguments, data, compute) -> None:
        assert (data, compute) == (CUDA_R_16BF, COMPUTE_32F)
        assert a.dtype == b.dtype == np.uint16 and out.dtype == np.float32
        self.calls += 1
        op_b, op_a, n, m, k, ld_b, ld_a, ld_out = arguments
        (fa, oa), (fb, ob), (fc, oc) = memory(a), memory(b), memory(out)
        product = (as_cublas_reads(op_b, widened(fb)[ob:], n, k, ld_b)
                   @ as_cublas_reads(op_a, widened(fa)[oa:], k, m, ld_a))
        for r in range(n):
            for c in range(m):
                fc[oc + r + c * ld_out] = product[r, c]


def rounding_kernel():
    """The rounding kernel a GPU launches, compiled for the CPU."""
    return EmulatedModule(ROUND_SOURCE, [ROUND_KERNEL]).get_function(ROUND_KERNEL)


def compile_cell(cell: rnnc.Cell, fused_step: str) -> rnnc.Function:
    return rnnc.compile(cell, backend="cuda", emulate=True, precision="bf16",
                        fused_step=fused_step)


def hosts(fn: rnnc.Function):
    """Every host of every runner ``fn`` has built, with its runner's key."""
    return [(key, host) for key, runner in fn._runners.items()
            for host in runner.hosts.values()]


def simulate_the_gpu(fn: rnnc.Function) -> tuple[SimulatedBf16Cublas, Rounder]:
    """Make ``fn``'s hosts run their GEMMs as on a GPU (cuBLAS simulated, the rounding kernel
    emulated), their plans built again."""
    blas, rounder = SimulatedBf16Cublas(), Rounder(np, rounding_kernel())
    for runner in fn._runners.values():
        runner.plans = Plans()
        for host in runner.hosts.values():
            host.blas, host.rounder = blas, rounder
    return blas, rounder


def launches(fn: rnnc.Function, mode: str) -> int:
    """The roundings the hosts of ``mode``'s runners have made."""
    return sum(host.rounding().launches for key, host in hosts(fn) if key[0] == mode)


def only_plan(fn: rnnc.Function, mode: str):
    (plan,) = [p for key, runner in fn._runners.items() if key[0] == mode
               for p in runner.plans.plans.values()]
    return plan


def expected_roundings(plan, steps: int) -> int:
    """A GEMM outside the loop rounds both operands once; the loop's GEMM its per-step
    operand at every step; each loop constant is converted once."""
    outside = plan.count("pre").get("gemm", 0) + plan.count("post").get("gemm", 0)
    return 2 * outside + plan.count("pre").get("convert", 0) + steps * plan.per_step(0)["gemm"]


def training_case(name: str, seed: int = 1):
    cell = make(name, H)
    return cell, *case(cell, B, np.float32, seed=seed)


def train(fn: rnnc.Function, x, params, states, lengths):
    """Forward and backward with fixed output gradients: outputs, finals and gradients."""
    ys, finals, tape = fn.forward(x, params, states=states, lengths=lengths)
    rng = np.random.default_rng(2)
    d_outputs = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in ys.items()}
    return ys, finals, fn.backward(tape, d_outputs=d_outputs)


def assert_trains_like_the_oracle(got, want) -> None:
    (ys, finals, grads), (want_ys, want_finals, want_grads) = got, want
    for key in want_ys:
        np.testing.assert_allclose(ys[key], want_ys[key], err_msg=key, **TOLERANCE)
    for key in want_finals:
        np.testing.assert_allclose(finals[key], want_finals[key], err_msg=key, **TOLERANCE)
    for part in ("params", "states"):
        for key, want_value in getattr(want_grads, part).items():
            np.testing.assert_allclose(getattr(grads, part)[key], want_value,
                                       err_msg=f"{part} {key}", **GRADIENT_TOLERANCE)
    np.testing.assert_allclose(grads.x, want_grads.x, **GRADIENT_TOLERANCE)


@pytest.mark.parametrize("steps", [1, 4, 9])
def test_the_gemm_path_rounds_the_recurrent_weight_once_per_call(steps: int) -> None:
    """An LSTM's GEMM path at T steps: the hoisted input projection rounds x and W once, U is
    converted once before the loop, h is rounded at every step: 3 + T per call, every call
    (graphs replay the conversion). Rounding U at every step too would be 2 + 2T."""
    cell = make("lstm", H)
    fn = compile_cell(cell, "never")
    x = np.random.default_rng(0).standard_normal((steps, B, 4)).astype(np.float32)
    params = cell.init_params(seed=0)
    for call in range(3):
        before = launches(fn, "inference")
        fn(x, params)
        assert launches(fn, "inference") - before == 3 + steps, call
    plan = only_plan(fn, "inference")
    assert plan.count("pre") == {"gemm": 1, "kernel": 1, "convert": 1}
    assert plan.per_step(0)["gemm"] == 1


# The fused GRU's forward kernels are also checked by test_cuda_bf16_kernels.py.
@pytest.mark.parametrize("name, fused_step", [
    ("lstm", "never"), ("gru", "never"), ("lstm", "always"),
    pytest.param("gru", "always", marks=pytest.mark.slow)])
def test_training_matches_the_bf16_oracle(name: str, fused_step: str) -> None:
    """Forward and backward (whose loop GEMM ``dG @ U^T`` reads U converted once) with
    lengths and initial states; the roundings of each call counted."""
    cell, x, params, states, lengths = training_case(name)
    oracle = rnnc.compile(cell, optimize=False, precision="bf16")
    fn = compile_cell(cell, fused_step)
    want = train(oracle, x, params, states, lengths)
    assert_trains_like_the_oracle(train(fn, x, params, states, lengths), want)
    forward, backward = only_plan(fn, "forward"), only_plan(fn, "backward")
    assert forward.count("pre")["convert"] == backward.count("pre")["convert"] == 1
    assert ("gemm" in forward.per_step(0)) == (fused_step == "never")
    before = {mode: launches(fn, mode) for mode in ("forward", "backward")}
    train(fn, x, params, states, lengths)
    for mode, plan in (("forward", forward), ("backward", backward)):
        expected = expected_roundings(plan, T) if fused_step == "never" or mode == "backward" \
            else plan.count("pre").get("gemm", 0) * 2 + 1  # the fused loop rounds in-kernel
        assert launches(fn, mode) - before[mode] == expected, mode


@pytest.mark.parametrize("name", ["lstm", pytest.param("gru", marks=pytest.mark.slow)])
def test_the_gpu_path_rounds_each_weight_once_and_matches_the_oracle(name: str) -> None:
    """The GPU's calls (cuBLAS on bfloat16 bits, the rounding kernel), simulated: forward and
    backward agree with the oracle, and each call launches the rounding kernel once per
    loop constant and once per step for the state."""
    cell, x, params, states, lengths = training_case(name)
    fn = compile_cell(cell, "never")
    want = train(rnnc.compile(cell, optimize=False, precision="bf16"), x, params, states,
                 lengths)
    train(fn, x, params, states, lengths)  # builds the runners
    blas, rounder = simulate_the_gpu(fn)
    assert_trains_like_the_oracle(train(fn, x, params, states, lengths), want)
    forward, backward = only_plan(fn, "forward"), only_plan(fn, "backward")
    gemms = sum(sum(plan.count(where).get("gemm", 0) for where in ("pre", "body", "post"))
                for plan in (forward, backward))
    assert gemms > 2 * T and blas.calls == gemms  # every bf16 GEMM in cuBLAS, no fallback
    assert rounder.launches == expected_roundings(forward, T) + expected_roundings(backward, T)


@pytest.mark.parametrize("path", ["never", "always", "gpu"])
def test_a_weight_changed_between_calls_is_rounded_again(path: str) -> None:
    """Call, change the parameters in place (the arrays the user holds), call again: the
    second call's results are the oracle's for the new parameters, on each path."""
    cell = make("lstm", H)
    x, params, states, lengths = case(cell, B, np.float32)
    oracle = rnnc.compile(cell, optimize=False, precision="bf16")
    fn = compile_cell(cell, "always" if path == "always" else "never")
    fn(x, params, states=states, lengths=lengths)
    if path == "gpu":
        simulate_the_gpu(fn)
        fn(x, params, states=states, lengths=lengths)
    first, _ = oracle(x, params, states=states, lengths=lengths)
    for value in params.values():
        value *= np.float32(-1.5)
    got, got_finals = fn(x, params, states=states, lengths=lengths)
    want, want_finals = oracle(x, params, states=states, lengths=lengths)
    assert np.abs(want["y"] - first["y"]).max() > 0.1  # a stale weight would show
    np.testing.assert_allclose(got["y"], want["y"], **TOLERANCE)
    for key in want_finals:
        np.testing.assert_allclose(got_finals[key], want_finals[key], **TOLERANCE)


def test_a_gemm_rounds_only_what_is_not_bits_already() -> None:
    """An operand given as bits is read as it is; a float32 one is rounded (a transposed
    view through the array under it, a view with neither order contiguous through a copy in
    emulation); the product is that of the rounded operands."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 8)).astype(np.float32)
    w = rng.standard_normal((8, 10)).astype(np.float32)
    w_bits = w.astype(ml_dtypes.bfloat16).view(np.uint16)
    want = a.astype(ml_dtypes.bfloat16).astype(np.float32) @ \
        w.astype(ml_dtypes.bfloat16).astype(np.float32)
    for rounder in (Rounder(np), Rounder(np, rounding_kernel())):
        gemm = Bf16Gemm(np, rounder)
        for operand, rounds in ((a, 1), (np.asfortranarray(a), 1),
                                (np.repeat(a, 2, axis=1)[:, ::2], 1)):
            before = rounder.launches
            out = np.zeros((6, 10), np.float32)
            gemm(operand, w_bits, out=out)
            assert rounder.launches - before == rounds
            np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
        before = rounder.launches
        gemm(a, w, out=out)  # a float32 weight: rounded at this call
        assert rounder.launches - before == 2


def test_on_a_gpu_a_layout_cublas_cannot_read_falls_back_with_the_bits() -> None:
    """An operand with neither order contiguous goes to the fallback (CuPy's bfloat16 matmul,
    here the emulation), given the weight's bits as they are; the others to cuBLAS."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 8)).astype(np.float32)
    w_bits = rng.standard_normal((8, 10)).astype(ml_dtypes.bfloat16).view(np.uint16).copy()
    want = a.astype(ml_dtypes.bfloat16).astype(np.float32) @ widened(w_bits)
    blas = SimulatedBf16Cublas()
    gemm = Bf16Gemm(np, Rounder(np, rounding_kernel()), blas, emulated_matmul)
    for operand, calls in ((a, 1), (np.repeat(a, 2, axis=1)[:, ::2], 1)):
        out = np.zeros((6, 10), np.float32)
        gemm(operand, w_bits, out=out)
        assert blas.calls == calls
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compiler", compilers())
@pytest.mark.parametrize("arch", ARCHS)
def test_the_kernels_of_the_bf16_gemm_path_compile_to_ptx(compiler: str, arch: str) -> None:
    """What a bf16 GEMM-path call launches: the LSTM's and GRU's kernels of every mode and the
    rounding kernel, as one module."""
    modules = []
    for name in ("lstm", "gru"):
        fn = rnnc.compile(make(name, H), backend="numpy", precision="bf16")
        for mode in ("inference", "forward", "backward"):
            modules.append(codegen.render(fn.program(mode, "f32", True),
                                          prefix=f"{name}_{mode}_", fused_step="never"))
    assert not any(m.fused for m in modules)
    source = modules[0].prelude + "".join(m.kernel_text for m in modules) + ROUND_SOURCE
    ptx = compile_ptx(source, arch, compiler=compiler)
    assert f".target {arch}" in ptx
    for kernel in [k for m in modules for k in m.kernels] + [ROUND_KERNEL]:
        assert f".entry {kernel}(" in ptx
