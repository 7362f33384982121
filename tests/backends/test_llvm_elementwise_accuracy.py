"""Accuracy of the LLVM backend's per-element rules for the elementwise family's functions.

Each rule of ``rnnc.backends.llvm.scalar.SCALAR`` for a smooth member (sin, cos, erf, log1p,
expm1, log_sigmoid, silu, gelu) is compiled into a loop over an array and measured in ULP of
the target type against a wider reference: float64 NumPy/SciPy for float32, mpmath at 40 digits
for float64 (on fewer points: it is slow). The inputs cover the finite range by bit pattern,
the working range densely, and the values near 0 where log1p and expm1 must stay accurate.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytest.importorskip("llvmlite")
mpmath = pytest.importorskip("mpmath")
special = pytest.importorskip("scipy.special")

import llvmlite.binding as llvm  # noqa: E402
from llvmlite import ir  # noqa: E402

from rnnc import ops_elementwise as elementwise  # noqa: E402
from rnnc.backends.llvm import scalar  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DTYPES = {np.float32: ir.FloatType(), np.float64: ir.DoubleType()}

# name: (float64 NumPy form for float32 targets, mpmath form for float64 targets)
REFERENCES = {
    "sin": (np.sin, mpmath.sin),
    "cos": (np.cos, mpmath.cos),
    "erf": (special.erf, mpmath.erf),
    "log1p": (np.log1p, mpmath.log1p),
    "expm1": (np.expm1, mpmath.expm1),
    "log_sigmoid": (lambda x: -np.logaddexp(0.0, -x), lambda x: -mpmath.log1p(mpmath.exp(-x))),
    "silu": (lambda x: x * special.expit(x), lambda x: x / (1 + mpmath.exp(-x))),
    "gelu": (lambda x: 0.5 * x * special.erfc(-x / np.sqrt(2.0)),
             lambda x: x * mpmath.erfc(-x / mpmath.sqrt(2)) / 2),
}
# Measured maxima rounded up (float32, float64), in ULP of the target type, for results in the
# normal range (a result below it must be within the smallest normal number of the exact one).
MAX_ULP = {
    "sin": (1.0, 1.0),
    "cos": (1.0, 1.0),
    "erf": (1.0, 1.0),
    "log1p": (2.5, 2.5),
    "expm1": (1.0, 1.0),
    "log_sigmoid": (3.0, 3.0),
    "silu": (3.0, 3.5),
    "gelu": (2.0, 2.0),
}
# Where the bound grows with x: gelu's erfc of the rounded x / sqrt 2 has condition number
# about x^2 (torch's 1 + erf(x / sqrt 2) loses everything there); silu's sigmoid leaves the
# normal range below x = log(smallest normal), so x * sigmoid(x) is measured above it.
SCALE = {"gelu": lambda x: 1 + x * x}
DOMAIN = {"silu": lambda x: x >= np.log(np.finfo(x.dtype).tiny)}


def _map_function(module: ir.Module, name: str, emit, element: ir.Type) -> None:
    """``void name(ptr in, ptr out, i64 n)``: out[i] = emit(in[i])."""
    i64, ptr = ir.IntType(64), ir.PointerType()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, ptr, i64]), name)
    src, dst, n = fn.args
    entry, head, body, done = (fn.append_basic_block(b) for b in ("entry", "head", "body", "done"))
    b = ir.IRBuilder(entry)
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    value = b.load(b.gep(src, [i], source_etype=element), typ=element)
    b.store(emit(b, value), b.gep(dst, [i], source_etype=element))
    i.add_incoming(b.add(i, ir.Constant(i64, 1)), body)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()


class _Jit:
    """The rules of REFERENCES, in float and double, compiled once."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        tm = llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
        module = ir.Module(name="family_accuracy")
        module.triple = llvm.get_process_triple()
        for name in REFERENCES:
            emit = scalar.SCALAR[elementwise.MEMBERS[name].op]
            for dtype, element in DTYPES.items():
                _map_function(module, f"{name}_{np.dtype(dtype).name}", emit, element)
        parsed = llvm.parse_assembly(str(module))
        parsed.verify()
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
        pb.getModulePassManager().run(parsed, pb)
        self.engine = llvm.create_mcjit_compiler(parsed, tm)
        self.engine.finalize_object()
        signature = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
        self.kernels = {f"{n}_{np.dtype(d).name}": signature(
            self.engine.get_function_address(f"{n}_{np.dtype(d).name}"))
            for n in REFERENCES for d in DTYPES}

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        self.kernels[f"{name}_{x.dtype.name}"](x.ctypes.data, out.ctypes.data, x.size)
        return out


@pytest.fixture(scope="module")
def jit() -> _Jit:
    return _Jit()


