"""rnnc.RNN device calls on the CUDA backend: the layer glue stays on the device.

In emulation a device array is an object exposing host memory only through
``__cuda_array_interface__`` (:class:`Fake`). A two-layer bidirectional layer with lengths
and dropout runs forward and backward on such inputs; every result must be a device array,
equal to the same layer on the unoptimized NumPy oracle with host inputs (and to PyTorch
without dropout), and the host<->device byte counters must show only what
``docs/device-calls.md`` lists: the lengths and dropout draws the layer uploads, the length
masks each cell call uploads, host parameters the first time they are seen.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

import rnnc
from rnnc.backends.cuda.device import EmulatedArray
from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.names import MASK
from tests.backends.test_cuda_backend import gpu_reason
from tests.backends.test_cuda_device_calls import Fake, host

I, H, T, B, L, D = 3, 2, 5, 3, 2, 2  # I and H of tests.rnnc.test_layers
LENGTHS = np.array([5, 2, 4])
P = 0.4
TOL = {np.float32: dict(rtol=2e-4, atol=2e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}


def fake(tree: Any) -> Any:
    """Host arrays (in dicts and lists) as device arrays."""
    if isinstance(tree, dict):
        return {k: fake(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [fake(v) for v in tree]
    return Fake(np.ascontiguousarray(tree))


def is_device(value: Any) -> bool:
    return isinstance(value, EmulatedArray)


def layers(mode: str, dtype: Any, dropout: float = P, **kw: Any) -> tuple[rnnc.RNN, rnnc.RNN]:
    """The layer on the emulated CUDA backend, and the same layer on the NumPy oracle."""
    args = dict(num_layers=L, bidirectional=True, dropout=dropout, seed=5, dtype=dtype, **kw)
    device = rnnc.RNN(mode, I, H, backend="cuda", emulate=True, **args)
    oracle = rnnc.RNN(mode, I, H, backend="numpy", optimize=False, **args)
    oracle.params = copy.deepcopy(device.params)
    return device, oracle


def data(mode: str, dtype: Any, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    names = ("h", "c") if mode == "lstm" else ("h",)
    return {"x": rng.standard_normal((T, B, I)).astype(dtype),
            "states": {n: rng.standard_normal((L * D, B, H)).astype(dtype) for n in names},
            "d_y": rng.standard_normal((T, B, D * H)).astype(dtype),
            "d_states": {n: rng.standard_normal((L * D, B, H)).astype(dtype) for n in names}}


def assert_device_close(got: Any, want: np.ndarray, tol: dict, what: str) -> None:
    assert is_device(got), f"{what} is a {type(got).__name__}, not a device array"
    np.testing.assert_allclose(host(got), want, **tol, err_msg=what)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forward_and_backward_stay_on_the_device_and_match_the_oracle(mode, dtype,
                                                                      runner_copies) -> None:
    device, oracle = layers(mode, dtype)
    v, tol = data(mode, dtype), TOL[dtype]
    y, final, tape = device.forward(Fake(v["x"]), LENGTHS, fake(v["states"]),
                                    params=fake(device.params), rng=np.random.default_rng(9))
    glue_forward = dict(device.transfers)
    g = device.backward(tape, Fake(v["d_y"]), fake(v["d_states"]))
    want_y, want_final, want_tape = oracle.forward(v["x"], LENGTHS, v["states"],
                                                   rng=np.random.default_rng(9))
    want = oracle.backward(want_tape, v["d_y"], v["d_states"])
    assert_device_close(y, want_y, tol, "y")
    for n in want_final:
        assert_device_close(final[n], want_final[n], tol, f"final state {n}")
        assert_device_close(g.states[n], want.states[n], tol, f"state gradient {n}")
    assert_device_close(g.x, want.x, tol, "x gradient")
    for k in range(L):
        for d in range(D):
            for n, a in want.params[k][d].items():
                assert_device_close(g.params[k][d][n], a, tol, f"params[{k}][{d}][{n}]")
    # The same draws give the same dropout masks on both sides.
    assert len(tape.dropout_masks) == L - 1
    for got_mask, want_mask in zip(tape.dropout_masks, want_tape.dropout_masks, strict=True):
        assert is_device(got_mask)
        np.testing.assert_array_equal(host(got_mask), want_mask)
    assert all(is_device(a) for row in tape.tapes for t in row for n, a in t.env.items()
               if n != MASK)  # the length mask each cell call uploads
    # The layer's own copies: the lengths (B int64) and each dropout draw (a byte per element)
    # in forward, the lengths again in backward; nothing back to the host.
    assert glue_forward == {"to_device": B * 8 + (L - 1) * T * B * D * H, "to_host": 0}
    assert device.transfers == {"to_device": B * 8, "to_host": 0}
    # Each cell call's copies: only its length mask, T x B values of the dtype.
    mask = T * B * np.dtype(dtype).itemsize
    assert runner_copies == [{"to_device": mask, "to_host": 0}] * (2 * L * D)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_the_device_path_matches_torch(mode) -> None:
    pytest.importorskip("torch")
    from tests.rnnc.test_layers import torch_module, torch_reference

    module = torch_module(mode, L, True, False)
    device, _ = layers(mode, np.float64, dropout=0.0)
    device.load_torch(module)
    v = data(mode, np.float64, seed=1)
    valid = (np.arange(T)[:, None] < LENGTHS[None, :])[:, :, None]
    d_y = v["d_y"] * valid  # torch's packed output has nothing to differentiate past a length
    y_ref, st_ref, gx_ref, gst_ref, gp_ref = torch_reference(
        module, v["x"], LENGTHS, v["states"], d_y, v["d_states"], False)
    y, final, tape = device.forward(Fake(v["x"]), LENGTHS, fake(v["states"]))
    g = device.backward(tape, Fake(d_y), fake(v["d_states"]))
    tol = dict(rtol=0, atol=1e-9)
    assert_device_close(y, y_ref, tol, "y")
    assert_device_close(g.x, gx_ref, tol, "x gradient")
    for n in st_ref:
        assert_device_close(final[n], st_ref[n], tol, f"final state {n}")
        assert_device_close(g.states[n], gst_ref[n], tol, f"state gradient {n}")
    host_grads = [[{n: host(a) for n, a in p.items()} for p in row] for row in g.params]
    got = rnnc.interop.weights.layers_to_torch_state_dict(mode, host_grads)
    for n, a in got.items():
        np.testing.assert_allclose(a, gp_ref[n], **tol, err_msg=n)


def test_host_parameters_are_uploaded_once_and_again_after_a_change(runner_copies) -> None:
    device, oracle = layers("gru", np.float32, dropout=0.0)
    v = data("gru", np.float32)
    flat_bytes = sum(device.function(k, d).pack(device.params[k][d]).nbytes
                     for k in range(L) for d in range(D))
    device(Fake(v["x"]))
    assert device.transfers == {"to_device": flat_bytes, "to_host": 0}
    y, _ = device(Fake(v["x"]))
    assert device.transfers == {"to_device": 0, "to_host": 0}
    assert runner_copies[-L * D:] == [{"to_device": 0, "to_host": 0}] * (L * D)
    device.params[1][0]["W_hz"] *= 2  # an optimizer's in-place step
    oracle.params[1][0]["W_hz"] *= 2
    y, _ = device(Fake(v["x"]))
    changed = device.function(1, 0).pack(device.params[1][0]).nbytes
    assert device.transfers == {"to_device": changed, "to_host": 0}
    assert_device_close(y, oracle(v["x"])[0], TOL[np.float32], "y after the change")


def test_host_states_and_cotangents_are_uploaded_and_counted() -> None:
    device, oracle = layers("lstm", np.float64, dropout=0.0, batch_first=True)
    v = data("lstm", np.float64)
    x = v["x"].transpose(1, 0, 2).copy()
    y, final, tape = device.forward(Fake(x), states=v["states"], params=fake(device.params))
    state_bytes = sum(a.nbytes for a in v["states"].values())
    assert device.transfers["to_device"] == state_bytes
    d_y = v["d_y"].transpose(1, 0, 2).copy()
    g = device.backward(tape, d_y, v["d_states"])
    assert device.transfers["to_device"] == d_y.nbytes + state_bytes
    want_y, _, want_tape = oracle.forward(x, states=v["states"])
    want = oracle.backward(want_tape, d_y, v["d_states"])
    assert_device_close(y, want_y, TOL[np.float64], "y")
    assert_device_close(g.x, want.x, TOL[np.float64], "x gradient")


def test_host_inputs_keep_the_host_path() -> None:
    device, oracle = layers("gru", np.float32)
    v = data("gru", np.float32)
    y, final, tape = device.forward(v["x"], LENGTHS, rng=np.random.default_rng(3))
    assert type(y) is np.ndarray and tape.device is None
    assert all(type(m) is np.ndarray for m in tape.dropout_masks)
    want_y, _, _ = oracle.forward(v["x"], LENGTHS, rng=np.random.default_rng(3))
    np.testing.assert_allclose(y, want_y, **TOL[np.float32])
    g = device.backward(tape, v["d_y"])
    assert type(g.x) is np.ndarray and type(g.params[0][0]["W_ir"]) is np.ndarray
    assert device.transfers == {"to_device": 0, "to_host": 0}


def two_inputs(n_in: int, n_h: int) -> rnnc.Cell:
    """h' = tanh(x W + u V + h U): a cell with the extra input u."""
    c = rnnc.Cell("two_inputs")
    x, u, h = c.input("x", n_in), c.input("u", 2), c.state("h", n_h)
    W, V, U = c.param("W", (n_in, n_h)), c.param("V", (2, n_h)), c.param("U", (n_h, n_h))
    h_new = rnnc.tanh(x @ W + u @ V + h @ U)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def test_extra_inputs_on_the_device_match_the_oracle() -> None:
    device, oracle = layers(two_inputs, np.float64, extra_inputs="first")
    rng = np.random.default_rng(4)
    x, u = rng.standard_normal((T, B, I)), rng.standard_normal((T, B, 2))
    y, _, tape = device.forward(Fake(x), LENGTHS, extra={"u": Fake(u)},
                                rng=np.random.default_rng(0))
    d_y = rng.standard_normal((T, B, D * H))
    g = device.backward(tape, Fake(d_y))
    want_y, _, want_tape = oracle.forward(x, LENGTHS, extra={"u": u},
                                          rng=np.random.default_rng(0))
    want = oracle.backward(want_tape, d_y)
    assert_device_close(y, want_y, TOL[np.float64], "y")
    assert_device_close(g.extra["u"], want.extra["u"], TOL[np.float64], "u gradient")


