"""rnnc.torch.RNN in bfloat16: under torch.autocast and after .to(torch.bfloat16), against a
float64 LSTM written here with bfloat16 GEMM operands (the rounding model of precision="bf16"),
and against nn.LSTM's own bfloat16 path, loosely."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.torch as rt  # noqa: E402

I, H, T, B = 8, 16, 6, 3


def _bf16_lstm(x, w_ih, w_hh, b_ih, b_hh):
    """float64 LSTM in torch's layout whose GEMM operands are rounded to bfloat16."""
    r = lambda t: t.detach().to(torch.bfloat16).double().numpy()  # noqa: E731
    b = (b_ih + b_hh).detach().double().numpy()
    h = np.zeros((x.shape[1], H))
    c = np.zeros_like(h)
    ys = []
    for t in range(x.shape[0]):
        pre = r(x[t]) @ r(w_ih).T + r(torch.from_numpy(h).float()) @ r(w_hh).T + b
        i, f, g, o = np.split(pre, 4, axis=1)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        ys.append(h)
    return np.stack(ys)


def _module(backend="llvm"):
    torch.manual_seed(0)
    return rt.RNN("lstm", I, H, backend=backend)


def test_autocast_runs_bf16_gemms_and_answers_in_float32() -> None:
    m = _module()
    x = torch.randn(T, B, I)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, (h, c) = m(x)
    assert y.dtype == torch.float32 and h.dtype == torch.float32
    want = _bf16_lstm(x, m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=0, atol=2e-5)
    y.sum().backward()
    assert m.weight_hh_l0.grad.dtype == torch.float32  # fp32 master weights
    ref = torch.nn.LSTM(I, H)
    ref.load_state_dict(m.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch_y, _ = ref(x)
    assert (torch_y.float() - y).abs().max() < 3e-2  # nn.LSTM's bf16 path, elementwise too


def test_a_plain_call_after_autocast_is_float32_and_its_tape_still_runs() -> None:
    m = _module()
    x = torch.randn(T, B, I)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_auto, _ = m(x)
    y, _ = m(x)
    want = _bf16_lstm(x, m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0, m.bias_hh_l0)
    assert np.abs(y.detach().numpy() - want).max() > 1e-4  # float32 GEMMs now
    y_auto.sum().backward()  # the autocast call's tape, after a float32 call
    auto = m.weight_hh_l0.grad.clone()
    m.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m(x)[0].sum().backward()
    torch.testing.assert_close(m.weight_hh_l0.grad, auto)


def test_module_in_bfloat16_answers_in_bfloat16() -> None:
    m = _module()
    m = m.to(torch.bfloat16)
    x = torch.randn(T, B, I).to(torch.bfloat16).requires_grad_()
    y, (h, c) = m(x)
    assert y.dtype == torch.bfloat16 and c.dtype == torch.bfloat16
    want = _bf16_lstm(x.float(), *(p.float() for p in (m.weight_ih_l0, m.weight_hh_l0,
                                                        m.bias_ih_l0, m.bias_hh_l0)))
    np.testing.assert_allclose(y.float().detach().numpy(), want, rtol=2 ** -8, atol=1e-6)
    y.float().sum().backward()
    assert m.weight_hh_l0.grad.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    with pytest.raises(rnnc.RnncValueError, match="does not match weight dtype"):
        m(torch.randn(T, B, I))
