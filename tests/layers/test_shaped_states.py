"""rnnc.RNN over cells whose states have feature shapes (sLSTM's (heads, d), an SSM's (D, N)).

Every result is checked against ``shaped_oracle``: the unoptimized NumPy cell run sequence by
sequence and composed into layers and directions by hand, forward and backward, in float64.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import rnnc
from rnnc.errors import CellError, RnncValueError
from tests.layers.shaped_oracle import Oracle

T, B = 4, 3
LENGTHS = np.array([4, 2, 3])  # unsorted, with a full-length sequence
TOL = dict(rtol=1e-9, atol=1e-11)  # float64


def slstm2(input_size: int, hidden_size: int) -> rnnc.Cell:
    """sLSTM with two heads: states h, c, n, m of shape (2, hidden_size / 2)."""
    return rnnc.cells.slstm(input_size, hidden_size, heads=2)


def ssm_block(input_size: int, hidden_size: int) -> rnnc.Cell:
    """``rnnc.cells.selective_ssm``'s step after an input projection to ``hidden_size``
    channels, so that its (hidden_size, 3) state is the same in every layer of a stack."""
    D, N = hidden_size, 3
    c = rnnc.Cell("ssm_block")
    x_in = c.input("x", input_size)
    h = c.state("h", (D, N))
    W_in = c.param("W_in", (input_size, D))
    W_dt, b_dt = c.param("W_dt", (D, D)), c.param("b_dt", (D,))
    W_B, W_C = c.param("W_B", (D, N)), c.param("W_C", (D, N))
    A_log = c.param("A_log", (D, N))
    x = x_in @ W_in
    dt = rnnc.softplus(x @ W_dt + b_dt)
    Bt, Ct = x @ W_B, x @ W_C
    h_new = rnnc.exp(dt[:, :, None] * -rnnc.exp(A_log)) * h \
        + (dt * x)[:, :, None] * Bt[:, None, :]
    c.update(h=h_new)
    c.output("y", (h_new * Ct[:, None, :]).sum(-1))
    return c


def ssm(input_size: int, hidden_size: int) -> rnnc.Cell:
    """The published selective SSM, ``input_size`` channels of 2 states each."""
    return rnnc.cells.selective_ssm(input_size, state_size=2)


def initial_states(layer: rnnc.RNN, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random initial states ``(L*D, B, *shape)``; sLSTM's normalizer n positive."""
    LD = layer.num_layers * layer.num_directions
    out = {n: rng.standard_normal((LD, B, *s)) for n, s in layer.state_shapes.items()}
    if "n" in out:
        out["n"] = rng.uniform(0.5, 1.5, out["n"].shape)
    return out


def check_against_the_oracle(layer: rnnc.RNN, factory, wrap=lambda a: a,
                             host=lambda a: a) -> None:
    """Forward (with the tape's dropout masks) and every gradient of ``layer`` on random
    data, lengths and initial states, against the composed cells; ``wrap`` makes the call's
    arrays (a device call's) and ``host`` reads its results back."""
    I, L = layer.input_size, layer.num_layers
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, B, I))
    init = initial_states(layer, rng)
    caller = (lambda a: a.transpose(1, 0, 2)) if layer.batch_first else (lambda a: a)
    y, final, tape = layer.forward(wrap(caller(x)), LENGTHS, {n: wrap(a) for n, a in init.items()})
    assert {n: a.shape[2:] for n, a in final.items()} == layer.state_shapes

    oracle = Oracle(factory, I, layer.hidden_size, L, layer.num_directions)
    masks = [None if m is None else host(m) for m in tape.dropout_masks]
    want = oracle.forward(x, LENGTHS, layer.params, init, masks)
    if layer.dropout:  # the masks are dropout's (zeros and 1 / (1 - p)), not ones
        assert any(0 < (m == 0).mean() < 1 for m in masks)
    np.testing.assert_allclose(caller(host(y)), want.y, **TOL)
    for n, a in want.final.items():
        np.testing.assert_allclose(host(final[n]), a, **TOL, err_msg=n)

    d_y = rng.standard_normal(want.y.shape)
    d_final = {n: rng.standard_normal(a.shape) for n, a in want.final.items()}
    grads = layer.backward(tape, wrap(caller(d_y)), {n: wrap(a) for n, a in d_final.items()})
    in_sizes = [layer.layer_input_size(k) for k in range(L)]
    g_x, g_params, g_init = oracle.backward(want, LENGTHS, d_y, d_final, in_sizes, masks)
    np.testing.assert_allclose(caller(host(grads.x)), g_x, **TOL)
    for n, a in g_init.items():
        assert np.abs(a).max() > 0  # every initial state reaches the loss
        np.testing.assert_allclose(host(grads.states[n]), a, **TOL, err_msg=n)
    for k in range(L):
        for d in range(layer.num_directions):
            assert grads.params[k][d].keys() == g_params[k][d].keys()
            for n, a in g_params[k][d].items():
                np.testing.assert_allclose(host(grads.params[k][d][n]), a, **TOL,
                                           err_msg=f"{n} of layer {k} direction {d}")


