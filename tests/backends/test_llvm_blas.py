"""BLAS bindings of the LLVM backend: each library computes the right product."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import llvmlite.binding as llvm  # noqa: E402
from llvmlite import ir  # noqa: E402

from rnnc.backends.llvm import autotune, blas, gemm  # noqa: E402

LIBRARIES = {
    "openblas": "scipy-openblas32",
    "scipy": "scipy (scipy.linalg.cython_blas)",
    "mkl": "mkl (Intel MKL wheel)",
}


def _library(name: str) -> blas.Blas:
    libraries = blas.available()
    if name not in libraries:
        pytest.skip(f"{LIBRARIES[name]} is not installed")
    return libraries[name]


def _operands(dtype, transa: bool, transb: bool, m: int = 7, n: int = 5, k: int = 3):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m) if transa else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transb else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    op_a = a.T if transa else a
    op_b = b.T if transb else b
    expected = 1.5 * op_a.astype(np.float64) @ op_b.astype(np.float64) - 0.5 * c
    return a, b, c, expected


@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(LIBRARIES))
def test_ctypes_call_computes_row_major_product(name, dtype, transa, transb) -> None:
    library = _library(name)
    a, b, c, expected = _operands(dtype, transa, transb)
    m, n = c.shape
    k = a.shape[0] if transa else a.shape[1]
    blas.call_gemm_ctypes(
        library, transa, transb, m, n, k, 1.5, a, a.shape[1], b, b.shape[1], -0.5, c, n
    )
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)


class _GemmJit:
    """JIT one function per (library, dtype, transposes) that calls GEMM via inttoptr."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.engines = []

    def compile(self, library: blas.Blas, dtype, transa: bool, transb: bool, in_loop: bool):
        """Return ``f(a, b, c, m, n, k, lda, ldb, ldc, reps)`` doing ``C = 1.5 AB - 0.5 C``.

        With ``in_loop`` the call sits in a loop body (not the entry block), which
        is where the generated time loop puts it.
        """
        i32 = ir.IntType(32)
        ptr = ir.PointerType()
        module = ir.Module(name="gemm_test")
        module.triple = llvm.get_process_triple()
        fn = ir.Function(
            module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr] + [i32] * 7), "gemm"
        )
        a, b, c, m, n, k, lda, ldb, ldc, reps = fn.args
        entry = fn.append_basic_block("entry")
        builder = ir.IRBuilder(entry)

        def call() -> None:
            gemm.emit_gemm_call(
                builder, library.gemm_addr(dtype), library.convention, dtype, transa, transb,
                m, n, k, 1.5, a, lda, b, ldb, -0.5, c, ldc,
            )  # fmt: skip

        if not in_loop:
            call()
            builder.ret_void()
        else:
            head, body, done = (fn.append_basic_block(x) for x in ("head", "body", "done"))
            builder.branch(head)
            builder.position_at_end(head)
            i = builder.phi(i32)
            i.add_incoming(ir.Constant(i32, 0), entry)
            builder.cbranch(builder.icmp_signed("<", i, reps), body, done)
            builder.position_at_end(body)
            call()
            i.add_incoming(builder.add(i, ir.Constant(i32, 1)), body)
            builder.branch(head)
            builder.position_at_end(done)
            builder.ret_void()
        parsed = llvm.parse_assembly(str(module))
        parsed.verify()
        # The engine takes ownership of its target machine, so each gets its own.
        target_machine = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2
        )
        engine = llvm.create_mcjit_compiler(parsed, target_machine)
        engine.finalize_object()
        self.engines.append(engine)
        return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, *[ctypes.c_int32] * 7)(
            engine.get_function_address("gemm")
        )


@pytest.fixture(scope="module")
def gemm_jit() -> _GemmJit:
    return _GemmJit()


@pytest.mark.parametrize("in_loop", [False, True], ids=["entry", "loop"])
@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(LIBRARIES))
def test_emitted_call_computes_row_major_product(
    gemm_jit, name, dtype, transa, transb, in_loop
) -> None:
    library = _library(name)
    function = gemm_jit.compile(library, dtype, transa, transb, in_loop)
    a, b, c, expected = _operands(dtype, transa, transb)
    m, n = c.shape
    k = a.shape[0] if transa else a.shape[1]
    reps = 3
    if in_loop:
        # C = 1.5 AB - 0.5 C applied three times: the fixed point recurrence is linear.
        product = (
            1.5
            * (a.T if transa else a).astype(np.float64)
            @ (b.T if transb else b).astype(np.float64)
        )
        expected = c.astype(np.float64)
        for _ in range(reps):
            expected = product - 0.5 * expected
    function(a.ctypes.data, b.ctypes.data, c.ctypes.data, m, n, k, a.shape[1], b.shape[1], n, reps)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5)


