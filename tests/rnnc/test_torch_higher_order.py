"""Double backward and torch.compile for rnnc.torch.RNN.

Second derivatives are checked with torch's gradgradcheck (float64 finite differences of the
first derivative, an independent oracle), run against ``torch.nn`` too to show the test is right,
and compared with ``torch.nn``'s own double backward. The NumPy-level pieces (``Function`` and
``rnnc.RNN`` ``double_backward``) are checked against central differences of ``backward``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import rnnc
import rnnc.torch as rt
from rnnc import cells
from rnnc.cells import mgu
from rnnc.errors import RnncError

F64 = torch.float64
KINDS = ("LSTM", "GRU", "RNN")


def make(impl: str, kind, *args, **kwargs) -> nn.Module:
    """``torch.nn`` or rnnc's module; rnnc's on the NumPy backend, which compiles nothing (the
    second-order programs on LLVM are checked below, one cell at a time)."""
    if impl == "torch":
        return getattr(nn, kind)(*args, **kwargs)
    return rt.RNN(kind, *args, backend="numpy", **kwargs)


def functional(m: nn.Module, n_states: int, custom: bool = False):
    """``f(x, *states, *params) -> (y, *final_states)`` for gradcheck."""
    names = [n for n, _ in m.named_parameters()]

    def f(x, *rest):
        hx = rest[:n_states]
        hx = {"h": hx[0]} if custom else hx if n_states == 2 else hx[0]
        y, h = torch.func.functional_call(m, dict(zip(names, rest[n_states:], strict=True)),
                                          (x, hx))
        h = (h["h"],) if custom else h if n_states == 2 else (h,)
        return (y, *h)
    return f


def inputs_for(m: nn.Module, n_states: int, T: int = 2, B: int = 2) -> list[torch.Tensor]:
    LD = m.num_layers * (2 if m.bidirectional else 1)
    sizes = [m.proj_size or m.hidden_size, m.hidden_size]  # h, then an LSTM's c
    ts = [torch.randn(T, B, m.input_size, dtype=F64)]
    ts += [torch.randn(LD, B, size, dtype=F64) for size in sizes[:n_states]]
    ts += [p.detach() for p in m.parameters()]
    return [t.clone().requires_grad_() for t in ts]


@pytest.mark.parametrize("impl", ["torch", "rnnc"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradgradcheck_one_layer(impl, kind):
    torch.manual_seed(0)
    m = make(impl, kind, 2, 2, dtype=F64)
    n_states = 2 if kind == "LSTM" else 1
    assert torch.autograd.gradgradcheck(functional(m, n_states), inputs_for(m, n_states))


@pytest.mark.parametrize("impl", ["torch", "rnnc"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradgradcheck_two_layers_bidirectional(impl, kind):
    # fast_mode checks the second derivative along random directions: the whole Jacobian
    # of a 2-layer bidirectional layer is many thousand double-backward calls
    torch.manual_seed(0)
    m = make(impl, kind, 2, 2, num_layers=2, bidirectional=True, dtype=F64)
    n_states = 2 if kind == "LSTM" else 1
    assert torch.autograd.gradgradcheck(functional(m, n_states), inputs_for(m, n_states),
                                        fast_mode=True)


def test_gradgradcheck_custom_cell():
    torch.manual_seed(0)
    m = make("rnnc", mgu, 2, 2, num_layers=2, bidirectional=True, dtype=F64)
    assert torch.autograd.gradgradcheck(functional(m, 1, custom=True), inputs_for(m, 1),
                                        fast_mode=True)


def hessian_vector_products(m: nn.Module, x, lengths, hx, v):
    """Gradients of ``<d loss / d params, v>`` w.r.t. x, h_0 and the parameters."""
    inputs = [t.clone().requires_grad_() for t in (x, *hx)]
    packed = nn.utils.rnn.pack_padded_sequence(inputs[0], lengths, enforce_sorted=False)
    out, (h, c) = m(packed, tuple(inputs[1:]))
    y, _ = nn.utils.rnn.pad_packed_sequence(out)
    loss = y.sin().sum() + h.pow(2).sum() + c.sin().sum()
    params = list(m.parameters())
    grads = torch.autograd.grad(loss, params, create_graph=True)
    inner = sum((g * w).sum() for g, w in zip(grads, v, strict=True))
    return torch.autograd.grad(inner, [*inputs, *params])


def test_double_backward_matches_torch_with_packed_sequences_and_projections():
    torch.manual_seed(0)
    ref = nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=F64)
    ours = make("rnnc", "LSTM", 3, 4, num_layers=2, bidirectional=True, proj_size=2,
                dtype=F64)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 3, dtype=F64)
    lengths = torch.tensor([5, 2, 4])
    hx = (torch.randn(4, 3, 2, dtype=F64), torch.randn(4, 3, 4, dtype=F64))
    v = [torch.randn_like(p) for p in ref.parameters()]
    want = hessian_vector_products(ref, x, lengths, hx, v)
    got = hessian_vector_products(ours, x, lengths, hx, v)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("impl", ["torch", "rnnc"])
@pytest.mark.parametrize("kind, proj_size", [("RNN", 0), ("GRU", 0), ("LSTM", 0), ("LSTM", 1)],
                         ids=["rnn", "gru", "lstm", "lstm-projections"])
def test_gradgradcheck_with_batched_gradients(impl, kind, proj_size):
    # as PyTorch's own module tests call it: the batched check vmaps over double backward
    torch.manual_seed(0)
    kwargs = {"proj_size": proj_size} if proj_size else {}
    m = make(impl, kind, 2, 2, dtype=F64, **kwargs)
    n_states = 2 if kind == "LSTM" else 1
    assert torch.autograd.gradgradcheck(functional(m, n_states), inputs_for(m, n_states, B=1),
                                        check_batched_grad=True, fast_mode=True)


def second_derivative(m: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, gg)``: ``gg`` the gradient of ``|d loss / dx|^2`` with respect to a fresh ``x``,
    kept differentiable (``create_graph=True``) for a third derivative."""
    x = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(m(x)[0].pow(2).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.pow(2).sum(), x, create_graph=True)
    return x, gg


