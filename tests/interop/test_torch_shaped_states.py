"""rnnc.torch.RNN over a cell whose states have feature shapes (sLSTM's (heads, d)).

Outputs, final states and every gradient autograd computes are checked against the oracle of
tests/layers/shaped_oracle.py: the unoptimized NumPy cell composed by hand, in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.errors import RnncRuntimeError
from tests.layers.shaped_oracle import Oracle

torch = pytest.importorskip("torch")
import rnnc.torch  # noqa: E402  (after the skip: it imports torch)

I, H, L, D, T, B = 3, 4, 2, 2, 4, 3
LENGTHS = np.array([4, 2, 3])
NAMES = ("h", "c", "n", "m")
TOL = dict(rtol=1e-9, atol=1e-11)


def slstm2(input_size: int, hidden_size: int) -> rnnc.Cell:
    """sLSTM with two heads: states h, c, n, m of shape (2, hidden_size / 2)."""
    return rnnc.cells.slstm(input_size, hidden_size, heads=2)


def grid_of(module) -> list[list[dict[str, np.ndarray]]]:
    """The module's parameters as rnnc's ``[layer][direction]`` dicts, by registered name."""
    return [[{n: getattr(module, f"{n}_l{k}" + ("_reverse" if d else "")).detach().numpy()
              for n in module.layer.params[k][d]} for d in range(D)] for k in range(L)]


def test_module_states_keep_their_shape_and_get_gradients():
    torch.manual_seed(0)
    module = rnnc.torch.RNN(slstm2, I, H, num_layers=L, bidirectional=True, backend="numpy",
                            dtype=torch.float64)
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.standard_normal((T, B, I)), requires_grad=True)
    init = {n: rng.standard_normal((L * D, B, 2, 2)) for n in NAMES}
    init["n"] = np.abs(init["n"]) + 0.5  # the normalizer stays positive
    hx = {n: torch.tensor(a, requires_grad=True) for n, a in init.items()}
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.as_tensor(LENGTHS),
                                                     enforce_sorted=False)
    out, states = module(packed, hx)
    y = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)[0]
    assert {n: tuple(s.shape) for n, s in states.items()} == {n: (L * D, B, 2, 2)
                                                              for n in NAMES}
    oracle = Oracle(slstm2, I, H, L, D)
    want = oracle.forward(x.detach().numpy(), LENGTHS, grid_of(module), init)
    np.testing.assert_allclose(y.detach().numpy(), want.y, **TOL)
    for n in NAMES:
        np.testing.assert_allclose(states[n].detach().numpy(), want.final[n], **TOL)

    d_y = rng.standard_normal(want.y.shape)
    d_final = {n: rng.standard_normal(a.shape) for n, a in want.final.items()}
    loss = (y * torch.tensor(d_y)).sum() + sum((states[n] * torch.tensor(d_final[n])).sum()
                                               for n in NAMES)
    loss.backward()
    g_x, g_params, g_init = oracle.backward(want, LENGTHS, d_y, d_final, [I, D * H])
    np.testing.assert_allclose(x.grad.numpy(), g_x, **TOL)
    for n in NAMES:
        np.testing.assert_allclose(hx[n].grad.numpy(), g_init[n], **TOL, err_msg=n)
    for k in range(L):
        for d in range(D):
            for n, a in g_params[k][d].items():
                p = getattr(module, f"{n}_l{k}" + ("_reverse" if d else ""))
                np.testing.assert_allclose(p.grad.numpy(), a, **TOL, err_msg=f"{n} {k} {d}")

    # unbatched: one sequence, states (L*D, 2, 2)
    y1, st1 = module(x.detach()[:, 0], {n: hx[n].detach()[:, 0] for n in NAMES})
    np.testing.assert_allclose(y1.detach().numpy(), want.y[:, 0], **TOL)
    for n in NAMES:
        np.testing.assert_allclose(st1[n].detach().numpy(), want.final[n][:, 0], **TOL)


def test_the_ops_shape_rules_keep_the_state_shapes():
    """What ``torch.compile`` traces with: the shape rules of ``rnnc::rnn`` and its backward
    op, on meta tensors."""
    module = rnnc.torch.RNN(slstm2, I, H, num_layers=L, bidirectional=True, backend="numpy",
                            dtype=torch.float64)
    x = torch.empty(T, B, I, dtype=torch.float64, device="meta")
    params = [p.to("meta") for p in module._flat_parameters()]
    args = (module._op_key, x, [None] * 4, params, None, None, False, [])
    y, *final = torch.ops.rnnc.rnn(*args)
    assert y.shape == (T, B, D * H)
    assert [tuple(s.shape) for s in final] == [(L * D, B, 2, 2)] * 4
    grads = torch.ops.rnnc.rnn_backward(*args, y, final)
    assert [tuple(g.shape) for g in grads[:5]] == [(T, B, I)] + [(L * D, B, 2, 2)] * 4


@pytest.mark.slow  # compiling costs seconds
def test_module_under_torch_compile_keeps_the_state_shapes():
    """The ``rnnc::rnn`` op's shape rule gives the states their feature shapes."""
    module = rnnc.torch.RNN(slstm2, I, H, backend="numpy", dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(lambda x: module(x), backend="aot_eager", fullgraph=True)
    y, states = compiled(x)
    want_y, want_states = module(x)
    assert states["c"].shape == (1, B, 2, 2)
    torch.testing.assert_close(y, want_y)
    for n in NAMES:
        torch.testing.assert_close(states[n], want_states[n])
    (states["c"].sum() + y.sum()).backward()  # the backward op's shape rule too
    assert x.grad.shape == x.shape


def test_a_state_of_the_wrong_shape_is_refused_naming_it():
    module = rnnc.torch.RNN(slstm2, I, H, backend="numpy", dtype=torch.float64)
    x = torch.zeros(T, B, I, dtype=torch.float64)
    with pytest.raises(RnncRuntimeError, match=r"hx\[1\] \(c\) should be 4-D but got a 3-D"):
        module(x, {"c": torch.zeros(1, B, 4, dtype=torch.float64)})
    with pytest.raises(RnncRuntimeError, match=r"Expected hidden\[1\] size \(1, 3, 2, 2\), got "
                                               r"\[1, 3, 4, 1\] \(state 'c', of feature shape"):
        module(x, {"c": torch.zeros(1, B, 4, 1, dtype=torch.float64)})
