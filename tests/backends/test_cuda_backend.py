"""The CUDA backend against the NumPy interpreter, in emulation (and on a GPU when present).

Emulated kernels are compiled with g++ and cached on disk by source text, so the tests use a
few small shapes that give the same kernels across cells and runs.
"""

from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

import rnnc
from rnnc import ops
from rnnc.backends.cuda import codegen
from rnnc.backends.cuda.runtime import CudaBackend
from rnnc.backends.numpy.runtime import run_program
from rnnc.backends.steps import NUMPY_DTYPES
from rnnc.composites import layer_norm
from rnnc.errors import BackendUnavailable, RnncValueError
from rnnc.ir import Carry, Graph, Program, Scan, Type
from rnnc.names import Role
from rnnc.verify import verify

I, H, T, B = 3, 4, 5, 3
TOLERANCE = {"f32": dict(rtol=1e-5, atol=1e-6), "f64": dict(rtol=1e-10, atol=1e-12)}
GRAD_TOLERANCE = {"f32": dict(rtol=1e-4, atol=1e-5), "f64": dict(rtol=1e-9, atol=1e-11)}


def gpu_reason() -> str | None:
    """Why the real-GPU variants cannot run here, or None when they can."""
    try:
        import cupy
    except ImportError:
        return "needs CuPy (not installed)"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception as err:  # CUDARuntimeError without a driver
        return f"needs a CUDA device ({err})"
    return "needs a CUDA device (none found)"


GPU = pytest.param(False, id="gpu", marks=[
    pytest.mark.cuda, pytest.mark.skipif(gpu_reason() is not None, reason=str(gpu_reason()))])
EMULATE = [pytest.param(True, id="emulated"), GPU]


# The minimal gated unit of the README's "Your own cell", as rnnc ships it.
mgu = rnnc.cells.mgu


def layer_norm_rnn(input_size: int, hidden_size: int) -> rnnc.Cell:
    """An Elman cell with layer normalization of the pre-activation (a reduction per row)."""
    c = rnnc.Cell("ln_rnn")
    x = c.input("x", input_size)
    h = c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size))
    U = c.param("U", (hidden_size, hidden_size))
    gamma = c.param("gamma", (hidden_size,), init=1.0)
    beta = c.param("beta", (hidden_size,), init=0.1)
    h_new = rnnc.tanh(layer_norm(x @ W + h @ U, gamma, beta))
    c.update(h=h_new)
    c.output("y", h_new)
    return c


CELLS = {
    "rnn": lambda: rnnc.cells.rnn(I, H),
    "rnn_relu": lambda: rnnc.cells.rnn(I, H, "relu"),
    "lstm": lambda: rnnc.cells.lstm(I, H),
    "gru": lambda: rnnc.cells.gru(I, H),
    "gru_v3": lambda: rnnc.cells.gru(I, H, reset_after=False),
    "mgu": lambda: mgu(I, H),
    "layer_norm": lambda: layer_norm_rnn(I, H),
}


def inputs(cell: rnnc.Cell, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I)).astype(NUMPY_DTYPES[dtype])
    params = cell.init_params(seed, dtype=NUMPY_DTYPES[dtype])
    states = {s: rng.standard_normal((B, H)).astype(NUMPY_DTYPES[dtype])
              for s in cell.sizes("state")}
    return x, params, states


def assert_close(actual: dict, expected: dict, tolerance: dict) -> None:
    assert set(actual) == set(expected)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], err_msg=name, **tolerance)


@pytest.mark.parametrize("emulate", EMULATE)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_inference_matches_numpy(name: str, dtype: str, emulate: bool) -> None:
    cell = CELLS[name]()
    fn = rnnc.compile(cell, backend="cuda", emulate=emulate)
    ref = rnnc.compile(cell, optimize=False)
    x, params, states = inputs(cell, dtype)
    lengths = np.array([T, 2, 1])
    for kwargs in ({}, {"states": states}, {"states": states, "lengths": lengths}):
        ys, finals = fn(x, params, **kwargs)
        ys_ref, finals_ref = ref(x, params, **kwargs)
        assert_close(ys, ys_ref, TOLERANCE[dtype])
        assert_close(finals, finals_ref, TOLERANCE[dtype])
        assert ys["y"].dtype == NUMPY_DTYPES[dtype] and isinstance(ys["y"], np.ndarray)


