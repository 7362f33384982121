"""Every member of the elementwise family on every backend, from the family's table.

Values: a cell applying one member to its inputs, on NumPy, LLVM and CUDA (emulated), in float32
and float64, against the member's float64 reference on the same (rounded) inputs, over the
member's test draws and the hard values of ``HARD``. Gradients: one cell applying every member,
trained through each backend's backward program in float64, against float64 central
differences of the references. PTX: the CUDA kernels of that cell (inference, forward and
backward) compile with nvcc or NVRTC where one is present.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from test_cuda_backend import fuse_body

import rnnc
from rnnc import ops_elementwise as elementwise
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx

T, B, W = 3, 2, 8
BACKENDS = {"numpy": {"backend": "numpy"}, "llvm": {"backend": "llvm"},
            "cuda": {"backend": "cuda", "emulate": True}}
FAMILY = [pytest.param(m, id=m.op.name) for m in elementwise.DRAWN]

# Values where an implementation is most easily wrong, put into the first operand's first row.
HARD = {
    # Against the second operand's [3, 3, -3, 3, 3, -3, -2, 2]: ties, and both zeros.
    **{name: [3.0, 2.0, -3.0, 4.0, 3.0, -2.0, -2.0, 2.0]
       for name in ("less", "less_equal", "greater", "greater_equal", "maximum", "minimum")},
    "abs": [-0.0, 0.0, -1e-30, 1e-30, -3.5, 3.5, -1e30, 1e30],
    "round": [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.49999997],
    "floor": [-2.0, -1e-30, 0.0, 1e-30, 2.0, -2.5, 1e7 + 0.5, -0.0],
    "mod": [-7.0, 7.0, 0.0, -0.0, 1e-20, -1e-20, 5.5, -5.5],
    # Against divisors of their own: 1 // 0.1 = 9 (floor(1 / 0.1) = 10), zeros, a zero divisor.
    "floor_divide": ([1.0, -1.0, 0.0, -0.0, 7.0, 1.0, 0.3, 1e-20],
                     [0.1, 0.1, 3.0, 3.0, -3.0, 0.0, 0.1, -2.0]),
    "clip": [-1.0, 2.0, -1.0000001, 2.0000002, 0.0, -50.0, 50.0, 1.5],
    "sin": [1e4, -1e4, 1e6, 3.14159265, 1e-20, 0.0, 710.5, -123456.7],
    "cos": [1e4, -1e4, 1e6, 1.5707963, 1e-20, 0.0, 710.5, -123456.7],
    "log_sigmoid": [-1e4, 1e4, -100.0, 100.0, -20.0, 20.0, 0.0, -1e-8],
    "silu": [-1e4, 1e4, -100.0, 100.0, -20.0, 20.0, 0.0, -1e-8],
    "gelu": [-1e4, 1e4, -10.0, 10.0, -5.0, 5.0, 0.0, 1e-8],
    "erf": [-10.0, 10.0, -1e-20, 1e-20, 0.0, 3.9, -0.5, 1e-5],
    "log1p": [1e-10, -1e-10, 1e-30, 0.0, -0.5, 1e10, 3e-8, -0.999],
    "expm1": [1e-10, -1e-10, 1e-30, 0.0, -50.0, 80.0, 3e-8, -3e-8],
}


EXACT = ("floor", "round", "mod", "floor_divide", "clip", "less", "less_equal", "greater",
         "greater_equal", "maximum", "minimum", "abs")


def _inputs(member: elementwise.Member, dtype) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(member.op.name.encode()))
    xs = [np.asarray(draw(rng, (T, B, W)), np.float64) for draw in member.draws]
    hard = HARD[member.op.name]
    rows = hard if isinstance(hard, tuple) else (hard,)
    # A second operand without hard values of its own: both signs against the first's.
    rows += ([3.0, 3.0, -3.0, 3.0, 3.0, -3.0, -2.0, 2.0],) * (len(xs) - len(rows))
    for x, row in zip(xs, rows, strict=True):
        x[0, 0] = row
    return [x.astype(dtype) for x in xs]


def _cell(members: list[elementwise.Member]) -> rnnc.Cell:
    """One input per operand of each member (``m<i>_<k>``) and two outputs per member: the op
    of the inputs, and ``<name>_loop``, the op of the inputs minus the state, fused with the
    carry's arithmetic. The state stays +0.0 (its update halves it), so ``x - h`` is ``x`` to
    the bit, -0.0 included."""
    cell = rnnc.Cell("family")
    h = cell.state("h", W)
    cell.update(h=h * 0.5)
    for i, member in enumerate(members):
        xs = [cell.input(f"m{i}_{k}", W) for k in range(member.op.arity)]
        function = getattr(rnnc, member.op.name)
        cell.output(member.op.name, function(*xs, **member.test_attrs))
        cell.output(f"{member.op.name}_loop", function(*(x - h for x in xs),
                                                       **member.test_attrs))
    return cell


def test_every_member_has_hard_values() -> None:
    assert sorted(HARD) == sorted(m.op.name for m in elementwise.DRAWN)


def _check_values(member: elementwise.Member, xs: list[np.ndarray], got: np.ndarray) -> None:
    dtype = got.dtype
    with np.errstate(over="ignore", divide="ignore"):  # x // 0 is inf, as in NumPy
        want = member.op.ref(*(x.astype(np.float64) for x in xs), **member.test_attrs)
    if member.op.name in EXACT:
        # They only compare, select or round, and fmod is exact: equal to the bit, signs of
        # zero too.
        np.testing.assert_array_equal(got, want.astype(dtype), err_msg=member.op.name)
        assert np.array_equal(np.signbit(got), np.signbit(want.astype(dtype))), member.op.name
        return
    # A few ULP of the result, times the function's condition number |x f'(x) / f(x)| (capped
    # at 50) where the implementation rounds a scaled argument (gelu's x / sqrt 2).
    x = xs[0].astype(np.float64)
    with np.errstate(all="ignore"):
        slope = (member.op.ref(x * (1 + 1e-7), *xs[1:], **member.test_attrs) - want) / (x * 1e-7)
        condition = np.nan_to_num(np.abs(x * slope / want), nan=0.0, posinf=50.0)
    tolerance = 4 * np.finfo(dtype).eps * (1 + np.minimum(condition, 50.0)) * np.abs(want)
    bad = np.abs(got.astype(np.float64) - want) > tolerance + np.finfo(dtype).tiny
    assert not bad.any(), f"{member.op.name}: x={x[bad]}, got={got[bad]}, want={want[bad]}"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_backend_matches_reference(dtype, backend: str) -> None:
    """Every member in one cell (one compile per backend and dtype), checked member by member."""
    members = list(elementwise.DRAWN)
    fn = rnnc.compile(_cell(members), **BACKENDS[backend])
    inputs = {i: _inputs(m, dtype) for i, m in enumerate(members)}
    with np.errstate(over="ignore", divide="ignore"):
        ys, _ = fn({f"m{i}_{k}": x for i, xs in inputs.items() for k, x in enumerate(xs)}, {})
    for i, member in enumerate(members):
        for name in (member.op.name, f"{member.op.name}_loop"):
            assert ys[name].dtype == dtype
            _check_values(member, inputs[i], ys[name])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_backend_gradients_match_central_differences(backend: str) -> None:
    members = list(elementwise.DRAWN)
    fn = rnnc.compile(_cell(members), **BACKENDS[backend])
    rng = np.random.default_rng(7)
    xs = {f"m{i}_{k}": np.asarray(draw(rng, (T, B, W)), np.float64)
          for i, m in enumerate(members) for k, draw in enumerate(m.draws)}
    for i, m in enumerate(members):  # the saturating ones at +-1e4 too: gradients stay finite
        if m.op.name in ("log_sigmoid", "silu", "gelu"):
            xs[f"m{i}_0"][0, 0] = HARD[m.op.name]  # single-operand members: a list
    dy = {name: rng.standard_normal((T, B, W)) for m in members
          for name in (m.op.name, f"{m.op.name}_loop")}
    _, _, tape = fn.forward(xs, {})
    grads = fn.backward(tape, d_outputs=dy).x
    for i, member in enumerate(members):
        operands = [xs[f"m{i}_{k}"] for k in range(member.op.arity)]
        for k in range(member.op.arity):
            eps = 1e-6 * np.maximum(1.0, np.abs(operands[k]))
            plus, minus = list(operands), list(operands)
            plus[k], minus[k] = operands[k] + eps, operands[k] - eps
            slope = (member.op.ref(*plus, **member.test_attrs)
                     - member.op.ref(*minus, **member.test_attrs)) / (2 * eps)
            # Both outputs read the operand: the hoisted op's and the loop's cotangents add up.
            upstream = dy[member.op.name] + dy[f"{member.op.name}_loop"]
            np.testing.assert_allclose(grads[f"m{i}_{k}"], upstream * slope,
                                       rtol=1e-6, atol=1e-7,
                                       err_msg=f"{member.op.name} operand {k} on {backend}")


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
@pytest.mark.parametrize("dtype", ["f32", pytest.param("f64", marks=pytest.mark.slow)])
def test_family_kernels_compile_to_ptx(dtype: str) -> None:
    fn = rnnc.compile(_cell(list(elementwise.DRAWN)), backend="numpy")
    modules = []
    for mode in ("inference", "forward", "backward"):
        program = fn.program(mode, dtype)
        if not any(n.op.name == "fused" for n in program.scan.body.nodes()):
            program = fuse_body(program)
        modules.append(codegen.render(program, prefix=f"{mode}_k_"))
    # One compile: the modules share the prelude, their kernels are prefixed apart.
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), "sm_80")
    for module in modules:
        assert all(f".entry {kernel}(" in ptx for kernel in module.kernels)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_percent_and_floor_division_on_values_on_every_backend(backend: str, dtype) -> None:
    """``%`` and ``//`` on traced values, with a traced or a constant side, are NumPy's."""
    cell = rnnc.Cell("operators")
    h = cell.state("h", W)
    cell.update(h=h)
    x, d = cell.input("x", W), cell.input("d", W)
    outputs = {"x_mod_d": x % d, "x_mod_c": x % 1.5, "c_mod_d": 2.0 % d,
               "x_div_d": x // d, "x_div_c": x // 0.75, "c_div_d": 7.0 // d}
    for name, value in outputs.items():
        cell.output(name, value)
    rng = np.random.default_rng(11)
    xs = rng.uniform(-6.0, 6.0, (T, B, W)).astype(dtype)
    ds = elementwise.MEMBERS["mod"].draws[1](rng, (T, B, W)).astype(dtype)
    ys, _ = rnnc.compile(cell, **BACKENDS[backend])({"x": xs, "d": ds}, {})
    c = dtype  # the constants, in the program's dtype
    want = {"x_mod_d": np.mod(xs, ds), "x_mod_c": np.mod(xs, c(1.5)), "c_mod_d": np.mod(c(2.0), ds),
            "x_div_d": np.floor_divide(xs, ds), "x_div_c": np.floor_divide(xs, c(0.75)),
            "c_div_d": np.floor_divide(c(7.0), ds)}
    for name, value in want.items():
        assert ys[name].dtype == dtype
        np.testing.assert_array_equal(ys[name], value, err_msg=f"{name} on {backend}")
