"""Einsums on the CUDA backend as one strided-batched GEMM (backends/cuda/batched.py).

Which specs are batched products and the 3-D views each makes, against NumPy's einsum; cells
with heads (sLSTM, hand-written einsum cells) in emulation against the unoptimized traced
program, forward, every gradient, with lengths; a step of the sLSTM counted as one batched
GEMM whatever the heads, in emulation and on the GPU path with cuBLAS simulated on the CPU
(test_cuda_blas.py reads its arguments as column-major memory); the remaining kernels
compiled to PTX.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_blas import simulate_strided_batched

import rnnc
from rnnc.backends.cuda import batched, codegen
from rnnc.backends.cuda.plan import Plans, at_step
from rnnc.backends.cuda.ptx import NO_COMPILER, available_compiler, compile_ptx
from rnnc.ops_tensor import _einsum_ref

T, B = 5, 3
LENGTHS = np.array([5, 2, 1])
HEADS, D = 3, 2

# (canonical spec, operand shapes): every batched form the backend runs as one GEMM.
BATCHED = {
    "head-wise": ("...hd,hde->...he", [("B", 3, 4), (3, 4, 5)]),
    "input's gradient": ("...he,hde->...hd", [("B", 3, 5), (3, 4, 5)]),
    "weight's gradient": ("...he,...hd->hde", [("B", 3, 5), ("B", 3, 4)]),
    "weight read transposed": ("...hd,hed->...he", [("B", 3, 4), (3, 5, 4)]),
    "heads inside the weight": ("...hd,dhe->...he", [("B", 3, 4), (4, 3, 5)]),
    "weight first": ("hde,...hd->...he", [(3, 4, 5), ("B", 3, 4)]),
    "no heads": ("...d,de->...e", [("B", 4), (4, 5)]),
    "two head axes": ("...hgd,hgde->...hge", [("B", 2, 3, 4), (2, 3, 4, 5)]),
    "hoisted rows": ("...hd,hde->...he", [("T", "B", 3, 4), (3, 4, 5)]),
    "weight gradient, hoisted": ("...he,...hd->hde", [("T", "B", 3, 5), ("T", "B", 3, 4)]),
}
# Specs that keep the elementwise kernel, and why.
NOT_BATCHED = {
    "no contraction": ("...hd,hd->...hd", [("B", 3, 4), (3, 4)]),
    "result ends in a head": ("...hd,...hd->...h", [("B", 3, 4), ("B", 3, 4)]),
    "operand ends in a head": ("...dh,hde->...he", [("B", 4, 3), (3, 4, 5)]),
    "heads in two orders": ("...hgd,ghde->...hge", [("B", 2, 3, 4), (3, 2, 4, 5)]),
    "three operands": ("...hd,hd,hde->...he", [("B", 3, 4), (3, 4), (3, 4, 5)]),
}


@pytest.mark.parametrize("name", list(BATCHED))
def test_a_batched_form_views_its_operands_as_numpy_computes(name: str) -> None:
    spec, shapes = BATCHED[name]
    form = batched.batched_form(spec, shapes)
    assert form is not None
    swap, layouts = form
    dims = {"T": 2, "B": 3}
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(tuple(dims.get(d, d) for d in s)) for s in shapes]
    want = _einsum_ref(*xs, spec=spec)
    out = np.full(want.shape, np.nan)
    a, b = reversed(xs) if swap else xs
    views = [batched.view(x, layout, dims) for x, layout in zip((a, b, out), layouts,
                                                                  strict=True)]
    assert views[2].base is not None and np.shares_memory(views[2], out)
    np.matmul(views[0], views[1], out=views[2])
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(NOT_BATCHED))
def test_other_forms_keep_their_kernel(name: str) -> None:
    assert batched.batched_form(*NOT_BATCHED[name]) is None


def test_a_view_of_a_result_that_is_not_contiguous_is_refused() -> None:
    layout = batched.batched_form(*BATCHED["head-wise"])[1][2]
    out = np.zeros((6, 3, 5))[::2]
    with pytest.raises(RuntimeError, match="contiguous"):
        batched.view(out, layout, {"T": 1, "B": 3}, written=True)


def heads_cell(form: str) -> rnnc.Cell:
    """A recurrence ``h' = tanh(x + R(h))`` over heads, ``R`` written as the einsum of
    ``form``; "kernel" adds a head-wise dot product that keeps its kernel."""
    c = rnnc.Cell(f"heads_{form}")
    x = c.input("x", (HEADS, D))
    h = c.state("h", (HEADS, D))
    if form == "transposed":
        rec = rnnc.einsum("hd,hed->he", h, c.param("R", (HEADS, D, D)))
    elif form == "weight first":
        rec = rnnc.einsum("hde,hd->he", c.param("R", (HEADS, D, D)), h)
    else:
        rec = rnnc.einsum("hd,hde->he", h, c.param("R", (HEADS, D, D)))
    if form == "input":  # an einsum of the input alone: hoisted out of the loop
        x = rnnc.einsum("hd,hde->he", x, c.param("W", (HEADS, D, D)))
    pre = x + rec
    if form == "kernel":
        pre = pre * rnnc.einsum("hd,hd->h", h, x)[:, :, None]
    h_new = rnnc.tanh(pre)
    c.update(h=h_new)
    c.output("y", h_new.reshape(-1))
    return c


def problem(cell: rnnc.Cell, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=seed, dtype=np.float64).items()}
    x = rng.standard_normal((T, B, cell.sizes("input")["x"][-1]))
    states = {k: 0.5 * rng.standard_normal((B,) + shape[1:])
              for k, shape in cell.sizes("state").items()}
    if "n" in states:  # the sLSTM's normalizer stays positive
        states["n"] = 1.0 + np.abs(states["n"])
    return params, x, states


def check_against_oracle(cell: rnnc.Cell, fn: rnnc.Function) -> None:
    """Outputs, final states and every gradient of ``fn`` (float64, with lengths) against
    the unoptimized traced program; inference without lengths too."""
    p, x, s0 = problem(cell)
    oracle = rnnc.compile(cell, optimize=False)
    results = []
    for f in (oracle, fn):
        ys, st, tape = f.forward(x, p, states=s0, lengths=LENGTHS)
        rng = np.random.default_rng(1)
        g = f.backward(tape, d_outputs={k: rng.standard_normal(v.shape) for k, v in ys.items()},
                       d_states={k: rng.standard_normal(v.shape) for k, v in st.items()})
        inference, _ = f(x, p, states=s0)
        results.append({"y": ys["y"], "inference y": inference["y"], "grad x": g.x,
                        **{f"state {k}": v for k, v in st.items()},
                        **{f"grad {k}": v for k, v in g.params.items()},
                        **{f"grad state {k}": v for k, v in g.states.items()}})
    want, got = results
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-11, err_msg=k)


def loop_gemms(fn: rnnc.Function, mode: str) -> list[tuple]:
    """The shapes of (a, b, out) of every GEMM one step of ``mode``'s loop makes."""
    runner = next(r for key, r in fn._runners.items() if key[0] == mode)
    (plan,) = runner.plans.plans.values()
    calls = [call for call, entry in zip(plan.loop.calls, plan.loop.entries, strict=True)
             if entry.kind == "gemm"]
    return [tuple(np.shape(at_step(v, 0)) for v in (*call.args, call.kwargs["out"]))
            for call in calls]