def test_third_derivative_raises_rnncs_error():
    torch.manual_seed(0)
    ref = nn.GRU(2, 3, dtype=F64)
    ours = make("rnnc", "GRU", 2, 3, dtype=F64)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 2, 2, dtype=F64)
    (x_ref, gg_ref), (x_ours, gg_ours) = second_derivative(ref, x), second_derivative(ours, x)
    # the second derivative itself, kept differentiable, is right
    torch.testing.assert_close(gg_ours, gg_ref, rtol=1e-9, atol=1e-11)
    # a third derivative with a term that avoids double backward (sum(x * x)): torch's
    # answer exists, and rnnc refuses rather than dropping the terms through double backward
    third = torch.autograd.grad(gg_ref.pow(2).sum() + (x_ref * x_ref).sum(), x_ref)[0]
    assert third.abs().max() > 0
    with pytest.raises(RnncError, match="third derivative"):
        torch.autograd.grad(gg_ours.pow(2).sum() + (x_ours * x_ours).sum(), x_ours)
    # every path of this one runs through double backward
    x_ours, gg_ours = second_derivative(ours, x)
    with pytest.raises(RnncError, match="differentiable twice"):
        torch.autograd.grad(gg_ours.pow(2).sum(), x_ours)
    _, gg_ours = second_derivative(ours, x)
    with pytest.raises(RnncError, match="third derivative"):  # to the weights, by backward
        gg_ours.sum().backward()


# -- the NumPy-level pieces against central differences of backward, along random directions