def test_gemm_goes_through_inttoptr_without_symbols() -> None:
    library = blas.get()
    module = ir.Module()
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr]), "f")
    builder = ir.IRBuilder(fn.append_basic_block())
    a, b, c = fn.args
    gemm.emit_gemm_call(
        builder, library.sgemm_addr, library.convention, np.float32, False, False,
        4, 4, 4, 1.0, a, 4, b, 4, 0.0, c, 4,
    )  # fmt: skip
    builder.ret_void()
    text = str(module)
    assert f"inttoptr (i64 {library.sgemm_addr}" in text or "inttoptr i64" in text
    assert "declare" not in text


def test_get_default_and_unknown_name() -> None:
    libraries = blas.available()
    if not libraries:
        with pytest.raises(ValueError, match="no BLAS"):
            blas.get()
        return
    assert blas.get().name == next(iter(libraries))
    if "openblas" in libraries:
        assert blas.get().name == "openblas"
    with pytest.raises(ValueError, match="available") as error:
        blas.get("no-such-blas")
    for name in libraries:
        assert name in str(error.value)


def test_openblas_symbols_and_threads() -> None:
    library = _library("openblas")
    assert library.convention == "cblas"
    assert (
        library.sgemm_addr == ctypes.cast(library.handle.scipy_cblas_sgemm, ctypes.c_void_p).value
    )
    get_threads = library.handle.scipy_openblas_get_num_threads
    get_threads.restype = ctypes.c_int
    before = get_threads()
    try:
        blas.set_threads(1, "openblas")
        assert get_threads() == 1
    finally:
        blas.set_threads(before, library)
    with pytest.raises(ValueError, match="at least 1"):
        blas.set_threads(0)


def test_choose_with_one_candidate_does_not_measure(tmp_path, monkeypatch) -> None:
    library = blas.get()

    def fail(*args, **kwargs):
        raise AssertionError("measured with a single candidate")

    monkeypatch.setattr(autotune, "_time_gemm", fail)
    assert autotune.choose(8, 8, 8, np.float32, [library.name], cache_dir=tmp_path) == library.name
    assert not (tmp_path / "blas.json").exists()


def test_choose_measures_once_and_caches_on_disk(tmp_path, monkeypatch) -> None:
    library = blas.get()
    # Two names for the same library exercise the measuring path on any machine.
    twin = blas.Blas("twin", library.sgemm_addr, library.dgemm_addr, library.convention)
    monkeypatch.setattr(blas, "_load", {library.name: library, "twin": twin}.get)
    monkeypatch.setattr(autotune, "_CHOICES", {})
    measured = []
    real_time = autotune._time_gemm

    def timed(lib, *args):
        measured.append(lib.name)
        return real_time(lib, *args)

    monkeypatch.setattr(autotune, "_time_gemm", timed)
    candidates = [library.name, "twin"]
    first = autotune.choose(16, 8, 4, np.float64, candidates, cache_dir=tmp_path, reps=2)
    assert first in candidates
    assert sorted(measured) == sorted(candidates)
    assert autotune.choose(16, 8, 4, np.float64, candidates, cache_dir=tmp_path) == first
    assert len(measured) == 2
    stored = json.loads((tmp_path / "blas.json").read_text())
    assert list(stored.values()) == [first]
    # A fresh process (empty memory cache) reads the file instead of measuring.
    monkeypatch.setattr(autotune, "_CHOICES", {})
    assert autotune.choose(16, 8, 4, np.float64, candidates, cache_dir=tmp_path) == first
    assert len(measured) == 2
    with pytest.raises(ValueError, match="available"):
        autotune.choose(16, 8, 4, np.float64, ["no-such-blas", library.name], cache_dir=tmp_path)


def test_split_candidate_names_a_library_and_a_thread_count() -> None:
    library = blas.get()
    assert autotune.split_candidate(f"{library.name}@1") == (library, 1)
    assert autotune.split_candidate(library.name) == (library, None)
    for bad in (f"{library.name}@0", f"{library.name}@two", "no-such-blas@1"):
        with pytest.raises(ValueError):
            autotune.split_candidate(bad)
