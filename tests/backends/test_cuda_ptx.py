"""PTX compilation of CUDA kernels in rnnc's generated style for sm_80 and sm_90."""

import pytest
from rnnc.backends.cuda.ptx import available_compiler, compile_ptx, load_nvrtc
from test_cuda_emulate import KERNELS

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
