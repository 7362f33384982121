"""Bad input to fn.backward: each is an rnnc.RnncError subclass whose message names the problem."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc

T, B, I, H = 3, 2, 2, 4


@pytest.fixture(scope="module")
def lstm():
    cell = rnnc.cells.lstm(I, H)
    fn = rnnc.compile(cell, backend="numpy")
    params = cell.init_params(seed=0, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((T, B, I))
    _, _, tape = fn.forward(x, params)
    return fn, tape


def dy(shape=(T, B, H), dtype=np.float64) -> np.ndarray:
    return np.ones(shape, dtype)


@pytest.mark.parametrize("shape", [(T + 1, B, H), (T, B + 1, H), (T, B, H + 1), (T, B), (B, H)],
                         ids=["T", "B", "features", "rank2", "no-time"])
def test_output_gradient_of_wrong_shape(lstm, shape) -> None:
    fn, tape = lstm
    with pytest.raises(rnnc.RnncValueError) as err:
        fn.backward(tape, d_outputs={"y": dy(shape)})
    msg = str(err.value)
    assert "'y'" in msg and str((T, B, H)) in msg and str(shape) in msg, msg


def test_state_gradient_of_wrong_shape(lstm) -> None:
    fn, tape = lstm
    with pytest.raises(rnnc.RnncValueError) as err:
        fn.backward(tape, d_states={"c": np.ones((B, H + 1))})
    msg = str(err.value)
    assert "'c'" in msg and str((B, H)) in msg and str((B, H + 1)) in msg, msg


def test_unknown_output_name(lstm) -> None:
    fn, tape = lstm
    with pytest.raises(rnnc.RnncValueError) as err:
        fn.backward(tape, d_outputs={"y": dy(), "h": dy()})
    msg = str(err.value)
    assert "'h'" in msg and "output" in msg and "y" in msg, msg


def test_unknown_state_name(lstm) -> None:
    fn, tape = lstm
    with pytest.raises(rnnc.RnncValueError) as err:
        fn.backward(tape, d_states={"cell": np.ones((B, H))})
    msg = str(err.value)
    assert "'cell'" in msg and "state" in msg and "'c'" in msg and "'h'" in msg, msg


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.complex128])
def test_output_gradient_of_wrong_dtype(lstm, dtype) -> None:
    fn, tape = lstm  # the tape is float64
    with pytest.raises(rnnc.RnncTypeError) as err:
        fn.backward(tape, d_outputs={"y": dy(dtype=dtype)})
    msg = str(err.value)
    assert "'y'" in msg and np.dtype(dtype).name in msg, msg


def test_state_gradient_of_wrong_dtype(lstm) -> None:
    fn, tape = lstm
    with pytest.raises(rnnc.RnncTypeError) as err:
        fn.backward(tape, d_states={"h": np.ones((B, H), np.float32)})
    msg = str(err.value)
    assert "'h'" in msg and "float32" in msg and "float64" in msg, msg


def test_upstream_gradients_not_a_dict(lstm) -> None:
    fn, tape = lstm
    with pytest.raises(rnnc.RnncTypeError) as err:
        fn.backward(tape, d_outputs=dy())
    assert "dict" in str(err.value), str(err.value)


def test_tape_from_another_function(lstm) -> None:
    fn, tape = lstm
    twin = rnnc.compile(rnnc.cells.lstm(I, H), backend="numpy")  # same cell, other function
    with pytest.raises(rnnc.RnncValueError) as err:
        twin.backward(tape, d_outputs={"y": dy()})
    assert "tape" in str(err.value) and "another" in str(err.value), str(err.value)


@pytest.mark.parametrize("not_a_tape", [None, {"env": {}}, np.zeros(3), "tape"],
                         ids=["None", "dict", "array", "str"])
def test_not_a_tape(lstm, not_a_tape) -> None:
    fn, _ = lstm
    with pytest.raises(rnnc.RnncTypeError) as err:
        fn.backward(not_a_tape, d_outputs={"y": dy()})
    msg = str(err.value)
    assert "tape" in msg and type(not_a_tape).__name__ in msg, msg


def test_errors_are_also_builtin_errors(lstm) -> None:
    """Callers that catch ValueError / TypeError still catch rnnc's errors."""
    fn, tape = lstm
    with pytest.raises(ValueError):
        fn.backward(tape, d_outputs={"nope": dy()})
    with pytest.raises(TypeError):
        fn.backward("not a tape")


def test_a_failed_backward_leaves_the_tape_usable(lstm) -> None:
    fn, tape = lstm
    good = fn.backward(tape, d_outputs={"y": dy()})
    with pytest.raises(rnnc.RnncError):
        fn.backward(tape, d_outputs={"y": dy((T, B, H + 1))})
    again = fn.backward(tape, d_outputs={"y": dy()})
    np.testing.assert_array_equal(good.x, again.x)
