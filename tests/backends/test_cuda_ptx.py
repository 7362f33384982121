"""PTX compilation of CUDA kernels in rnnc's generated style for sm_80 and sm_90."""

import pytest
from test_cuda_backend import CELLS, fuse_body
from test_cuda_emulate import KERNELS

import rnnc
from rnnc import passes
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx, load_nvrtc
from rnnc.ir import Program, retype

ARCHS = ("sm_80", "sm_90")


def compilers() -> list:
    """Every compiler present here, so both code paths run where both exist."""
    found = []
    if available_compiler() == "nvcc":
        found.append("nvcc")
    if load_nvrtc() is not None:
        found.append("nvrtc")
    if not found:
        reason = "no CUDA compiler: neither nvcc on PATH nor the nvidia-cuda-nvrtc wheel"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    return found


@pytest.mark.parametrize("compiler", compilers())
@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_to_ptx(compiler: str, arch: str) -> None:
    ptx = compile_ptx("\n".join(KERNELS.values()), arch, compiler=compiler)
    assert f".target {arch}" in ptx
    for name in KERNELS:
        assert f".entry {name}(" in ptx


@pytest.mark.parametrize("compiler", compilers())
def test_compile_error_shows_log_and_numbered_source(compiler: str) -> None:
    source = 'extern "C" __global__ void broken(float* y) {\n    y[0] = undefined_name;\n}\n'
    with pytest.raises(RuntimeError) as caught:
        compile_ptx(source, "sm_80", compiler=compiler)
    message = str(caught.value)
    assert "undefined_name" in message
    assert "   2 |     y[0] = undefined_name;" in message


def test_rejects_bad_arch_and_compiler() -> None:
    with pytest.raises(ValueError, match="arch must look like"):
        compile_ptx(KERNELS["masked_update"], "sm80; rm -rf /")
    with pytest.raises(ValueError, match="compiler must be"):
        compile_ptx(KERNELS["masked_update"], "sm_80", compiler="clang")


def generated_programs(name: str) -> dict[str, Program]:
    """The programs of a cell the backend compiles: inference, and training once autodiff exists.

    The body is fused by the tests' stand-in for fuse-elementwise when the pipeline has not
    fused it, so multi-result kernels and reductions inside regions are compiled too.
    """
    fn = rnnc.compile(CELLS[name](), backend="numpy")
    passes.pipeline("forward")  # loads every pass that exists
    modes = ["inference"]
    if "autodiff-forward" in passes.PASSES and "autodiff-backward" in passes.PASSES:
        modes += ["forward", "backward"]
    out = {}
    for mode in modes:
        program = fn.program(mode, "f32")
        if not any(n.op.name == "fused" for n in program.scan.body.nodes()):
            program = fuse_body(program)
        out[mode] = program
    return out


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
@pytest.mark.parametrize("arch", ARCHS)
def test_generated_kernels_compile_to_ptx(arch: str) -> None:
    """LSTM, GRU and MGU programs, their kernels prefixed apart to compile as one module."""
    modules = [codegen.render(program, prefix=f"{name}_{mode}_k_")
               for name in ("lstm", "gru", "mgu")
               for mode, program in generated_programs(name).items()]
    assert len({m.prelude for m in modules}) == 1
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), arch)
    for module in modules:
        for kernel in module.kernels:
            assert f".entry {kernel}(" in ptx


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
def test_generated_double_kernels_compile_to_ptx() -> None:
    program = retype(CELLS["layer_norm"]().program(), "f64")
    module = codegen.render(fuse_body(program))
    assert "double* __restrict__ out0" in module.source and "float" not in module.source
    ptx = compile_ptx(module.source, "sm_80")
    assert all(f".entry {kernel}(" in ptx for kernel in module.kernels)
