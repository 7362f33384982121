"""Tests of rnnc.RNN: multi-layer, bidirectional, lengths, dropout, weights, against PyTorch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rnnc
from rnnc.errors import RnncError
from rnnc.interop import weights as W

torch = pytest.importorskip("torch")
nn = torch.nn
rnn_utils = torch.nn.utils.rnn

I, H, T, B = 3, 2, 4, 3
LENGTHS = np.array([3, 4, 1])  # unsorted, with a full-length and a length-1 sequence
TORCH = {"rnn_tanh": nn.RNN, "rnn_relu": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def backend_options(name: str) -> dict:
    """Return the rnnc.RNN backend keywords, skipping when the backend's module is absent."""
    if name == "llvm":
        pytest.importorskip("rnnc.backends.llvm.runtime", reason="rnnc.backends.llvm.runtime")
        return {"backend": "llvm"}
    if name == "cuda":
        pytest.importorskip("rnnc.backends.cuda.runtime", reason="rnnc.backends.cuda.runtime")
        return {"backend": "cuda", "emulate": True}
    return {"backend": "numpy"}


def torch_module(mode: str, num_layers: int, bidirectional: bool, batch_first: bool,
                 seed: int = 0, input_size: int = I):
    """Return a seeded float64 torch.nn.RNN/LSTM/GRU."""
    torch.manual_seed(seed)
    kw = {"nonlinearity": mode[4:]} if mode.startswith("rnn_") else {}
    return TORCH[mode](input_size, H, num_layers=num_layers, bidirectional=bidirectional,
                       batch_first=batch_first, dtype=torch.float64, **kw)


def torch_reference(module, x, lengths, states, d_y, d_states, batch_first):
    """Run ``module`` (packed when lengths are given) and backpropagate the given gradients."""
    xt = torch.tensor(x, requires_grad=True)
    st = {n: torch.tensor(v, requires_grad=True) for n, v in states.items()}
    hx = (st["h"], st["c"]) if "c" in st else st["h"]
    inp = xt
    if lengths is not None:
        inp = rnn_utils.pack_padded_sequence(xt, torch.tensor(lengths), batch_first=batch_first,
                                             enforce_sorted=False)
    out, fin = module(inp, hx)
    if lengths is not None:
        out, _ = rnn_utils.pad_packed_sequence(out, batch_first=batch_first,
                                               total_length=x.shape[1 if batch_first else 0])
    fin = {"h": fin[0], "c": fin[1]} if "c" in st else {"h": fin}
    loss = (out * torch.tensor(d_y)).sum()
    for n, v in fin.items():
        loss = loss + (v * torch.tensor(d_states[n])).sum()
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in module.named_parameters()}
    return (out.detach().numpy(), {n: v.detach().numpy() for n, v in fin.items()},
            xt.grad.numpy(), {n: v.grad.numpy() for n, v in st.items()}, grads)


def check_against_torch(mode: str, num_layers: int, bidirectional: bool, with_lengths: bool,
                        batch_first: bool, options: dict) -> None:
    """rnnc.RNN's outputs, final states and every gradient equal PyTorch's to 1e-9."""
    rng = np.random.default_rng(hash((mode, num_layers, bidirectional)) % 2**32)
    module = torch_module(mode, num_layers, bidirectional, batch_first)
    layer = rnnc.RNN(mode, I, H, num_layers=num_layers, bidirectional=bidirectional,
                     batch_first=batch_first, dtype=np.float64, **options)
    layer.load_torch(module)
    D = 2 if bidirectional else 1
    x = rng.standard_normal((B, T, I) if batch_first else (T, B, I))
    names = ("h", "c") if mode == "lstm" else ("h",)
    states = {n: rng.standard_normal((num_layers * D, B, H)) for n in names}
    d_states = {n: rng.standard_normal((num_layers * D, B, H)) for n in names}
    d_y = rng.standard_normal((B, T, D * H) if batch_first else (T, B, D * H))
    lengths = LENGTHS if with_lengths else None
    if lengths is not None:  # PyTorch's packed output has nothing to differentiate past a length
        t = np.arange(T)[None, :] if batch_first else np.arange(T)[:, None]
        valid = t < (lengths[:, None] if batch_first else lengths[None, :])
        d_y = d_y * valid[:, :, None]
    y_ref, st_ref, gx_ref, gst_ref, gp_ref = torch_reference(module, x, lengths, states, d_y,
                                                             d_states, batch_first)
    y, st, tape = layer.forward(x, lengths=lengths, states=states)
    g = layer.backward(tape, d_y, d_states)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-9)
    y_inf, st_inf = layer(x, lengths=lengths, states=states)
    np.testing.assert_allclose(y_inf, y_ref, rtol=0, atol=1e-9)
    for n in names:
        np.testing.assert_allclose(st[n], st_ref[n], rtol=0, atol=1e-9, err_msg=n)
        np.testing.assert_allclose(st_inf[n], st_ref[n], rtol=0, atol=1e-9, err_msg=n)
        np.testing.assert_allclose(g.states[n], gst_ref[n], rtol=0, atol=1e-9, err_msg=n)
    np.testing.assert_allclose(g.x, gx_ref, rtol=0, atol=1e-9)
    gp = W.layers_to_torch_state_dict(mode, g.params)
    assert sorted(gp) == sorted(gp_ref)
    for n in gp:
        np.testing.assert_allclose(gp[n], gp_ref[n], rtol=0, atol=1e-9, err_msg=n)


