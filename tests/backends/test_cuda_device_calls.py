"""Device calls of the CUDA backend: device arrays in, device arrays out, nothing through the host.

In emulation the device is host memory, so a test device array is :class:`Fake`, an object
that exposes a NumPy array only through ``__cuda_array_interface__`` (as CuPy, Numba and
PyTorch CUDA tensors do). Every result is compared with the unoptimized NumPy oracle on host
copies of the same values, and the runner's transfer counters must show no host↔device bytes
for a call whose inputs and parameters are on the device. With a GPU, the same checks run on
CuPy arrays and PyTorch CUDA tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rnnc
from rnnc.errors import RnncTypeError, RnncValueError
from tests.backends.test_cuda_backend import gpu_reason

I, H, T, B = 3, 4, 5, 2
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}
GRAD_TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-9, atol=1e-11)}


class Fake:
    """A device array in emulation: host memory seen only through the CUDA interface."""

    def __init__(self, array: np.ndarray, strides: tuple[int, ...] | None = None) -> None:
        self.array = array
        self.strides = strides

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.array.shape, "typestr": self.array.dtype.str, "version": 3,
                "data": (self.array.ctypes.data, False), "strides": self.strides}


def host(value: Any) -> np.ndarray:
    """A host copy of a result, read through the CUDA interface like any consumer would."""
    cai = value.__cuda_array_interface__
    holder = type("H", (), {"__array_interface__": {**cai, "version": 3}})()
    return np.array(holder)


def _setup(name: str = "lstm", dtype: Any = np.float32, seed: int = 0):
    cell = getattr(rnnc.cells, name)(I, H)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    params = cell.init_params(seed=seed, dtype=dtype)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    return cell, fn, x, params


def _runner(fn: rnnc.Function, mode: str, dtype: Any = np.float32, masked: bool = False):
    return fn._runners[(mode, "f32" if dtype == np.float32 else "f64", masked)]


@pytest.mark.parametrize("name", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inference_on_device_arrays_matches_the_oracle_and_copies_nothing(name, dtype) -> None:
    cell, fn, x, params = _setup(name, dtype)
    ys, finals = fn(Fake(x), Fake(fn.pack(params)))
    want, want_finals = rnnc.compile(cell, optimize=False)(x, params)
    for k in want:
        assert hasattr(ys[k], "__cuda_array_interface__")
        np.testing.assert_allclose(host(ys[k]), want[k], **TOL[dtype])
    for k in want_finals:
        np.testing.assert_allclose(host(finals[k]), want_finals[k], **TOL[dtype])
    assert _runner(fn, "inference", dtype).transfers == {"to_device": 0, "to_host": 0}


def test_named_device_parameters_and_states_are_packed_on_the_device() -> None:
    cell, fn, x, params = _setup("lstm")
    rng = np.random.default_rng(1)
    states = {n: rng.standard_normal((B, H)).astype(np.float32) for n in fn.states}
    ys, finals = fn(Fake(x), {n: Fake(v) for n, v in params.items()},
                    states={n: Fake(v) for n, v in states.items()})
    want, want_finals = rnnc.compile(cell, optimize=False)(x, params, states=states)
    np.testing.assert_allclose(host(ys["y"]), want["y"], **TOL[np.float32])
    for k in want_finals:
        np.testing.assert_allclose(host(finals[k]), want_finals[k], **TOL[np.float32])
    assert _runner(fn, "inference").transfers == {"to_device": 0, "to_host": 0}


def test_host_parameters_in_a_device_call_are_uploaded_and_counted() -> None:
    cell, fn, x, params = _setup("gru")
    flat = fn.pack(params)
    ys, _ = fn(Fake(x), flat)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    np.testing.assert_allclose(host(ys["y"]), want["y"], **TOL[np.float32])
    assert _runner(fn, "inference").transfers == {"to_device": flat.nbytes, "to_host": 0}


def test_a_host_call_still_copies_in_and_out() -> None:
    cell, fn, x, params = _setup("lstm")
    ys, finals = fn(x, params)
    assert type(ys["y"]) is np.ndarray
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    np.testing.assert_allclose(ys["y"], want["y"], **TOL[np.float32])
    moved = _runner(fn, "inference").transfers
    # x, the packed parameters and two zero initial states in; y and two final states out
    assert moved["to_device"] == x.nbytes + fn.pack(params).nbytes + 2 * B * H * 4
    assert moved["to_host"] == (T * B * H + 2 * B * H) * 4


def test_lengths_add_only_the_mask_to_the_transfers() -> None:
    cell, fn, x, params = _setup("lstm")
    lengths = np.array([T, 2])
    ys, _ = fn(Fake(x), Fake(fn.pack(params)), lengths=lengths)
    want, _ = rnnc.compile(cell, optimize=False)(x, params, lengths=lengths)
    np.testing.assert_allclose(host(ys["y"]), want["y"], **TOL[np.float32])
    assert _runner(fn, "inference", masked=True).transfers == {"to_device": T * B * 4,
                                                               "to_host": 0}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_training_keeps_the_tape_and_gradients_on_the_device(dtype) -> None:
    cell, fn, x, params = _setup("lstm", dtype)
    ys, finals, tape = fn.forward(Fake(x), Fake(fn.pack(params)))
    assert all(hasattr(v, "__cuda_array_interface__") for v in tape.env.values())
    rng = np.random.default_rng(2)
    d_y = rng.standard_normal((T, B, H)).astype(dtype)
    grads = fn.backward(tape, {"y": Fake(d_y)})
    oracle = rnnc.compile(cell, optimize=False)
    _, _, want_tape = oracle.forward(x, params)
    want = oracle.backward(want_tape, {"y": d_y})
    np.testing.assert_allclose(host(grads.x), want.x, **GRAD_TOL[dtype])
    for k in want.params:
        np.testing.assert_allclose(host(grads.params[k]), want.params[k],
                                   **GRAD_TOL[dtype])
    for k in want.states:
        np.testing.assert_allclose(host(grads.states[k]), want.states[k], **GRAD_TOL[dtype])
    for mode in ("forward", "backward"):
        assert _runner(fn, mode, dtype).transfers == {"to_device": 0, "to_host": 0}, mode


def test_a_strided_device_array_is_made_contiguous_on_the_device() -> None:
    cell, fn, x, params = _setup("lstm")
    wide = np.zeros((T, B, 2 * I), np.float32)
    wide[:, :, ::2] = x
    every_other = wide[:, :, ::2]
    view = Fake(every_other, strides=every_other.strides)
    ys, _ = fn(view, Fake(fn.pack(params)))
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    np.testing.assert_allclose(host(ys["y"]), want["y"], **TOL[np.float32])


def test_an_empty_sequence_on_the_device_gives_device_results() -> None:
    cell, fn, x, params = _setup("lstm")
    ys, finals = fn(Fake(x[:0]), Fake(fn.pack(params)))
    assert host(ys["y"]).shape == (0, B, H)
    assert all(hasattr(v, "__cuda_array_interface__") for v in finals.values())


@pytest.mark.parametrize("backend", ["numpy", "llvm"])
def test_a_device_array_on_a_host_backend_is_refused(backend: str) -> None:
    cell, _, x, params = _setup("lstm")
    fn = rnnc.compile(cell, backend=backend)
    with pytest.raises(RnncTypeError, match="backend='cuda'"):
        fn(Fake(x), params)


def test_device_parameters_with_a_host_input_are_refused() -> None:
    _, fn, x, params = _setup("lstm")
    with pytest.raises(RnncTypeError, match="runs on the host"):
        fn(x, Fake(fn.pack(params)))


def test_mixed_parameters_are_refused() -> None:
    _, fn, x, params = _setup("lstm")
    mixed = {n: Fake(v) for n, v in params.items()}
    first = next(iter(params))
    mixed[first] = params[first]
    with pytest.raises(RnncTypeError, match=f"parameter {first!r} is a host array"):
        fn(Fake(x), mixed)


@pytest.mark.parametrize("bad, error, match", [
    (lambda x: Fake(x[:, :, :2].copy()), RnncValueError, r"must have 3 features"),
    (lambda x: Fake(x.astype(np.int32)), RnncTypeError, r"float32 or float64"),
    (lambda x: Fake(x[0].copy()), RnncValueError, r"shape \(T, B, 3\)"),
])
def test_bad_device_inputs_are_named(bad, error, match) -> None:
    _, fn, x, params = _setup("lstm")
    with pytest.raises(error, match=match):
        fn(bad(x), Fake(fn.pack(params)))
    assert not fn._runners  # refused before anything was built or run


def test_a_bad_device_parameter_buffer_is_named() -> None:
    _, fn, x, params = _setup("lstm")
    flat = fn.pack(params)
    with pytest.raises(RnncValueError, match="flat parameter buffer must have shape"):
        fn(Fake(x), Fake(flat[:-1].copy()))
    with pytest.raises(RnncTypeError, match="flat parameter buffer is float64"):
        fn(Fake(x), Fake(flat.astype(np.float64)))


def test_a_malformed_interface_is_named() -> None:
    _, fn, x, params = _setup("lstm")

    class Broken:
        __cuda_array_interface__ = {"shape": (T, B, I), "version": 3}

    with pytest.raises(RnncTypeError, match="malformed __cuda_array_interface__"):
        fn(Broken(), Fake(fn.pack(params)))


def test_mixed_input_sequences_are_refused() -> None:
    c = rnnc.Cell("two")
    a, b = c.input("a", I), c.input("b", I)
    h = c.state("h", H)
    W = c.param("W", (I, H))
    hn = rnnc.tanh(a @ W + b @ W) + h
    c.update(h=hn)
    c.output("y", hn)
    fn = rnnc.compile(c, backend="cuda", emulate=True)
    x = np.zeros((T, B, I), np.float32)
    with pytest.raises(RnncTypeError, match="mix device arrays and host arrays"):
        fn({"a": Fake(x), "b": x}, c.init_params())


def test_double_backward_of_a_device_call_is_refused() -> None:
    _, fn, x, params = _setup("lstm")
    _, _, tape = fn.forward(Fake(x), Fake(fn.pack(params)))
    with pytest.raises(RnncValueError, match="double_backward"):
        fn.double_backward(tape, None, None, None, None, None)


GPU = pytest.mark.skipif(gpu_reason() is not None, reason=str(gpu_reason()))


@pytest.mark.cuda
@GPU
def test_cupy_arrays_stay_on_the_gpu() -> None:
    import cupy

    cell = rnnc.cells.lstm(I, H)
    fn = rnnc.compile(cell, backend="cuda")
    rng = np.random.default_rng(0)
    x, params = rng.standard_normal((T, B, I)).astype(np.float32), cell.init_params()
    ys, finals = fn(cupy.asarray(x), cupy.asarray(fn.pack(params)))
    assert isinstance(ys["y"], cupy.ndarray)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    np.testing.assert_allclose(ys["y"].get(), want["y"], **TOL[np.float32])
    assert _runner(fn, "inference").transfers == {"to_device": 0, "to_host": 0}


@pytest.mark.cuda
@GPU
def test_torch_cuda_tensors_are_read_in_place() -> None:
    torch = pytest.importorskip("torch")
    import cupy

    cell = rnnc.cells.gru(I, H)
    fn = rnnc.compile(cell, backend="cuda")
    rng = np.random.default_rng(0)
    x, params = rng.standard_normal((T, B, I)).astype(np.float32), cell.init_params()
    ys, _ = fn(torch.from_numpy(x).cuda(), torch.from_numpy(fn.pack(params)).cuda())
    assert isinstance(ys["y"], cupy.ndarray)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    np.testing.assert_allclose(ys["y"].get(), want["y"], **TOL[np.float32])
    assert _runner(fn, "inference").transfers == {"to_device": 0, "to_host": 0}
