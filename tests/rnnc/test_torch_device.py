"""rnnc.torch.RNN's tensor <-> array bridge (rnnc.interop.torch_device).

On the CPU: the per-gate split and join of torch's fused weights, done with torch operations
on the tensors' own device, must equal the NumPy conversions of ``rnnc.interop.weights``
bit for bit; CPU tensors take the host bridge whatever the backend; a device array becomes a
tensor through DLPack without a copy. On a GPU (tests marked ``cuda``): CUDA tensors stay on
the GPU through forward and backward, against ``torch.nn.LSTM``/``GRU`` on the same tensors,
with no host copy.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
import rnnc.torch
from rnnc.interop import torch_device
from rnnc.interop import weights as W
from tests.backends.test_cuda_backend import gpu_reason

torch = pytest.importorskip("torch")

I, H, T, B = 3, 4, 5, 2


def fused(mode: str, proj: int = 0, bias: bool = True, seed: int = 0) -> dict:
    """One pseudo-layer's torch weights by base name, float64, from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    G = W.num_gates(mode)
    out = {"weight_ih": torch.randn(G * H, I, generator=g, dtype=torch.float64),
           "weight_hh": torch.randn(G * H, proj or H, generator=g, dtype=torch.float64)}
    if bias:
        out.update(bias_ih=torch.randn(G * H, generator=g, dtype=torch.float64),
                   bias_hh=torch.randn(G * H, generator=g, dtype=torch.float64))
    if proj:
        out["weight_hr"] = torch.randn(proj, H, generator=g, dtype=torch.float64)
    return out


CASES = [("lstm", 0, True), ("lstm", 2, True), ("gru", 0, True), ("gru", 0, False),
         ("rnn_tanh", 0, True)]


@pytest.mark.parametrize("mode, proj, bias", CASES)
def test_split_gates_equals_the_numpy_conversion(mode, proj, bias) -> None:
    tensors = fused(mode, proj, bias)
    got = torch_device.split_gates(mode, tensors)
    want = W.from_torch_layer(mode, *(tensors.get(n) for n in (
        "weight_ih", "weight_hh", "bias_ih", "bias_hh")), weight_hr=tensors.get("weight_hr"))
    assert sorted(got) == sorted(want)
    for name, a in want.items():
        assert got[name].is_contiguous()
        np.testing.assert_array_equal(got[name].numpy(), a, err_msg=name)


@pytest.mark.parametrize("mode, proj, bias", CASES)
def test_join_gates_inverts_split_gates_like_the_numpy_conversion(mode, proj, bias) -> None:
    tensors = fused(mode, proj, bias, seed=1)
    params = torch_device.split_gates(mode, tensors)
    got = torch_device.join_gates(mode, params)
    want = W.to_torch_layer(mode, {n: t.numpy() for n, t in params.items()})
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)
    for name, t in tensors.items():  # the round trip gives the weights back
        index = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr").index(name)
        assert torch.equal(got[index], t)


@pytest.mark.parametrize("options", [{"backend": "numpy"}, {"backend": "cuda", "emulate": True}])
def test_cpu_tensors_take_the_host_bridge(options) -> None:
    module = rnnc.torch.RNN("LSTM", I, H, **options)
    side = torch_device.bridge(module, torch.zeros(T, B, I))
    assert isinstance(side, torch_device.HostBridge)
    x = torch.randn(T, B, I)
    assert np.shares_memory(side.array(x, "x"), x.numpy())


def test_a_device_array_becomes_a_tensor_without_a_copy() -> None:
    # In emulation a device array is host memory: DLPack gives a CPU tensor over it.
    from rnnc.backends.cuda.device import EmulatedArray

    a = np.arange(6.0).reshape(2, 3).view(EmulatedArray)
    t = torch_device.DeviceBridge(None, torch.device("cpu")).tensor(a, torch.zeros(1))
    assert t.data_ptr() == a.ctypes.data and t.tolist() == a.tolist()


def test_cuda_emulation_through_the_module_matches_torch() -> None:
    torch.manual_seed(0)
    reference = torch.nn.GRU(I, H, num_layers=2, bidirectional=True, dtype=torch.float64)
    module = rnnc.torch.RNN("GRU", I, H, num_layers=2, bidirectional=True,
                            backend="cuda", emulate=True, dtype=torch.float64)
    module.load_state_dict(reference.state_dict())
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    y, h = module(x)
    y_ref, h_ref = reference(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(h, h_ref)
    (g,) = torch.autograd.grad(y.sum() + h.sum(), x)
    (g_ref,) = torch.autograd.grad(y_ref.sum() + h_ref.sum(), x)
    torch.testing.assert_close(g, g_ref)


GPU = pytest.mark.skipif(gpu_reason() is not None, reason=str(gpu_reason()))


@pytest.mark.cuda
@GPU
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_cuda_tensors_stay_on_the_gpu_forward_and_backward(mode, monkeypatch,
                                                          runner_copies) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch (this one sees no GPU)")
    torch.manual_seed(0)
    kw = dict(num_layers=2, bidirectional=True, dtype=torch.float64, device="cuda")
    reference = getattr(torch.nn, mode)(I, H, **kw)
    module = rnnc.torch.RNN(mode, I, H, backend="cuda", **kw)
    module.load_state_dict(reference.state_dict())
    x = torch.randn(T, B, I, dtype=torch.float64, device="cuda", requires_grad=True)
    copies = runner_copies  # every cell call's bytes, host calls included

    def no_host_copy(*args, **kwargs):
        raise AssertionError("a CUDA tensor was copied to the host")

    monkeypatch.setattr(torch.Tensor, "cpu", no_host_copy)
    y, hx = module(x)
    h = hx[0] if mode == "LSTM" else hx
    loss = (y * y).sum() + h.sum()
    grads = torch.autograd.grad(loss, [x, *module.parameters()])
    monkeypatch.undo()
    assert y.is_cuda and h.is_cuda and all(g.is_cuda for g in grads)
    assert copies and all(c == {"to_device": 0, "to_host": 0} for c in copies)
    assert module.layer.transfers == {"to_device": 0, "to_host": 0}
    y_ref, hx_ref = reference(x)
    h_ref = hx_ref[0] if mode == "LSTM" else hx_ref
    torch.testing.assert_close(y, y_ref)
    grads_ref = torch.autograd.grad((y_ref * y_ref).sum() + h_ref.sum(),
                                    [x, *reference.parameters()])
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want)