def _inputs(dtype, count: int) -> np.ndarray:
    rng = np.random.default_rng(99)
    bits = (rng.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32).view(np.float32)
            if dtype == np.float32 else rng.integers(0, 2**64, count, dtype=np.uint64)
            .view(np.float64))
    dense = [rng.uniform(-20, 20, count), rng.uniform(-1, 1, count),
             rng.uniform(-1e5, 1e5, count // 4),
             np.exp(rng.uniform(-80, 5, count)) * rng.choice([-1, 1], count)]
    values = np.concatenate([bits.astype(dtype)] + [d.astype(dtype) for d in dense])
    values = values[np.isfinite(values)]
    # Finite bit patterns with huge magnitudes say little once sin's argument is that large
    # and cost mpmath minutes: keep |x| <= 1e22.
    return values[np.abs(values) <= 1e22]


def _check(name: str, x: np.ndarray, got: np.ndarray, exact: np.ndarray, err: np.ndarray,
           bound: float) -> None:
    keep = DOMAIN.get(name, lambda v: np.ones(v.shape, bool))(x)
    tiny = np.finfo(x.dtype).tiny
    normal = (np.abs(exact) >= tiny) & keep
    allowed = bound * SCALE.get(name, lambda v: 1.0)(x.astype(np.float64))
    ratio = np.where(normal, err / allowed, 0.0)
    worst = int(np.argmax(ratio))
    assert ratio.max() <= 1.0, (f"{name} {x.dtype.name}: {err[worst]:.2f} ULP (allowed "
                                f"{np.broadcast_to(allowed, x.shape)[worst]:.2f}) at "
                                f"x={x[worst]!r}, got {got[worst]!r}")
    below = (np.abs(exact) < tiny) & keep
    assert (np.abs(got[below].astype(np.float64) - exact[below].astype(np.float64))
            <= tiny).all(), name


def _ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    rounded = exact.astype(got.dtype)
    with np.errstate(all="ignore"):
        spacing = np.spacing(np.abs(rounded)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - exact) / spacing
    same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
    return np.where(same, 0.0, err)


def _exact(name: str, x: np.ndarray) -> np.ndarray:
    """The float64 reference of a float32 rule."""
    assert x.dtype == np.float32, "float64 is measured by _ulp_error_f64"
    return np.asarray(REFERENCES[name][0](x.astype(np.float64)), np.float64)


def _ulp_error_f64(name: str, x: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ULP error of float64 results against mpmath, computed in mpmath to keep the digits, and
    the exact values rounded to float64."""
    precise = REFERENCES[name][1]
    out, nearest_values = np.zeros(x.size), np.full(x.size, np.nan)
    with mpmath.workdps(40):
        for k, (xi, gi) in enumerate(zip(x.tolist(), got.tolist(), strict=True)):
            exact = precise(mpmath.mpf(xi))
            if isinstance(exact, mpmath.mpc):  # log1p below -1: NaN, as in NumPy
                assert np.isnan(gi), (name, xi, gi)
                continue
            nearest = nearest_values[k] = float(exact)
            if not np.isfinite(nearest) or gi == nearest:
                continue
            spacing = float(np.spacing(abs(nearest))) if nearest else 5e-324
            out[k] = float(abs(mpmath.mpf(gi) - exact)) / spacing
    return out, nearest_values


@pytest.mark.parametrize("name", list(REFERENCES))
def test_float32_rules_are_within_their_ulp_bound(jit: _Jit, name: str) -> None:
    x = _inputs(np.float32, 200_000)
    got = jit(name, x)
    exact = _exact(name, x)
    _check(name, x, got, exact, _ulp_error(got, exact), MAX_ULP[name][0])


@pytest.mark.slow  # mpmath at 40 digits: about 4 s for the eight functions
@pytest.mark.parametrize("name", list(REFERENCES))
def test_float64_rules_are_within_their_ulp_bound(jit: _Jit, name: str) -> None:
    x = _inputs(np.float64, 1_500)
    got = jit(name, x)
    err, exact = _ulp_error_f64(name, x, got)
    _check(name, x, got, exact, err, MAX_ULP[name][1])


def test_log1p_and_expm1_keep_relative_accuracy_near_zero(jit: _Jit) -> None:
    for dtype in DTYPES:
        x = np.array([1e-30, -1e-30, 1e-10, -1e-10, 3e-8, -3e-8, 1e-5, -1e-5], dtype)
        for name, exact in (("log1p", np.log1p), ("expm1", np.expm1)):
            np.testing.assert_allclose(jit(name, x), exact(x), rtol=2 * np.finfo(dtype).eps,
                                       err_msg=f"{name} {np.dtype(dtype).name}")
