"""fuse-elementwise with reductions over the feature axis, and outside the loop.

Reductions (sum, mean, amax, amin) join fused regions; the pre- and post-loop graphs are fused
too. Checked here: the op counts of layer-normalized cells, convexity, the backends' code for
such regions (LLVM row kernels, CUDA one-thread-per-row kernels), and every backend against the
unoptimized traced program (forward and gradients, float64 and float32, with and without
lengths), plus hand-built regions whose values share no row shape (the fallbacks).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import rnnc
from rnnc import ops, passes
from rnnc.backends.numpy.runtime import run_program
from rnnc.ir import FUSED, Carry, Graph, Program, Scan, Type, retype
from rnnc.names import Role
from rnnc.passes.fuse_elementwise import FEATURE_REDUCTIONS, _regions, fuse_elementwise
from rnnc.tools.bench.configs import ln_lstm
from rnnc.verify import verify
from tests.strategies import random_cells, random_data

MODES = ("inference", "forward", "backward")
ELEMENTWISE_OUTSIDE = {"add", "sub", "mul", "neg", "expand", "sum", "mean", "pad", "slice"}


def softmax_cell(input_size: int, hidden_size: int) -> rnnc.Cell:
    """softmax and logsumexp (amax inside) of the gate pre-activation."""
    c = rnnc.Cell("softmax_rnn")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    W, U = c.param("W", (input_size, hidden_size)), c.param("U", (hidden_size, hidden_size))
    a = x @ W + h @ U
    new = rnnc.softmax(a) * rnnc.tanh(a) + 0.1 * rnnc.logsumexp(a)
    c.update(h=new)
    c.output("y", new)
    return c


def amin_cell(input_size: int, hidden_size: int) -> rnnc.Cell:
    """amin and amax of values computed in the step, and a sum of their difference."""
    c = rnnc.Cell("amin_rnn")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    W, U = c.param("W", (input_size, hidden_size)), c.param("U", (hidden_size, hidden_size))
    a = rnnc.tanh(x @ W + h @ U)
    low = a - rnnc.amin(a)
    new = rnnc.sigmoid(rnnc.amax(a) - a) * low - 0.2 * rnnc.sum(low * low)
    c.update(h=new)
    c.output("y", new)
    return c


CELLS = {
    "ln_lstm": ln_lstm,
    "layer_norm_gru": rnnc.cells.layer_norm_gru,
    "softmax": softmax_cell,
    "amin": amin_cell,
}


# ---------------------------------------------------------------- what the pass makes

@pytest.mark.parametrize("name", ["ln_lstm", "layer_norm_gru"])
@pytest.mark.parametrize("mode", MODES)
def test_no_reduction_stays_alone_in_the_loop(name: str, mode: str) -> None:
    counts = rnnc.compile(CELLS[name](8, 16), backend="numpy").op_counts(mode)
    loop = counts["loop"]
    assert not {"sum", "mean", "amax", "amin"} & set(loop), loop
    assert set(loop) <= {"fused", "matmul"}, loop


@pytest.mark.parametrize("name", ["ln_lstm", "layer_norm_gru"])
def test_backward_post_graph_is_a_few_fused_nodes(name: str) -> None:
    outside = rnnc.compile(CELLS[name](8, 16), backend="numpy").op_counts("backward")["outside"]
    assert not ELEMENTWISE_OUTSIDE & set(outside), outside
    assert 1 <= outside["fused"] <= 3, outside


def test_reductions_join_regions_and_sum_rows_does_not() -> None:
    program = rnnc.compile(ln_lstm(8, 16), backend="numpy").program("backward")
    inside = set()
    for graph in program.graphs():
        for node in graph.nodes():
            if node.op is FUSED:
                inside |= {n.op for n in node.attrs["region"].nodes()}
    assert ops.sum_ in inside and ops.sum_rows not in inside
    assert any(n.op is ops.sum_rows for n in program.post.nodes())


def _convex(graph: Graph, members: list[int]) -> bool:
    """No path leaves ``members`` and comes back: no outside node lies between two members."""
    inside = set(members)
    after = graph.depends_on(inside) - inside
    before = set().union(*(graph.ancestors(n) for n in members)) - inside
    return not after & before


def _before_fusion(cell: rnnc.Cell, mode: str) -> Program:
    names = passes.pipeline(mode)
    return passes.run(cell.program(), names[:names.index("fuse-elementwise")])


@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("mode", MODES)
def test_regions_are_convex(name: str, mode: str) -> None:
    program = _before_fusion(CELLS[name](4, 6), mode)
    for graph in program.graphs():
        for members in _regions(graph):
            assert _convex(graph, members)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck),
          database=None, derandomize=True)
@given(cell=random_cells(max_ops=8))
def test_regions_of_random_cells_are_convex_and_fusion_is_idempotent(cell: rnnc.Cell) -> None:
    for mode in ("inference", "backward"):
        program = _before_fusion(cell, mode)
        for graph in program.graphs():
            for members in _regions(graph):
                assert _convex(graph, members)
        fused = fuse_elementwise(program)
        verify(fused)
        assert fuse_elementwise(fused) is fused
        for graph in fused.graphs():
            loose = [n.op for n in graph.nodes() if n.op in FEATURE_REDUCTIONS]
            assert loose == []


# ---------------------------------------------------------------- the backends' code

def test_llvm_emits_one_row_kernel_whose_loops_vectorize() -> None:
    pytest.importorskip("llvmlite")
    from rnnc.backends.llvm import blas, cache, codegen

    program = rnnc.compile(ln_lstm(8, 64), backend="numpy").program("inference")
    text, _ = codegen.lower(program, blas.get().convention)
    assert 'define internal void @"rows.' in text
    assert "reduce." not in text  # no reduction runs as a node of its own
    # The cell state c (64 wide) is made by the gate math inside mean(c)'s loop and
    # kept in a stack row for the variance's loop and the outputs' loop.
    assert "alloca [64 x float]" in text
    optimized = str(cache.optimize(text))
    assert "fadd reassoc <" in optimized  # a vectorized sum of the row
    assert "x float>" in optimized


def test_cuda_region_that_reduces_has_one_block_per_row() -> None:
    from rnnc.backends.cuda.codegen import render

    module = render(rnnc.compile(ln_lstm(4, 8), backend="numpy").program("inference"))
    launches = [s for steps in module.steps.values() for s in steps if hasattr(s, "per_row")]
    rows = [s for s in launches if s.per_row]
    assert rows and all(s.fused for s in rows)
    assert "one block per row" in module.kernel_text
    kernel = module.kernel_text.split("one block per row")[1]
    body = kernel.split("for (long long col")[0]
    assert body.count("acc") >= 2  # mean and variance before the row's loop
    # Each reduction: the threads' strided partial sums, then a tree through shared memory.
    assert "k1 = threadIdx.x" in body and body.count("__syncthreads();") >= 4


def test_row_kernels_compile_to_ptx() -> None:
    from rnnc.backends.cuda.codegen import render
    from rnnc.backends.cuda.ptx import available_compiler, compile_ptx

    if available_compiler() is None:
        pytest.skip("no CUDA compiler: neither nvcc on PATH nor the nvidia-cuda-nvrtc wheel")
    for dtype in ("f32", "f64"):
        modules = [render(rnnc.compile(CELLS[name](4, 8), backend="numpy").program(mode, dtype),
                          prefix=f"{name}_{mode}_k_")
                   for name in sorted(CELLS) for mode in MODES]
        modules.append(render(retype(fuse_elementwise(_mixed_program()), dtype), "mixed_k_"))
        assert any("one block per row" in m.kernel_text for m in modules)
        ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), "sm_80")
        assert all(f".entry {k}(" in ptx for m in modules for k in m.kernels)


# ---------------------------------------------------------------- against the oracle

BACKENDS = {
    "numpy": {"backend": "numpy"},
    "llvm": {"backend": "llvm", "cache_dir": False},
    "cuda-emulate": {"backend": "cuda", "emulate": True},
}
TOL = {np.float64: 1e-10, np.float32: 2e-4}
_functions: dict[tuple, rnnc.Function] = {}


def _function(name: str, backend: str) -> rnnc.Function:
    key = (name, backend)
    if key not in _functions:
        if backend == "llvm":
            pytest.importorskip("llvmlite")
        options = BACKENDS[backend] if backend != "oracle" else {"optimize": False}
        _functions[key] = rnnc.compile(CELLS[name](3, 5), **options)
    return _functions[key]


def _close(actual: np.ndarray, expected: np.ndarray, tol: float) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def _run(fn: rnnc.Function, dtype: type, lengths: np.ndarray | None) -> dict[str, np.ndarray]:
    """Inference, training forward and every gradient, by name."""
    x, params, states = random_data(fn.cell, 4, 3, 7, dtype)
    out: dict[str, np.ndarray] = {}
    ys, finals = fn(x, params, states, lengths=lengths)
    out.update({f"inference.{k}": v for k, v in {**ys, **finals}.items()})
    ys, finals, tape = fn.forward(x, params, states, lengths=lengths)
    out.update({f"forward.{k}": v for k, v in {**ys, **finals}.items()})
    rng = np.random.default_rng(11)
    d_y = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in ys.items()}
    d_states = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in finals.items()}
    grads = fn.backward(tape, d_y, d_states)
    out["grad.x"] = grads.x
    out.update({f"grad.{k}": v for k, v in {**grads.params, **grads.states}.items()})
    return out


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("dtype,masked", [
    (np.float64, False), (np.float64, True), (np.float32, False),
    pytest.param(np.float32, True, marks=pytest.mark.slow)],  # f32 with lengths: -m slow
    ids=["f64", "f64-lengths", "f32", "f32-lengths"])
def test_backend_matches_the_oracle(backend: str, name: str, dtype: type, masked: bool) -> None:
    lengths = np.array([4, 1, 3]) if masked else None
    want = _run(_function(name, "oracle"), dtype, lengths)
    got = _run(_function(name, backend), dtype, lengths)
    assert set(got) == set(want)
    for k in want:
        _close(got[k], want[k], TOL[dtype])


# ---------------------------------------------------------------- regions of no one row shape

def _mixed_program() -> Program:
    """Fused regions the pass could make from values of several row shapes: in ``pre`` a
    parameter's rows (3) beside the sequence's (T, B) (no row shape: node by node on LLVM,
    one thread per element on CUDA); in the loop a reduction with a result of fewer rows than
    the region (every row writes it)."""
    pre = Graph("f32")
    p, x = pre.arg("P", (3, 4)), pre.arg("x", ("T", "B", 4))
    pp = pre.add(ops.mul, [p, p])
    ex = pre.add(ops.exp, [x])
    pre.outputs = {"ps": pre.add(ops.amax, [pp]), "xm": pre.add(ops.sub, [
        ex, pre.add(ops.mean, [ex])]), "pp": pp}

    body = Graph("f32")
    h, xm, v = body.arg("h", ("B", 4)), body.arg("xm", ("B", 4)), \
        body.arg("v", (4,))
    vv = body.add(ops.tanh, [v])
    mixed = body.add(ops.add, [body.add(ops.mul, [h, vv]), xm])
    centred = body.add(ops.sub, [mixed, body.add(ops.amin, [mixed])])
    new = body.add(ops.div, [centred, body.add(ops.add, [
        body.add(ops.sum_, [centred]), body.add(ops.constant, [], {"value": 1.0})])])
    body.outputs = {"h": new, "y": new, "vv": vv}

    post = Graph("f32")
    y = post.arg("y", ("T", "B", 4))
    post.outputs = {"z": post.add(ops.mul, [y, post.add(ops.sum_, [y])])}
    scan = Scan(body, seqs=("xm",), consts=("v",), carries=(Carry("h", "h", "h.final"),),
                stacked=("y",), summed=("vv",))
    args = {"x": (Role.INPUT, Type("f32", ("T", "B", 4))), "h": (Role.STATE, Type("f32", ("B", 4))),
            "v": (Role.PARAM, Type("f32", (4,))), "P": (Role.PARAM, Type("f32", (3, 4)))}
    program = Program(args, pre, scan, post, ("y", "h.final", "ps", "pp", "vv", "z"))
    verify(program)
    return program


@pytest.mark.parametrize("backend", ["llvm", "cuda-emulate"])
def test_regions_without_one_row_shape_run_everywhere(backend: str) -> None:
    if backend == "llvm":
        pytest.importorskip("llvmlite")
        from rnnc.backends.llvm.runtime import LlvmBackend as make
        options: dict = {"cache_dir": False}
    else:
        from rnnc.backends.cuda.runtime import CudaBackend as make
        options = {"emulate": True}
    base = _mixed_program()
    fused = fuse_elementwise(base)
    assert sum(n.op is FUSED for g in fused.graphs() for n in g.nodes()) == 3
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        program = fused if dtype == np.float32 else retype(fused, "f64")
        oracle = base if dtype == np.float32 else retype(base, "f64")
        runner = make(**options).build(program, "inference")
        for T, B in ((1, 1), (3, 2)):
            env = {"x": rng.standard_normal((T, B, 4)).astype(dtype),
                   "h": rng.uniform(-1, 1, (B, 4)).astype(dtype),
                   "v": rng.uniform(-1, 1, 4).astype(dtype),
                   "P": rng.uniform(-1, 1, (3, 4)).astype(dtype)}
            got = runner(env, {"T": T, "B": B})
            want = run_program(oracle, env, {"T": T, "B": B})
            for k in want:
                _close(np.asarray(got[k]), want[k], TOL[dtype])


def _deep_cell(depth: int) -> rnnc.Cell:
    """A chain of centred tanh layers: one region longer than an LLVM kernel's part."""
    c = rnnc.Cell("deep")
    x, h = c.input("x", 3), c.state("h", 5)
    W = c.param("W", (3, 5))
    v = x @ W + h
    for _ in range(depth):
        v = rnnc.tanh(v - rnnc.mean(v)) + 0.5 * rnnc.amax(v)
    c.update(h=v)
    c.output("y", v)
    return c


