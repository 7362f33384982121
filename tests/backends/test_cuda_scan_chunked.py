"""The chunked CUDA ``linear_scan`` kernel (backends/cuda/scan.py), in emulation and as PTX.

A block takes ``COLUMNS`` columns and ``CHUNKS`` chunks of the steps: each chunk composes its
aggregate, the first warp turns the aggregates into carry-ins, each chunk rescans from its
carry-in. The oracles are float64 loops written here, element by element, and for whole cells
the unoptimized traced program on the NumPy backend. The sizes put steps in uneven chunks (T not
a multiple of CHUNKS, fewer steps than chunks, one step) and columns in a partial block; the
host's choice between this kernel and the one-thread-per-column one is checked on the plan
(which kernels it launches), and forced where a test wants the chunked kernel below its step
threshold.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rnnc
from rnnc import backends, ops
from rnnc.backends.cuda import codegen, scan
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx
from rnnc.ir import Graph, Program, Scan, Type, verify
from rnnc.names import Role

N = 5  # features: B * N columns, never a whole number of blocks of COLUMNS
SHAPES = {  # A, Bv: every way parallel-scan broadcasts them
    "sequences": (("T", "B", N), ("T", "B", N)),
    "vector-decay": ((N,), ("T", "B", N)),
    "masked": (("T", "B", 1), ("T", "B", N)),
    "per-step-offset": (("T", "B", N), (N,)),
    "constant-decay": (0.75, ("T", "B", N)),
}
ATTRS = [{"reverse": r, "exclusive": e} for r, e in itertools.product((False, True), repeat=2)]
# (T, B): fewer steps than chunks, one step, uneven chunks, and more columns than one block.
SIZES = [(1, 3), (7, 3), (scan.CHUNKS + 1, 3), (3 * scan.CHUNKS - 5, 9)]


def loop(a: np.ndarray, b: np.ndarray, c0: np.ndarray, steps: int, reverse: bool,
         exclusive: bool) -> np.ndarray:
    """The recurrence element by element in float64."""
    a, b = (np.broadcast_to(np.asarray(v, np.float64), (steps,) + c0.shape) for v in (a, b))
    out = np.zeros((steps,) + c0.shape)
    for idx in np.ndindex(c0.shape):
        c = float(c0[idx])
        for t in range(steps - 1, -1, -1) if reverse else range(steps):
            new = a[(t,) + idx] * c + b[(t,) + idx]
            out[(t,) + idx] = c if exclusive else new
            c = new
    return out


def program(row: str, dtype: str) -> Program:
    """pre: ``C{k} = linear_scan[ATTRS[k]](A, Bv, h)`` for every k; an empty loop."""
    pre = Graph(dtype)
    args, operands = {}, []
    for name, shape in zip(("A", "Bv"), SHAPES[row], strict=True):
        if isinstance(shape, float):
            operands.append(pre.add(ops.constant, (), {"value": shape}))
            continue
        role = Role.INPUT if shape[0] == "T" else Role.PARAM
        args[name] = (role, Type(dtype, shape))
        operands.append(pre.arg(name, shape, role))
    args["h"] = (Role.STATE, Type(dtype, ("B", N)))
    operands.append(pre.arg("h", ("B", N), Role.STATE))
    for k, attrs in enumerate(ATTRS):
        pre.outputs[f"C{k}"] = pre.add(ops.linear_scan, operands, attrs)
    p = Program(args, pre, Scan(Graph(dtype), (), (), (), (), ()), Graph(dtype),
                tuple(pre.outputs), dtype)
    verify(p)
    return p


def environment(row: str, dtype, steps: int, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(len(row) + 100 * steps + batch)
    env = {}
    for name, shape in zip(("A", "Bv"), SHAPES[row], strict=True):
        if not isinstance(shape, float):
            size = tuple({"T": steps, "B": batch}.get(d, d) for d in shape)
            draw = rng.uniform(0.5, 1.1, size) if name == "A" else rng.standard_normal(size)
            env[name] = draw.astype(dtype)
    env["h"] = rng.standard_normal((batch, N)).astype(dtype)
    return env


def launched(runner) -> set[str]:
    """The names of the kernels the runner's plans launch."""
    return {call.func.name for plan in runner.plans.plans.values() for call in plan.calls
            if hasattr(call.func, "name")}


def chunked_names(runner) -> set[str]:
    """The chunked kernels of the runner's linear_scan launches."""
    return {work.chunked for where in runner.host.work.values() for work in where.values()
            if getattr(work, "chunked", "")}