FULL = list(itertools.product(("rnn_tanh", "lstm", "gru"), (1, 2, 3), (False, True),
                              (False, True), (False, True)))


@pytest.mark.parametrize("mode,num_layers,bidirectional,with_lengths,batch_first", FULL)
def test_matches_torch_numpy(mode, num_layers, bidirectional, with_lengths, batch_first):
    check_against_torch(mode, num_layers, bidirectional, with_lengths, batch_first,
                        backend_options("numpy"))


def test_relu_matches_torch():
    check_against_torch("rnn_relu", 2, True, True, False, backend_options("numpy"))


SUBSET = [("lstm", 2, True, True, False), ("gru", 1, False, False, True),
          ("rnn_tanh", 3, True, False, False), ("gru", 2, True, True, True)]


@pytest.mark.parametrize("backend", ["llvm", "cuda"])
@pytest.mark.parametrize("mode,num_layers,bidirectional,with_lengths,batch_first", SUBSET)
def test_matches_torch_other_backends(backend, mode, num_layers, bidirectional, with_lengths,
                                      batch_first):
    check_against_torch(mode, num_layers, bidirectional, with_lengths, batch_first,
                        backend_options(backend))


# --------------------------------------------------------------------------- custom cells


# The minimal gated unit of the README's "Your own cell", as rnnc ships it.
mgu = rnnc.cells.mgu


def test_custom_cell_equals_composed_single_layers():
    """Two bidirectional MGU layers with lengths equal single-layer runs composed by hand."""
    layer = rnnc.RNN(mgu, I, H, num_layers=2, bidirectional=True, dtype=np.float64, seed=3,
                     backend="numpy")
    assert layer.function(0) is not layer.function(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, I))
    h0 = rng.standard_normal((4, B, H))
    y, st = layer(x, lengths=LENGTHS, states={"h": h0})
    fns = [rnnc.compile(mgu(I, H), backend="numpy"), rnnc.compile(mgu(2 * H, H), backend="numpy")]
    for b, n in enumerate(LENGTHS):
        inp = x[:n, b:b + 1]
        for k in range(2):
            outs = []
            for d in range(2):
                p = layer.params[k][d]
                seq = inp if d == 0 else inp[::-1]
                ys, s = fns[k](seq, p, states={"h": h0[2 * k + d, b:b + 1]})
                outs.append(ys["y"] if d == 0 else ys["y"][::-1])
                np.testing.assert_allclose(st["h"][2 * k + d, b], s["h"][0], atol=1e-12)
            inp = np.concatenate(outs, axis=2)
        np.testing.assert_allclose(y[:n, b], inp[:, 0], atol=1e-12)
        assert not y[n:, b].any()


def test_one_function_per_cell_shape():
    layer = rnnc.RNN("gru", 2 * H, H, num_layers=3, bidirectional=True, backend="numpy")
    assert layer.function(0) is layer.function(1) is layer.function(2)
    layer = rnnc.RNN("gru", I, H, num_layers=3, backend="numpy")
    assert layer.function(0) is not layer.function(1)
    assert layer.function(1) is layer.function(2)


# --------------------------------------------------------------------------- dropout


def test_dropout_deterministic_and_off_in_eval():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, B, I))
    a = rnnc.RNN("lstm", I, H, num_layers=3, dropout=0.5, seed=7, dtype=np.float64, backend="numpy")
    b = rnnc.RNN("lstm", I, H, num_layers=3, dropout=0.5, seed=7, dtype=np.float64, backend="numpy")
    plain = rnnc.RNN("lstm", I, H, num_layers=3, dtype=np.float64, backend="numpy")
    plain.load_flat(a.flat_weights)
    ya, _, ta = a.forward(x)
    yb, _, _ = b.forward(x)
    np.testing.assert_array_equal(ya, yb)
    y_eval, _ = a(x)
    np.testing.assert_array_equal(y_eval, plain(x)[0])
    np.testing.assert_array_equal(a.forward(x, train=False)[0], y_eval)
    assert not np.allclose(ya, y_eval)
    assert len(ta.dropout_masks) == 2
    for m in ta.dropout_masks:
        assert set(np.unique(m)) <= {0.0, 2.0}  # inverted dropout: kept units scaled by 1/(1-p)


