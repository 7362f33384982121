"""Tests of rnnc.interop.weights: PyTorch, cuDNN flat-buffer and Keras layouts of the standard
cells."""

from __future__ import annotations

import numpy as np
import pytest

from rnnc.interop import weights as W
from rnnc.interop.weights import WeightError

MODES = ("rnn_tanh", "rnn_relu", "lstm", "gru")
I, H = 5, 4


def _torch():
    """Import torch or skip: only the interop tests need it."""
    return pytest.importorskip("torch")


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Return True when two arrays have the same dtype, shape and bytes (bit-exact)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _layers_equal(x: W.Layers, y: W.Layers) -> bool:
    """Return True when two [layer][direction] grids hold bit-identical parameters."""
    if len(x) != len(y):
        return False
    for rx, ry in zip(x, y, strict=True):
        if len(rx) != len(ry):
            return False
        for px, py in zip(rx, ry, strict=True):
            if list(px) != list(py) or not all(_bits_equal(px[n], py[n]) for n in px):
                return False
    return True


def _torch_module(mode: str, num_layers: int, bidirectional: bool, bias: bool, seed: int = 0):
    """Build a torch.nn.RNN/LSTM/GRU with seeded random weights."""
    torch = _torch()
    torch.manual_seed(seed)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, bias=bias)
    if mode == "lstm":
        return torch.nn.LSTM(I, H, **kw)
    if mode == "gru":
        return torch.nn.GRU(I, H, **kw)
    return torch.nn.RNN(I, H, nonlinearity=mode[4:], **kw)


def _random_params(mode: str, in_size: int, hidden: int, rng, dtype=np.float64) -> W.Params:
    """Return random rnnc params of one cell, every bias non-zero."""
    return {
        n: rng.standard_normal(s).astype(dtype)
        for n, s in W.param_shapes(mode, in_size, hidden).items()
    }


# --------------------------------------------------------------------------- reference math


def _sigmoid(v):
    """Logistic function in float64."""
    return 1.0 / (1.0 + np.exp(-v))


def _rnnc_step(mode, p, x, h, c=None, reset_after=True):
    """One step of PyTorch's documented equations on rnnc's x @ W parameters."""
    if mode in ("rnn_tanh", "rnn_relu"):
        a = x @ p["W_ih"] + p["b_ih"] + h @ p["W_hh"] + p["b_hh"]
        return (np.tanh(a) if mode == "rnn_tanh" else np.maximum(a, 0.0)), None
    if mode == "lstm":
        i = _sigmoid(x @ p["W_ii"] + p["b_ii"] + h @ p["W_hi"] + p["b_hi"])
        f = _sigmoid(x @ p["W_if"] + p["b_if"] + h @ p["W_hf"] + p["b_hf"])
        g = np.tanh(x @ p["W_ig"] + p["b_ig"] + h @ p["W_hg"] + p["b_hg"])
        o = _sigmoid(x @ p["W_io"] + p["b_io"] + h @ p["W_ho"] + p["b_ho"])
        c_new = f * c + i * g
        return o * np.tanh(c_new), c_new
    r = _sigmoid(x @ p["W_ir"] + p["b_ir"] + h @ p["W_hr"] + p["b_hr"])
    z = _sigmoid(x @ p["W_iz"] + p["b_iz"] + h @ p["W_hz"] + p["b_hz"])
    if reset_after:  # PyTorch / cuDNN (v1)
        n = np.tanh(x @ p["W_in"] + p["b_in"] + r * (h @ p["W_hn"] + p["b_hn"]))
    else:  # v3: the reset gate scales h before the matmul
        n = np.tanh(x @ p["W_in"] + p["b_in"] + (r * h) @ p["W_hn"] + p["b_hn"])
    return (1.0 - z) * n + z * h, None