def post_gemms(fn: rnnc.Function, mode: str) -> list[tuple]:
    """The shapes of (a, b, out) of every GEMM ``mode``'s post-loop graph makes."""
    runner = next(r for key, r in fn._runners.items() if key[0] == mode)
    (plan,) = runner.plans.plans.values()
    return [tuple(np.shape(v) for v in (*call.args, call.keywords["out"]))
            for call, entry in zip(plan.calls, plan.entries, strict=True)
            if entry.where == "post" and entry.kind == "gemm"]


@pytest.mark.parametrize("form", ["head-wise", "transposed", "weight first", "input", "kernel"])
def test_einsum_cells_match_the_oracle(form: str) -> None:
    cell = heads_cell(form)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    check_against_oracle(cell, fn)
    # The recurrent product and, in the backward, the state's gradient: one GEMM over the
    # heads each step; the weights' gradients (sums over the rows) one GEMM over the heads
    # after the loop, its rows all T * B of them. The head-wise dot product ("kernel") stays a
    # kernel, as do its gradients.
    assert [g[-1] for g in loop_gemms(fn, "forward")] == [(HEADS, B, D)]
    assert [g[-1] for g in loop_gemms(fn, "backward")] == [(HEADS, B, D)]
    weights = [(HEADS, D, D)] * (1 + (form == "input"))
    assert [g[-1] for g in post_gemms(fn, "backward") if g[0][-1] == T * B] == weights


