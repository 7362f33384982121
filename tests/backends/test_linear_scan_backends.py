"""linear_scan and last_step on every backend, against float64 loops written here.

Each row is a program built by hand: its ``pre`` graph scans operands of the shapes and
attributes of the row (A and Bv broadcasting as parallel-scan makes them: a ``(n,)``
parameter, a ``(T,B,1)`` mask, a constant) and takes the last step; its loop is empty. The
NumPy rule's log-depth form is checked against the same loops, and the CUDA kernels compile
to PTX where nvcc or NVRTC is present.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rnnc import backends, ops
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx
from rnnc.backends.numpy.rules import linear_scan_log_depth
from rnnc.ir import Graph, Program, Scan, Type
from rnnc.names import Role
from rnnc.verify import verify

T, B, N = 6, 3, 5
SHAPES = {  # A, Bv
    "sequences": (("T", "B", N), ("T", "B", N)),
    "vector-decay": ((N,), ("T", "B", N)),
    "masked": (("T", "B", 1), ("T", "B", N)),
    "per-step-offset": (("T", "B", N), (N,)),
    "constant-decay": (0.75, ("T", "B", N)),
}
ATTRS = [{"reverse": r, "exclusive": e} for r, e in itertools.product((False, True), repeat=2)]
try:
    import llvmlite  # noqa: F401

    BACKENDS = ["numpy", "llvm", "cuda"]
except ImportError:
    BACKENDS = ["numpy", pytest.param("llvm", marks=pytest.mark.skip(reason="needs llvmlite")),
                "cuda"]


def loop(a: np.ndarray, b: np.ndarray, c0: np.ndarray, reverse: bool, exclusive: bool,
         steps: int = T) -> np.ndarray:
    """The recurrence element by element in float64."""
    a, b = (np.broadcast_to(v, (steps,) + c0.shape).astype(np.float64) for v in (a, b))
    out = np.zeros((steps,) + c0.shape)
    for idx in np.ndindex(c0.shape):
        c = float(c0[idx])
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            new = a[(t,) + idx] * c + b[(t,) + idx]
            out[(t,) + idx] = c if exclusive else new
            c = new
    return out


def program(row: str, dtype: str) -> Program:
    """pre: ``C{k} = linear_scan[ATTRS[k]](A, Bv, h)`` and ``last{k}``, its last step, for
    every k; an empty loop."""
    pre = Graph(dtype)
    args = {}
    operands = []
    for name, shape in zip(("A", "Bv"), SHAPES[row], strict=True):
        if isinstance(shape, float):
            operands.append(pre.add(ops.constant, (), {"value": shape}))
            continue
        role = Role.INPUT if shape[0] == "T" else Role.PARAM
        args[name] = (role, Type(dtype, shape))
        operands.append(pre.arg(name, shape))
    args["h"] = (Role.STATE, Type(dtype, ("B", N)))
    operands.append(pre.arg("h", ("B", N)))
    for k, attrs in enumerate(ATTRS):
        scanned = pre.add(ops.linear_scan, operands, attrs)
        pre.outputs[f"C{k}"] = scanned
        pre.outputs[f"last{k}"] = pre.add(ops.last_step, (scanned,), {"reverse": attrs["reverse"]})
    p = Program(args, pre, Scan(Graph(dtype), (), (), (), (), ()), Graph(dtype),
                tuple(pre.outputs), dtype)
    verify(p)
    return p


def environment(row: str, dtype, steps: int = T, batch: int = B) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([len(row) + steps, batch])
    env = {}
    for name, shape in zip(("A", "Bv"), SHAPES[row], strict=True):
        if not isinstance(shape, float):
            size = tuple({"T": steps, "B": batch}.get(d, d) for d in shape)
            draw = rng.uniform(0.5, 1.1, size) if name == "A" else rng.standard_normal(size)
            env[name] = draw.astype(dtype)
    env["h"] = rng.standard_normal((batch, N)).astype(dtype)
    return env


def _operands(row: str, env: dict) -> tuple:
    a, b = (env[n] if n in env else np.float64(s) for n, s in zip(("A", "Bv"), SHAPES[row],
                                                                   strict=True))
    return a, b, env["h"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row", sorted(SHAPES))
def test_backend_matches_the_loop(row: str, dtype, backend: str) -> None:
    name = "f64" if dtype == np.float64 else "f32"
    options = {"emulate": True} if backend == "cuda" else {}
    runner = backends.get(backend, **options).build(program(row, name), "inference")
    env = environment(row, dtype)
    got = runner(env, {"T": T, "B": B})
    a, b, c0 = (np.asarray(v, np.float64) for v in _operands(row, env))
    tol = 1e-12 if dtype == np.float64 else 2e-5
    for k, attrs in enumerate(ATTRS):
        want = loop(a, b, c0, **attrs)
        np.testing.assert_allclose(got[f"C{k}"], want, rtol=tol, atol=tol, err_msg=str(attrs))
        np.testing.assert_allclose(got[f"last{k}"], want[0 if attrs["reverse"] else -1],
                                   rtol=tol, atol=tol, err_msg=str(attrs))


@pytest.mark.parametrize("attrs", ATTRS)
@pytest.mark.parametrize("row", sorted(SHAPES))
def test_log_depth_scan_matches_the_sequential_one(row: str, attrs: dict) -> None:
    for steps in (1, 2, 3, 6, 17):
        operands = _operands(row, environment(row, np.float64, steps))
        want = loop(*operands, **attrs, steps=steps)
        np.testing.assert_allclose(ops.linear_scan.ref(*operands, **attrs), want, rtol=1e-12)
        np.testing.assert_allclose(linear_scan_log_depth(*operands, **attrs), want,
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_scan_kernels_compile_to_ptx(arch: str, dtype: str) -> None:
    modules = [codegen.render(program(row, dtype), prefix=f"k{j}_")
               for j, row in enumerate(sorted(SHAPES))]
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), arch)
    for module in modules:
        for kernel in module.kernels:
            assert f".entry {kernel}(" in ptx