@pytest.mark.parametrize("emulate", EMULATE)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("name", ["lstm", "gru", "gru_v3", "mgu", "layer_norm"])
def test_gradients_match_numpy(name: str, dtype: str, emulate: bool) -> None:
    cell = CELLS[name]()
    fn = rnnc.compile(cell, backend="cuda", emulate=emulate)
    ref = rnnc.compile(cell, optimize=False)
    x, params, states = inputs(cell, dtype)
    rng = np.random.default_rng(1)
    dy = rng.standard_normal((T, B, H)).astype(NUMPY_DTYPES[dtype])
    d_states = {s: rng.standard_normal((B, H)).astype(NUMPY_DTYPES[dtype]) for s in states}
    for kwargs in ({"states": states}, {"states": states, "lengths": np.array([T, 2, 1])}):
        results = []
        for f in (fn, ref):
            ys, finals, tape = f.forward(x, params, **kwargs)
            g = f.backward(tape, d_outputs={"y": dy}, d_states=d_states)
            results.append((ys, finals, g))
        (ys, finals, g), (ys_ref, finals_ref, g_ref) = results
        assert_close(ys, ys_ref, TOLERANCE[dtype])
        assert_close(finals, finals_ref, TOLERANCE[dtype])
        np.testing.assert_allclose(g.x, g_ref.x, **GRAD_TOLERANCE[dtype])
        assert_close(g.params, g_ref.params, GRAD_TOLERANCE[dtype])
        assert_close(g.states, g_ref.states, GRAD_TOLERANCE[dtype])


# ---------------------------------------------------------------- programs built by hand


def fuse_body(program: Program) -> Program:
    """Fuse the scan body's elementwise/layout/reduce nodes into ``fused`` nodes.

    A small stand-in for the fuse-elementwise pass: nodes are grouped by how many matmuls lie
    on their longest path from the inputs, which never makes a cycle, and every group becomes
    one fused node with several results.
    """
    body = program.scan.body.copy()
    depth: dict[int, int] = {}
    for node in body.nodes():
        depth[node.id] = max((depth[i] + (body.node(i).op is ops.matmul) for i in node.inputs),
                             default=0)
    groups: dict[int, list[int]] = {}
    for node in body.nodes():
        if node.op.kind in codegen.KERNEL_KINDS or node.op is ops.constant:
            groups.setdefault(depth[node.id], []).append(node.id)
    outputs = set(body.outputs.values())
    for members in groups.values():
        inside = set(members)
        if not any(body.node(m).op.kind in codegen.KERNEL_KINDS for m in members):
            continue
        region = Graph(body.dtype)
        operands: list[int] = []
        mapped: dict[int, int] = {}
        for m in members:
            node = body.node(m)
            for src in node.inputs:
                if src not in inside and src not in operands:
                    operands.append(src)
                    mapped[src] = region.arg(f"a{len(operands)}", body.node(src).shape)
            mapped[m] = region.add(node.op, [mapped[i] for i in node.inputs], dict(node.attrs))
        results = [m for m in members if m in outputs or any(u not in inside
                                                             for u in body.users(m))]
        region.outputs = {f"r{k}": mapped[m] for k, m in enumerate(results)}
        fused = body.add_fused(region, operands, origin="test")
        for k, m in enumerate(results):
            body.replace_all_uses(m, body.get(fused, k, origin="test"))
        for m in reversed(members):
            body.remove(m)
    fused_program = replace(program, scan=replace(program.scan, body=body))
    verify(fused_program)
    return fused_program