@pytest.fixture
def chunked_from_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host chooses the chunked kernel whatever the number of steps."""
    monkeypatch.setattr(scan, "CHUNKED_MIN_STEPS", 1)


@pytest.mark.usefixtures("chunked_from_one_step")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("row", sorted(SHAPES))
def test_chunked_kernel_matches_the_loop(row: str, dtype) -> None:
    name = "f64" if dtype == np.float64 else "f32"
    runner = backends.get("cuda", emulate=True).build(program(row, name))
    tol = 1e-10 if dtype == np.float64 else 1e-5
    for steps, batch in SIZES:
        env = environment(row, dtype, steps, batch)
        got = runner(env, {"T": steps, "B": batch})
        a, b = (np.float64(s) if isinstance(s, float) else env[n].astype(np.float64)
                for n, s in zip(("A", "Bv"), SHAPES[row], strict=True))
        for k, attrs in enumerate(ATTRS):
            want = loop(a, b, env["h"].astype(np.float64), steps, **attrs)
            np.testing.assert_allclose(got[f"C{k}"], want, rtol=tol, atol=tol,
                                       err_msg=f"{attrs} T={steps} B={batch}")
    names = chunked_names(runner)
    assert len(names) == len(ATTRS) and launched(runner) == names


def test_the_host_chooses_by_steps_and_columns() -> None:
    runner = backends.get("cuda", emulate=True).build(program("sequences", "f64"))
    for steps in (scan.CHUNKED_MIN_STEPS - 1, scan.CHUNKED_MIN_STEPS):
        runner(environment("sequences", np.float64, steps, 2), {"T": steps, "B": 2})
    plans = list(runner.plans.plans.values())
    few, many = ({call.func.name for call in plan.calls} for plan in plans)
    assert not few & chunked_names(runner) and many == chunked_names(runner)
    assert scan.chunked_geometry(scan.CHUNKED_MIN_STEPS, 70) == (
        3, scan.COLUMNS * scan.CHUNKS)
    assert scan.chunked_geometry(scan.CHUNKED_MIN_STEPS - 1, 70) is None
    assert scan.chunked_geometry(4096, scan.CHUNKED_MAX_COLUMNS) is None
    assert scan.chunked_geometry(4096, scan.CHUNKED_MAX_COLUMNS - 1) is not None


# ------------------------------------------------------------------ whole cells

STEPS = 2 * scan.CHUNKED_MIN_STEPS + 3  # chosen by the host, uneven chunks
CELLS = {
    "min_gru": lambda: rnnc.cells.min_gru(3, 6),
    "min_lstm": lambda: rnnc.cells.min_lstm(3, 6),
    "sru": lambda: rnnc.cells.sru(6, 6),
    "diag_linear": lambda: rnnc.cells.diag_linear(3, 6),
}


def everything(fn: rnnc.Function, cell: rnnc.Cell, lengths) -> dict[str, np.ndarray]:
    """Inference, the training forward's outputs and every gradient, at B = 1 in float64."""
    rng = np.random.default_rng(0)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=0, dtype=np.float64).items()}
    (name, size), = cell.sizes("input").items()
    x = rng.standard_normal((STEPS, 1, size[-1]))
    states = {k: 0.5 * rng.standard_normal((1, s[-1])) for k, s in cell.sizes("state").items()}
    ys, finals = fn(x, params, states=states, lengths=lengths)
    ys2, finals2, tape = fn.forward(x, params, states=states, lengths=lengths)
    d_y = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
    d_s = {k: rng.standard_normal(v.shape) for k, v in finals.items()}
    g = fn.backward(tape, d_outputs=d_y, d_states=d_s)
    out = {}
    for prefix, value in (("y", ys), ("final", finals), ("train.y", ys2), ("train.final", finals2),
                          ("grad.x", {name: g.x}), ("grad.param", g.params),
                          ("grad.state", g.states)):
        out.update({f"{prefix}.{k}": np.asarray(v) for k, v in value.items()})
    return out


@pytest.mark.parametrize("lengths,reverse", [(None, False), (np.array([STEPS - 40]), False),
                                             (None, True), (np.array([37]), True)],
                         ids=["full-forward", "lengths-forward", "full-reverse",
                              "lengths-reverse"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_cells_through_the_chunked_kernel(name: str, lengths, reverse: bool) -> None:
    cell = CELLS[name]()
    want = everything(rnnc.compile(cell, backend="numpy", optimize=False, reverse=reverse),
                      cell, lengths)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, parallel_scan=True, reverse=reverse)
    got = everything(fn, cell, lengths)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name} {key}")
    masked = lengths is not None
    for mode in ("inference", "forward", "backward"):
        runner = fn._runners[(mode, "f64", masked)]
        assert chunked_names(runner) and chunked_names(runner) <= launched(runner), mode


# ------------------------------------------------------------------ PTX


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_chunked_kernels_compile_to_ptx(arch: str, dtype: str) -> None:
    modules = [codegen.render(program(row, dtype), prefix=f"k{j}_")
               for j, row in enumerate(sorted(SHAPES))]
    names = [launch.chunked for m in modules for launch in m.steps["pre"]]
    assert len(set(names)) == len(modules) * len(ATTRS)
    assert all(name in m.barriers for m in modules for name in m.kernels if name in names)
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), arch)
    for name in names:
        assert f".entry {name}(" in ptx
