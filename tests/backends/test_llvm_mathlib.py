"""Accuracy, special values and vectorization of the LLVM backend's math library."""

from __future__ import annotations

import ctypes
import ctypes.util
import re

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import llvmlite.binding as llvm  # noqa: E402
from llvmlite import ir  # noqa: E402

from rnnc.backends.llvm import mathlib, powers  # noqa: E402

# Reference values beyond the target type's range overflow to inf on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

FUNCTIONS = {
    "exp": mathlib.emit_exp,
    "log": mathlib.emit_log,
    "tanh": mathlib.emit_tanh,
    "sigmoid": mathlib.emit_sigmoid,
}
DTYPES = {np.float32: ir.FloatType(), np.float64: ir.DoubleType()}
# The bounds documented at the top of mathlib, in ULP of the target type.
MAX_ULP = {
    ("exp", np.float32): 1.0,
    ("log", np.float32): 1.0,
    ("tanh", np.float32): 1.5,
    ("sigmoid", np.float32): 2.5,
    ("exp", np.float64): 1.0,
    ("log", np.float64): 1.0,
    ("tanh", np.float64): 1.5,
    ("sigmoid", np.float64): 2.5,
}


def _emit_map_loop(module: ir.Module, name: str, emit, element: ir.Type) -> None:
    """Emit ``void name(ptr in, ptr out, i64 n)``: a vector loop plus a scalar tail."""
    i64 = ir.IntType(64)
    lanes = mathlib.vector_width(64 if isinstance(element, ir.DoubleType) else 32)
    vector = ir.VectorType(element, lanes)
    ptr = ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), name)
    src, dst, n = fn.args
    entry, vhead, vbody, thead, tbody, done = (
        fn.append_basic_block(label)
        for label in ("entry", "vhead", "vbody", "thead", "tbody", "done")
    )
    b = ir.IRBuilder(entry)
    n_vector = b.and_(n, ir.Constant(i64, -lanes))
    b.branch(vhead)

    b.position_at_end(vhead)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed("<", i, n_vector), vbody, thead)
    b.position_at_end(vbody)
    align = 8 if isinstance(element, ir.DoubleType) else 4
    value = b.load(b.gep(src, [i], source_etype=element), typ=vector, align=align)
    b.store(emit(b, value), b.gep(dst, [i], source_etype=element), align=align)
    i_next = b.add(i, ir.Constant(i64, lanes))
    i.add_incoming(i_next, vbody)
    b.branch(vhead)

    b.position_at_end(thead)
    j = b.phi(i64)
    j.add_incoming(i, vhead)
    b.cbranch(b.icmp_signed("<", j, n), tbody, done)
    b.position_at_end(tbody)
    scalar = b.load(b.gep(src, [j], source_etype=element), typ=element)
    b.store(emit(b, scalar), b.gep(dst, [j], source_etype=element))
    j.add_incoming(b.add(j, ir.Constant(i64, 1)), tbody)
    b.branch(thead)

    b.position_at_end(done)
    b.ret_void()


class _Jit:
    """All eight math kernels compiled once for the host CPU."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        self.tm = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(),
            features=llvm.get_host_cpu_features().flatten(),
            opt=3,
        )
        module = ir.Module(name="mathlib_test")
        module.triple = llvm.get_process_triple()
        for fname, emit in FUNCTIONS.items():
            for dtype, element in DTYPES.items():
                _emit_map_loop(module, f"{fname}_{np.dtype(dtype).name}", emit, element)
        self.source_ir = str(module)
        parsed = llvm.parse_assembly(self.source_ir)
        parsed.verify()
        pb = llvm.create_pass_builder(self.tm, llvm.create_pipeline_tuning_options(speed_level=3))
        pb.getModulePassManager().run(parsed, pb)
        self.optimized_ir = str(parsed)
        self.assembly = self.tm.emit_assembly(parsed)
        self.engine = llvm.create_mcjit_compiler(parsed, self.tm)
        self.engine.finalize_object()
        signature = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        self.kernels = {
            name: signature(self.engine.get_function_address(name))
            for name in (f"{f}_{np.dtype(d).name}" for f in FUNCTIONS for d in DTYPES)
        }

    def __call__(self, fname: str, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        self.kernels[f"{fname}_{x.dtype.name}"](x.ctypes.data, out.ctypes.data, x.size)
        return out


@pytest.fixture(scope="module")
def jit() -> _Jit:
    return _Jit()


def _reference(fname: str, x: np.ndarray) -> np.ndarray:
    """Return the function in higher precision: float64 for float32, longdouble for float64."""
    wide = np.float64 if x.dtype == np.float32 else np.longdouble
    w = x.astype(wide)
    with np.errstate(all="ignore"):
        if fname == "exp":
            return np.exp(w)
        if fname == "log":
            return np.log(w)
        if fname == "tanh":
            return np.tanh(w)
        e = np.exp(-np.abs(w))
        q = e / (1 + e)
        return np.where(w < 0, q, 1 - q)


def _ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Distance from the exact value in units of the target type's spacing there."""
    dtype = got.dtype
    rounded = exact.astype(dtype)
    with np.errstate(all="ignore"):
        spacing = np.spacing(np.abs(rounded)).astype(exact.dtype)
        err = np.abs(got.astype(exact.dtype) - exact) / spacing
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    return np.where(same, 0.0, err)


