"""rnnc.torch.RNN's parameter init (a custom cell's initializers, torch's seed) and its checks
of what a forward is given (``hx`` dict keys, dtypes it cannot compute in)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import rnnc
import rnnc.torch as rt
from rnnc.errors import RnncTypeError, RnncValueError

F64 = torch.float64


def biased_cell(input_size: int, hidden_size: int) -> rnnc.Cell:
    """A gated cell whose forget bias starts at 1.0 and gain at 1.0, as the papers init them,
    and whose input weights start from a callable initializer (normal around 5)."""
    c = rnnc.Cell("biased")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size), init=lambda rng, s: rng.normal(5.0, 0.1, s))
    U = c.param("U", (hidden_size, hidden_size))  # no init: PyTorch's uniform
    b_f = c.param("b_f", (hidden_size,), init=1.0)
    gain = c.param("gain", (hidden_size,), init=1.0)
    f = rnnc.sigmoid(x @ W + h @ U + b_f)
    c.update(h=f * h + (1 - f) * rnnc.tanh(gain * (x @ W)))
    c.output("y", h)
    return c


def test_custom_cell_keeps_its_initializers():
    torch.manual_seed(0)
    m = rt.RNN(biased_cell, 2, 4, num_layers=2, bidirectional=True, backend="numpy",
               dtype=F64)
    params = dict(m.named_parameters())
    for k in range(2):
        for suffix in ("", "_reverse"):
            for name in ("b_f", "gain"):
                torch.testing.assert_close(params[f"{name}_l{k}{suffix}"],
                                           torch.ones(4, dtype=F64), rtol=0, atol=0)
            W, U = params[f"W_l{k}{suffix}"], params[f"U_l{k}{suffix}"]
            assert abs(W.mean().item() - 5.0) < 0.1 and 0.02 < W.std().item() < 0.3
            assert U.abs().max().item() <= 0.5  # ±1/sqrt(4)
    # each layer and direction draws its own values
    assert not torch.equal(params["U_l0"], params["U_l0_reverse"])
    assert not torch.equal(params["U_l1"], params["U_l0"])


def test_custom_cell_init_follows_torch_seed():
    def state(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return rt.RNN(biased_cell, 2, 4, backend="numpy").state_dict()

    a, b, c = state(1), state(1), state(2)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["U_l0"], c["U_l0"]) and not torch.equal(a["W_l0"], c["W_l0"])
    # reset_parameters draws afresh from torch's generator, the cell's inits kept
    torch.manual_seed(1)
    m = rt.RNN(biased_cell, 2, 4, backend="numpy")
    m.reset_parameters()
    assert not torch.equal(m.U_l0, a["U_l0"]) and torch.equal(m.b_f_l0, a["b_f_l0"])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_standard_modes_keep_torchs_init(kind):
    torch.manual_seed(4)
    want = getattr(nn, kind)(3, 5, num_layers=2, bidirectional=True).state_dict()
    torch.manual_seed(4)
    got = rt.RNN(kind, 3, 5, num_layers=2, bidirectional=True, backend="numpy").state_dict()
    assert list(got) == list(want)
    assert all(torch.equal(got[n], want[n]) for n in want)


def test_unknown_hx_key_is_an_error():
    m = rt.RNN(biased_cell, 2, 3, backend="numpy")
    x = torch.randn(4, 2, 2)
    with pytest.raises(RnncValueError, match=r"unknown state 'hidden'.*\['h'\]"):
        m(x, {"hidden": torch.ones(1, 2, 3)})
    with pytest.raises(RnncValueError, match=r"unknown state 'c'"):
        m(x, {"h": torch.ones(1, 2, 3), "c": torch.ones(1, 2, 3)})
    lstm = rt.RNN("LSTM", 2, 3, backend="numpy")
    with pytest.raises(RnncValueError, match=r"unknown state 'hx'.*\['h', 'c'\]"):
        lstm(x, {"hx": torch.ones(1, 2, 3)})
    # the known keys, some left out, still run (a missing state starts at zeros)
    h = torch.randn(1, 2, 3)
    torch.testing.assert_close(m(x, {"h": h})[0], m(x, (h,))[0])


@pytest.mark.parametrize("half", [torch.float16])  # bfloat16 runs: test_torch_bf16.py
def test_half_precision_module_names_the_torch_fix(half):
    x = torch.randn(4, 2, 3)
    for m in (rt.RNN("LSTM", 3, 4, backend="numpy").to(half),
              rt.RNN("GRU", 3, 4, backend="numpy").half() if half == torch.float16 else
              rt.RNN("GRU", 3, 4, backend="numpy").bfloat16()):
        with pytest.raises(RnncTypeError, match=rf"parameters are {half}.*module\.float\(\)"):
            m(x.to(half))
        with pytest.raises(RnncTypeError, match=r"module\.float\(\)"):
            m(x)  # checked before the dtype mismatch
    m = rt.RNN("GRU", 3, 4, backend="numpy")
    with pytest.raises(RnncTypeError, match=rf"input is {half}.*input\.to\(torch\.float32\)"):
        m(x.to(half))
    m = rt.RNN("GRU", 3, 4, backend="numpy", dtype=F64)
    with pytest.raises(RnncTypeError, match=r"input\.to\(torch\.float64\)"):
        m(x.to(half))
    # back in float32 the module runs and matches torch
    ref = nn.GRU(3, 4)
    m = rt.RNN("GRU", 3, 4, backend="numpy").to(half)
    m.float()
    m.load_state_dict(ref.state_dict())
    torch.testing.assert_close(m(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)


def extra_cell(input_size: int, hidden_size: int) -> rnnc.Cell:
    c = rnnc.Cell("gated")
    x, u, h = c.input("x", input_size), c.input("u", 1), c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size))
    c.update(h=rnnc.tanh(x @ W) * u + h)
    c.output("y", h)
    return c


def test_half_precision_extra_input_is_an_error():
    m = rt.RNN(extra_cell, 3, 4, backend="numpy")
    x = torch.randn(5, 2, 3)
    for half in (torch.bfloat16, torch.float16):
        with pytest.raises(RnncTypeError, match=rf"extra input 'u' is {half}.*"
                                                r"\.to\(torch\.float32\)"):
            m(x, extra={"u": torch.ones(5, 2, 1, dtype=half)})
    y = m(x, extra={"u": torch.zeros(5, 2, 1)})[0]
    assert not y.any()  # u = 0 gates every step off: h stays at its zeros