def test_mixed_input_sequences_are_refused() -> None:
    device, _ = layers(two_inputs, np.float32)
    x, u = np.zeros((T, B, I), np.float32), np.zeros((T, B, 2), np.float32)
    with pytest.raises(RnncTypeError, match="x is a device array .* extra input 'u' is a host"):
        device(Fake(x), extra={"u": u})
    with pytest.raises(RnncTypeError, match="extra input 'u' is a device array .* x is a host"):
        device(x, extra={"u": Fake(u)})


def test_device_parameters_with_host_inputs_and_mixed_parameters_are_refused() -> None:
    device, _ = layers("gru", np.float32)
    x = np.zeros((T, B, I), np.float32)
    with pytest.raises(RnncTypeError, match="device array"):
        device(x, states={"h": Fake(np.zeros((L * D, B, H), np.float32))})
    with pytest.raises(RnncTypeError, match="device array"):
        device.forward(x, params=fake(device.params))
    mixed = fake(device.params)
    mixed[0][1]["W_ir"] = device.params[0][1]["W_ir"]
    with pytest.raises(RnncTypeError, match="parameter 'W_ir' is a host array"):
        device.forward(Fake(x), params=mixed)


def test_device_lengths_are_refused() -> None:
    device, _ = layers("gru", np.float32)
    with pytest.raises(RnncTypeError, match="lengths are a device array"):
        device(Fake(np.zeros((T, B, I), np.float32)), Fake(LENGTHS))


