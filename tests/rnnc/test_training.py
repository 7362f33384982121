"""Training: fn.forward + fn.backward against torch.autograd and float64 central differences.

The loss is ``sum(dy * y) + sum(dh * h_T)`` (plus ``sum(dc * c_T)`` for an LSTM) with random
upstream gradients, so every output and final state feeds the gradients. Relative error is
``max|a - b| / max(1, max|b|)``.

Standard cells go against ``torch.nn.RNN/LSTM/GRU`` (weights mapped as DESIGN says, gradients
mapped back by hand). Custom cells go against central differences of the loss computed by the
inference path ``fn(...)``, perturbing every parameter, input and initial-state entry.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rnnc
from rnnc.interop.weights import from_torch_layer
from tests.strategies import random_cells, random_data

torch = pytest.importorskip("torch")

TOL = {np.float32: 1e-4, np.float64: 1e-9}
GATES = {"rnn_tanh": "h", "rnn_relu": "h", "lstm": "ifgo", "gru": "rzn"}
# (T, B, input, hidden), including T=1 and B=1.
SHAPES = [(4, 3, 3, 5), (1, 1, 2, 3), (1, 2, 1, 2), (5, 1, 3, 4), (3, 2, 4, 1)]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))


def state_names(mode: str) -> tuple[str, ...]:
    return ("h", "c") if mode == "lstm" else ("h",)


def make_cell(mode: str, I: int, H: int) -> rnnc.Cell:
    if mode == "lstm":
        return rnnc.cells.lstm(I, H)
    if mode == "gru":
        return rnnc.cells.gru(I, H, reset_after=True)
    return rnnc.cells.rnn(I, H, nonlinearity=mode[4:])


def torch_module(mode: str, I: int, H: int, seed: int):
    torch.manual_seed(seed)
    if mode == "lstm":
        m = torch.nn.LSTM(I, H)
    elif mode == "gru":
        m = torch.nn.GRU(I, H)
    else:
        m = torch.nn.RNN(I, H, nonlinearity=mode[4:])
    return m.double()


TORCH_NAMES = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")


def grads_by_hand(mode: str, module) -> dict[str, np.ndarray]:
    """torch's parameter gradients under rnnc's names: dW_i<g> = weight_ih.grad[jH:(j+1)H].T."""
    w_ih, w_hh, b_ih, b_hh = (getattr(module, n).grad.numpy() for n in TORCH_NAMES)
    H = module.hidden_size
    out = {}
    for j, g in enumerate(GATES[mode]):
        rows = slice(j * H, (j + 1) * H)
        out[f"W_i{g}"], out[f"W_h{g}"] = w_ih[rows].T, w_hh[rows].T
        out[f"b_i{g}"], out[f"b_h{g}"] = b_ih[rows], b_hh[rows]
    return out


def torch_run(mode, module, x, states, dy, dstates, lengths=None):
    """Outputs, final states and gradients (x, params, initial states) from torch.autograd."""
    module.zero_grad()
    tx = torch.from_numpy(np.asarray(x, np.float64)).requires_grad_()
    th = {s: torch.from_numpy(np.asarray(v, np.float64))[None].requires_grad_()
          for s, v in states.items()}
    init = (th["h"], th["c"]) if mode == "lstm" else th["h"]
    inp = tx
    if lengths is not None:
        inp = torch.nn.utils.rnn.pack_padded_sequence(tx, torch.as_tensor(lengths),
                                                      enforce_sorted=False)
    ty, final = module(inp, init)
    if lengths is not None:
        ty, _ = torch.nn.utils.rnn.pad_packed_sequence(ty, total_length=x.shape[0])
    finals = dict(zip(state_names(mode), final if mode == "lstm" else (final,), strict=True))
    loss = (ty * torch.from_numpy(dy)).sum()
    for s, v in finals.items():
        loss = loss + (v[0] * torch.from_numpy(dstates[s])).sum()
    loss.backward()
    return {
        "y": ty.detach().numpy(),
        "states": {s: v[0].detach().numpy() for s, v in finals.items()},
        "x": tx.grad.numpy(),
        "params": grads_by_hand(mode, module),
        "init": {s: v.grad[0].numpy() for s, v in th.items()},
    }


def setup(mode: str, shape, dtype, seed: int):
    """A torch module (float64, holding the dtype-rounded weights), rnnc params and data."""
    T, B, I, H = shape
    module = torch_module(mode, I, H, seed)
    with torch.no_grad():
        for name in TORCH_NAMES:
            p = getattr(module, name)
            p.copy_(torch.from_numpy(p.detach().numpy().astype(dtype).astype(np.float64)))
    params = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in from_torch_layer(
        mode, *(getattr(module, n).detach().numpy() for n in TORCH_NAMES)).items()}
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    states = {s: (0.5 * rng.standard_normal((B, H))).astype(dtype) for s in state_names(mode)}
    dy = rng.standard_normal((T, B, H))
    dstates = {s: rng.standard_normal((B, H)) for s in state_names(mode)}
    return module, params, x, states, dy, dstates


def check_against_torch(fn, mode, got_y, got_states, g, want, dtype, lengths=None) -> None:
    tol = TOL[dtype]
    y = got_y["y"]
    if lengths is not None:  # rnnc's outputs past a sequence's end are not PyTorch's zeros
        valid = (np.arange(y.shape[0])[:, None] < np.asarray(lengths)[None, :])[:, :, None]
        y = np.where(valid, y, 0.0)
    assert rel_err(y, want["y"]) <= tol, "y"
    for s in state_names(mode):
        assert rel_err(got_states[s], want["states"][s]) <= tol, f"final {s}"
    assert g.x.dtype == dtype
    assert rel_err(g.x, want["x"]) <= tol, "grad x"
    assert set(g.params) == set(want["params"])
    for name, w in want["params"].items():
        assert g.params[name].dtype == dtype, name
        assert rel_err(g.params[name], w) <= tol, f"grad {name}"
    assert set(g.states) == set(state_names(mode))
    for s in state_names(mode):
        assert rel_err(g.states[s], want["init"][s]) <= tol, f"grad initial {s}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}B{}I{}H{}".format(*s))
@pytest.mark.parametrize("mode", list(GATES))
def test_standard_cell_gradients_match_torch(mode: str, shape, dtype) -> None:
    module, params, x, states, dy, dstates = setup(mode, shape, dtype, seed=sum(shape))
    fn = rnnc.compile(make_cell(mode, shape[2], shape[3]), backend="numpy")
    ys, final, tape = fn.forward(x, params, states=states)
    g = fn.backward(tape, d_outputs={"y": dy.astype(dtype)},
                    d_states={s: v.astype(dtype) for s, v in dstates.items()})
    want = torch_run(mode, module, x, states, dy, dstates)
    check_against_torch(fn, mode, ys, final, g, want, dtype)


@pytest.mark.parametrize("mode", list(GATES))
def test_gradients_through_lengths_match_torch_packed(mode: str) -> None:
    """Variable lengths (the mask-lengths pass) against pack_padded_sequence, unsorted."""
    T, B, I, H = 5, 4, 3, 4
    module, params, x, states, dy, dstates = setup(mode, (T, B, I, H), np.float64, seed=11)
    lengths = np.array([3, 5, 1, 4])
    # The loss reads no output past a sequence's end, so rnnc's values there do not matter.
    dy *= (np.arange(T)[:, None] < lengths[None, :])[:, :, None]
    fn = rnnc.compile(make_cell(mode, I, H), backend="numpy")
    ys, final, tape = fn.forward(x, params, states=states, lengths=lengths)
    g = fn.backward(tape, d_outputs={"y": dy}, d_states=dstates)
    want = torch_run(mode, module, x, states, dy, dstates, lengths=lengths)
    check_against_torch(fn, mode, ys, final, g, want, np.float64, lengths=lengths)


def test_omitted_upstream_gradients_are_zero() -> None:
    mode, shape = "lstm", (3, 2, 2, 3)
    module, params, x, states, dy, dstates = setup(mode, shape, np.float64, seed=5)
    fn = rnnc.compile(make_cell(mode, 2, 3), backend="numpy")
    _, _, tape = fn.forward(x, params, states=states)
    zeros = {s: np.zeros_like(v) for s, v in dstates.items()}
    # Only the output gradient: torch with zero state gradients.
    g = fn.backward(tape, d_outputs={"y": dy})
    want = torch_run(mode, module, x, states, dy, zeros)
    check_against_torch(fn, mode, *fn(x, params, states=states), g, want, np.float64)
    # Only one state gradient (c omitted, d_outputs None).
    g = fn.backward(tape, d_outputs=None, d_states={"h": dstates["h"]})
    want = torch_run(mode, module, x, states, np.zeros_like(dy), {**zeros, "h": dstates["h"]})
    check_against_torch(fn, mode, *fn(x, params, states=states), g, want, np.float64)
    # Nothing at all: every gradient is zero.
    g = fn.backward(tape)
    assert not np.any(g.x) and not any(np.any(v) for v in g.params.values())
    assert not any(np.any(v) for v in g.states.values())


def test_tape_is_reusable() -> None:
    mode, shape = "gru", (4, 2, 3, 3)
    _, params, x, states, dy, dstates = setup(mode, shape, np.float64, seed=3)
    fn = rnnc.compile(make_cell(mode, 3, 3), backend="numpy")
    _, _, tape = fn.forward(x, params, states=states)
    saved = {k: np.array(v, copy=True) for k, v in tape.env.items()}
    first = fn.backward(tape, d_outputs={"y": dy}, d_states=dstates)
    other = fn.backward(tape, d_outputs={"y": 2 * dy})  # a different backward in between
    second = fn.backward(tape, d_outputs={"y": dy}, d_states=dstates)
    assert not np.array_equal(other.x, first.x)
    np.testing.assert_array_equal(first.x, second.x)
    for name in first.params:
        np.testing.assert_array_equal(first.params[name], second.params[name])
    for name in first.states:
        np.testing.assert_array_equal(first.states[name], second.states[name])
    for k, v in saved.items():
        np.testing.assert_array_equal(tape.env[k], v, err_msg=f"backward changed the tape {k}")


# ------------------------------------------------------------ custom cells, central differences


def peephole_lstm(I: int, H: int) -> rnnc.Cell:
    """LSTM whose gates also see the cell state (Gers & Schmidhuber peepholes)."""
    c = rnnc.Cell("peephole_lstm")
    x, h, cs = c.input("x", I), c.state("h", H), c.state("c", H)
    W = {g: c.param(f"W_{g}", (I, H)) for g in "ifgo"}
    U = {g: c.param(f"U_{g}", (H, H)) for g in "ifgo"}
    b = {g: c.param(f"b_{g}", (H,)) for g in "ifgo"}
    P = {g: c.param(f"P_{g}", (H,)) for g in "ifo"}
    i = rnnc.sigmoid(x @ W["i"] + h @ U["i"] + cs * P["i"] + b["i"])
    f = rnnc.sigmoid(x @ W["f"] + h @ U["f"] + cs * P["f"] + b["f"])
    g = rnnc.tanh(x @ W["g"] + h @ U["g"] + b["g"])
    c_new = f * cs + i * g
    o = rnnc.sigmoid(x @ W["o"] + h @ U["o"] + c_new * P["o"] + b["o"])
    h_new = o * rnnc.tanh(c_new)
    c.update(h=h_new, c=c_new)
    c.output("y", h_new)
    return c


def mgu(I: int, H: int) -> rnnc.Cell:
    """The minimal gated unit of the README's "Your own cell"."""
    c = rnnc.Cell("mgu")
    x, h = c.input("x", I), c.state("h", H)
    W_f, U_f = c.param("W_f", (I, H)), c.param("U_f", (H, H))
    W_n, U_n = c.param("W_n", (I, H)), c.param("U_n", (H, H))
    b_f, b_n = c.param("b_f", (H,)), c.param("b_n", (H,))
    f = rnnc.sigmoid(x @ W_f + h @ U_f + b_f)
    n = rnnc.tanh(x @ W_n + (f * h) @ U_n + b_n)
    h_new = (1 - f) * h + f * n
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def layer_norm_rnn(I: int, H: int) -> rnnc.Cell:
    """An Elman cell with layer normalization of the pre-activation (mean and sqrt)."""
    c = rnnc.Cell("ln_rnn")
    x, h = c.input("x", I), c.state("h", H)
    W, U = c.param("W", (I, H)), c.param("U", (H, H))
    gamma, beta = c.param("gamma", (H,)), c.param("beta", (H,))
    a = x @ W + h @ U
    centred = a - rnnc.mean(a)
    normed = centred / rnnc.sqrt(rnnc.mean(centred * centred) + 1e-3)
    h_new = rnnc.tanh(normed * gamma + beta)
    c.update(h=h_new)
    c.output("y", h_new)
    c.output("z", rnnc.sum(h_new * gamma))
    return c