CASES = {  # factory, input size, hidden size, layers, bidirectional, dropout, batch_first
    "slstm": (slstm2, 3, 4, 2, True, 0.4, False),
    "ssm_block": (ssm_block, 3, 2, 2, True, 0.0, True),
    "selective_ssm": (ssm, 2, 2, 2, False, 0.0, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_layers_of_shaped_states_match_the_composed_cells(case):
    factory, I, H, L, bidir, dropout, batch_first = CASES[case]
    layer = rnnc.RNN(factory, I, H, num_layers=L, bidirectional=bidir, dropout=dropout,
                     batch_first=batch_first, backend="numpy", seed=1, dtype=np.float64)
    check_against_the_oracle(layer, factory)


def test_device_calls_match_the_composed_cells():
    """A device call (emulated CUDA): the glue keeps the states' shapes on the device too."""
    from rnnc.backends.cuda.device import EmulatedArray
    from tests.backends.test_cuda_device_calls import Fake, host

    layer = rnnc.RNN(slstm2, 3, 4, bidirectional=True, backend="cuda", emulate=True, seed=5,
                     dtype=np.float64)

    def on_host(a):
        assert isinstance(a, EmulatedArray)  # every result stays on the device
        return host(a)

    check_against_the_oracle(layer, slstm2, Fake, on_host)


def test_default_backend_inference_matches_the_composed_cells():
    """The default backend's programs (LLVM here), forward only: compiling their backward
    programs too would cost seconds; the glue is the one checked above."""
    layer = rnnc.RNN(slstm2, 3, 4, num_layers=2, bidirectional=True, seed=3,
                     dtype=np.float64)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, B, 3))
    init = initial_states(layer, rng)
    y, final = layer(x, LENGTHS, init)
    want = Oracle(slstm2, 3, 4, 2, 2).forward(x, LENGTHS, layer.params, init)
    np.testing.assert_allclose(y, want.y, **TOL)
    for n, a in want.final.items():
        np.testing.assert_allclose(final[n], a, **TOL, err_msg=n)
    # an empty batch keeps the states' feature shapes too
    _, empty = layer(np.zeros((T, 0, 3)))
    assert {n: a.shape for n, a in empty.items()} == {n: (4, 0, 2, 2) for n in "hcnm"}


def test_a_state_of_the_wrong_shape_names_the_state_and_both_shapes():
    layer = rnnc.RNN(slstm2, 3, 4, num_layers=2, backend="numpy", dtype=np.float64)
    x = np.zeros((T, B, 3))
    with pytest.raises(RnncValueError,
                       match=r"state 'c' must have shape \(num_layers \* directions, B, "
                             r"\*feature shape\) = \(2, 3, 2, 2\), got \(2, 3, 4\)"):
        layer(x, states={"c": np.zeros((2, B, 4))})  # flattened
    with pytest.raises(RnncValueError, match=r"state 'h'.*\(2, 3, 2, 2\), got \(2, 3, 2, 3\)"):
        layer(x, states={"h": np.zeros((2, B, 2, 3))})
    _, _, tape = layer.forward(x)
    with pytest.raises(RnncValueError,
                       match=r"state gradient 'm'.*\(2, 3, 2, 2\), got \(2, 3, 4\)"):
        layer.backward(tape, None, {"m": np.zeros((2, B, 4))})


def test_cells_whose_states_differ_between_layers_do_not_stack():
    def factory(input_size, hidden_size):  # two heads in layer 0, one above it
        return rnnc.cells.slstm(input_size, hidden_size, heads=2 if input_size == 3 else 1)

    with pytest.raises(CellError, match=r"for input size 4 its states are \{'h': \(1, 4\), "
                                        r".*for input size 3 \{'h': \(2, 2\)"):
        rnnc.RNN(factory, 3, 4, num_layers=2, backend="numpy")


def test_a_layer_pickled_before_shaped_states_loads():
    layer = rnnc.RNN("gru", 3, 4, backend="numpy")
    state = layer.__getstate__()
    del state["state_shapes"]  # what a layer pickled by the earlier rnnc holds
    loaded = rnnc.RNN.__new__(rnnc.RNN)
    loaded.__setstate__(state)
    assert loaded.state_shapes == {"h": (4,)} and loaded.state_sizes == {"h": 4}
    x = np.ones((T, B, 3), np.float32)
    np.testing.assert_array_equal(loaded(x)[0], layer(x)[0])
    assert pickle.loads(pickle.dumps(layer)).state_shapes == {"h": (4,)}
