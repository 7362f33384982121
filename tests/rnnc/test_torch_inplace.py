"""rnnc.torch.RNN's results may be changed in place, as nn.LSTM's may: the gradients stay
right and the caller's input stays as it was, eagerly, packed and through the op that
torch.compile runs. And a dtype mismatch names torch's conversions."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import rnnc  # noqa: E402 - after the skip
import rnnc.torch as rt  # noqa: E402
from rnnc.errors import RnncValueError  # noqa: E402
from rnnc.interop.torch_device import from_numpy, unshared  # noqa: E402

F64 = torch.float64
rnn_utils = torch.nn.utils.rnn
I, H, T, B = 3, 4, 5, 2


def saved_output(input_size: int, hidden_size: int) -> rnnc.Cell:
    """h' = tanh(x W + h U), y = tanh(x W): the output is saved for its own derivative."""
    c = rnnc.Cell("saved_output")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    W, U = c.param("W", (input_size, hidden_size)), c.param("U", (hidden_size, hidden_size))
    c.update(h=rnnc.tanh(x @ W + h @ U))
    c.output("y", rnnc.tanh(x @ W))
    return c


def input_output(input_size: int, hidden_size: int) -> rnnc.Cell:
    """h' = h + x W, y = x: the output is the input."""
    c = rnnc.Cell("input_output")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    c.update(h=h + x @ c.param("W", (input_size, hidden_size)))
    c.output("y", x)
    return c


def oracle(cell, x, params):
    """The cell's recurrence written in torch: ``(y, h_n)`` from a zero state."""
    W = params["W_l0"]
    h, ys = x.new_zeros(x.shape[1], W.shape[1]), []
    for t in range(x.shape[0]):
        if cell is saved_output:
            ys.append(torch.tanh(x[t] @ W))
            h = torch.tanh(x[t] @ W + h @ params["U_l0"])
        else:
            ys.append(x[t])
            h = h + x[t] @ W
    return torch.stack(ys), h[None]


def loss_and_grads(call, x, params, changed: str, in_place: bool):
    """Triple ``changed`` (the output or the final state; in place or not), then the
    gradients of a loss of both by x and the weights; also returns the input after it all."""
    x = x.clone().requires_grad_()
    y, h = call(x)
    if in_place:
        {"y": y, "h": h}[changed].mul_(3.0)
    elif changed == "y":
        y = y * 3.0
    else:
        h = h * 3.0
    loss = (y * y).sum() + (h * torch.arange(1.0, h.shape[-1] + 1, dtype=F64)).sum()
    return torch.autograd.grad(loss, [x, *params]), x.detach()