def test_dropout_gradient_central_differences():
    rng = np.random.default_rng(2)
    layer = rnnc.RNN("gru", I, H, num_layers=2, bidirectional=True, dropout=0.4, seed=1,
                     dtype=np.float64, backend="numpy")
    x = rng.standard_normal((T, B, I))
    h0 = rng.standard_normal((4, B, H))
    d_y = rng.standard_normal((T, B, 2 * H))

    def loss(x, h0):
        y, _, _ = layer.forward(x, states={"h": h0}, rng=np.random.default_rng(5))
        return float((y * d_y).sum())

    _, _, tape = layer.forward(x, states={"h": h0}, rng=np.random.default_rng(5))
    assert tape.dropout_masks[0] is not None and not tape.dropout_masks[0].all()
    g = layer.backward(tape, d_y)
    eps = 1e-6
    for idx in [(0, 0, 0), (2, 1, 2), (3, 2, 1)]:
        e = np.zeros_like(x)
        e[idx] = eps
        num = (loss(x + e, h0) - loss(x - e, h0)) / (2 * eps)
        assert abs(num - g.x[idx]) < 1e-7
    for idx in [(0, 0, 0), (3, 2, 1)]:
        e = np.zeros_like(h0)
        e[idx] = eps
        num = (loss(x, h0 + e) - loss(x, h0 - e)) / (2 * eps)
        assert abs(num - g.states["h"][idx]) < 1e-7
    p = layer.params[1][1]["W_hz"]
    for idx in [(0, 0), (1, 1)]:
        old = p[idx]
        p[idx] = old + eps
        up = loss(x, h0)
        p[idx] = old - eps
        down = loss(x, h0)
        p[idx] = old
        assert abs((up - down) / (2 * eps) - g.params[1][1]["W_hz"][idx]) < 1e-7


# --------------------------------------------------------------------------- weights


