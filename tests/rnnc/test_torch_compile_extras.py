"""rnnc.torch.RNN with extra per-step inputs under torch.compile: the layer is one ``rnnc::rnn``
op taking the extras as a tensor list, and its backward op returns their gradients.

The oracle is the same module run eagerly (its autograd.Function, tested against a torch loop
and gradcheck in test_torch_module.py): losses and every gradient must agree.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
import rnnc  # noqa: E402 - needs torch, imported after the skip
import rnnc.torch as rt  # noqa: E402
from rnnc.errors import RnncError  # noqa: E402

nn = torch.nn
F64 = torch.float64
I, H, T, B = 3, 4, 5, 2
U = 2  # width of the extra input u


def two_extras(n_in: int, n_h: int) -> rnnc.Cell:
    """h' = m * tanh(x W + u V + h R) + (1 - m) * h, y = h': an extra input ``u`` with a
    gradient and a width-1 ``m`` declared grad=False (data: how much of the step to keep)."""
    c = rnnc.Cell("two_extras")
    x, u, m = c.input("x", n_in), c.input("u", U), c.input("m", 1, grad=False)
    h = c.state("h", n_h)
    W, V, R = c.param("W", (n_in, n_h)), c.param("V", (U, n_h)), c.param("R", (n_h, n_h))
    new = m * rnnc.tanh(x @ W + u @ V + h @ R) + (1.0 - m) * h
    c.update(h=new)
    c.output("y", new)
    return c


class Model(nn.Module):
    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(2 * rnn.hidden_size, 1, dtype=F64)

    def forward(self, x, h0, u, m):
        y, st = self.rnn(x, {"h": h0}, extra={"u": u, "m": m})
        return self.head(torch.tanh(y)).sum() + st["h"].pow(2).sum()


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, I, generator=g, dtype=F64)
    h0 = torch.randn(4, B, H, generator=g, dtype=F64)
    u = torch.randn(B, T, U, generator=g, dtype=F64)
    m = torch.rand(B, T, 1, generator=g, dtype=F64)
    return x, h0, u, m


def _step(model, x, h0, u, m):
    """Loss and the gradients of x, h0, u and every parameter."""
    leaves = [t.clone().requires_grad_() for t in (x, h0, u)]
    model.zero_grad()
    loss = model(*leaves, m)
    loss.backward()
    return [loss.detach(), *(t.grad for t in leaves),
            *(p.grad.clone() for p in model.parameters())]


def compiled_extras_match_eager(backend) -> None:
    torch.manual_seed(0)
    rnn = rt.RNN(two_extras, I, H, num_layers=2, bidirectional=True, batch_first=True,
                 backend="numpy", dtype=F64)
    assert rnn.extra_names == ("u", "m")
    eager = Model(rnn)
    compiled = torch.compile(copy.deepcopy(eager), backend=backend, fullgraph=True)
    for seed in (1, 2):  # the second call reuses the compiled graph
        inputs = _inputs(seed)
        want, got = _step(eager, *inputs), _step(compiled, *inputs)
        assert len(got) == len(want) == 4 + len(list(eager.parameters()))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_compiled_extras_match_eager_forward_and_backward():
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    compiled_extras_match_eager(backend)
    assert len(graphs) == 1  # fullgraph: no graph breaks
    assert graphs[0].count(torch.ops.rnnc.rnn) == 1  # the layer, extras too, is one op


@pytest.mark.slow
def test_compiled_extras_match_eager_with_inductor():
    compiled_extras_match_eager("inductor")


def test_compiled_extras_check_their_shapes():
    rnn = rt.RNN(two_extras, I, H, backend="numpy", dtype=F64)
    x, _, u, m = _inputs(3)
    x, u, m = (t.transpose(0, 1) for t in (x, u, m))  # time-major

    def run(x, u, m):
        return rnn(x, extra={"u": u, "m": m})[0]

    compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, u, m), run(x, u, m), rtol=1e-12, atol=1e-12)
    with pytest.raises(RnncError, match=r"'u' must have shape \(T, B, size\) = \(5, 2, 2\)"):
        compiled(x, u[..., :1], m)
