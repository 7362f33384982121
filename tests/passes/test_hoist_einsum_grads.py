"""hoist-sequence and einsum weight gradients: a head-wise weight's gradient
``einsum[spec=...he,...hd->hde]`` (a sum over the batch rows) runs once after the backward
loop, over the stacked ``(T, B, ...)`` operands, like ``matmul[transpose_a]``.

The backward loops of a cell with head-wise products and of sLSTM hold no such einsum; the
gradients match the unoptimized traced program with lengths and in reverse, on NumPy, LLVM and
CUDA (emulated), in float32 and float64. A weight gradient that needs no carry (the output
reads an input's head-wise product) is not hoisted before the loop as a loop constant: there
it summed over every step, and the loop added that sum once per step again.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import rnnc
from rnnc import einsum, ops
from rnnc.passes import pipeline
from rnnc.passes import run as run_passes
from rnnc.printer import format_program
from tests.passes.common import head_gates_cell

T, B = 5, 3
LENGTHS = np.array([5, 3, 1])


def gates_cell() -> rnnc.Cell:
    """Two head-wise gates on the input and the state: four weights, each with an einsum
    gradient summed over the rows."""
    return head_gates_cell("gates")


def readout_cell() -> rnnc.Cell:
    """An output that reads only the input's head-wise product: ``W``'s gradient reads the
    output's cotangent and the input, no carry."""
    c = rnnc.Cell("readout")
    heads, d = 2, 3
    x, h = c.input("x", (heads, d)), c.state("h", (heads, d))
    W, R = c.param("W", (heads, d, d)), c.param("R", (heads, d, d))
    c.update(h=rnnc.tanh(einsum("hd,hde->he", h, R) + x))
    c.output("y", einsum("hd,hde->he", x, W).reshape(-1))
    return c


def kernel_cell() -> rnnc.Cell:
    """Einsums that are no matrix product (three operands, no contraction): their weights'
    gradients after the loop run as loop nests (LLVM) and kernels (CUDA) over (T, B) rows."""
    c = rnnc.Cell("kernel")
    heads, d = 2, 3
    x, h = c.input("x", (heads, d)), c.state("h", (heads, d))
    P, Q = c.param("P", (heads, d)), c.param("Q", (heads, d))
    score = einsum("hd,hd,hd->h", h, x, P)[:, :, None]
    new = rnnc.tanh(h * score + x + einsum("hd,hd->hd", h, Q))
    c.update(h=new)
    c.output("y", new.reshape(-1))
    return c


CELLS = {"gates": gates_cell, "kernel": kernel_cell, "readout": readout_cell,
         "slstm": lambda: rnnc.cells.slstm(4, 4, heads=2),
         "selective_ssm": lambda: rnnc.cells.selective_ssm(4, 3)}


def _summed_einsums(g) -> list:
    """The einsums of ``g`` whose result has no rows while an operand has."""
    out = []
    for node in g.nodes():
        if node.op is ops.einsum and not node.attrs["spec"].split("->")[1].startswith("..."):
            out.append(node)
    return out


def _backward(cell: rnnc.Cell):
    return run_passes(cell.program(), pipeline("backward", parallel_scan=False))


def test_weight_gradients_of_head_wise_products_run_after_the_loop():
    backward = _backward(gates_cell())
    assert not _summed_einsums(backward.scan.body), format_program(backward)
    # fuse-gate-matmuls packs Wz|Wf and Rz|Rf: one weight-gradient einsum per block
    assert len(_summed_einsums(backward.post)) == 2, format_program(backward)
    assert {"grad.Wz|Wf", "grad.Rz|Rf"} <= set(backward.post.outputs)
    assert not backward.scan.summed, format_program(backward)


def test_weight_gradients_of_other_einsums_run_after_the_loop():
    backward = _backward(kernel_cell())
    assert not _summed_einsums(backward.scan.body), format_program(backward)
    assert {"grad.P", "grad.Q"} <= set(backward.post.outputs)
    specs = {n.attrs["spec"] for n in _summed_einsums(backward.post)}
    assert "...h,...hd,...hd->hd" in specs, specs