def _bits_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("mode", ["rnn_relu", "lstm", "gru"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_round_trip(mode, dtype):
    layer = rnnc.RNN(mode, I, H, num_layers=2, bidirectional=True, seed=4, dtype=dtype,
                     backend="numpy")
    module = layer.to_torch()
    assert module.num_layers == 2 and module.bidirectional
    again = rnnc.RNN(mode, I, H, num_layers=2, bidirectional=True, seed=9, dtype=dtype,
                     backend="numpy")
    again.load_torch(module)
    for row_a, row_b in zip(layer.params, again.params, strict=True):
        for pa, pb in zip(row_a, row_b, strict=True):
            assert all(_bits_equal(pa[n], pb[n]) for n in pa)
    sd = again.to_torch().state_dict()
    assert all(_bits_equal(sd[n].numpy(), v.numpy()) for n, v in module.state_dict().items())


def test_flat_weights_are_cudnn_order():
    module = torch_module("lstm", 2, True, False)
    layer = rnnc.RNN("lstm", I, H, num_layers=2, bidirectional=True, dtype=np.float64,
                     backend="numpy")
    layer.load_torch(module)
    want = torch.cat([w.detach().reshape(-1) for w in module._flat_weights]).numpy()
    assert _bits_equal(layer.flat_weights, want)
    other = rnnc.RNN("lstm", I, H, num_layers=2, bidirectional=True, dtype=np.float64, seed=5,
                     backend="numpy")
    other.load_flat(want)
    assert _bits_equal(other.flat_weights, want)


def test_flat_weights_custom_cell():
    layer = rnnc.RNN(mgu, I, H, num_layers=2, seed=1, dtype=np.float64, backend="numpy")
    other = rnnc.RNN(mgu, I, H, num_layers=2, seed=2, dtype=np.float64, backend="numpy")
    other.load_flat(layer.flat_weights)
    assert _bits_equal(other.flat_weights, layer.flat_weights)


@pytest.mark.parametrize("mode", ["rnn_tanh", "lstm", "gru"])
def test_keras_round_trip(mode):
    layer = rnnc.RNN(mode, I, H, seed=2, dtype=np.float64, backend="numpy")
    kernel, recurrent, bias = layer.to_keras()
    assert kernel.shape == (I, W.num_gates(mode) * H)
    other = rnnc.RNN(mode, I, H, seed=8, dtype=np.float64, backend="numpy")
    other.load_keras(kernel, recurrent, bias)
    assert all(_bits_equal(a, b) for a, b in zip(other.to_keras(), (kernel, recurrent, bias),
                                                 strict=True))
    x = np.random.default_rng(0).standard_normal((T, B, I))
    np.testing.assert_allclose(other(x)[0], layer(x)[0], atol=1e-12)


def test_backend_none_picks_a_working_backend():
    layer = rnnc.RNN("gru", I, H, backend=None)
    assert layer.backend in ("llvm", "numpy")
    x = np.zeros((T, B, I), np.float32)
    assert layer(x)[0].shape == (T, B, H)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("make_module,message", [
    (lambda: nn.GRU(I, H), "mode"),
    (lambda: nn.RNN(I, H, nonlinearity="relu"), "mode"),
    (lambda: nn.LSTM(I + 1, H), "input_size"),
    (lambda: nn.LSTM(I, H + 1), "hidden_size"),
    (lambda: nn.LSTM(I, H, num_layers=3), "num_layers"),
    (lambda: nn.LSTM(I, H, num_layers=2), "bidirectional"),
])
def test_load_torch_mismatch(make_module, message):
    layer = rnnc.RNN("lstm", I, H, num_layers=1 if message != "bidirectional" else 2,
                     bidirectional=message == "bidirectional", backend="numpy")
    with pytest.raises(RnncError, match=message):
        layer.load_torch(make_module())


def test_custom_cell_has_no_torch_layout():
    with pytest.raises(RnncError, match="standard mode"):
        rnnc.RNN(mgu, I, H, backend="numpy").to_torch()


@pytest.mark.parametrize("dropout", [-0.1, 1.5, "0.5", True])
def test_dropout_out_of_range(dropout):
    with pytest.raises(RnncError, match="dropout"):
        rnnc.RNN("lstm", I, H, dropout=dropout, backend="numpy")


def test_dropout_one_zeroes_the_layer_below():
    # torch accepts p = 1: everything passed up is zero, so the top layer sees only zeros
    layer = rnnc.RNN("gru", I, H, num_layers=2, dropout=1.0, seed=0, backend="numpy")
    x = np.random.default_rng(0).standard_normal((4, 3, I)).astype(np.float32)
    y, _, tape = layer.forward(x)
    top = rnnc.RNN("gru", H, H, backend="numpy")
    top.params = [layer.params[1]]
    want, _ = top(np.zeros((4, 3, H), np.float32))
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    g = layer.backward(tape, np.ones_like(y))
    assert not np.any(g.x)


def test_constructor_errors():
    with pytest.raises(RnncError, match="mode"):
        rnnc.RNN("lstmx", I, H, backend="numpy")
    with pytest.raises(RnncError, match="num_layers"):
        rnnc.RNN("lstm", I, H, num_layers=0, backend="numpy")
    with pytest.raises(RnncError, match="backend"):
        rnnc.RNN("lstm", I, H, backend="tpu")


def test_state_shape_errors():
    layer = rnnc.RNN("lstm", I, H, num_layers=2, bidirectional=True, backend="numpy")
    x = np.zeros((T, B, I), np.float32)
    with pytest.raises(RnncError, match=r"'c' must have shape .*\(4, 3, 2\)"):
        layer(x, states={"c": np.zeros((2, B, H), np.float32)})
    with pytest.raises(RnncError, match="unknown state 'x'"):
        layer(x, states={"x": np.zeros((4, B, H), np.float32)})
    with pytest.raises(RnncError, match="'h' is float64"):
        layer(x, states={"h": np.zeros((4, B, H))})


def test_input_errors():
    layer = rnnc.RNN("gru", I, H, backend="numpy")
    with pytest.raises(RnncError, match="3 dimensions"):
        layer(np.zeros((T, I), np.float32))
    with pytest.raises(RnncError, match=f"{I} features"):
        layer(np.zeros((T, B, I + 1), np.float32))
    with pytest.raises(RnncError, match="float64"):
        layer(np.zeros((T, B, I)))


def test_lengths_batch_first_mixup():
    layer = rnnc.RNN("gru", I, H, batch_first=True, backend="numpy")
    x = np.zeros((B, T, I), np.float32)
    with pytest.raises(RnncError, match=r"one entry per sequence.*batch_first=True"):
        layer(x, lengths=np.full(T, 2))  # T entries, not B: lengths of a time-major reading
    with pytest.raises(RnncError, match="lengths must be in"):
        layer(x, lengths=np.array([1, 2, T + 1]))


def test_backward_errors():
    layer = rnnc.RNN("gru", I, H, backend="numpy")
    x = np.zeros((T, B, I), np.float32)
    _, _, tape = layer.forward(x)
    with pytest.raises(RnncError, match="shape of y"):
        layer.backward(tape, np.zeros((T, B, H + 1), np.float32))
    with pytest.raises(RnncError, match="another layer"):
        rnnc.RNN("gru", I, H, backend="numpy").backward(tape, np.zeros((T, B, H), np.float32))
