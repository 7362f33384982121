"""Hostile inputs and faults (issues 17 and 19): each case either gives the right numbers or
raises an RnncError that names the input and the fix, on every backend.

References are float64 NumPy loops written here, independent of the compiler. Cases that
compile very large cells are marked slow (``pytest -m slow``).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import time

import numpy as np
import pytest

import rnnc

LLVM = importlib.util.find_spec("llvmlite") is not None
CXX = any(shutil.which(c) for c in ("g++", "clang++", "c++"))
BACKENDS = [
    pytest.param("numpy", id="numpy"),
    pytest.param("llvm", id="llvm", marks=pytest.mark.skipif(not LLVM, reason="needs llvmlite")),
    pytest.param("cuda", id="cuda-emulate", marks=pytest.mark.skipif(
        not CXX, reason="CUDA emulation needs a C++ compiler")),
]


def compile_for(cell: rnnc.Cell, backend: str) -> rnnc.Function:
    return rnnc.compile(cell, backend=backend, **({"emulate": True} if backend == "cuda" else {}))


def raises(kind: type, *fragments: str):
    """pytest.raises for an RnncError that is also ``kind`` and mentions every fragment."""
    return pytest.raises(kind, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1 / (1 + e), e / (1 + e))


# ---------------------------------------------------------------- names (issue 19, high 1)


def _mask_cell() -> rnnc.Cell:
    c = rnnc.Cell("m")
    x = c.input("x", 3)
    m = c.input("mask", 1)
    h = c.state("h", 4)
    W = c.param("W", (3, 4))
    hn = rnnc.tanh(x @ W + h) * m
    c.update(h=hn)
    c.output("y", hn)
    return c


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_named_mask_keeps_its_values_with_lengths(backend: str) -> None:
    cell = _mask_cell()
    p = cell.init_params(seed=0)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 2, 3)).astype(np.float32)
    M = np.full((4, 2, 1), 3.0, np.float32)
    lens = np.array([4, 2])
    ys, states = compile_for(cell, backend)({"x": X, "mask": M}, p, lengths=lens)

    W = p["W"].astype(np.float64)
    want_y = np.zeros((4, 2, 4))
    want_h = np.zeros((2, 4))
    for b in range(2):
        h = np.zeros(4)
        for t in range(lens[b]):
            h = np.tanh(X[t, b].astype(np.float64) @ W + h) * 3.0
            want_y[t, b] = h
        want_h[b] = h
    np.testing.assert_allclose(ys["y"], want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(states["h"], want_h, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- torch (issue 19, high 2)


@pytest.mark.parametrize("changed", ["input", "weight", "state"])
def test_torch_tensor_changed_in_place_before_backward_raises(changed: str) -> None:
    torch = pytest.importorskip("torch")
    import rnnc.torch as rtorch

    torch.manual_seed(0)
    module = rtorch.RNN("lstm", 3, 4, backend="numpy")
    x = torch.randn(5, 2, 3)
    h0, c0 = torch.randn(1, 2, 4), torch.randn(1, 2, 4)
    y, _ = module(x, (h0, c0))
    with torch.no_grad():
        {"input": x, "weight": module.weight_hh_l0, "state": h0}[changed].add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


# ---------------------------------------------------------------- cell size (issue 19, high 6)


def _chain_cell(n_ops: int) -> rnnc.Cell:
    """``x @ W + h`` followed by a chain of elementwise ops, three per step, each the first
    operand of the next (so that a recursion over first operands goes down the whole chain)."""
    c = rnnc.Cell("chain")
    x = c.input("x", 3)
    h = c.state("h", 4)
    W = c.param("W", (3, 4))
    v = x @ W + h
    for k in range((n_ops - 2) // 3):
        v = 0.01 * rnnc.tanh(v) + v if k % 2 == 0 else -0.01 * rnnc.sigmoid(v) + v
    c.update(h=v)
    c.output("y", v)
    return c


def _chain_reference(x: np.ndarray, W: np.ndarray, n_ops: int) -> np.ndarray:
    h = np.zeros((x.shape[1], 4))
    ys = []
    for t in range(x.shape[0]):
        v = x[t] @ W + h
        for k in range((n_ops - 2) // 3):
            v = 0.01 * np.tanh(v) + v if k % 2 == 0 else -0.01 * _sigmoid(v) + v
        h = v
        ys.append(v)
    return np.stack(ys)


def _matmul_chain_cell(n_matmuls: int) -> rnnc.Cell:
    c = rnnc.Cell("matmuls")
    x = c.input("x", 3)
    h = c.state("h", 4)
    W = c.param("W", (3, 4))
    U = c.param("U", (4, 4))
    v = x @ W + h
    for _ in range(n_matmuls):
        v = rnnc.tanh(v @ U) + v
    c.update(h=v)
    c.output("y", v)
    return c


def _matmul_chain_reference(x: np.ndarray, W: np.ndarray, U: np.ndarray, n: int) -> np.ndarray:
    h = np.zeros((x.shape[1], 4))
    ys = []
    for t in range(x.shape[0]):
        v = x[t] @ W + h
        for _ in range(n):
            v = np.tanh(v @ U) + v
        h = v
        ys.append(v)
    return np.stack(ys)


def _check_big_cell(cell: rnnc.Cell, backend: str, reference) -> None:
    """Inference and training against a float64 loop; dW against its central differences."""
    fn = compile_for(cell, backend)
    p = cell.init_params(seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 3)).astype(np.float32)
    dy = rng.standard_normal((3, 2, 4))
    params64 = {k: v.astype(np.float64) for k, v in p.items()}
    want = reference(x.astype(np.float64), params64)
    ys, _ = fn(x, p)
    np.testing.assert_allclose(ys["y"], want, rtol=1e-3, atol=1e-3)
    ys, _, tape = fn.forward(x, p)
    np.testing.assert_allclose(ys["y"], want, rtol=1e-3, atol=1e-3)
    grads = fn.backward(tape, {"y": dy.astype(np.float32)})
    eps = 1e-6
    dW = np.zeros((3, 4))
    for i in range(3):
        for j in range(4):
            up, down = dict(params64), dict(params64)
            up["W"], down["W"] = params64["W"].copy(), params64["W"].copy()
            up["W"][i, j] += eps
            down["W"][i, j] -= eps
            loss_up = np.sum(reference(x.astype(np.float64), up) * dy)
            loss_down = np.sum(reference(x.astype(np.float64), down) * dy)
            dW[i, j] = (loss_up - loss_down) / (2 * eps)
    np.testing.assert_allclose(grads.params["W"], dW, rtol=2e-3, atol=2e-3)


CHAIN_OPS = 600  # well past the ~250 chained ops where code generation used to recurse too deep


@pytest.fixture(scope="module")
def chain_cell() -> rnnc.Cell:
    # One cell for every backend: the optimized programs are shared, passes run once.
    return _chain_cell(CHAIN_OPS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_elementwise_chain_compiles_and_trains(chain_cell: rnnc.Cell, backend: str
                                                       ) -> None:
    _check_big_cell(chain_cell, backend,
                    lambda x, p: _chain_reference(x, p["W"], CHAIN_OPS))


def test_a_reused_parameter_expression_differentiates_in_linear_time() -> None:
    # Each level reads the previous one twice: without memoized analyses, autodiff's
    # "depends on parameters only" test walked 2**depth paths (depth 22: about 20 s).
    c = rnnc.Cell("reused")
    x = c.input("x", 4)
    h = c.state("h", 4)
    W = c.param("W", (4, 4))
    v = c.param("b", (4,))
    for _ in range(22):
        v = rnnc.tanh(v) + v
    c.update(h=rnnc.tanh(x @ W + h * v))
    c.output("y", h)
    start = time.perf_counter()
    fn = rnnc.compile(c, backend="numpy")
    p = c.init_params(seed=0)
    x = np.ones((2, 2, 4), np.float32)
    ys, _, tape = fn.forward(x, p)
    grads = fn.backward(tape, {"y": np.ones_like(ys["y"])})
    assert time.perf_counter() - start < 5.0
    assert np.all(np.isfinite(grads.params["b"]))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_10000_op_chain_compiles_and_trains(backend: str) -> None:
    _check_big_cell(_chain_cell(10_000), backend,
                    lambda x, p: _chain_reference(x, p["W"], 10_000))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_chain_of_300_matmuls_compiles_and_trains(backend: str) -> None:
    _check_big_cell(_matmul_chain_cell(300), backend,
                    lambda x, p: _matmul_chain_reference(x, p["W"], p["U"], 300))


# ---------------------------------------------------------------- arrays: converted


def _lstm() -> tuple[rnnc.Cell, dict, dict]:
    cell = rnnc.cells.lstm(3, 4)
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((5, 2, 3)).astype(np.float32),
            "h": rng.standard_normal((2, 4)).astype(np.float32),
            "c": rng.standard_normal((2, 4)).astype(np.float32),
            "dy": rng.standard_normal((5, 2, 4)).astype(np.float32)}
    return cell, cell.init_params(seed=0), data


def _run_all(fn: rnnc.Function, p: dict, d: dict) -> list[np.ndarray]:
    ys, st = fn(d["x"], p, states={"h": d["h"], "c": d["c"]})
    _, _, tape = fn.forward(d["x"], p, states={"h": d["h"], "c": d["c"]})
    g = fn.backward(tape, {"y": d["dy"]}, {"h": d["h"], "c": d["c"]})
    return [ys["y"], st["h"], st["c"], g.x, g.states["h"], *g.params.values()]


def _misaligned(a: np.ndarray) -> np.ndarray:
    raw = np.zeros(a.nbytes + 1, np.uint8)
    out = raw[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("convert", ["misaligned", "big-endian"])
def test_misaligned_and_byte_swapped_arrays_are_copied(backend: str, convert: str) -> None:
    cell, p, d = _lstm()
    fn = compile_for(cell, backend)
    change = _misaligned if convert == "misaligned" else \
        (lambda a: a.astype(a.dtype.newbyteorder(">")))
    want = _run_all(fn, p, d)
    got = _run_all(fn, {k: change(v) for k, v in p.items()}, {k: change(v) for k, v in d.items()})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    flat = fn.pack(p)
    ys, _ = fn(change(d["x"]), change(flat))
    np.testing.assert_array_equal(ys["y"], fn(d["x"], flat)[0]["y"])


def test_layer_takes_byte_swapped_input() -> None:
    layer = rnnc.RNN("gru", 3, 4, backend="numpy")
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    y, _ = layer(x.astype(">f4"))
    np.testing.assert_array_equal(y, layer(x)[0])


# ---------------------------------------------------------------- arrays: refused with the fix


def test_a_ragged_list_names_the_input_and_lengths() -> None:
    cell, p, _ = _lstm()
    with raises(rnnc.RnncValueError, "input 'x'", "ragged", "lengths="):
        rnnc.compile(cell, backend="numpy")([[[1.0, 2.0, 3.0]], [[1.0, 2.0]]], p)


def test_a_python_list_x_names_the_float64_conversion() -> None:
    cell, p, d = _lstm()
    with raises(rnnc.RnncTypeError, "x is a Python list, converted to float64",
                "np.asarray(x, np.float32)", "init_params(dtype=np.float64)"):
        rnnc.compile(cell, backend="numpy")(d["x"].tolist(), p)
    with raises(rnnc.RnncTypeError, "x is a Python list, converted to float64",
                "np.asarray(x, np.float32)", "dtype=np.float64"):
        rnnc.RNN("lstm", 3, 4, backend="numpy")(d["x"].tolist())


def test_a_dtype_mismatch_names_both_fixes() -> None:
    cell, p, d = _lstm()
    fn = rnnc.compile(cell, backend="numpy")
    with raises(rnnc.RnncTypeError, "x is float64", "parameter 'W_ii' is float32",
                "x.astype(np.float32)", "cell.init_params(dtype=np.float64)"):
        fn(d["x"].astype(np.float64), p)
    with raises(rnnc.RnncTypeError, "x is float32", "float64", "x.astype(np.float64)",
                "cell.init_params(dtype=np.float32)"):
        fn(d["x"], cell.init_params(dtype=np.float64))


@pytest.mark.parametrize("case", ["requires_grad", "bfloat16"])
def test_torch_tensors_in_the_numpy_api_name_the_conversion(case: str) -> None:
    torch = pytest.importorskip("torch")
    cell, p, d = _lstm()
    if case == "requires_grad":
        x = torch.tensor(d["x"], requires_grad=True)
        fix = "tensor.detach().numpy()"
    else:
        x = torch.tensor(d["x"], dtype=torch.bfloat16)
        fix = "tensor.float().numpy()"
    with raises(rnnc.RnncTypeError, "input 'x'", fix):
        rnnc.compile(cell, backend="numpy")(x, p)
    with raises(rnnc.RnncTypeError, "parameter 'W_ii'", fix):
        rnnc.compile(cell,
                     backend="numpy")(d["x"], {**p, "W_ii": torch.tensor(p["W_ii"], dtype=x.dtype,
                                                             requires_grad=x.requires_grad)})


# ---------------------------------------------------------------- sizes (issue 17, fault 4)


def test_a_hidden_size_of_10_to_the_20_is_refused_when_declared() -> None:
    with raises(rnnc.CellError, "state 'h'", "100000000000000000000", "2**31", "bytes"):
        rnnc.cells.lstm(3, 10**20)


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffers_too_big_to_allocate_fail_at_call_time_naming_size_and_bytes(backend: str
                                                                             ) -> None:
    c = rnnc.Cell("wide")
    x = c.input("x", 1)
    h = c.state("h", 2**30)
    c.update(h=rnnc.tanh(h + x))
    c.output("y", h)
    fn = compile_for(c, backend)
    x = np.zeros((1000, 1000, 1), np.float32)
    with raises(rnnc.RnncValueError, "1073741824", "bytes", "B=1000"):
        fn(x, {})
    with raises(rnnc.RnncValueError, "1073741824", "bytes"):
        fn.forward(x, {})


def test_a_parameter_too_big_to_initialize_names_its_shape_and_bytes() -> None:
    c = rnnc.Cell("huge")
    x = c.input("x", 2**30)
    h = c.state("h", 2**30)
    W = c.param("W", (2**30, 2**30))
    c.update(h=rnnc.tanh(x @ W + h))
    with raises(rnnc.CellError, "parameter 'W'", "(1073741824, 1073741824)", "bytes"):
        c.init_params()


# ---------------------------------------------------------------- options


@pytest.mark.skipif(not LLVM, reason="needs llvmlite")
def test_an_option_the_backend_does_not_take_lists_the_ones_it_does() -> None:
    with raises(rnnc.RnncError, "backend 'llvm'", "'emulate'", "blas=", "threads=",
                "cache_dir="):
        rnnc.compile(rnnc.cells.rnn(3, 4), backend="llvm", emulate=True)
    with raises(rnnc.RnncError, "backend 'numpy'", "emulate"):
        rnnc.compile(rnnc.cells.rnn(3, 4), backend="numpy", emulate=True)


# ---------------------------------------------------------------- batch-first (issue 17, item 7)


def test_batch_first_data_with_states_or_lengths_says_so() -> None:
    cell, p, d = _lstm()
    fn = rnnc.compile(cell, backend="numpy")
    x = d["x"].transpose(1, 0, 2).copy()  # (B, T, I) = (2, 5, 3)
    with raises(rnnc.RnncValueError, "state 'h'", "batch-first", "x.transpose(1, 0, 2)",
                "batch_first=True"):
        fn(x, p, states={"h": d["h"]})
    with raises(rnnc.RnncValueError, "lengths", "batch-first", "x.transpose(1, 0, 2)"):
        fn(x, p, lengths=np.array([5, 3]))
    layer = rnnc.RNN("lstm", 3, 4, backend="numpy")
    with raises(rnnc.RnncValueError, "state 'h'", "batch_first=True"):
        layer(x, states={"h": d["h"][None]})


# ---------------------------------------------------------------- numerics (issue 17, fault 5)


def _lstm_reference(x, p, h, c):
    x, h, c = (a.astype(np.float64) for a in (x, h, c))
    p = {k: v.astype(np.float64) for k, v in p.items()}
    ys = []
    for t in range(x.shape[0]):
        gate = {g: x[t] @ p[f"W_i{g}"] + p[f"b_i{g}"] + h @ p[f"W_h{g}"] + p[f"b_h{g}"]
                for g in "ifgo"}
        i, f, o = _sigmoid(gate["i"]), _sigmoid(gate["f"]), _sigmoid(gate["o"])
        c = f * c + i * np.tanh(gate["g"])
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys), h, c


def _edge_case(case: str):
    cell, p, d = _lstm()
    x, h, c, p = d["x"].copy(), d["h"].copy(), d["c"].copy(), dict(p)
    if case == "x*1e30":
        x *= 1e30
    elif case == "nan-in-x-row":
        x[2, 1, 0] = np.nan
    elif case == "inf-in-x":
        x[1, 0, 2] = np.inf
    elif case == "-inf-in-x":
        x[1, 0, 2] = -np.inf
    elif case == "nan-in-param":
        p["W_hi"] = p["W_hi"].copy()
        p["W_hi"][0, 0] = np.nan
    elif case == "inf-in-bias":
        p["b_ig"] = p["b_ig"].copy()
        p["b_ig"][1] = np.inf
    elif case == "nan-in-state-row":
        h[1, 2] = np.nan
    elif case == "inf-in-cell-state":
        c[0, 0] = np.inf
    return cell, p, x, h, c


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["x*1e30", "nan-in-x-row", "inf-in-x", "-inf-in-x",
                                  "nan-in-param", "inf-in-bias", "nan-in-state-row",
                                  "inf-in-cell-state"])
def test_nan_inf_and_huge_values_propagate_like_float64(backend: str, case: str) -> None:
    cell, p, x, h, c = _edge_case(case)
    with np.errstate(all="ignore"):  # the NumPy backend computes inf - inf like the reference
        ys, st = compile_for(cell, backend)(x, p, states={"h": h, "c": c})
        want = _lstm_reference(x, p, h, c)
    for got, ref in zip((ys["y"], st["h"], st["c"]), want, strict=True):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    if case in ("nan-in-x-row", "nan-in-state-row"):
        assert not np.isnan(ys["y"][:, 0]).any()  # the other batch row stays clean
    if case == "x*1e30":
        assert np.all(np.abs(ys["y"]) <= 1)  # saturated gates stay finite


EDGE_VALUES = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 1e-30, 1.0, -1.0,
                        3.0, -3.0, 50.0, -50.0, 100.0, -100.0], np.float32)
ELEMENTWISE = {
    "exp": (rnnc.exp, np.exp), "log": (rnnc.log, np.log), "tanh": (rnnc.tanh, np.tanh),
    "sigmoid": (rnnc.sigmoid, _sigmoid), "relu": (rnnc.relu, lambda v: np.maximum(v, 0)),
    "sqrt": (rnnc.sqrt, np.sqrt), "rsqrt": (rnnc.rsqrt, lambda v: 1 / np.sqrt(v)),
    "reciprocal": (lambda v: 1 / v, lambda v: 1 / v),
    "where": (lambda v: rnnc.where(v, v, -v), lambda v: np.where(v > 0, v, -v)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", sorted(ELEMENTWISE))
def test_elementwise_ops_at_edge_values_match_float64(backend: str, op: str) -> None:
    traced, reference = ELEMENTWISE[op]
    c = rnnc.Cell(op)
    x = c.input("x", 1)
    h = c.state("h", 1)
    c.update(h=h + x)
    c.output("y", traced(x))
    with np.errstate(all="ignore"):  # log(-1), 1/0, ... in the NumPy backend and reference
        ys, _ = compile_for(c, backend)(EDGE_VALUES.reshape(1, -1, 1), {})
        want = reference(EDGE_VALUES.astype(np.float64)).astype(np.float32)
    got = ys["y"].ravel()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


# ---------------------------------------------------------------- initializers and flat buffers


def _cell_with_init(init) -> rnnc.Cell:
    c = rnnc.Cell("init")
    x, h = c.input("x", 2), c.state("h", 3)
    b = c.param("b", (3,), init=init)
    c.update(h=rnnc.tanh(x @ c.param("W", (2, 3)) + h + b))
    c.output("y", h)
    return c


@pytest.mark.parametrize("returned, fragments", [
    (lambda rng, shape: np.full(shape, "zeros"), ["'b'", "dtype <U5", "float array of shape (3,)"]),
    (lambda rng, shape: ["1", "2", "3"], ["'b'", "<U1", "real numbers"]),
    (lambda rng, shape: None, ["'b'", "NoneType", "real numbers"]),
    (lambda rng, shape: np.ones(shape, complex), ["'b'", "complex128", "real numbers"]),
    (lambda rng, shape: np.ones(shape, bool), ["'b'", "bool", "real numbers"]),
    (lambda rng, shape: [[1.0], [1.0, 2.0]], ["'b'", "not an array", "shape (3,)"]),
    (lambda rng, shape: np.ones(4), ["'b'", "shape (4,)", "expected (3,)"]),
    (lambda rng: np.ones(3), ["'b'", "failed: TypeError", "init(rng, shape)"]),
], ids=["strings", "string-list", "none", "complex", "bool", "ragged", "shape", "signature"])
def test_an_initializer_returning_no_float_array_of_the_shape_is_named(returned, fragments
                                                                        ) -> None:
    # Strings were parsed as numbers or raised NumPy's own ValueError; a wrong signature gave a
    # bare TypeError from inside init_params.
    cell = _cell_with_init(returned)
    with raises(rnnc.CellError, *fragments):
        cell.init_params()
    with raises(rnnc.CellError, *fragments):
        rnnc.RNN(lambda i, h: _cell_with_init(returned), 2, 3)


def test_an_initializer_of_integers_gives_floats() -> None:
    p = _cell_with_init(lambda rng, shape: np.arange(3)).init_params(dtype=np.float64)
    np.testing.assert_array_equal(p["b"], [0.0, 1.0, 2.0])
    assert p["b"].dtype == np.float64


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float16, np.bool_])
def test_unpack_of_a_buffer_not_float32_or_float64_is_named(dtype) -> None:
    # The views of an int buffer were returned as int "parameters".
    cell = _cell_with_init(None)
    fn = rnnc.compile(cell)
    params = cell.init_params(dtype=np.float64)
    flat = fn.pack(params)
    with raises(rnnc.RnncTypeError, "flat parameter buffer", "float32 or float64",
                np.dtype(dtype).name):
        fn.unpack(np.zeros(flat.size, dtype))
    np.testing.assert_array_equal(fn.unpack(flat)["b"], params["b"])


@pytest.mark.parametrize("mode", ["lstm", "custom"])
@pytest.mark.parametrize("buffer", [np.int64, np.int32, "strings"])
def test_load_flat_of_a_buffer_not_float_is_named(mode: str, buffer) -> None:
    # An int buffer was loaded, converted to floats without a word.
    layer = rnnc.RNN("lstm" if mode == "lstm" else lambda i, h: _cell_with_init(None), 2, 3)
    size = layer.flat_weights.size
    flat = np.full(size, "w") if buffer == "strings" else np.ones(size, buffer)
    name = "<U1" if buffer == "strings" else np.dtype(buffer).name
    before = layer.flat_weights.copy()
    with raises(rnnc.RnncValueError, "load_flat", "float", name):
        layer.load_flat(flat)
    np.testing.assert_array_equal(layer.flat_weights, before)
    layer.load_flat(np.ones(size, np.float64))
    np.testing.assert_array_equal(layer.flat_weights, 1.0)
