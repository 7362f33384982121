"""The default backend on device data: a CUDA twin of the function, in CUDA emulation.

``settings.DEVICE_BACKEND_OPTIONS = {"emulate": True}`` makes the twin an emulated CUDA
function, and :class:`Fake` (tests.backends.test_cuda_device_calls) an emulated device array.
Results and gradients are compared with the unoptimized NumPy oracle on the same host values.
"""

from __future__ import annotations

import pickle
import threading
from collections import OrderedDict

import numpy as np
import pytest

import rnnc
from rnnc import settings
from rnnc.backends.cuda.device import EmulatedArray
from rnnc.errors import RnncValueError
from rnnc.layers import rnn as rnn_layer
from tests.backends.test_cuda_device_calls import Fake, host

I, H, T, B = 3, 4, 5, 2
TOL = dict(rtol=1e-10, atol=1e-12)  # float64


@pytest.fixture(autouse=True)
def emulated_twins(monkeypatch) -> None:
    monkeypatch.setattr(settings, "DEVICE_BACKEND_OPTIONS", {"emulate": True})
    # Layers share standard cells' functions, and so their twins: start from none.
    monkeypatch.setattr(rnn_layer, "_CACHE", OrderedDict())


def _setup(name: str = "lstm", seed: int = 0):
    cell = getattr(rnnc.cells, name)(I, H)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I))
    d_y = rng.standard_normal((T, B, H))
    return cell, x, d_y, cell.init_params(seed=seed, dtype=np.float64)


def test_device_calls_of_a_default_function_run_on_its_cuda_twin() -> None:
    cell, x, d_y, params = _setup("lstm")
    fn = rnnc.compile(cell)
    assert fn.backend.name == "llvm"
    flat = Fake(fn.pack(params))
    ys, finals = fn(Fake(x), flat)
    twin = fn._device_twin.function
    assert twin.backend.name == "cuda" and twin.backend.emulate
    oracle = rnnc.compile(cell, optimize=False)
    want, want_finals = oracle(x, params)
    assert isinstance(ys["y"], EmulatedArray)
    np.testing.assert_allclose(host(ys["y"]), want["y"], **TOL)
    for n in want_finals:
        np.testing.assert_allclose(host(finals[n]), want_finals[n], **TOL)
    # training: the twin records the tape, and fn hands it back to the twin
    _, _, tape = fn.forward(Fake(x), flat)
    assert tape.owner is twin and fn._device_twin.function is twin  # built once
    grads = fn.backward(tape, {"y": Fake(d_y)})
    _, _, want_tape = oracle.forward(x, params)
    want_grads = oracle.backward(want_tape, {"y": d_y})
    np.testing.assert_allclose(host(grads.x), want_grads.x, **TOL)
    for n in want_grads.params:
        np.testing.assert_allclose(host(grads.params[n]), want_grads.params[n], **TOL)
    for n in want_grads.states:
        np.testing.assert_allclose(host(grads.states[n]), want_grads.states[n], **TOL)
    # host calls of the same function still run on LLVM, with host tapes
    _, _, host_tape = fn.forward(x, params)
    assert host_tape.owner is fn
    np.testing.assert_allclose(fn.backward(host_tape, {"y": d_y}).x, want_grads.x, **TOL)


def test_a_twins_tape_goes_to_the_twin_and_no_other_function() -> None:
    cell, x, d_y, params = _setup("gru")
    fn, other = rnnc.compile(cell), rnnc.compile(cell)
    _, _, tape = fn.forward(Fake(x), params)  # host parameters are uploaded
    with pytest.raises(RnncValueError, match="recorded by another compiled function"):
        other.backward(tape, {"y": Fake(d_y)})
    # the twin's own answer, not "another function's tape"
    with pytest.raises(RnncValueError, match="double_backward\\(\\) of a device call"):
        fn.double_backward(tape, {"y": Fake(d_y)}, None, None, None, None)


def test_threads_making_their_first_device_calls_at_once_build_one_twin(monkeypatch) -> None:
    cell, x, _, params = _setup("rnn")
    fn = rnnc.compile(cell)
    builds, real = [], settings.device_backend_options
    monkeypatch.setattr(settings, "device_backend_options",
                        lambda: builds.append(1) or real())  # read once per twin built
    start, results = threading.Barrier(4), [None] * 4

    def call(i: int) -> None:
        start.wait()
        results[i] = host(fn(Fake(x), Fake(fn.pack(params)))[0]["y"])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    want = rnnc.compile(cell, optimize=False)(x, params)[0]["y"]
    for got in results:
        np.testing.assert_allclose(got, want, **TOL)


def test_a_pickled_default_function_keeps_its_default() -> None:
    cell, x, _, params = _setup("rnn")
    loaded = pickle.loads(pickle.dumps(rnnc.compile(cell)))
    assert loaded.backend.name == "llvm"
    ys, _ = loaded(Fake(x), params)
    want = rnnc.compile(cell, optimize=False)(x, params)[0]["y"]
    np.testing.assert_allclose(host(ys["y"]), want, **TOL)


def test_a_default_layer_runs_device_calls_on_cuda_twins() -> None:
    args = dict(num_layers=2, bidirectional=True, seed=3, dtype=np.float64)
    layer = rnnc.RNN("gru", I, H, **args)
    assert layer.backend == "llvm"
    oracle = rnnc.RNN("gru", I, H, backend="numpy", optimize=False, **args)
    oracle.params = layer.params
    _, x, _, _ = _setup()
    d_y = np.random.default_rng(4).standard_normal((T, B, 2 * H))
    lengths = np.array([T, 3])
    y, final, tape = layer.forward(Fake(x), lengths)
    grads = layer.backward(tape, Fake(d_y))
    want_y, want_final, want_tape = oracle.forward(x, lengths)
    want = oracle.backward(want_tape, d_y)
    assert isinstance(y, EmulatedArray) and isinstance(grads.x, EmulatedArray)
    np.testing.assert_allclose(host(y), want_y, **TOL)
    np.testing.assert_allclose(host(final["h"]), want_final["h"], **TOL)
    np.testing.assert_allclose(host(grads.x), want.x, **TOL)
    for k in range(2):
        for d in range(2):
            for n, a in want.params[k][d].items():
                np.testing.assert_allclose(host(grads.params[k][d][n]), a, **TOL)
    assert all(t.owner is layer.function(k, d)._device_twin.function
               for k, row in enumerate(tape.tapes) for d, t in enumerate(row))
    # host calls of the same layer run on LLVM
    np.testing.assert_allclose(layer(x, lengths)[0], want_y, **TOL)