def _rnnc_stack(mode, layers, x, h0, c0):
    """Run a multi-layer, maybe bidirectional stack with _rnnc_step, PyTorch's conventions."""
    d = len(layers[0])
    inp = x
    hn, cn = np.zeros_like(h0), np.zeros_like(h0)
    for k, row in enumerate(layers):
        outs = []
        for j, p in enumerate(row):
            idx = k * d + j
            h, c = h0[idx], (c0[idx] if c0 is not None else None)
            steps = range(len(x)) if j == 0 else range(len(x) - 1, -1, -1)
            ys = [None] * len(x)
            for t in steps:
                h, c = _rnnc_step(mode, p, inp[t], h, c)
                ys[t] = h
            hn[idx] = h
            if c is not None:
                cn[idx] = c
            outs.append(np.stack(ys))
        inp = np.concatenate(outs, axis=-1)
    return inp, hn, cn


def _keras_simple_rnn_step(act, kernel, recurrent_kernel, bias, x, h):
    """Keras SimpleRNNCell.call: act(x @ kernel + bias + h @ recurrent_kernel)."""
    return act(x @ kernel + bias + h @ recurrent_kernel)


def _keras_lstm_step(kernel, recurrent_kernel, bias, x, h, c):
    """Keras LSTMCell.call (sigmoid recurrent activation, tanh activation), gates i,f,c,o."""
    z = x @ kernel + h @ recurrent_kernel + bias
    z0, z1, z2, z3 = np.split(z, 4, axis=-1)
    i = _sigmoid(z0)
    f = _sigmoid(z1)
    c_new = f * c + i * np.tanh(z2)
    o = _sigmoid(z3)
    return o * np.tanh(c_new), c_new


def _keras_gru_step(kernel, recurrent_kernel, bias, x, h, reset_after):
    """Keras GRUCell.call, gates z,r,h; bias is (2, 3H) with reset_after, else (3H,)."""
    units = h.shape[-1]
    if reset_after:
        input_bias, recurrent_bias = bias[0], bias[1]
    else:
        input_bias, recurrent_bias = bias, None
    matrix_x = x @ kernel + input_bias
    x_z, x_r, x_h = np.split(matrix_x, 3, axis=-1)
    if reset_after:
        matrix_inner = h @ recurrent_kernel + recurrent_bias
    else:
        matrix_inner = h @ recurrent_kernel[:, : 2 * units]
    recurrent_z = matrix_inner[:, :units]
    recurrent_r = matrix_inner[:, units : 2 * units]
    z = _sigmoid(x_z + recurrent_z)
    r = _sigmoid(x_r + recurrent_r)
    if reset_after:
        recurrent_h = r * matrix_inner[:, 2 * units :]
    else:
        recurrent_h = (r * h) @ recurrent_kernel[:, 2 * units :]
    hh = np.tanh(x_h + recurrent_h)
    return z * h + (1.0 - z) * hh


# --------------------------------------------------------------------------- names


def test_gates_and_names():
    assert W.GATES["lstm"] == ("i", "f", "g", "o")
    assert W.GATES["gru"] == ("r", "z", "n")
    assert W.param_names("rnn_tanh") == ("W_ih", "W_hh", "b_ih", "b_hh")
    assert W.param_names("lstm") == (
        "W_ii", "W_if", "W_ig", "W_io", "W_hi", "W_hf", "W_hg", "W_ho",
        "b_ii", "b_if", "b_ig", "b_io", "b_hi", "b_hf", "b_hg", "b_ho",
    )  # fmt: skip
    assert W.param_names("gru") == (
        "W_ir", "W_iz", "W_in", "W_hr", "W_hz", "W_hn",
        "b_ir", "b_iz", "b_in", "b_hr", "b_hz", "b_hn",
    )  # fmt: skip
    shapes = W.param_shapes("gru", 3, 7)
    assert shapes["W_iz"] == (3, 7) and shapes["W_hn"] == (7, 7) and shapes["b_hr"] == (7,)
    assert W.torch_names(2, True) == (
        "weight_ih_l2_reverse",
        "weight_hh_l2_reverse",
        "bias_ih_l2_reverse",
        "bias_hh_l2_reverse",
    )