@pytest.mark.parametrize("cell", [saved_output, input_output])
@pytest.mark.parametrize("backend", ["numpy", "llvm"])
@pytest.mark.parametrize("changed", ["y", "h"])
def test_a_result_changed_in_place_keeps_the_gradients(cell, backend: str, changed: str):
    """The output a cell saves for backward came back as that saved array (gradients off by
    up to 480), and an output that is the input as the caller's x (changed with it)."""
    torch.manual_seed(0)
    module = rt.RNN(cell, I, H if cell is saved_output else I, backend=backend, dtype=F64)
    x = torch.randn(T, B, I, dtype=F64)
    params = dict(module.named_parameters())

    got, x_after = loss_and_grads(
        lambda v: (lambda y, st: (y, st["h"]))(*module(v)), x, params.values(), changed,
        in_place=True)
    want, _ = loss_and_grads(lambda v: oracle(cell, v, params), x, params.values(), changed,
                             in_place=False)
    torch.testing.assert_close(x_after, x, rtol=0, atol=0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(("mode", "changed"),
                         [("lstm", 0), ("lstm", 1), ("lstm", 2), ("gru", 0), ("gru", 1)])
def test_a_standard_result_changed_in_place_matches_torch(mode: str, changed: int):
    """y, h_n (and c_n) changed in place give nn.LSTM's/nn.GRU's gradients, as nn's do."""
    torch.manual_seed(0)
    ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[mode](I, H, dtype=F64)
    ours = rt.RNN(mode, I, H, backend="numpy", dtype=F64)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(T, B, I, dtype=F64)

    def grads(module):
        v = x.clone().requires_grad_()
        y, st = module(v)
        results = [y, *(st if isinstance(st, tuple) else (st,))]
        results[changed].mul_(3.0)
        loss = sum((r * r).sum() for r in results)
        return torch.autograd.grad(loss, [v, *module.parameters()])

    for g, w in zip(grads(ours), grads(ref), strict=True):
        torch.testing.assert_close(g, w)


def test_a_packed_output_changed_in_place_keeps_the_gradients():
    """The packed path: lengths, in-place edits of the packed data and of h_n."""
    torch.manual_seed(0)
    module = rt.RNN(saved_output, I, H, backend="numpy", dtype=F64)
    params = dict(module.named_parameters())
    x = torch.randn(T, B, I, dtype=F64)
    lengths = torch.tensor([T, 3])

    def grads(in_place: bool):
        v = x.clone().requires_grad_()
        y, st = module(rnn_utils.pack_padded_sequence(v, lengths))
        data, h = y.data, st["h"]
        if in_place:
            data.mul_(3.0)
            h.mul_(3.0)
        else:
            data, h = data * 3.0, h * 3.0
        loss = (data * data).sum() + h.sum()
        return torch.autograd.grad(loss, [v, *params.values()])

    for g, w in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(g, w)


def test_the_compiled_op_returns_results_apart_from_its_inputs():
    """torch.compile runs the op rnnc::rnn, whose results must not alias its inputs (inductor
    writes into them): with an output that is the input, its y was the caller's x."""
    torch.manual_seed(0)
    module = rt.RNN(input_output, I, I, backend="numpy", dtype=F64)
    x = torch.randn(T, B, I, dtype=F64)
    y, h = torch.ops.rnnc.rnn(module._op_key, x, [None], module._flat_parameters(), None,
                              None, False, [])
    torch.testing.assert_close(y, x)
    for result in (y, h):
        for given in (x, *module.parameters()):
            assert not np.shares_memory(result.detach().numpy(), given.detach().numpy())


@pytest.mark.slow
def test_inductor_leaves_the_input_of_an_output_that_is_the_input():
    """Under inductor, which writes into buffers an op returns, the caller's x changed by up
    to 34 when the op's y was x, though the step changes nothing in place."""
    torch.manual_seed(0)
    module = rt.RNN(input_output, I, I, backend="numpy", dtype=F64)
    params = dict(module.named_parameters())
    x = torch.randn(T, B, I, dtype=F64)

    def step(call, v):
        y, h = call(v)
        return (y * 3.0).pow(2).sum() + h.sum()

    compiled = torch.compile(lambda v: step(lambda u: (lambda y, st: (y, st["h"]))(
        *module(u)), v), backend="inductor")
    v = x.clone().requires_grad_()
    got = torch.autograd.grad(compiled(v), [v, *params.values()])
    torch.testing.assert_close(v.detach(), x, rtol=0, atol=0)
    w = x.clone().requires_grad_()
    want = torch.autograd.grad(step(lambda u: oracle(input_output, u, params), w),
                               [w, *params.values()])
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r)


def test_a_read_only_array_becomes_a_tensor_of_its_own():
    """A tensor is writable, so a read-only array (one rnnc saved) is copied, not wrapped."""
    a = np.arange(6.0)
    a.flags.writeable = False
    t = from_numpy(a, torch.empty(0, dtype=F64))
    t.mul_(2.0)
    np.testing.assert_array_equal(a, np.arange(6.0))


def test_unshared_copies_only_what_overlaps():
    base = np.arange(12.0)
    view, other = base[2:5], np.arange(3.0)
    assert unshared(np, view, [base]) is not view
    np.testing.assert_array_equal(unshared(np, view, [base]), view)
    assert unshared(np, other, [base]) is other


def parameterless(input_size: int, hidden_size: int) -> rnnc.Cell:
    """h' = tanh(x + h), y = h * x: a cell without parameters."""
    c = rnnc.Cell("parameterless")
    x, h = c.input("x", input_size), c.state("h", input_size)
    c.update(h=rnnc.tanh(x + h))
    c.output("y", h * x)
    return c


@pytest.mark.parametrize(("module_dtype", "x_dtype"), [(None, F64), (F64, torch.float32)])
def test_a_dtype_mismatch_without_parameters_names_torch_conversions(module_dtype, x_dtype):
    """This gave rnnc's NumPy advice (.astype(np.float32)) to a torch user."""
    module = rt.RNN(parameterless, 3, 3, backend="numpy", dtype=module_dtype)
    want = torch.float32 if module_dtype is None else module_dtype
    with pytest.raises(RnncValueError, match=rf"input dtype \({x_dtype}\) does not match the "
                       rf"module's dtype \({want}\).*input\.to\({want}\).*dtype={x_dtype}"):
        module(torch.randn(4, 2, 3, dtype=x_dtype))