def test_slstm_with_heads_matches_the_oracle() -> None:
    cell = rnnc.cells.slstm(4, 8, heads=4)
    check_against_oracle(cell, rnnc.compile(cell, backend="cuda", emulate=True))


def test_a_step_of_the_slstm_is_one_batched_gemm() -> None:
    """Inference, training forward and backward: each einsum of a step is one GEMM over all
    four heads (the backward's one: the state's gradient; the weight's runs after the loop),
    never one per head; on the GPU path each is one cublasGemmStridedBatchedEx (cuBLAS
    simulated)."""
    heads, hidden = 4, 16
    cell = rnnc.cells.slstm(8, hidden, heads=heads)
    d = hidden // heads
    p, x, s0 = problem(cell)
    p, x = {k: v.astype(np.float32) for k, v in p.items()}, x.astype(np.float32)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    want, _ = rnnc.compile(cell, optimize=False)(x, p)
    got, _ = fn(x, p)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    assert loop_gemms(fn, "inference") == [((heads, B, d), (heads, d, 4 * d), (heads, B, 4 * d))]
    _, _, tape = fn.forward(x, p)
    fn.backward(tape, d_outputs={"y": np.ones((T, B, hidden), np.float32)})
    assert loop_gemms(fn, "forward") == loop_gemms(fn, "inference")
    assert loop_gemms(fn, "backward") == [
        ((heads, B, 4 * d), (heads, 4 * d, d), (heads, B, d))]  # the state's gradient
    # The weight's, a sum over the rows: once after the loop, over all T * B rows.
    assert ((heads, d, T * B), (heads, T * B, 4 * d), (heads, d, 4 * d)) in post_gemms(
        fn, "backward")

    simulated = SimulatedCublas()
    runner = fn._runners[("inference", "f32", False)]
    for host in runner.hosts.values():
        host.blas = simulated  # what Host makes on a GPU, its calls read as cuBLAS would
    runner.plans = Plans()
    got, _ = fn(x, p)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    # The input projection once, hoisted; then one call per step for all the heads.
    assert simulated.calls == [("gemm", 1)] + [("batched", heads)] * T


class SimulatedCublas:
    """:class:`rnnc.backends.cuda.blas.Cublas` on the CPU: each call recorded and made by
    reading and writing the operands' memory as cuBLAS would with its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def gemm(self, a, b, out, arguments, data, compute) -> None:
        self.calls.append(("gemm", 1))
        op_b, op_a, n, m, k, ld_b, ld_a, ld_out = arguments
        simulate_strided_batched(a[None], b[None], out[None],
                                 (op_b, op_a, n, m, k, ld_b, 0, ld_a, 0, ld_out, 0, 1))

    def gemm_batched(self, a, b, out, arguments, data, compute) -> None:
        self.calls.append(("batched", arguments[-1]))
        simulate_strided_batched(a, b, out, arguments)


@pytest.mark.skipif(available_compiler() is None, reason=NO_COMPILER)
def test_kernels_of_einsum_cells_compile_to_ptx() -> None:
    """The sLSTM's kernels (its products are GEMMs) and a cell's head-wise dot product (an
    einsum kernel) and its gradients, every mode, as one module."""
    modules = []
    for name, cell in (("slstm", rnnc.cells.slstm(4, 8, heads=4)), ("dot", heads_cell("kernel"))):
        fn = rnnc.compile(cell, backend="numpy")
        for mode in ("inference", "forward", "backward"):
            module = codegen.render(fn.program(mode, "f32"), prefix=f"{name}_{mode}_k_")
            assert "einsum" not in module.source or name == "dot"
            modules.append(module)
    assert any("einsum" in m.source for m in modules)  # the dot product's kernel is there
    ptx = compile_ptx(modules[0].prelude + "".join(m.kernel_text for m in modules), "sm_80")
    for module in modules:
        assert all(f".entry {kernel}(" in ptx for kernel in module.kernels)