def directional_check(loss, arrays: list[np.ndarray], grads: list[np.ndarray], seed: int = 0
                      ) -> None:
    """``d/dt loss(arrays + t * v)`` at 0 by central differences equals ``<grads, v>``."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        v = [rng.standard_normal(a.shape) for a in arrays]
        eps = 1e-5
        for a, d in zip(arrays, v, strict=True):
            a += eps * d
        plus = loss()
        for a, d in zip(arrays, v, strict=True):
            a -= 2 * eps * d
        minus = loss()
        for a, d in zip(arrays, v, strict=True):
            a += eps * d
        want = (plus - minus) / (2 * eps)
        got = sum((g * d).sum() for g, d in zip(grads, v, strict=True))
        assert abs(got - want) <= 1e-7 * (1 + abs(want)), (got, want)


@pytest.mark.parametrize("cell, backend", [
    (cells.lstm(2, 3), "numpy"), (cells.gru(2, 3), "numpy"), (mgu(2, 3), "numpy"),
    (cells.lstm(2, 3, proj_size=2), "numpy"), (cells.gru(2, 3), "llvm"),
], ids=["lstm", "gru", "mgu", "lstm-projections", "gru-llvm"])
def test_function_double_backward_matches_central_differences(cell, backend):
    f = rnnc.compile(cell, backend=backend)
    rng = np.random.default_rng(1)
    T, B = 4, 3
    lengths = np.array([4, 2, 3])
    x = rng.standard_normal((T, B, 2))
    params = {n: rng.standard_normal(s) * 0.5 for n, s in f.params.items()}
    states = {n: rng.standard_normal((B, s[-1])) for n, s in f.states.items()}
    d_y = {"y": rng.standard_normal(f(x, params, states)[0]["y"].shape)}
    d_states = {n: rng.standard_normal((B, s[-1])) for n, s in f.states.items()}
    u_x = rng.standard_normal(x.shape)
    u_params = {n: rng.standard_normal(a.shape) for n, a in params.items()}
    u_states = {n: rng.standard_normal(a.shape) for n, a in states.items()}

    def loss() -> float:
        g = f.backward(f.forward(x, params, states, lengths)[2], d_y, d_states)
        return ((g.x * u_x).sum() + sum((g.params[n] * u_params[n]).sum() for n in params)
                + sum((g.states[n] * u_states[n]).sum() for n in states))

    tape = f.forward(x, params, states, lengths)[2]
    c_dy, c_ds, c = f.double_backward(tape, d_y, d_states, {"x": u_x}, u_params, u_states)
    arrays = [x, *params.values(), *states.values(), d_y["y"], *d_states.values()]
    grads = [c.x, *(c.params[n] for n in params), *(c.states[n] for n in states), c_dy["y"],
             *(c_ds[n] for n in d_states)]
    directional_check(loss, arrays, grads)


def test_layer_double_backward_with_dropout_lengths_and_batch_first():
    layer = rnnc.RNN("lstm", 2, 3, num_layers=3, bidirectional=True, dropout=0.4,
                     batch_first=True, backend="numpy", seed=0, dtype=np.float64)
    rng = np.random.default_rng(2)
    B, T = 3, 4
    x, lengths = rng.standard_normal((B, T, 2)), np.array([4, 1, 3])
    states = {n: rng.standard_normal((6, B, 3)) for n in ("h", "c")}
    params = layer.params

    def run():
        return layer.forward(x, lengths, states, params=params, rng=np.random.default_rng(7))

    y = run()[0]
    d_y = rng.standard_normal(y.shape)
    d_states = {n: rng.standard_normal(a.shape) for n, a in states.items()}
    u_x = rng.standard_normal(x.shape)
    u_params = [[{n: rng.standard_normal(a.shape) for n, a in p.items()} for p in row]
                for row in params]
    u_states = {n: rng.standard_normal(a.shape) for n, a in states.items()}
    flat = [(p[n], u[n]) for row, urow in zip(params, u_params, strict=True)
            for p, u in zip(row, urow, strict=True) for n in p]

    def loss() -> float:
        g = layer.backward(run()[2], d_y, d_states)
        g_flat = [gp[n] for row in g.params for gp in row for n in gp]
        return ((g.x * u_x).sum() + sum((a * u).sum() for a, (_, u) in zip(g_flat, flat,
                                                                            strict=True))
                + sum((g.states[n] * u_states[n]).sum() for n in states))

    c_dy, c_ds, c = layer.double_backward(run()[2], d_y, d_states, u_x, u_params, u_states)
    c_flat = [cp[n] for row in c.params for cp in row for n in cp]
    arrays = [x, *(p for p, _ in flat), *states.values(), d_y, *d_states.values()]
    grads = [c.x, *c_flat, *(c.states[n] for n in states), c_dy, *(c_ds[n] for n in d_states)]
    directional_check(loss, arrays, grads)


# -- torch.compile


class Model(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(2 * rnn.hidden_size, 1)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        y, (h, c) = self.rnn(x, (h0, torch.zeros_like(h0)))
        return self.head(torch.tanh(y)).sum() + h.pow(2).sum() + c.sum()


def compiled_training_matches_eager(backend) -> None:
    torch.manual_seed(0)
    eager = Model(rt.RNN("LSTM", 3, 4, num_layers=2, bidirectional=True, batch_first=True))
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, backend=backend, fullgraph=True)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (eager, twin)]
    x, h0 = torch.randn(2, 5, 3), torch.randn(4, 2, 4)
    for _ in range(3):
        results = []
        for model, opt in zip((eager, compiled), optimizers, strict=True):
            opt.zero_grad()
            h = h0.clone().requires_grad_()
            loss = model(x, h)
            loss.backward()
            opt.step()
            results.append((loss.detach(), h.grad))
        torch.testing.assert_close(results[1], results[0])
    for a, b in zip(eager.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b, a)


def test_compiled_training_step_matches_eager():
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    compiled_training_matches_eager(backend)
    assert len(graphs) == 1  # fullgraph: no graph breaks
    assert graphs[0].count(torch.ops.rnnc.rnn) == 1  # the layer is one opaque op


@pytest.mark.slow
def test_compiled_training_step_matches_eager_with_inductor():
    compiled_training_matches_eager("inductor")