def test_slstm_recurrent_weight_gradient_runs_after_the_loop():
    backward = _backward(rnnc.cells.slstm(8, 8, heads=4))
    assert not _summed_einsums(backward.scan.body), format_program(backward)
    assert "grad.R" in backward.post.outputs
    [grad_r] = _summed_einsums(backward.post)
    assert backward.post.outputs["grad.R"] == grad_r.id
    # Its operands are sequences the loop stacks or the forward saved anyway.
    reads = {backward.post.node(i).attrs.get("name") for i in grad_r.inputs}
    assert reads <= set(backward.scan.stacked) | set(backward.args), reads


def test_carry_free_weight_gradient_is_not_a_loop_constant():
    """``W``'s gradient in the readout cell needs no carry; it moves after the loop, never
    into ``pre`` as a constant the loop would read (and sum) at every step."""
    backward = _backward(readout_cell())
    assert not _summed_einsums(backward.pre), format_program(backward)
    assert not _summed_einsums(backward.scan.body), format_program(backward)
    assert {"grad.W", "grad.R"} <= set(backward.post.outputs)


def _problem(cell: rnnc.Cell):
    rng = np.random.default_rng(5)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=2, dtype=np.float64).items()}
    x = rng.standard_normal((T, B, cell.sizes("input")["x"][-1]))
    states = {k: 0.5 * rng.standard_normal((B,) + shape[1:])
              for k, shape in cell.sizes("state").items()}
    rng = np.random.default_rng(6)
    d_y = rng.standard_normal((T, B, cell.graph.node(cell.outputs["y"]).shape[-1]))
    d_states = {k: rng.standard_normal(v.shape) for k, v in states.items()}
    return params, x, states, d_y, d_states


def _gradients(fn, cell: rnnc.Cell, dtype) -> dict[str, np.ndarray]:
    params, x, states, d_y, d_states = _problem(cell)

    def cast(tree):
        return {k: v.astype(dtype) for k, v in tree.items()}

    _, _, tape = fn.forward(x.astype(dtype), cast(params), states=cast(states),
                            lengths=LENGTHS)
    g = fn.backward(tape, d_outputs={"y": d_y.astype(dtype)}, d_states=cast(d_states))
    return {"x": g.x, **{f"param {k}": v for k, v in g.params.items()},
            **{f"state {k}": v for k, v in g.states.items()}}


@functools.cache
def _reference(name: str) -> dict[str, np.ndarray]:
    """The gradients of the traced program without optimization passes, in float64."""
    cell = CELLS[name]()
    return _gradients(rnnc.compile(cell, optimize=False, reverse=True), cell, np.float64)


BACKENDS = {"numpy": {}, "llvm": {}, "cuda": {"emulate": True}}
# Native builds take seconds each: the default suite runs the head-wise cell in float32 and
# sLSTM in float64 on LLVM and CUDA (the weight gradients after the loop, whose rows span
# (T, B), in both element types), the kernel cell on CUDA, every other native case with the
# slow tests.
DEFAULT_NATIVE = {("gates", "llvm", np.float32), ("gates", "cuda", np.float32),
                  ("slstm", "llvm", np.float64), ("slstm", "cuda", np.float64),
                  ("kernel", "cuda", np.float64)}
TOLERANCE = {np.float64: 1e-10, np.float32: 5e-5}


def _cases():
    for name in sorted(CELLS):
        for backend in sorted(BACKENDS):
            for dtype in (np.float64, np.float32):
                slow = backend != "numpy" and (name, backend, dtype) not in DEFAULT_NATIVE
                yield pytest.param(name, backend, dtype, id=f"{name}-{backend}-{dtype.__name__}",
                                   marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("name,backend,dtype", list(_cases()))
def test_gradients_match_the_unoptimized_program(name, backend, dtype):
    """Every gradient, with lengths and in reverse, against the float64 reference (relative to
    each gradient's largest element: sLSTM's exponential gates make gradients in the
    thousands)."""
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    cell = CELLS[name]()
    want = _reference(name)
    fn = rnnc.compile(cell, backend=backend, reverse=True, **BACKENDS[backend])
    got = _gradients(fn, cell, dtype)
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == dtype, k
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(got[k], w, rtol=0, atol=TOLERANCE[dtype] * scale, err_msg=k)