# --------------------------------------------------------------------------- PyTorch


@pytest.mark.parametrize("mode", MODES)
def test_from_torch_layer_blocks_and_round_trip(mode):
    rng = np.random.default_rng(1)
    g = W.num_gates(mode)
    w_ih = rng.standard_normal((g * H, I)).astype(np.float32)
    w_hh = rng.standard_normal((g * H, H)).astype(np.float32)
    b_ih = rng.standard_normal(g * H).astype(np.float32)
    b_hh = rng.standard_normal(g * H).astype(np.float32)
    p = W.from_torch_layer(mode, w_ih, w_hh, b_ih, b_hh)
    assert tuple(p) == W.param_names(mode)
    for j, gate in enumerate(W.GATES[mode]):
        assert _bits_equal(p[f"W_i{gate}"], w_ih[j * H : (j + 1) * H].T.copy())
        assert _bits_equal(p[f"W_h{gate}"], w_hh[j * H : (j + 1) * H].T.copy())
        assert _bits_equal(p[f"b_h{gate}"], b_hh[j * H : (j + 1) * H])
    for a in p.values():
        assert a.dtype == np.float32 and a.flags.c_contiguous
        assert not any(np.shares_memory(a, src) for src in (w_ih, w_hh, b_ih, b_hh))
    back = W.to_torch_layer(mode, p)
    for x, y in zip(back, (w_ih, w_hh, b_ih, b_hh), strict=True):
        assert _bits_equal(x, y) and x.flags.c_contiguous


def test_from_torch_layer_none_bias_is_zeros():
    rng = np.random.default_rng(2)
    p = W.from_torch_layer("gru", rng.standard_normal((3 * H, I)), rng.standard_normal((3 * H, H)))
    for n in W.input_bias_names("gru") + W.hidden_bias_names("gru"):
        assert p[n].dtype == np.float64 and p[n].shape == (H,) and not p[n].any()


CONFIGS = [
    (mode, layers, bidir, bias)
    for mode in MODES
    for layers in (1, 2, 3)
    for bidir in (False, True)
    for bias in (True, False)
]


@pytest.mark.parametrize("mode,num_layers,bidirectional,bias", CONFIGS)
def test_torch_state_dict_round_trip_and_flat(mode, num_layers, bidirectional, bias):
    torch = _torch()
    m = _torch_module(mode, num_layers, bidirectional, bias)
    sd = m.state_dict()
    layers = W.torch_state_dict_to_layers(mode, sd, num_layers, bidirectional)
    d = 2 if bidirectional else 1
    assert len(layers) == num_layers and all(len(r) == d for r in layers)
    in_sizes = [I] + [d * H] * (num_layers - 1)
    for k, row in enumerate(layers):
        for p in row:
            assert tuple(p) == W.param_names(mode)
            assert p[W.input_weight_names(mode)[0]].shape == (in_sizes[k], H)
            assert all(a.dtype == np.float32 for a in p.values())
    if not bias:
        assert not any(p[n].any() for r in layers for p in r for n in W.input_bias_names(mode))

    back = W.layers_to_torch_state_dict(mode, layers, bias=bias)
    assert list(back) == list(sd)  # same keys in PyTorch's order
    for k, v in sd.items():
        assert _bits_equal(back[k], v.numpy()), k
    m2 = _torch_module(mode, num_layers, bidirectional, bias, seed=1)
    m2.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()})
    for k, v in m2.state_dict().items():
        assert torch.equal(v, sd[k])

    # named_parameters() tensors require grad; they must be accepted as well.
    layers2 = W.torch_state_dict_to_layers(
        mode, dict(m.named_parameters()), num_layers, bidirectional
    )
    assert _layers_equal(layers, layers2)

    flat_torch = torch.cat([p.detach().reshape(-1) for p in m._flat_weights]).numpy()
    flat = W.to_flat(mode, layers, bias=bias)
    assert _bits_equal(flat, flat_torch)
    assert flat.size == W.flat_size(mode, I, H, num_layers, bidirectional, bias)
    again = W.from_flat(mode, flat_torch, I, H, num_layers, bidirectional, bias=bias)
    assert _layers_equal(again, layers)
    if not bias:
        # The with-bias buffer of the same weights carries explicit zero biases.
        full = W.from_flat(
            mode, W.to_flat(mode, layers), I, H, num_layers, bidirectional, bias=True
        )
        assert _layers_equal(full, layers)