def test_a_long_region_with_reductions_is_cut_into_parts() -> None:
    pytest.importorskip("llvmlite")
    from rnnc.backends.schedule import LlvmSchedule

    cell = _deep_cell(40)
    fn = rnnc.compile(cell, backend="llvm", cache_dir=False)
    (region,) = [n.attrs["region"] for n in fn.program("inference").scan.body.nodes()
                 if n.op is FUSED]
    assert len(region) > LlvmSchedule().kernel_nodes
    _matches_oracle(cell, fn)


def test_a_chain_of_normalizations_is_one_linear_cuda_kernel() -> None:
    """Each layer's operand is kept in a local array while its mean runs, so the kernel
    computes each tanh once instead of once per reduction reading it."""
    from rnnc.backends.cuda.codegen import render

    cell = _deep_cell(40)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    module = render(fn.program("inference"))
    assert len(module.kernels) == 1 and module.kernel_text.count("tanhf(") == 40
    _matches_oracle(cell, fn)


def _matches_oracle(cell: rnnc.Cell, fn: rnnc.Function) -> None:
    ref = rnnc.compile(cell, optimize=False)
    x, params, states = random_data(cell, 3, 2, 1, np.float64)
    for got, want in zip(fn(x, params, states), ref(x, params, states), strict=True):
        for k in want:
            _close(got[k], want[k], TOL[np.float64])
