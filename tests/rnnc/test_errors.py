"""DESIGN's error contract: every bad input raises an RnncError naming the offender and the
expected value, before any backend runs."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import rnnc

T, B, I, H = 5, 2, 3, 4


@pytest.fixture(scope="module")
def rnn():
    cell = rnnc.cells.rnn(I, H)
    return cell, rnnc.compile(cell, backend="numpy"), cell.init_params(seed=0)


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)


def raises(kind: type, *fragments: str):
    """pytest.raises for an RnncError of ``kind``; the message must contain every fragment."""

    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(kind)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            err = self.info.value
            assert isinstance(err, rnnc.RnncError), type(err)
            msg = str(err)
            for f in fragments:
                assert f in msg, f"{f!r} not in {msg!r}"
            return handled

    return Check()


VALUE = (rnnc.RnncError, ValueError)
TYPE = (rnnc.RnncError, TypeError)


def is_a(err: BaseException, kinds: tuple[type, ...]) -> bool:
    return all(isinstance(err, k) for k in kinds)


# ---------------------------------------------------------------- inputs


def test_wrong_rank_of_x(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "input 'x'", "(T, B, 3)", "(2, 3)") as info:
        fn(x[0], p)
    assert is_a(info.value, VALUE)


def test_wrong_feature_size(rnn) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "input 'x'", "3 features", "(5, 2, 4)") as info:
        fn(np.zeros((T, B, 4), np.float32), p)
    assert is_a(info.value, VALUE)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16, np.bool_])
def test_non_float_dtype(rnn, x, dtype) -> None:
    cell, fn, p = rnn
    with raises(TypeError, "input 'x'", "float32 or float64", np.dtype(dtype).name) as info:
        fn(x.astype(dtype), p)
    assert is_a(info.value, TYPE)


def test_mixed_dtypes(rnn, x) -> None:
    cell, fn, p = rnn
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    with raises(TypeError, "parameter 'W_ih'", "float64", "float32") as info:
        fn(x, p64)
    assert is_a(info.value, TYPE)
    with raises(TypeError, "state 'h'", "float64", "float32"):
        fn(x, p, states={"h": np.zeros((B, H))})


def test_multi_input_mixed_dtypes_and_lengths() -> None:
    c = rnnc.Cell("two")
    a = c.input("a", 2)
    v = c.input("v", 3)
    h = c.state("h", H)
    W = c.param("W", (2, H))
    U = c.param("U", (3, H))
    c.update(h=rnnc.tanh(a @ W + v @ U + h))
    fn, p = rnnc.compile(c, backend="numpy"), c.init_params()
    xa, xv = np.zeros((T, B, 2), np.float32), np.zeros((T, B, 3), np.float32)
    with raises(TypeError, "'v'", "float64", "float32"):
        fn({"a": xa, "v": xv.astype(np.float64)}, p)
    with raises(ValueError, "'v'", "(4, 2)", "(5, 2)"):
        fn({"a": xa, "v": np.zeros((4, B, 3), np.float32)}, p)
    with raises(ValueError, "missing input 'v'"):
        fn({"a": xa}, p)
    with raises(ValueError, "unknown input 'w'"):
        fn({"a": xa, "v": xv, "w": xv}, p)
    with raises(TypeError, "dict"):
        fn(xa, p)


# ---------------------------------------------------------------- parameters


def test_missing_parameter(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "missing parameter 'W_hh'", "(4, 4)") as info:
        fn(x, {k: v for k, v in p.items() if k != "W_hh"})
    assert is_a(info.value, VALUE)


def test_extra_parameter(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "unknown parameter 'W_xx'", "W_ih") as info:
        fn(x, {**p, "W_xx": p["W_ih"]})
    assert is_a(info.value, VALUE)


def test_misshaped_parameter(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "parameter 'W_ih'", "(3, 4)", "(4, 3)") as info:
        fn(x, {**p, "W_ih": np.ascontiguousarray(p["W_ih"].T)})
    assert is_a(info.value, VALUE)
    with raises(ValueError, "parameter 'b_ih'", "(4,)", "(1, 4)"):
        fn(x, {**p, "b_ih": p["b_ih"][None]})


def test_parameters_not_a_dict(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(TypeError, "dict", "list"):
        fn(x, list(p.values()))


# ---------------------------------------------------------------- states


def test_unknown_state_name(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "unknown state 'c'", "'h'") as info:
        fn(x, p, states={"c": np.zeros((B, H), np.float32)})
    assert is_a(info.value, VALUE)


def test_state_with_wrong_batch(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "state 'h'", "(2, 4)", "(3, 4)") as info:
        fn(x, p, states={"h": np.zeros((B + 1, H), np.float32)})
    assert is_a(info.value, VALUE)


def test_state_never_updated() -> None:
    c = rnnc.Cell("forgetful")
    x = c.input("x", I)
    h = c.state("h", H)
    c.state("c", H)
    W = c.param("W", (I, H))
    c.update(h=rnnc.tanh(x @ W + h))
    with raises(ValueError, "state 'c'", "never updated") as info:
        rnnc.compile(c, backend="numpy")
    assert isinstance(info.value, rnnc.CellError)
    with raises(ValueError, "never updated"):
        c.init_params()


def test_update_of_unknown_state() -> None:
    c = rnnc.Cell()
    x = c.input("x", I)
    c.state("h", H)
    with raises(ValueError, "unknown state 'g'", "'h'") as info:
        c.update(g=x)
    assert isinstance(info.value, rnnc.CellError)


def test_update_with_wrong_shape() -> None:
    c = rnnc.Cell()
    x = c.input("x", I)
    c.state("h", H)
    with raises(ValueError, "state 'h'", "[B,4]", "[B,3]", os.path.basename(__file__)):
        c.update(h=x)


def test_state_updated_twice() -> None:
    c = rnnc.Cell()
    c.input("x", I)
    h = c.state("h", H)
    c.update(h=h * 2)
    with raises(ValueError, "'h'", "twice"):
        c.update(h=h * 3)


# ---------------------------------------------------------------- cell definitions


def test_shape_mismatch_inside_the_cell_names_the_line() -> None:
    c = rnnc.Cell()
    x = c.input("x", I)
    h = c.state("h", H)
    W = c.param("W", (H, H))
    line = inspect.currentframe().f_lineno + 2
    with raises(ValueError, "matmul", "[B,3]", "[4,4]") as info:
        x @ W  # the bad expression: 3 features against a (4, 4) matrix
    assert isinstance(info.value, rnnc.ShapeError)
    assert f"{os.path.basename(__file__)}:{line}" in str(info.value), str(info.value)
    line = inspect.currentframe().f_lineno + 2
    with raises(ValueError, "add", "[B,3]", "[B,4]") as info:
        _ = x + h
    assert f"{os.path.basename(__file__)}:{line}" in str(info.value), str(info.value)


def test_shape_mismatch_inside_a_composite_names_the_user_line() -> None:
    c = rnnc.Cell()
    x = c.input("x", I)
    g = c.param("g", (H,))
    line = inspect.currentframe().f_lineno + 2
    with raises(ValueError, "mul") as info:
        rnnc.layer_norm(x, g)
    assert f"{os.path.basename(__file__)}:{line}" in str(info.value), str(info.value)


@pytest.mark.parametrize("second", ["input", "state", "param", "output"])
def test_name_used_twice(second: str) -> None:
    c = rnnc.Cell("dup")
    x = c.input("x", I)
    h = c.state("h", H)
    c.output("y", h)
    declare = {
        "input": lambda name: c.input(name, I),
        "state": lambda name: c.state(name, H),
        "param": lambda name: c.param(name, (H,)),
        "output": lambda name: c.output(name, x),
    }[second]
    for name in ("x", "h", "y"):
        with raises(ValueError, repr(name), "already used") as info:
            declare(name)
        assert isinstance(info.value, rnnc.CellError)


def test_output_must_be_per_step() -> None:
    c = rnnc.Cell()
    c.input("x", I)
    b = c.param("b", (H,))
    with raises(ValueError, "output 'y'", "[B,n]", "[4]"):
        c.output("y", b)


def test_bad_names_and_sizes() -> None:
    c = rnnc.Cell()
    with raises(ValueError, "identifier", "'2x'"):
        c.input("2x", 3)
    with raises(ValueError, "positive int", "0"):
        c.state("h", 0)
    # Parameters of any rank are values with feature shapes (docs/tensors.md); a shape
    # needs at least one size, each positive.
    assert c.param("W", (2, 3, 4)).shape == (2, 3, 4)
    with raises(ValueError, "at least one size", "()"):
        c.param("V", ())
    with raises(ValueError, "positive int", "-1"):
        c.state("s", (2, -1))


def test_traced_value_has_no_truth_value() -> None:
    c = rnnc.Cell()
    x = c.input("x", I)
    with raises(TypeError, "where"):
        if x:
            pass


def test_values_of_two_cells_do_not_mix() -> None:
    a, b = rnnc.Cell("a"), rnnc.Cell("b")
    xa, xb = a.input("x", I), b.input("x", I)
    with raises(ValueError, "'a'", "'b'"):
        xa + xb


def test_compile_takes_a_cell() -> None:
    with raises(TypeError, "Cell", "str"):
        rnnc.compile("lstm", backend="numpy")


# ---------------------------------------------------------------- lengths


@pytest.mark.parametrize("bad", [0, -1, T + 1])
def test_lengths_outside_1_to_T(rnn, x, bad: int) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "lengths", f"1..{T}", str(bad)) as info:
        fn(x, p, lengths=np.array([bad, T]))
    assert is_a(info.value, VALUE)


def test_lengths_wrong_count(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(ValueError, "lengths", f"({B},)", "(3,)") as info:
        fn(x, p, lengths=np.array([1, 2, 3]))
    assert is_a(info.value, VALUE)


def test_lengths_float_dtype(rnn, x) -> None:
    cell, fn, p = rnn
    with raises(TypeError, "lengths", "integer", "float64") as info:
        fn(x, p, lengths=np.array([1.0, 2.0]))
    assert is_a(info.value, TYPE)


# ---------------------------------------------------------------- memory layout and backends


def test_non_contiguous_x_is_copied_and_correct(rnn, x) -> None:
    """rnnc copies a non-contiguous input to C order; the result equals the contiguous run."""
    cell, fn, p = rnn
    wide = np.zeros((T, B, 2 * I), np.float32)
    wide[:, :, ::2] = x
    strided = wide[:, :, ::2]
    assert not strided.flags.c_contiguous
    transposed = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    assert not transposed.flags.c_contiguous
    want, want_st = fn(x, p)
    for arr in (strided, transposed):
        before = arr.copy()
        ys, st = fn(arr, p)
        np.testing.assert_array_equal(ys["y"], want["y"])
        np.testing.assert_array_equal(st["h"], want_st["h"])
        np.testing.assert_array_equal(arr, before)  # never written


def test_non_contiguous_params_and_states(rnn, x) -> None:
    cell, fn, p = rnn
    fortran = {k: np.asfortranarray(v) for k, v in p.items()}
    h0 = np.asfortranarray(np.random.default_rng(1).standard_normal((B, H)).astype(np.float32))
    want, want_st = fn(x, p, states={"h": np.ascontiguousarray(h0)})
    ys, st = fn(x, fortran, states={"h": h0})
    np.testing.assert_array_equal(ys["y"], want["y"])
    np.testing.assert_array_equal(st["h"], want_st["h"])


def test_unknown_backend() -> None:
    with raises(ValueError, "unknown backend 'tpu'", "numpy", "llvm", "cuda") as info:
        rnnc.compile(rnnc.cells.rnn(I, H), backend="tpu")
    assert is_a(info.value, VALUE)


def test_numpy_backend_takes_no_options() -> None:
    with raises(ValueError, "numpy", "fast"):
        rnnc.compile(rnnc.cells.rnn(I, H), backend="numpy", fast=True)