CUSTOM = {
    "peephole_lstm": peephole_lstm,
    "mgu": mgu,
    "layer_norm": layer_norm_rnn,
    "gru_v3": lambda I, H: rnnc.cells.gru(I, H, reset_after=False),
}


def loss_from_inference(fn, x, params, states, d_outputs, d_states) -> float:
    ys, final = fn(x, params, states=states)
    return float(sum(np.sum(d_outputs[n] * ys[n]) for n in d_outputs)
                 + sum(np.sum(d_states[n] * final[n]) for n in d_states))


def check_central_differences(fn, x, params, states, seed: int, eps: float = 1e-6,
                              tol: float = 1e-6) -> None:
    """Every gradient entry of fn.backward against central differences of fn(...)."""
    rng = np.random.default_rng(seed)
    ys, final, tape = fn.forward(x, params, states=states)
    d_out = {n: rng.standard_normal(v.shape) for n, v in ys.items()}
    d_st = {n: rng.standard_normal(v.shape) for n, v in final.items()}
    g = fn.backward(tape, d_outputs=d_out, d_states=d_st)
    xs = dict(x) if isinstance(x, dict) else {"x": x}
    gx = dict(g.x) if isinstance(g.x, dict) else {"x": g.x}
    groups = [("x", xs, gx), ("param", params, g.params), ("state", states, g.states)]
    for kind, values, grads in groups:
        assert set(grads) == set(values), (kind, sorted(grads), sorted(values))
        for name, base in values.items():
            num = np.zeros_like(base)
            for idx in np.ndindex(base.shape):
                diffs = []
                for sign in (1.0, -1.0):
                    moved = {k: v.copy() for k, v in values.items()}
                    moved[name][idx] += sign * eps
                    args = {"x": xs, "param": params, "state": states}
                    args[kind] = moved
                    xin = args["x"] if isinstance(x, dict) else args["x"]["x"]
                    diffs.append(loss_from_inference(fn, xin, args["param"], args["state"],
                                                     d_out, d_st))
                num[idx] = (diffs[0] - diffs[1]) / (2 * eps)
            assert grads[name].shape == base.shape, (kind, name)
            err = rel_err(grads[name], num)
            assert err <= tol, f"{kind} {name}: rel err {err:.2e}"


