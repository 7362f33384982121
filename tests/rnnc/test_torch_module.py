"""Tests of rnnc.torch.RNN: the nn.Module matches torch.nn's modules and trains in torch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import rnnc.torch as rt  # noqa: E402 - needs torch, imported after the skip
from rnnc.errors import RnncError  # noqa: E402

nn = torch.nn
rnn_utils = torch.nn.utils.rnn
I, H, T, B = 3, 2, 5, 3
TORCH = {"rnn_tanh": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def pair(mode: str, dtype=torch.float64, **kw):
    """Return a torch.nn module and an rnnc.torch.RNN loaded from its state dict."""
    torch.manual_seed(0)
    ref = TORCH[mode](I, H, dtype=dtype, **kw)
    ours = rt.RNN(mode, I, H, backend="numpy", dtype=dtype, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def run(module, x, hx, loss_weights):
    """Forward, a weighted-sum loss over output and final states, backward; return all."""
    x = x.clone().requires_grad_()
    hx = tuple(h.clone().requires_grad_() for h in hx)
    out, fin = module(x, hx if len(hx) > 1 else hx[0])
    fin = fin if isinstance(fin, tuple) else (fin,)
    loss = (out * loss_weights[0]).sum() + sum((f * w).sum() for f, w in
                                               zip(fin, loss_weights[1:], strict=True))
    loss.backward()
    return ([out.detach(), *(f.detach() for f in fin), x.grad, *(h.grad for h in hx)]
            + [p.grad.clone() for p in module.parameters()])


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_gradients_equal_torch(mode, batch_first):
    ref, ours = pair(mode, num_layers=2, bidirectional=True, batch_first=batch_first)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in ours.named_parameters()]
    g = torch.Generator().manual_seed(1)
    x = torch.randn((B, T, I) if batch_first else (T, B, I), generator=g, dtype=torch.float64)
    n_states = 2 if mode == "lstm" else 1
    hx = tuple(torch.randn(4, B, H, generator=g, dtype=torch.float64) for _ in range(n_states))
    weights = [torch.randn(x.shape[:2] + (2 * H,), generator=g, dtype=torch.float64)]
    weights += [torch.randn(4, B, H, generator=g, dtype=torch.float64) for _ in hx]
    for a, b in zip(run(ref, x, hx, weights), run(ours, x, hx, weights), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-9)


@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequence(batch_first):
    ref, ours = pair("lstm", num_layers=2, bidirectional=True, batch_first=batch_first)
    g = torch.Generator().manual_seed(2)
    x = torch.randn((B, T, I) if batch_first else (T, B, I), generator=g, dtype=torch.float64)
    lengths = torch.tensor([2, 5, 3])
    results = []
    for module in (ref, ours):
        xx = x.clone().requires_grad_()
        packed = rnn_utils.pack_padded_sequence(xx, lengths, batch_first=batch_first,
                                                enforce_sorted=False)
        out, (h, c) = module(packed)
        assert isinstance(out, rnn_utils.PackedSequence)
        loss = (out.data ** 2).sum() + (h * 0.5).sum() + c.sum()
        loss.backward()
        results.append([out.data.detach(), out.batch_sizes, out.sorted_indices, h.detach(),
                        c.detach(), xx.grad] + [p.grad.clone() for p in module.parameters()])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-9)


def test_state_dict_loads_both_ways_and_defaults():
    torch.manual_seed(3)
    ours = rt.RNN("gru", I, H, num_layers=2, bias=False)
    ref = nn.GRU(I, H, num_layers=2, bias=False)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(T, B, I)
    torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours(x[:, 0])[0], ref(x[:, 0])[0], rtol=1e-5, atol=1e-6)
    assert ours(x)[0].dtype == torch.float32


def test_dropout_follows_torch_seed():
    ours = rt.RNN("lstm", I, H, num_layers=3, dropout=0.5, backend="numpy")
    x = torch.randn(T, B, I)
    torch.manual_seed(5)
    a = ours(x)[0]
    torch.manual_seed(5)
    b = ours(x)[0]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    ours.eval()
    assert not torch.allclose(ours(x)[0], a)


def test_dtype_mismatch_is_an_error():
    ours = rt.RNN("lstm", I, H, backend="numpy")
    with pytest.raises(RnncError, match="float64"):
        ours(torch.zeros(T, B, I, dtype=torch.float64))


def test_sequence_classifier_trains():
    """A small classifier (is the sum of the sequence positive?) learns with Adam."""
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = rt.RNN("lstm", 1, 8, batch_first=True, bidirectional=True,
                              backend="numpy")
            self.head = nn.Linear(16, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, (h, _) = self.rnn(x)
            return self.head(torch.cat([h[0], h[1]], dim=1))

    model = Model()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x = torch.randn(32, 6, 1)
    labels = (x.sum(dim=(1, 2)) > 0).long()
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