def _sweep(dtype) -> np.ndarray:
    """A dense sweep of the finite range plus the ranges each function works in."""
    rng = np.random.default_rng(1234)
    if dtype == np.float32:
        patterns = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        patterns = rng.integers(0, 2**64, size=1_000_000, dtype=np.uint64).view(np.float64)
    dense = [
        rng.uniform(-760, 760, 300_000),
        rng.uniform(-110, 110, 300_000),
        rng.uniform(-20, 20, 300_000),
        rng.uniform(-1, 1, 300_000),
        np.exp(rng.uniform(-745, 709, 300_000)),
    ]
    with np.errstate(over="ignore"):
        values = np.concatenate([patterns.astype(dtype)] + [d.astype(dtype) for d in dense])
    return values[np.isfinite(values)]


def _specials(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    tiny_denormal = info.smallest_subnormal
    edges = [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        -1.0,
        0.625,
        -0.625,
        tiny_denormal,
        -tiny_denormal,
        info.smallest_normal,
        info.smallest_normal - tiny_denormal,
        info.max,
        -info.max,
        1e-30,
        -1e-30,
        np.log(info.max),
        np.log(info.smallest_normal),
        np.log(tiny_denormal),
        np.log(tiny_denormal) - 1,
        np.log(info.max) + 1,
    ]
    values = np.array(edges, dtype=dtype)
    with np.errstate(over="ignore"):
        up = np.nextafter(values, np.array(np.inf, dtype))
        down = np.nextafter(values, np.array(-np.inf, dtype))
    return np.concatenate([values, up, down])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("fname", list(FUNCTIONS))
def test_max_ulp_error(jit: _Jit, fname: str, dtype) -> None:
    x = np.concatenate([_sweep(dtype), _specials(dtype)])
    got = jit(fname, x)
    exact = _reference(fname, x)
    err = _ulp_error(got, exact)
    finite_exact = np.isfinite(exact.astype(dtype))
    worst = int(np.nanargmax(np.where(finite_exact, err, 0.0)))
    assert err[finite_exact].max() <= MAX_ULP[fname, dtype], (
        f"{fname} {np.dtype(dtype).name}: {err[worst]:.3f} ULP at x={x[worst]!r}, "
        f"got {got[worst]!r}, exact {exact[worst]!r}"
    )
    # Where the exact value rounds to ±inf, NaN or a signed zero, the result is that value.
    special = ~finite_exact
    np.testing.assert_array_equal(got[special], exact[special].astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_special_values(jit: _Jit, dtype) -> None:
    info = np.finfo(dtype)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, info.max, -info.max, 1.0], dtype)
    inf, nan = np.inf, np.nan
    expected = {
        "exp": [1.0, 1.0, inf, 0.0, nan, np.exp(-1.0), inf, 0.0, np.e],
        "log": [-inf, -inf, inf, nan, nan, nan, np.log(info.max), nan, 0.0],
        "tanh": [0.0, -0.0, 1.0, -1.0, nan, np.tanh(-1.0), 1.0, -1.0, np.tanh(1.0)],
        "sigmoid": [0.5, 0.5, 1.0, 0.0, nan, 1 / (1 + np.e), 1.0, 0.0, 1 / (1 + np.exp(-1.0))],
    }
    for fname, values in expected.items():
        want = np.array(values, dtype)
        got = jit(fname, x)
        np.testing.assert_allclose(got, want, rtol=4 * info.eps, atol=0, err_msg=fname)
        exact = np.isinf(want) | (want == 0) | (np.abs(want) == 1)
        np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(want[exact]), fname)
    # log of denormals is the log of the value, not of a flushed zero.
    denormals = np.array([info.smallest_subnormal, info.smallest_normal / 2], dtype)
    np.testing.assert_allclose(
        jit("log", denormals), np.log(denormals.astype(np.longdouble)).astype(dtype), rtol=info.eps
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_tanh_and_sigmoid_ranges(jit: _Jit, dtype) -> None:
    x = np.concatenate([_sweep(dtype), _specials(dtype)])
    x = x[~np.isnan(x)]
    t = jit("tanh", x)
    s = jit("sigmoid", x)
    assert not np.isnan(t).any() and not np.isnan(s).any()
    assert (np.abs(t) <= 1).all()
    assert ((s >= 0) & (s <= 1)).all()
    exact_s = _reference("sigmoid", x).astype(dtype)
    exact_t = _reference("tanh", x).astype(dtype)
    # A result saturates only where the true value rounds to the bound; where the
    # true value rounds there, the result is at most one ULP away (it may sit just
    # inside when the true value is within an ULP error of the rounding midpoint).
    below_one = np.nextafter(np.array(1, dtype), np.array(0, dtype))
    assert (exact_s[s == 1] == 1).all() and (exact_s[s == 0] == 0).all()
    assert (np.abs(exact_t[np.abs(t) == 1]) == 1).all()
    assert (s[exact_s == 1] >= below_one).all()
    assert (s[exact_s == 0] <= np.finfo(dtype).smallest_subnormal).all()
    assert (np.abs(t[np.abs(exact_t) == 1]) >= below_one).all()
    # Large negative inputs keep relative accuracy in the normal range.
    x_neg = np.linspace(-80 if dtype == np.float32 else -700, -20, 1001).astype(dtype)
    exact_neg = _reference("sigmoid", x_neg)
    rel = np.abs(jit("sigmoid", x_neg) - exact_neg) / exact_neg
    assert rel.max() <= 4 * np.finfo(dtype).eps


def test_f32_loop_vectorizes_without_libm_calls(jit: _Jit) -> None:
    optimized = jit.optimized_ir
    for fname in FUNCTIONS:
        body = optimized.split(f"@{fname}_float32(", 1)[1].split("\n}\n", 1)[0]
        assert "<16 x float>" in body, fname
        # Only intrinsic calls remain, and those lower to single vector instructions.
        assert re.findall(r"call [^@]*@(?!llvm\.)\S+", body) == [], fname
    for libm in ("expf", "logf", "tanhf", "exp", "log", "tanh"):
        assert f"@{libm}(" not in optimized
        assert f"call\t{libm}" not in jit.assembly
    if "+avx512f" in llvm.get_host_cpu_features().flatten():
        assert "zmm" in jit.assembly


# ---------------------------------------------------------------- powers

# Exponents the general path takes (±0.5 is a square root, integers to 64 are products).
POWERS = (1.5, 2.5, -1.5, 1.0 / 3.0, -2.7, 0.1, 7.25, 0.5, -0.5)
LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
LIBM.pow.restype = ctypes.c_double
LIBM.pow.argtypes = (ctypes.c_double, ctypes.c_double)


@pytest.fixture(scope="module")
def power_jit() -> _Jit:
    saved = dict(FUNCTIONS)
    FUNCTIONS.clear()
    for k, p in enumerate(POWERS + (65.0, 66.0)):
        FUNCTIONS[f"power{k}"] = lambda b, x, p=p: powers.emit_power(b, x, p)
    try:
        return _Jit()
    finally:
        FUNCTIONS.clear()
        FUNCTIONS.update(saved)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("k", range(len(POWERS)), ids=[repr(p) for p in POWERS])
def test_power_is_accurate_to_two_ulp(power_jit: _Jit, k: int, dtype) -> None:
    # exp(p * log(x)) in the target precision was off by up to 104 ULP (float32) and 256 ULP
    # (float64): the error of log(x) grows with |log(x)| and is then multiplied by p.
    x = np.abs(np.concatenate([_sweep(dtype)[::12], _specials(dtype)]))  # 200,000 to 500,000
    got = power_jit(f"power{k}", x)
    wide = np.float64 if dtype == np.float32 else np.longdouble
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(wide), wide(POWERS[k]))
    err = _ulp_error(got, exact)
    finite = np.isfinite(exact.astype(dtype))
    worst = int(np.argmax(np.where(finite, err, 0.0)))
    assert err[finite].max() <= 2.0, (
        f"x ** {POWERS[k]} {np.dtype(dtype).name}: {err[worst]:.2f} ULP at x={x[worst]!r}")
    np.testing.assert_array_equal(got[~finite], exact[~finite].astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_power_special_values_are_c99_pow(power_jit: _Jit, dtype) -> None:
    # (-inf) ** 1.5 was NaN, and a negative base to an integer power above 64 too.
    info = np.finfo(dtype)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5,
                  info.smallest_subnormal, -info.smallest_subnormal, info.max, -info.max],
                 dtype)
    for k, p in enumerate(POWERS + (65.0, 66.0)):
        got = power_jit(f"power{k}", x)
        with np.errstate(all="ignore"):
            want = np.array([LIBM.pow(float(v), p) for v in x]).astype(dtype)
        np.testing.assert_allclose(got, want, rtol=2 * info.eps, atol=0, err_msg=f"** {p}")
        exact = np.isinf(want) | (want == 0)
        np.testing.assert_array_equal(np.signbit(got[exact]), np.signbit(want[exact]), f"{p}")


def test_power_loops_vectorize_without_libm_calls(power_jit: _Jit) -> None:
    for k in range(len(POWERS)):
        body = power_jit.optimized_ir.split(f"@power{k}_float32(", 1)[1].split("\n}\n", 1)[0]
        assert "<16 x float>" in body, POWERS[k]
        # float32 powers other than square roots are computed in float64
        assert ("x double>" in body) == (abs(POWERS[k]) != 0.5), POWERS[k]
        assert re.findall(r"call [^@]*@(?!llvm\.)\S+", body) == [], POWERS[k]
    assert "@pow(" not in power_jit.optimized_ir and "@powf(" not in power_jit.optimized_ir