@pytest.mark.parametrize("T,B", [(3, 2), (1, 1)])
@pytest.mark.parametrize("name", list(CUSTOM))
def test_custom_cell_gradients_match_central_differences(name: str, T: int, B: int) -> None:
    I, H = 2, 3
    cell = CUSTOM[name](I, H)
    fn = rnnc.compile(cell, backend="numpy")
    rng = np.random.default_rng(T * 10 + B)
    x = rng.standard_normal((T, B, I))
    params = cell.init_params(seed=T + B, dtype=np.float64)
    if name == "layer_norm":
        params["gamma"] += 1.0
    states = {s: 0.5 * rng.standard_normal((B, H)) for s in cell.sizes("state")}
    check_central_differences(fn, x, params, states, seed=T + 7 * B)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell=random_cells(max_ops=6), T=st.integers(1, 3), B=st.integers(1, 2),
       seed=st.integers(0, 2**16))
def test_random_cell_gradients_match_central_differences(cell, T, B, seed) -> None:
    fn = rnnc.compile(cell, backend="numpy")
    x, params, states = random_data(cell, T=T, B=B, seed=seed, dtype=np.float64)
    check_central_differences(fn, x, params, states, seed=seed, tol=1e-5)


def test_empty_sequence_passes_state_gradients_through() -> None:
    """T=0: the final states are the initial ones, so their gradients pass through unchanged."""
    cell = rnnc.cells.lstm(2, 3)
    fn = rnnc.compile(cell, backend="numpy")
    params = cell.init_params(seed=0, dtype=np.float64)
    h0 = {"h": np.ones((2, 3)), "c": -np.ones((2, 3))}
    _, final, tape = fn.forward(np.zeros((0, 2, 2)), params, states=h0)
    np.testing.assert_array_equal(final["h"], h0["h"])
    dh = np.arange(6.0).reshape(2, 3)
    g = fn.backward(tape, d_outputs={"y": np.zeros((0, 2, 3))}, d_states={"h": dh})
    assert g.x.shape == (0, 2, 2)
    np.testing.assert_array_equal(g.states["h"], dh)
    np.testing.assert_array_equal(g.states["c"], np.zeros((2, 3)))
    assert not any(np.any(v) for v in g.params.values())
