"""Messages for the mistakes a first hour makes: each says what to write instead."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.errors import RnncTypeError, RnncValueError


def ln_lstm(input_size, hidden_size):
    c = rnnc.Cell("ln_lstm")
    x, h = c.input("x", input_size), c.state("h", hidden_size)
    W = c.param("W", (input_size, hidden_size))
    new = rnnc.layer_norm(rnnc.tanh(x @ W + h))
    c.update(h=new)
    c.output("y", new)
    return c


def test_a_cell_where_a_factory_is_expected_says_pass_the_factory() -> None:
    with pytest.raises(RnncTypeError, match=r"mode is a Cell \('ln_lstm'\).*"
                                            r"rnnc\.RNN\(ln_lstm, 16, 64\), not "
                                            r"rnnc\.RNN\(ln_lstm\(16, 64\)"):
        rnnc.RNN(ln_lstm(16, 64), 16, 64, backend="numpy")
    torch_rnn = pytest.importorskip("rnnc.interop.torch").RNN
    with pytest.raises(RnncTypeError, match=r"pass the function itself"):
        torch_rnn(ln_lstm(16, 64), 16, 64)


def _cell():
    c = rnnc.Cell("numpy_in_a_cell")
    return c, c.input("x", 3), c.state("h", 3), c.param("W", (3, 3))


@pytest.mark.parametrize("call, hint", [
    (lambda x, h, W: np.tanh(x @ W + h), "use rnnc.tanh instead"),
    (lambda x, h, W: np.exp(x), "use rnnc.exp instead"),
    (lambda x, h, W: np.maximum(x, h), "use rnnc.maximum instead"),
    (lambda x, h, W: np.concatenate([x, h], axis=1), "use rnnc.concat instead"),
    (lambda x, h, W: np.mean(x), "use rnnc.mean instead"),
    (lambda x, h, W: np.square(x), "write x ** 2 instead"),
    (lambda x, h, W: np.arctan(x), "the cell's functions are rnnc's"),
])
def test_a_numpy_function_on_a_traced_value_names_rnnc_s(call, hint) -> None:
    _, x, h, W = _cell()
    with pytest.raises(RnncTypeError, match="was called on a traced rnnc value") as err:
        call(x, h, W)
    assert hint in str(err.value)
    assert "test_messages.py" in str(err.value)  # the line of the user's cell


def test_numpy_scalars_still_trace_as_numbers() -> None:
    """NumPy hands a traced value its operators as ufuncs: they build what Python numbers do."""
    programs = []
    for number in (float, np.float32):
        c, x, h, W = _cell()
        new = rnnc.tanh(number(2.0) * (x @ W) - number(0.5) / (number(1.0) + h * h))
        c.update(h=rnnc.where(number(0.0) < new, new, -new))
        c.output("y", new)
        programs.append(rnnc.compile(c, backend="numpy").ir())
    assert programs[0] == programs[1]


def test_float64_input_into_a_float32_module_gives_torch_s_advice() -> None:
    torch = pytest.importorskip("torch")
    from rnnc.interop.torch import RNN

    x = torch.zeros(5, 2, 3, dtype=torch.float64)
    with pytest.raises(RnncValueError) as ours:
        RNN("LSTM", 3, 4)(x)
    with pytest.raises(ValueError) as theirs:
        torch.nn.LSTM(3, 4)(x)
    for advice in ("input.to(torch.float32)", "model.to(torch.float64)"):
        assert advice in str(ours.value) and advice in str(theirs.value)
