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


# --------------------------------------------------------------------------- extra inputs

E, M, K = 2, 3, 4  # extra input width, second state's size, output width


def extra_cell(n_in: int, n_h: int):
    """m' = tanh(u A + h C + m G), h' = tanh(x W + u V + m' D + h U), y = h' P."""
    from rnnc.dsl import Cell, tanh

    c = Cell("extra_cell")
    x, u, h, m = c.input("x", n_in), c.input("u", E), c.state("h", n_h), c.state("m", M)
    A, C, G = c.param("A", (E, M)), c.param("C", (n_h, M)), c.param("G", (M, M))
    W, V, D = c.param("W", (n_in, n_h)), c.param("V", (E, n_h)), c.param("D", (M, n_h))
    U, P = c.param("U", (n_h, n_h)), c.param("P", (n_h, K))
    m_new = tanh(u @ A + h @ C + m @ G)
    h_new = tanh(x @ W + u @ V + m_new @ D + h @ U)
    c.update(h=h_new, m=m_new)
    c.output("y", h_new @ P)
    return c


def eager(module, x, u, h0, m0, first_only=False):
    """The module's forward as a torch loop over its own parameters (time-major, 2 layers,
    bidirectional, full lengths)."""
    inp, hs, ms = x, [], []
    for k in range(2):
        uk = torch.zeros_like(u) if first_only and k else u
        outs = []
        for d in range(2):
            p = {n: getattr(module, f"{n}_l{k}" + ("_reverse" if d else "")) for n in "ACGWVDUP"}
            h, m, ys = h0[2 * k + d], m0[2 * k + d], [None] * x.shape[0]
            for t in (range(x.shape[0]) if d == 0 else reversed(range(x.shape[0]))):
                m = torch.tanh(uk[t] @ p["A"] + h @ p["C"] + m @ p["G"])
                h = torch.tanh(inp[t] @ p["W"] + uk[t] @ p["V"] + m @ p["D"] + h @ p["U"])
                ys[t] = h @ p["P"]
            outs.append(torch.stack(ys))
            hs.append(h)
            ms.append(m)
        inp = torch.cat(outs, 2)
    return inp, torch.stack(hs), torch.stack(ms)