def test_double_backward_of_a_device_tape_is_refused() -> None:
    device, _ = layers("gru", np.float64, dropout=0.0)
    x = np.zeros((T, B, I))
    _, _, tape = device.forward(Fake(x))
    with pytest.raises(RnncValueError, match="double_backward of a device call"):
        device.double_backward(tape, np.zeros((T, B, D * H)), {}, x, device.params, {})


def test_an_empty_batch_on_the_device_gives_device_results() -> None:
    device, _ = layers("lstm", np.float32)
    y, final, tape = device.forward(Fake(np.zeros((T, 0, I), np.float32)))
    assert is_device(y) and host(y).shape == (T, 0, D * H)
    assert all(is_device(a) for a in final.values())
    g = device.backward(tape)
    assert is_device(g.x) and is_device(g.params[0][0]["W_ii"])


@pytest.mark.cuda
@pytest.mark.skipif(gpu_reason() is not None, reason=str(gpu_reason()))
def test_cupy_arrays_stay_on_the_gpu_through_the_layer(runner_copies) -> None:
    import cupy

    args = dict(num_layers=L, bidirectional=True, dropout=P, seed=5, dtype=np.float64)
    device = rnnc.RNN("lstm", I, H, backend="cuda", **args)
    oracle = rnnc.RNN("lstm", I, H, backend="numpy", optimize=False, **args)
    oracle.params = copy.deepcopy(device.params)
    v = data("lstm", np.float64)
    on_gpu = [[{n: cupy.asarray(a) for n, a in p.items()} for p in row] for row in device.params]
    y, final, tape = device.forward(cupy.asarray(v["x"]), LENGTHS, params=on_gpu,
                                    rng=np.random.default_rng(9))
    g = device.backward(tape, cupy.asarray(v["d_y"]))
    want_y, _, want_tape = oracle.forward(v["x"], LENGTHS, rng=np.random.default_rng(9))
    want = oracle.backward(want_tape, v["d_y"])
    assert isinstance(y, cupy.ndarray) and isinstance(g.x, cupy.ndarray)
    np.testing.assert_allclose(y.get(), want_y, **TOL[np.float64])
    np.testing.assert_allclose(g.x.get(), want.x, **TOL[np.float64])
    assert device.transfers == {"to_device": B * 8, "to_host": 0}
    assert all(c == {"to_device": T * B * 8, "to_host": 0} for c in runner_copies)