@pytest.mark.parametrize("mode,num_layers,bidirectional,bias", CONFIGS)
def test_converted_params_match_torch_forward(mode, num_layers, bidirectional, bias):
    torch = _torch()
    m = _torch_module(mode, num_layers, bidirectional, bias, seed=3).double()
    layers = W.torch_state_dict_to_layers(mode, m.state_dict(), num_layers, bidirectional)
    rng = np.random.default_rng(4)
    t_len, batch, d = 3, 2, 2 if bidirectional else 1
    x = rng.standard_normal((t_len, batch, I))
    h0 = rng.standard_normal((num_layers * d, batch, H))
    c0 = rng.standard_normal((num_layers * d, batch, H)) if mode == "lstm" else None
    y, hn, cn = _rnnc_stack(mode, layers, x, h0, c0)
    with torch.no_grad():
        if mode == "lstm":
            ty, (thn, tcn) = m(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
            np.testing.assert_allclose(cn, tcn.numpy(), rtol=0, atol=1e-12)
        else:
            ty, thn = m(torch.from_numpy(x), torch.from_numpy(h0))
    np.testing.assert_allclose(y, ty.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(hn, thn.numpy(), rtol=0, atol=1e-12)


def test_flat_order_is_pseudo_layer_major():
    # Hand-built order check, independent of torch: layer 0 fwd, layer 0 rev, layer 1 fwd, ...
    rng = np.random.default_rng(5)
    mode, g = "lstm", 4
    layers = [
        [_random_params("lstm", I, H, rng), _random_params("lstm", I, H, rng)],
        [_random_params("lstm", 2 * H, H, rng), _random_params("lstm", 2 * H, H, rng)],
    ]
    flat = W.to_flat(mode, layers)
    pieces = []
    for row in layers:
        for p in row:
            pieces.append(np.concatenate([p[f"W_i{q}"].T for q in "ifgo"]).ravel())
            pieces.append(np.concatenate([p[f"W_h{q}"].T for q in "ifgo"]).ravel())
            pieces.append(np.concatenate([p[f"b_i{q}"] for q in "ifgo"]))
            pieces.append(np.concatenate([p[f"b_h{q}"] for q in "ifgo"]))
    assert _bits_equal(flat, np.concatenate(pieces))
    assert flat.size == 2 * (g * H * (I + H) + 2 * g * H) + 2 * (g * H * (2 * H + H) + 2 * g * H)


def test_flat_accepts_torch_tensor_and_keeps_dtype():
    torch = _torch()
    m = _torch_module("gru", 2, True, True)
    flat = torch.cat([p.detach().reshape(-1) for p in m._flat_weights])
    layers = W.from_flat("gru", flat, I, H, 2, True)
    assert layers[1][1]["W_in"].dtype == np.float32 and layers[1][1]["W_in"].shape == (2 * H, H)
    assert all(a.flags.c_contiguous for r in layers for p in r for a in p.values())


# --------------------------------------------------------------------------- Keras


@pytest.mark.parametrize(
    "mode,reset_after",
    [("rnn_tanh", True), ("rnn_relu", True), ("lstm", True), ("gru", True), ("gru", False)],
)
def test_keras_round_trip_bit_exact(mode, reset_after):
    rng = np.random.default_rng(6)
    g = W.num_gates(mode)
    kernel = rng.standard_normal((I, g * H)).astype(np.float32)
    rk = rng.standard_normal((H, g * H)).astype(np.float32)
    b_shape = (2, g * H) if mode == "gru" and reset_after else (g * H,)
    bias = rng.standard_normal(b_shape).astype(np.float32)
    bias.reshape(-1)[0] = -0.0  # survives the b_i + 0 export untouched
    p = W.from_keras(mode, kernel, rk, bias, reset_after=reset_after)
    assert tuple(p) == W.param_names(mode)
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in p.values())
    if not (mode == "gru" and reset_after):
        assert not any(p[n].any() for n in W.hidden_bias_names(mode))
    k2, rk2, b2 = W.to_keras(mode, p, reset_after=reset_after)
    assert _bits_equal(k2, kernel) and _bits_equal(rk2, rk) and _bits_equal(b2, bias)


def test_keras_gate_blocks():
    rng = np.random.default_rng(7)
    kernel = rng.standard_normal((I, 3 * H))
    rk = rng.standard_normal((H, 3 * H))
    bias = rng.standard_normal((2, 3 * H))
    p = W.from_keras("gru", kernel, rk, bias)
    assert _bits_equal(p["W_iz"], kernel[:, :H].copy())  # Keras GRU order is z, r, h
    assert _bits_equal(p["W_hr"], rk[:, H : 2 * H].copy())
    assert _bits_equal(p["b_hn"], bias[1, 2 * H :].copy())
    kernel = rng.standard_normal((I, 4 * H))
    p = W.from_keras("lstm", kernel, rng.standard_normal((H, 4 * H)), rng.standard_normal(4 * H))
    assert _bits_equal(p["W_ig"], kernel[:, 2 * H : 3 * H].copy())  # Keras LSTM c == rnnc g
    assert _bits_equal(p["W_io"], kernel[:, 3 * H :].copy())


def test_keras_gru_reset_after_rnnc_round_trip_bit_exact():
    rng = np.random.default_rng(8)
    p = _random_params("gru", I, H, rng)
    back = W.from_keras("gru", *W.to_keras("gru", p, reset_after=True), reset_after=True)
    assert all(_bits_equal(back[n], p[n]) for n in p)


@pytest.mark.parametrize(
    "mode,reset_after",
    [("rnn_tanh", True), ("rnn_relu", True), ("lstm", True), ("gru", True), ("gru", False)],
)
def test_keras_mapping_matches_keras_equations(mode, reset_after):
    rng = np.random.default_rng(9)
    g, batch = W.num_gates(mode), 3
    x = rng.standard_normal((batch, I))
    h = rng.standard_normal((batch, H))
    c = rng.standard_normal((batch, H))

    def keras_step(kernel, rk, bias):
        """Dispatch to the hand-written Keras cell equations."""
        if mode == "lstm":
            return _keras_lstm_step(kernel, rk, bias, x, h, c)
        if mode == "gru":
            return _keras_gru_step(kernel, rk, bias, x, h, reset_after), None
        act = np.tanh if mode == "rnn_tanh" else (lambda v: np.maximum(v, 0.0))
        return _keras_simple_rnn_step(act, kernel, rk, bias, x, h), None

    # Keras weights -> rnnc params: PyTorch-style equations agree with Keras's.
    kernel = rng.standard_normal((I, g * H))
    rk = rng.standard_normal((H, g * H))
    bias = rng.standard_normal((2, g * H) if mode == "gru" and reset_after else (g * H,))
    p = W.from_keras(mode, kernel, rk, bias, reset_after=reset_after)
    want_h, want_c = keras_step(kernel, rk, bias)
    got_h, got_c = _rnnc_step(mode, p, x, h, c, reset_after=reset_after)
    np.testing.assert_allclose(got_h, want_h, rtol=0, atol=1e-12)
    if mode == "lstm":
        np.testing.assert_allclose(got_c, want_c, rtol=0, atol=1e-12)

    # rnnc params with non-zero recurrent biases -> Keras: the summed bias is exact in meaning.
    p = _random_params(mode, I, H, rng)
    want_h, want_c = _rnnc_step(mode, p, x, h, c, reset_after=reset_after)
    got_h, got_c = keras_step(*W.to_keras(mode, p, reset_after=reset_after))
    np.testing.assert_allclose(got_h, want_h, rtol=0, atol=1e-12)
    if mode == "lstm":
        np.testing.assert_allclose(got_c, want_c, rtol=0, atol=1e-12)


def test_keras_none_bias_is_zeros():
    rng = np.random.default_rng(10)
    p = W.from_keras("lstm", rng.standard_normal((I, 4 * H)), rng.standard_normal((H, 4 * H)), None)
    assert not any(p[n].any() for n in W.input_bias_names("lstm") + W.hidden_bias_names("lstm"))


# --------------------------------------------------------------------------- errors


def test_weight_error_is_value_error():
    assert issubclass(WeightError, ValueError)


@pytest.mark.parametrize(
    "call",
    [
        lambda: W.param_names("mgu"),
        lambda: W.from_torch_layer("lstmm", np.zeros((16, 3)), np.zeros((16, 4))),
        lambda: W.to_torch_layer("gru2", {}),
        lambda: W.torch_state_dict_to_layers("rnn", {}, 1, False),
        lambda: W.from_flat("lsm", np.zeros(10), 1, 1),
        lambda: W.from_keras("GRU", np.zeros((1, 3)), np.zeros((1, 3)), None),
    ],
)
def test_unknown_mode(call):
    with pytest.raises(WeightError, match="mode: expected one of"):
        call()


def test_from_torch_layer_shape_errors():
    with pytest.raises(WeightError, match=r"weight_hh: expected shape \(4\*H, H\) = \(16, 4\)"):
        W.from_torch_layer("lstm", np.zeros((12, 3)), np.zeros((12, 4)))
    with pytest.raises(WeightError, match=r"weight_ih: expected shape \(16, 3\), got \(12, 3\)"):
        W.from_torch_layer("lstm", np.zeros((12, 3)), np.zeros((16, 4)))
    with pytest.raises(WeightError, match=r"bias_hh: expected shape \(12,\), got \(9,\)"):
        W.from_torch_layer("gru", np.zeros((12, 3)), np.zeros((12, 4)), None, np.zeros(9))
    with pytest.raises(WeightError, match="bias_ih: expected dtype float64, got float32"):
        W.from_torch_layer(
            "gru", np.zeros((12, 3)), np.zeros((12, 4)), np.zeros(12, np.float32), None
        )


def test_to_torch_layer_errors():
    rng = np.random.default_rng(11)
    p = _random_params("lstm", I, H, rng)
    missing = {k: v for k, v in p.items() if k != "b_hg"}
    with pytest.raises(WeightError, match="missing parameter 'b_hg'"):
        W.to_torch_layer("lstm", missing)
    with pytest.raises(WeightError, match="unexpected parameter 'W_xx'"):
        W.to_torch_layer("lstm", {**p, "W_xx": p["W_ii"]})
    with pytest.raises(WeightError, match=r"\['W_hf'\]: expected shape \(4, 4\), got \(4, 5\)"):
        W.to_torch_layer("lstm", {**p, "W_hf": np.zeros((4, 5))})
    with pytest.raises(WeightError, match=r"\['b_io'\]: expected dtype float64, got float32"):
        W.to_torch_layer("lstm", {**p, "b_io": p["b_io"].astype(np.float32)})


def test_state_dict_errors():
    m = _torch_module("lstm", 2, True, True)
    sd = dict(m.state_dict())
    with pytest.raises(WeightError, match="missing key 'weight_hh_l1'"):
        W.torch_state_dict_to_layers(
            "lstm", {k: v for k, v in sd.items() if k != "weight_hh_l1"}, 2, True
        )
    with pytest.raises(WeightError, match="missing key 'bias_hh_l0'.*bias=False"):
        W.torch_state_dict_to_layers(
            "lstm", {k: v for k, v in sd.items() if k != "bias_hh_l0"}, 2, True
        )
    bad = {**sd, "weight_ih_l1_reverse": np.zeros((16, 5), np.float32)}
    with pytest.raises(
        WeightError, match=r"weight_ih_l1_reverse: expected shape \(16, 8\), got \(16, 5\)"
    ):
        W.torch_state_dict_to_layers("lstm", bad, 2, True)
    with pytest.raises(WeightError, match="unexpected key 'bias_hh_l0_reverse'"):
        W.torch_state_dict_to_layers("lstm", sd, 2, False)
    with pytest.raises(WeightError, match="unexpected key 'bias_hh_l1'"):
        W.torch_state_dict_to_layers("lstm", sd, 1, True)
    with pytest.raises(WeightError, match="missing key 'weight_ih_l2'"):
        W.torch_state_dict_to_layers("lstm", sd, 3, True)
    with pytest.raises(WeightError, match=r"weight_hh_l0: expected shape \(3\*H, H\)"):
        W.torch_state_dict_to_layers("gru", sd, 2, True)  # LSTM weights read as a GRU
    with pytest.raises(WeightError, match="weight_hh_l1: expected dtype float32, got float64"):
        W.torch_state_dict_to_layers(
            "lstm", {**sd, "weight_hh_l1": sd["weight_hh_l1"].double()}, 2, True
        )
    with pytest.raises(WeightError, match="no NumPy equivalent"):
        W.torch_state_dict_to_layers("lstm", {k: v.bfloat16() for k, v in sd.items()}, 2, True)
    with pytest.raises(WeightError, match="num_layers"):
        W.torch_state_dict_to_layers("lstm", sd, 0, True)


def test_layers_errors():
    rng = np.random.default_rng(12)
    p0 = _random_params("gru", I, H, rng)
    p1 = _random_params("gru", H, H, rng)
    with pytest.raises(WeightError, match=r"layers\[1\]: expected 2 directions"):
        W.layers_to_torch_state_dict("gru", [[p0, p0], [p1]])
    with pytest.raises(WeightError, match=r"layers\[1\]\[0\]\['W_ir'\]: expected shape \(8, 4\)"):
        W.to_flat("gru", [[p0, p0], [p1, p1]])  # layer 1 of a bidirectional stack takes 2H
    with pytest.raises(WeightError, match="bias_ih_l0: bias=False needs zero biases"):
        W.layers_to_torch_state_dict("gru", [[p0]], bias=False)
    with pytest.raises(WeightError, match="non-empty list"):
        W.to_flat("gru", [])


def test_from_flat_errors():
    n = W.flat_size("gru", I, H, 2, True)
    with pytest.raises(WeightError, match=f"flat: expected length {n}.*got {n - 1}"):
        W.from_flat("gru", np.zeros(n - 1), I, H, 2, True)
    with pytest.raises(WeightError, match=r"flat: expected a 1-D array, got shape \(2, 3\)"):
        W.from_flat("gru", np.zeros((2, 3)), I, H)
    with pytest.raises(WeightError, match="hidden_size: expected an integer >= 1"):
        W.from_flat("gru", np.zeros(n), I, 0)


def test_keras_errors():
    with pytest.raises(WeightError, match=r"bias: expected shape \(2, 12\), got \(12,\)"):
        W.from_keras("gru", np.zeros((I, 12)), np.zeros((4, 12)), np.zeros(12))
    with pytest.raises(WeightError, match=r"bias: expected shape \(12,\), got \(2, 12\)"):
        W.from_keras("gru", np.zeros((I, 12)), np.zeros((4, 12)), np.zeros((2, 12)), False)
    with pytest.raises(WeightError, match=r"recurrent_kernel: expected shape \(H, 4\*H\)"):
        W.from_keras("lstm", np.zeros((I, 16)), np.zeros((4, 12)), None)
    with pytest.raises(WeightError, match=r"kernel: expected shape \(5, 16\), got \(5, 12\)"):
        W.from_keras("lstm", np.zeros((I, 12)), np.zeros((4, 16)), None)