def layout_program(dtype: str, reverse: bool) -> Program:
    """Pre-loop GEMM over (T, B, I), a body using every layout/reduce op, post-loop reductions."""
    f = lambda *shape: Type(dtype, shape)  # noqa: E731
    pre = Graph(dtype)
    x, W = pre.arg("x", ("T", "B", 3)), pre.arg("W", (3, 8))
    pre.outputs = {"xw": pre.add(ops.matmul, (x, W))}
    body = Graph(dtype)
    xw, h, U = body.arg("xw", ("B", 8)), body.arg("h", ("B", 4)), \
        body.arg("U", (4, 8))
    g = body.add(ops.add, (xw, body.add(ops.matmul, (h, U))))
    a = body.add(ops.slice_, (g,), {"start": 0, "stop": 4})
    b = body.add(ops.slice_, (g,), {"start": 4, "stop": 8})
    h_new = body.add(ops.mul, (body.add(ops.tanh, (a,)), body.add(ops.sigmoid, (b,))))
    padded = body.add(ops.pad, (h_new,), {"before": 1, "after": 2})
    # mean(padded * mean(padded)): a reduction whose loop-invariant operand is a reduction.
    total = body.add(ops.mean, (body.add(ops.mul, (padded, body.add(ops.mean, (padded,)))),))
    spread = body.add(ops.expand, (total,), {"size": 4})
    half = body.add(ops.constant, (), {"value": 0.5})
    chosen = body.add(ops.where, (body.add(ops.sub, (h_new, half)), spread, h))
    both = body.add(ops.concat, (h_new, chosen))
    body.outputs = {"h": h_new, "y": both, "z": chosen, "acc": body.add(ops.sum_, (spread,))}
    scan = Scan(body, seqs=("xw",), consts=("U",), carries=(Carry("h", "h", "h.final"),),
                stacked=("y", "z"), summed=("acc",), reverse=reverse)
    post = Graph(dtype)
    y, x2 = post.arg("y", ("T", "B", 8)), post.arg("x", ("T", "B", 3))
    post.outputs = {"gW": post.add(ops.matmul, (x2, y), {"transpose_a": True}),
                    "bias": post.add(ops.sum_rows, (y,)),
                    "rsq": post.add(ops.rsqrt, (post.add(ops.exp, (y,)),))}
    args = {"x": (Role.INPUT, f("T", "B", 3)), "W": (Role.PARAM, f(3, 8)),
            "U": (Role.PARAM, f(4, 8)), "h": (Role.STATE, f("B", 4))}
    program = Program(args, pre, scan, post, ("y", "z", "acc", "h.final", "gW", "bias", "rsq"),
                      dtype)
    verify(program)
    return program