@pytest.mark.parametrize("first_only", [False, True])
def test_extra_inputs_match_eager_loop(first_only):
    torch.manual_seed(0)
    ours = rt.RNN(extra_cell, I, H, num_layers=2, bidirectional=True, backend="numpy",
                  dtype=torch.float64, extra_inputs="first" if first_only else "all")
    assert ours.extra_names == ("u",)
    g = torch.Generator().manual_seed(1)
    leaves = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
              for s in ((T, B, I), (T, B, E), (4, B, H), (4, B, M))]
    x, u, h0, m0 = leaves
    weights = [torch.randn(s, generator=g, dtype=torch.float64)
               for s in ((T, B, 2 * K), (4, B, H), (4, B, M))]
    y, st = ours(x, {"h": h0, "m": m0}, extra={"u": u})
    want = eager(ours, x, u, h0, m0, first_only)
    params = list(ours.parameters())
    for a, b in zip((y, st["h"], st["m"]), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)

    def grads(outs):
        loss = sum((o * w).sum() for o, w in zip(outs, weights, strict=True))
        return torch.autograd.grad(loss, leaves + params)

    for a, b in zip(grads((y, st["h"], st["m"])), grads(want), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_extra_inputs_gradcheck_and_gradgradcheck():
    ours = rt.RNN(extra_cell, 2, 2, num_layers=2, bidirectional=True, batch_first=True,
                  backend="numpy", dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(2, 3, E, generator=g, dtype=torch.float64, requires_grad=True)

    def f(x, u):
        y, st = ours(x, extra={"u": u})
        return y, st["m"]

    assert torch.autograd.gradcheck(f, (x, u), check_batched_grad=True)
    assert torch.autograd.gradgradcheck(f, (x, u))


def test_extra_inputs_vmap_and_unbatched():
    ours = rt.RNN(extra_cell, I, H, backend="numpy", dtype=torch.float64)
    x, u = torch.randn(5, T, B, I, dtype=torch.float64), torch.randn(5, T, B, E,
                                                                     dtype=torch.float64)
    got = torch.func.vmap(lambda x, u: ours(x, extra={"u": u})[0])(x, u)
    want = torch.stack([ours(x[i], extra={"u": u[i]})[0] for i in range(5)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours(x[0, :, 0], extra={"u": u[0, :, 0]})[0], want[0, :, 0])


def test_extra_input_errors_in_torch():
    ours = rt.RNN(extra_cell, I, H, backend="numpy")
    x, u = torch.zeros(T, B, I), torch.zeros(T, B, E)
    with pytest.raises(RnncError, match="missing extra input 'u'"):
        ours(x)
    with pytest.raises(RnncError, match="unknown extra input 'v'"):
        ours(x, extra={"u": u, "v": u})
    with pytest.raises(RnncError, match="'u' must be a tensor"):
        ours(x, extra={"u": u.numpy()})
    with pytest.raises(RnncError, match=r"'u' must have shape \(T, B, size\) = \(5, 3, 2\)"):
        ours(x, extra={"u": torch.zeros(T, B, E + 1)})
    with pytest.raises(RnncError, match="'u' is float64, expected float32"):
        ours(x, extra={"u": u.double()})


def test_extra_inputs_with_packed_sequence():
    ours = rt.RNN(extra_cell, I, H, num_layers=2, bidirectional=True, backend="numpy",
                  dtype=torch.float64)
    x, u = torch.randn(T, B, I, dtype=torch.float64), torch.randn(T, B, E, dtype=torch.float64)
    lengths = torch.tensor([2, 5, 3])

    def pack(t):
        return rnn_utils.pack_padded_sequence(t, lengths, enforce_sorted=False)

    out, _ = ours(pack(x), extra={"u": pack(u)})
    got, _ = rnn_utils.pad_packed_sequence(out)
    grid = ours._rnnc_params(tuple(ours._flat_parameters()))
    want, _, _ = ours.layer.forward(x.numpy(), lengths.numpy(), params=grid, train=False,
                                    extra={"u": u.numpy()})
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=0, atol=0)


def test_no_grad_forward_runs_inference_and_matches_torch(monkeypatch):
    """Under torch.no_grad the layer runs without a tape (nothing can call backward), with
    grad mode on it records one; the results match nn.LSTM's either way, and dropout between
    layers still applies in training mode, as in torch."""
    torch.manual_seed(0)
    ref = nn.LSTM(I, H, num_layers=2, bidirectional=True)
    ours = rt.RNN("lstm", I, H, num_layers=2, bidirectional=True)
    ours.load_state_dict(ref.state_dict())
    ref.eval(), ours.eval()
    modes = []
    forward = ours.layer.forward

    def spy(*args, **kwargs):
        modes.append(kwargs["train"])
        return forward(*args, **kwargs)

    monkeypatch.setattr(ours.layer, "forward", spy)
    x = torch.randn(T, B, I)
    with torch.no_grad():
        y, (h, c) = ours(x)
        want, (want_h, want_c) = ref(x)
    with torch.inference_mode():
        y_inference = ours(x)[0]
    y_grad = ours(x)[0]
    assert modes == [False, False, True]
    for got, expected in ((y, want), (h, want_h), (c, want_c), (y_inference, want),
                          (y_grad, want)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)

    ours.train()
    ours.dropout = 0.5
    torch.manual_seed(1)
    with torch.no_grad():
        dropped = ours(x)[0]
    torch.manual_seed(1)
    assert not torch.allclose(dropped, want)
    torch.testing.assert_close(dropped, ours(x)[0].detach(), rtol=1e-5, atol=1e-6)
