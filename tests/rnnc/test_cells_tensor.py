"""The cells of rnnc/cells_tensor.py (sLSTM with heads, a selective SSM with a (D, N) state,
RG-LRU) against float64 NumPy loops written here from their papers' equations.

Forward with lengths on every backend against the loops; every gradient on NumPy against
central differences of the loops; every backend's gradients against the unoptimized traced
program; the parallel-scan form against the loop form; the sLSTM's recurrence as one einsum
per step.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import rnnc
from tests.numeric import central_difference

T, B, I = 4, 3, 3
LENGTHS = np.array([4, 2, 1])
HEADS, HIDDEN = 2, 4  # sLSTM: 2 heads of 2 units
D, N = 3, 2  # selective SSM
WIDTH = 3  # RG-LRU
NAMES = ("slstm", "slstm_exp", "selective_ssm", "rg_lru")
SCANS = ("selective_ssm", "rg_lru")  # linear in their state: parallel-scan applies


def sig(v):
    return 1 / (1 + np.exp(-v))


def softplus(v):
    return np.log1p(np.exp(v))


def make_cell(name: str) -> rnnc.Cell:
    if name.startswith("slstm"):
        return rnnc.cells.slstm(I, HIDDEN, heads=HEADS,
                                forget="exp" if name == "slstm_exp" else "sigmoid")
    return rnnc.cells.selective_ssm(D, N) if name == "selective_ssm" else rnnc.cells.rg_lru(WIDTH)


def step_slstm(p, x, s, exp_forget=False):
    d = HIDDEN // HEADS
    rec = np.stack([s["h"][:, k] @ p["R"][k] for k in range(HEADS)], axis=1)  # per head
    pre = (x @ p["W"]).reshape(-1, HEADS, 4 * d) + rec + p["b"]
    z, i, f, o = (pre[..., k * d:(k + 1) * d] for k in range(4))
    log_f = f if exp_forget else -np.log1p(np.exp(-f))
    m = np.maximum(log_f + s["m"], i)
    i_gate, f_gate = np.exp(i - m), np.exp(log_f + s["m"] - m)
    c = f_gate * s["c"] + i_gate * np.tanh(z)
    n = f_gate * s["n"] + i_gate
    h = sig(o) * c / n
    return h.reshape(-1, HIDDEN), {"h": h, "c": c, "n": n, "m": m}


def step_selective_ssm(p, x, s):
    dt = softplus(x @ p["W_dt"] + p["b_dt"])
    Bt, Ct = x @ p["W_B"], x @ p["W_C"]
    A = -np.exp(p["A_log"])
    h = np.zeros_like(s["h"])
    for d in range(D):  # channel by channel, state by state: no broadcasting to trust
        for k in range(N):
            h[:, d, k] = (np.exp(dt[:, d] * A[d, k]) * s["h"][:, d, k]
                          + dt[:, d] * x[:, d] * Bt[:, k])
    y = np.stack([(h[:, d, :] * Ct).sum(-1) for d in range(D)], axis=1) + p["D_skip"] * x
    return y, {"h": h}


def step_rg_lru(p, x, s):
    r, i = sig(x @ p["W_a"] + p["b_a"]), sig(x @ p["W_x"] + p["b_x"])
    a = sig(p["Lambda"]) ** (8.0 * r)
    h = a * s["h"] + np.sqrt(1 - a ** 2) * (i * x)
    return h, {"h": h}


STEPS = {"slstm": step_slstm, "slstm_exp": lambda p, x, s: step_slstm(p, x, s, True),
         "selective_ssm": step_selective_ssm, "rg_lru": step_rg_lru}


def reference(name, p, x, states, lengths=None, reverse=False):
    """The cell's loop with PyTorch's packed-sequence semantics for ``lengths``."""
    s, ys = dict(states), [None] * len(x)
    for t in range(len(x) - 1, -1, -1) if reverse else range(len(x)):
        y, new = STEPS[name](p, x[t], s)
        live = np.ones(B, bool) if lengths is None else t < lengths
        s = {k: np.where(live.reshape((-1,) + (1,) * (v.ndim - 1)), new[k], v)
             for k, v in s.items()}
        ys[t] = np.where(live[:, None], y, 0.0)
    return np.stack(ys), s


def problem(name, seed=0):
    cell = make_cell(name)
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=seed, dtype=np.float64).items()}
    width = cell.sizes("input")["x"][-1]
    x = rng.standard_normal((T, B, width))
    states = {k: 0.5 * rng.standard_normal((B,) + shape[1:])
              for k, shape in cell.sizes("state").items()}
    if "n" in states:  # the normalizer of sLSTM stays positive
        states["n"] = 1.0 + np.abs(states["n"])
    return cell, params, x, states


def _emulator() -> bool:
    return shutil.which("g++") is not None


def _options(backend: str) -> dict:
    if backend.startswith("llvm"):
        pytest.importorskip("llvmlite")
    if backend == "cuda-emulate":
        if not _emulator():
            pytest.skip("the CUDA emulation needs a C++ compiler")
        return {"backend": "cuda", "emulate": True}
    return {"backend": backend}


def _every_backend():
    """(name, backend) pairs: the emulated CUDA kernels take seconds to build, and the exp
    forget gate differs from the sigmoid one in one elementwise op, so those run as slow."""
    for name in NAMES:
        for backend in ("numpy", "llvm", "cuda-emulate"):
            slow = backend == "cuda-emulate" or (name == "slstm_exp" and backend != "numpy")
            yield pytest.param(name, backend, marks=[pytest.mark.slow] if slow else [],
                               id=f"{name}-{backend}")


@pytest.mark.parametrize("name,backend", list(_every_backend()))
def test_forward_and_gradients_on_every_backend(name, backend):
    """Outputs and final states against the NumPy loop, and every gradient against the
    unoptimized traced program (itself checked against central differences below), with
    lengths, float64."""
    cell, p, x, s0 = problem(name, seed=3)
    results = []
    for fn in (rnnc.compile(cell, optimize=False), rnnc.compile(cell, **_options(backend))):
        ys, st, tape = fn.forward(x, p, states=s0, lengths=LENGTHS)
        rng = np.random.default_rng(4)
        d_y = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
        d_s = {k: rng.standard_normal(v.shape) for k, v in st.items()}
        g = fn.backward(tape, d_outputs=d_y, d_states=d_s)
        results.append({"y": ys["y"], **{f"state {k}": v for k, v in st.items()},
                        "grad x": g.x, **{f"grad {k}": v for k, v in g.params.items()},
                        **{f"grad state {k}": v for k, v in g.states.items()}})
    want_y, want_s = reference(name, p, x, s0, LENGTHS)
    np.testing.assert_allclose(results[1]["y"], want_y, rtol=1e-10, atol=1e-12)
    for k, v in want_s.items():
        np.testing.assert_allclose(results[1][f"state {k}"], v, rtol=1e-10, atol=1e-12)
    want, got = results
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-11, err_msg=k)


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_central_differences(name, lengths):
    cell, p, x, s0 = problem(name, seed=1)
    rng = np.random.default_rng(2)
    wy = rng.standard_normal((T, B, cell.graph.node(cell.outputs["y"]).shape[-1]))
    ws = {k: rng.standard_normal(v.shape) for k, v in s0.items()}

    def loss():
        ys, st = reference(name, p, x, s0, lengths)
        return float((ys * wy).sum() + sum((st[k] * ws[k]).sum() for k in st))

    fn = rnnc.compile(cell, backend="numpy")
    _, _, tape = fn.forward(x, p, states=s0, lengths=lengths)
    g = fn.backward(tape, d_outputs={"y": wy}, d_states=ws)
    got = {**{f"param {k}": v for k, v in g.params.items()}, "x": g.x,
           **{f"state {k}": v for k, v in g.states.items()}}
    want = {**{f"param {k}": central_difference(loss, p[k]) for k in p},
            "x": central_difference(loss, x),
            **{f"state {k}": central_difference(loss, s0[k]) for k in s0}}
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)


def _scan_cases():
    """On NumPy both directions; on LLVM the SSM's (T, B, D, N) scan forward in time, the
    rest with the slow tests."""
    for name in SCANS:
        for backend, reverse in (("numpy", False), ("numpy", True), ("llvm", False),
                                 ("llvm", True)):
            slow = backend == "llvm" and (reverse or name != "selective_ssm")
            yield pytest.param(name, backend, reverse, marks=[pytest.mark.slow] * slow,
                               id=f"{name}-{backend}-{'reverse' if reverse else 'forward'}")


@pytest.mark.parametrize("name,backend,reverse", list(_scan_cases()))
def test_scan_form_matches_loop_form(name, backend, reverse):
    """parallel-scan finds the linear recurrence (in the SSM's (D, N) state too): no loop is
    left, and the scan form agrees with the loop form and with the NumPy loop."""
    _options(backend)
    cell, p, x, s0 = problem(name, seed=5)
    scan = rnnc.compile(cell, backend=backend, reverse=reverse, parallel_scan=True)
    loop = rnnc.compile(cell, backend=backend, reverse=reverse, parallel_scan=False)
    assert scan.op_counts("forward")["loop"] == {}  # (backward keeps a loop for the weights)
    assert loop.op_counts("forward")["loop"] != {}
    want_y, want_s = reference(name, p, x, s0, LENGTHS, reverse)
    d_y = np.random.default_rng(6).standard_normal(want_y.shape)
    grads = []
    for fn in (scan, loop):
        ys, st, tape = fn.forward(x, p, states=s0, lengths=LENGTHS)
        np.testing.assert_allclose(ys["y"], want_y, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(st["h"], want_s["h"], rtol=1e-10, atol=1e-12)
        g = fn.backward(tape, d_outputs={"y": d_y})
        grads.append({"x": g.x, **g.params, **{f"state {k}": v for k, v in g.states.items()}})
    for k in grads[1]:
        np.testing.assert_allclose(grads[0][k], grads[1][k], rtol=1e-9, atol=1e-11, err_msg=k)


def test_slstm_recurrence_is_one_einsum_per_step():
    """All heads' recurrent products are one einsum in the loop (one batched GEMM per step),
    the input projection is hoisted out of it, and so are the backward's weight products."""
    fn = rnnc.compile(rnnc.cells.slstm(8, 16, heads=4), backend="numpy")
    for mode in ("inference", "forward"):
        loop = fn.op_counts(mode)["loop"]
        assert loop.get("einsum") == 1 and "matmul" not in loop, (mode, loop)
    assert "matmul" not in fn.op_counts("backward")["loop"]


def test_cell_shapes_and_errors():
    cell = rnnc.cells.slstm(I, 8, heads=4)
    assert cell.sizes("state") == {k: ("B", 4, 2) for k in "hcnm"}
    assert cell.sizes("param")["R"] == (4, 2, 8)
    ssm = rnnc.cells.selective_ssm(5)
    assert ssm.sizes("state") == {"h": ("B", 5, 16)}
    A = ssm.init_params(seed=0)["A_log"]
    np.testing.assert_allclose(np.exp(A[0]), np.arange(1, 17), rtol=1e-6)
    lam = rnnc.cells.rg_lru(4).init_params(seed=0)["Lambda"]
    assert np.all((sig(lam) ** 8 >= 0.9 - 1e-6) & (sig(lam) ** 8 <= 0.999 + 1e-6))
    for bad in (3, 0, -1, True):
        with pytest.raises(rnnc.CellError, match="heads"):
            rnnc.cells.slstm(I, 8, heads=bad)
    with pytest.raises(rnnc.CellError, match="forget"):
        rnnc.cells.slstm(I, 8, heads=2, forget="tanh")