def program_env(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dims = {"T": T, "B": B}
    return {name: rng.standard_normal(tuple(dims.get(d, d) for d in ty.shape))
            .astype(NUMPY_DTYPES[program.dtype]) for name, (_, ty) in program.args.items()}


@pytest.mark.parametrize("emulate", EMULATE)
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("fuse", [False, True])
def test_layout_ops_pre_post_and_summed(fuse: bool, reverse: bool, dtype: str,
                                        emulate: bool) -> None:
    program = layout_program(dtype, reverse)
    env = program_env(program)
    expected = run_program(program, env, {"T": T, "B": B})
    if fuse:
        program = fuse_body(program)
        assert any(n.op.name == "fused" for n in program.scan.body.nodes())
    got = CudaBackend(emulate=emulate).build(program, "inference")(env, {"T": T, "B": B})
    assert_close(got, expected, TOLERANCE[dtype])


@pytest.mark.parametrize("emulate", EMULATE)
def test_broadcasting_and_carries_passed_through(emulate: bool) -> None:
    """Operands broadcast over T, B or both; carries and outputs that are loop inputs."""
    f = lambda *shape: Type("f32", shape)  # noqa: E731
    pre = Graph("f32")
    a, b = pre.arg("a", ("T", "B", 4)), pre.arg("b", ("T", 1, 4))
    c = pre.arg("c", ("B", 1))
    two = pre.add(ops.constant, (), {"value": 2.0})
    pre.outputs = {"s": pre.add(ops.add, (pre.add(ops.add, (a, b)), pre.add(ops.mul, (c, two))))}
    body = Graph("f32")
    s, acc = body.arg("s", ("B", 4)), body.arg("acc", ("B", 4))
    p, q = body.arg("p", ("B", 4)), body.arg("q", ("B", 4))
    body.outputs = {"acc": body.add(ops.add, (acc, s)), "p": q, "q": p, "prev": acc}
    carries = tuple(Carry(n, n, f"{n}.final") for n in ("acc", "p", "q"))
    scan = Scan(body, seqs=("s",), consts=(), carries=carries, stacked=("prev",))
    args = {"a": (Role.INPUT, f("T", "B", 4)), "b": (Role.INPUT, f("T", 1, 4)),
            "c": (Role.INPUT, f("B", 1)), "acc": (Role.STATE, f("B", 4)),
            "p": (Role.STATE, f("B", 4)), "q": (Role.STATE, f("B", 4))}
    program = Program(args, pre, scan, Graph("f32"),
                      ("prev", "acc.final", "p.final", "q.final"), "f32")
    verify(program)
    for steps in (T, T + 1):  # an odd and an even number of swaps
        env = program_env(program)
        dims = {"T": steps, "B": B}
        env.update(a=np.ones((steps, B, 4), np.float32), b=np.ones((steps, 1, 4), np.float32))
        got = CudaBackend(emulate=emulate).build(program, "inference")(env, dims)
        assert_close(got, run_program(program, env, dims), TOLERANCE["f32"])
        for value in got.values():
            assert not any(np.shares_memory(value, v) for v in env.values())


@pytest.mark.parametrize("emulate", EMULATE)
@pytest.mark.parametrize("name", ["lstm", "gru_v3", "layer_norm"])
def test_fused_bodies_match_numpy(name: str, emulate: bool) -> None:
    program = CELLS[name]().program()
    fused = fuse_body(program)
    kernels = codegen.render(fused).steps["body"]
    assert [type(s).__name__ for s in kernels].count("Launch") <= 3
    env = program_env(program)
    expected = run_program(program, env, {"T": T, "B": B})
    got = CudaBackend(emulate=emulate).build(fused, "inference")(env, {"T": T, "B": B})
    assert_close(got, expected, TOLERANCE["f32"])


@pytest.mark.parametrize("emulate", EMULATE)
def test_graph_mode_keeps_buffers_and_results_stay_valid(emulate: bool) -> None:
    cell = CELLS["gru"]()
    fn = rnnc.compile(cell, backend="cuda", emulate=emulate, graph=True)
    ref = rnnc.compile(cell, optimize=False)
    x, params, states = inputs(cell, "f32")
    first, _ = fn(x, params, states=states)
    kept = first["y"].copy()
    for seed in (1, 2):
        x2, params2, states2 = inputs(cell, "f32", seed)
        ys, finals = fn(x2, params2, states=states2)
        ys_ref, finals_ref = ref(x2, params2, states=states2)
        assert_close(ys, ys_ref, TOLERANCE["f32"])
        assert_close(finals, finals_ref, TOLERANCE["f32"])
    np.testing.assert_array_equal(first["y"], kept)


# ---------------------------------------------------------------- source, rules, errors


def test_source_is_deterministic_and_free_of_node_ids() -> None:
    first = codegen.render(CELLS["lstm"]().program()).source
    assert codegen.render(CELLS["lstm"]().program()).source == first
    assert 'extern "C" __global__ void k_0(' in first


def fake_cupy(devices: int, loaded: list) -> types.ModuleType:
    """A stand-in for cupy with what the backend touches before running anything."""

    class RawModule:
        def __init__(self, code: str, options: tuple = ()) -> None:
            loaded.append(code)

        def get_function(self, name: str) -> str:
            return name

    cupy = types.ModuleType("cupy")
    cupy.RawModule = RawModule
    cupy.full = np.full  # constants are made at build time
    cupy.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: devices))
    return cupy


def test_gpu_and_emulation_compile_the_same_source(monkeypatch: pytest.MonkeyPatch) -> None:
    program = CELLS["mgu"]().program()
    loaded: list[str] = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(1, loaded))
    gpu = CudaBackend().build(program, "inference")
    emulated = CudaBackend(emulate=True).build(program, "inference")
    assert loaded == [gpu.source]
    assert emulated.loaded.source == loaded[0] == codegen.render(program).source


def test_without_cupy_or_device_the_backend_is_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cell = CELLS["rnn"]()
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(BackendUnavailable, match="cupy is not installed.*emulate=True"):
        rnnc.compile(cell, backend="cuda")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(0, []))
    with pytest.raises(BackendUnavailable, match="no CUDA device.*emulate=True"):
        rnnc.compile(cell, backend="cuda")
    with pytest.raises(RnncValueError, match="emulate=, graph=, precision=, fused_step= and "
                                             "schedule="):
        rnnc.compile(cell, backend="cuda", emulate=True, fast=True)


def test_importing_rnnc_does_not_import_cupy() -> None:
    code = ("import sys, rnnc, rnnc.backends.cuda.runtime, rnnc.backends.cuda.codegen; "
            "assert 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
