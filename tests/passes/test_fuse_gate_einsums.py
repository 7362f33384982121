"""fuse-gate-matmuls on einsums: the gates of all heads written one einsum per gate become one
einsum by a packed parameter block and slices of its last axis.

Counts of einsum nodes per step; forward and every gradient against the unoptimized traced
program (optimize=False) with lengths on every backend; the cases that stay unfused; the
packed layout as users see it (their own names and shapes, gradients per member).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import rnnc
from rnnc import einsum
from rnnc.passes import run as run_passes
from tests.passes.common import check_pass, head_gates_cell

H, D = 2, 3  # heads, units per head
T, B = 4, 3
GATES = ("z", "i", "f", "o")


def probe_cell() -> rnnc.Cell:
    """Two gates, each one einsum of the input and one of the state per gate."""
    return head_gates_cell("probe", H, D)


def slstm_per_gate() -> rnnc.Cell:
    """sLSTM with heads written one einsum per gate and operand, a bias ``(H, d)`` per gate
    added to the recurrent product (so the biases fold into one block)."""
    c = rnnc.Cell("slstm_gates")
    x = c.input("x", (H, D))
    h, cs, n, m = (c.state(name, (H, D)) for name in ("h", "c", "n", "m"))
    pre = {}
    for g in GATES:
        W, R = c.param(f"W{g}", (H, D, D)), c.param(f"R{g}", (H, D, D))
        b = c.param(f"b{g}", (H, D))
        pre[g] = einsum("hd,hde->he", h, R) + b + einsum("hd,hde->he", x, W)
    log_f = rnnc.log_sigmoid(pre["f"])
    m_new = rnnc.maximum(log_f + m, pre["i"])
    i_gate = rnnc.exp(pre["i"] - m_new)
    f_gate = rnnc.exp(log_f + m - m_new)
    c_new = f_gate * cs + i_gate * rnnc.tanh(pre["z"])
    n_new = f_gate * n + i_gate
    h_new = rnnc.sigmoid(pre["o"]) * c_new / n_new
    c.update(h=h_new, c=c_new, n=n_new, m=m_new)
    c.output("y", h_new.reshape(-1))
    return c


def _fused(cell: rnnc.Cell):
    return run_passes(cell.program(), ["canonicalize", "fuse-gate-matmuls"])


def _einsum_count(program) -> int:
    return sum(node.op.name == "einsum" for node in program.scan.body.nodes())


def test_probe_cell_reads_the_state_and_the_input_once_each():
    fn = rnnc.compile(probe_cell(), backend="numpy")
    counts = fn.op_counts("inference")
    assert counts["loop"].get("einsum") == 1 and counts["outside"].get("einsum") == 1, counts
    assert fn.op_counts("forward")["loop"].get("einsum") == 1
    assert [b.name for b in fn.layout.blocks] == ["Wz|Wf", "Rz|Rf"]


def test_per_gate_slstm_is_one_batched_product_per_step():
    """Four gates of two heads: one einsum of ``h`` per step, one of ``x`` before the loop,
    and the four recurrent biases one ``(H, 4d)`` block added once."""
    fn = rnnc.compile(slstm_per_gate(), backend="numpy")
    for mode in ("inference", "forward"):
        loop = fn.op_counts(mode)["loop"]
        assert loop.get("einsum") == 1 and "matmul" not in loop, (mode, loop)
    assert fn.op_counts("inference")["outside"].get("einsum") == 1
    blocks = {b.name: b for b in fn.layout.blocks}
    assert blocks["Rz|Ri|Rf|Ro"].shape == (H, D, 4 * D)
    assert blocks["bz|bi|bf|bo"].shape == (H, 4 * D)
    assert blocks["Rz|Ri|Rf|Ro"].members == tuple((f"R{g}", k * D, (k + 1) * D)
                                                  for k, g in enumerate(GATES))


def test_pass_keeps_the_meaning_and_is_idempotent():
    for cell in (probe_cell(), slstm_per_gate()):
        check_pass(run_passes(cell.program(), ["canonicalize"]), "fuse-gate-matmuls",
                   _env(cell), T, B)


def test_users_pack_and_receive_their_own_parameters():
    """The flat buffer holds each member as a slice of its block's last axis: packing and
    unpacking by name is the identity, and each member's view is its block's columns."""
    fn = rnnc.compile(slstm_per_gate(), backend="numpy")
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s) for k, s in fn.params.items()}
    flat = fn.pack(params)
    views = fn.unpack(flat)
    assert set(views) == set(params)
    for k, v in params.items():
        np.testing.assert_array_equal(views[k], v, err_msg=k)
    block = fn.layout.block_views(flat)["Rz|Ri|Rf|Ro"]
    np.testing.assert_array_equal(block[..., 2 * D:3 * D], params["Rf"])


def _data(cell: rnnc.Cell, dtype, seed: int = 1):
    rng = np.random.default_rng(seed)
    params = {k: (rng.standard_normal(v.shape) * 0.5).astype(dtype)
              for k, v in cell.init_params(dtype=np.float64).items()}
    x = rng.standard_normal((T, B, H * D)).astype(dtype)
    states = {k: rng.standard_normal((B, H, D)).astype(dtype) for k in cell.states}
    if "n" in states:  # the normalizer stays positive
        states["n"] = np.abs(states["n"]) + 1.0
    return params, x, states


def _env(cell: rnnc.Cell) -> dict[str, np.ndarray]:
    """The inputs, user parameters and initial states by name, for the NumPy interpreter."""
    params, x, states = _data(cell, np.float64)
    return {"x": x, **params, **states}


def _options(backend: str) -> dict:
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    if backend == "cuda":
        if shutil.which("g++") is None:
            pytest.skip("the CUDA emulation needs a C++ compiler")
        return {"backend": "cuda", "emulate": True}
    return {"backend": backend}


def _backend_cases():
    """Every backend in float64 runs by default; float32 on LLVM and CUDA builds its kernels
    again and runs with the slow tests."""
    for backend in ("numpy", "llvm", "cuda"):
        for dtype in (np.float64, np.float32):
            slow = backend != "numpy" and dtype == np.float32
            yield pytest.param(backend, dtype, marks=[pytest.mark.slow] * slow,
                               id=f"{backend}-{np.dtype(dtype).name}")


@pytest.mark.parametrize("backend,dtype", list(_backend_cases()))
def test_forward_and_gradients_match_the_unoptimized_program(backend, dtype):
    cell = slstm_per_gate()
    params, x, states = _data(cell, dtype)
    lengths = np.array([4, 2, 1])
    rng = np.random.default_rng(2)
    d_y = rng.standard_normal((T, B, H * D)).astype(dtype)
    d_states = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in states.items()}
    tol = {"rtol": 1e-9, "atol": 1e-11} if dtype == np.float64 else {"rtol": 2e-4, "atol": 2e-5}
    out = []
    for fn in (rnnc.compile(cell, optimize=False), rnnc.compile(cell, **_options(backend))):
        ys, st, tape = fn.forward(x, params, states=states, lengths=lengths)
        g = fn.backward(tape, d_outputs={"y": d_y}, d_states=d_states)
        out.append({"y": ys["y"], **{f"state {k}": v for k, v in st.items()}, "x": g.x,
                    **g.params, **{f"d state {k}": v for k, v in g.states.items()}})
    assert "Rz|Ri|Rf|Ro" in {b.name for b in fn.layout.blocks}
    assert set(out[1]) == set(out[0])
    for k in out[0]:
        assert out[1][k].shape == out[0][k].shape, k
        np.testing.assert_allclose(out[1][k], out[0][k], err_msg=k, **tol)


# ---------------------------------------------------------------- what stays unfused


def _two_gates(spec: str, shape: tuple[int, ...], second_spec: str | None = None,
               second_shape: tuple[int, ...] | None = None) -> rnnc.Cell:
    """A state read by two parameters through ``spec`` (and ``second_spec``)."""
    c = rnnc.Cell("two")
    x, h = c.input("x", (H, D)), c.state("h", (H, D))
    A = c.param("A", shape)
    C = c.param("C", second_shape or shape)
    new = rnnc.tanh(einsum(spec, h, A) + x) * rnnc.sigmoid(einsum(second_spec or spec, h, C))
    c.update(h=new)
    c.output("y", new.reshape(-1))
    return c


@pytest.mark.parametrize("cell", [
    # different specs
    _two_gates("hd,hde->he", (H, D, D), "hd,dhe->he", (D, H, D)),
    # the parameter's last axis is contracted with the state's, not output-only
    _two_gates("he,hde->hd", (H, D, D)),
    # the output-only axis is not the parameter's last
    _two_gates("hd,hed->he", (H, D, D)),
], ids=["specs", "contracted", "not-last"])
def test_einsums_that_do_not_stack_stay_apart(cell):
    program = _fused(cell)
    assert _einsum_count(program) == 2
    assert all(len(b.members) == 1 for b in program.layout or ())


def test_a_parameter_packed_with_another_value_stays_apart_here():
    """``A`` reads both the input (with ``C``) and the state (with ``E``): it joins the
    input's block, so the state's two einsums stay apart and read ``A`` as columns of it."""
    c = rnnc.Cell("shared")
    x, h = c.input("x", (H, D)), c.state("h", (H, D))
    A, C, E = (c.param(n, (H, D, D)) for n in ("A", "C", "E"))
    new = rnnc.tanh(einsum("hd,hde->he", x, A) + einsum("hd,hde->he", h, A)) \
        * rnnc.sigmoid(einsum("hd,hde->he", x, C) + einsum("hd,hde->he", h, E))
    c.update(h=new)
    c.output("y", new.reshape(-1))
    program = _fused(c)
    assert _einsum_count(program) == 3
    assert [b.name for b in program.layout] == ["A|C", "E"]
    check_pass(run_passes(c.program(), ["canonicalize"]), "fuse-gate-matmuls", _env(c), T, B)


def test_biases_fold_only_when_every_member_has_one():
    """Only the first gate adds a bias right after its product: the products pack, the
    bias stays a parameter of its own."""
    c = rnnc.Cell("bias")
    x, h = c.input("x", (H, D)), c.state("h", (H, D))
    A, C = c.param("A", (H, D, D)), c.param("C", (H, D, D))
    b = c.param("b", (H, D))
    new = rnnc.tanh(einsum("hd,hde->he", h, A) + b + x) \
        * rnnc.sigmoid(einsum("hd,hde->he", h, C))
    c.update(h=new)
    c.output("y", new.reshape(-1))
    program = _fused(c)
    assert _einsum_count(program) == 1
    assert [b.name for b in program.layout] == ["A|C", "b"]
    check_pass(run_passes(c.program(), ["canonicalize"]), "fuse-gate-matmuls",
               _env(c), T, B)
