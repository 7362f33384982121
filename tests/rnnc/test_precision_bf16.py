"""precision="bf16": the rounding model, the oracle (optimize=False) against float64 formulas
written here, every backend against the oracle, the compile option and its errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import rnnc
from rnnc import ops
from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.precision import round_bf16
from rnnc.tools.bench.configs import ln_lstm

BF16 = ml_dtypes.bfloat16
CELLS = {"lstm": lambda: rnnc.cells.lstm(8, 16), "gru": lambda: rnnc.cells.gru(8, 16),
         "ln_lstm": lambda: ln_lstm(8, 16)}  # layer norm: reductions stay float32


def _data(cell, T=5, B=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, cell.sizes("input")["x"][-1])).astype(np.float32)
    return x, cell.init_params(seed=seed)


def test_rounding_is_round_to_nearest_even_as_ml_dtypes() -> None:
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.standard_normal(20_000).astype(np.float32) * 10.0 ** rng.integers(
        -30, 30, 20_000), np.array([0.0, -0.0, np.inf, -np.inf, 3.0e38, 1e-40], np.float32)])
    a = a.astype(np.float32)
    want = a.astype(BF16).astype(np.float32)
    np.testing.assert_array_equal(round_bf16(a), want)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], np.float32)  # halfway: to even
    np.testing.assert_array_equal(round_bf16(ties), [1.0, 1 + 2.0 ** -6])
    assert np.isnan(round_bf16(np.array([np.nan], np.float32)))[0]


def test_matmul_reference_rounds_operands_and_sums_in_float32() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 33)).astype(np.float32)
    b = rng.standard_normal((33, 5)).astype(np.float32)
    got = ops.matmul.ref(a, b, precision="bf16")
    exact = a.astype(BF16).astype(np.float64) @ b.astype(BF16).astype(np.float64)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-5)
    assert np.abs(ops.matmul.ref(a, b) - exact).max() > 1e-3  # the float32 GEMM differs


def _lstm_float64(x, p, H):
    """The unoptimized program's model, written out: bfloat16 GEMM operands, float64 rest."""
    r = lambda v: v.astype(BF16).astype(np.float64)  # noqa: E731
    h = np.zeros((x.shape[1], H))
    c = np.zeros_like(h)
    ys = []
    gates = "ifgo"
    for t in range(x.shape[0]):
        pre = {g: r(x[t]) @ r(p[f"W_i{g}"]) + p[f"b_i{g}"] + r(h) @ r(p[f"W_h{g}"]) + p[f"b_h{g}"]
               for g in gates}
        i, f, o = (1 / (1 + np.exp(-pre[g])) for g in "ifo")
        c = f * c + i * np.tanh(pre["g"])
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys)


def test_oracle_lstm_matches_a_float64_formula() -> None:
    cell = rnnc.cells.lstm(8, 16)
    x, p = _data(cell)
    got, _ = rnnc.compile(cell, optimize=False, precision="bf16")(x, p)
    want = _lstm_float64(x, p, 16)
    np.testing.assert_allclose(got["y"], want, rtol=0, atol=2e-5)
    fp32, _ = rnnc.compile(cell, optimize=False)(x, p)
    assert np.abs(fp32["y"] - want).max() > 1e-4  # the rounding shows


def _agree(cell, backend, **options):
    """Inference, forward and every gradient of ``backend`` against the bf16 oracle."""
    x, p = _data(cell)
    oracle = rnnc.compile(cell, optimize=False, precision="bf16")
    fn = rnnc.compile(cell, backend=backend, precision="bf16", **options)
    ys, _, tape = oracle.forward(x, p)
    got, _, gtape = fn.forward(x, p)
    inf, _ = fn(x, p)
    name = next(iter(ys))
    d = {name: np.random.default_rng(2).standard_normal(ys[name].shape).astype(np.float32)}
    want_g, got_g = oracle.backward(tape, d), fn.backward(gtape, d)
    for k in ys:
        np.testing.assert_allclose(got[k], ys[k], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(inf[k], ys[k], rtol=1e-4, atol=1e-5)
    for k in want_g.params:
        np.testing.assert_allclose(got_g.params[k], want_g.params[k], rtol=1e-4, atol=2e-5)
        assert got_g.params[k].dtype == np.float32
    np.testing.assert_allclose(got_g.x, want_g.x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,backend", [
    ("lstm", "numpy"), ("gru", "numpy"), ("ln_lstm", "numpy"), ("lstm", "llvm"),
    ("ln_lstm", "llvm"), pytest.param("gru", "llvm", marks=pytest.mark.slow)])
def test_optimized_bf16_agrees_with_the_oracle(name, backend) -> None:
    _agree(CELLS[name](), backend)


def test_llvm_bf16_on_the_panel_kernel_blas_and_a_team() -> None:
    """Rows past the small kernel, a width the panel kernel takes, two threads."""
    cell = rnnc.cells.lstm(16, 32)
    x, p = _data(cell, T=4, B=24)
    oracle, _ = rnnc.compile(cell, optimize=False, precision="bf16")(x, p)
    for options in ({"threads": 1}, {"threads": 2}):
        got, _ = rnnc.compile(cell, backend="llvm", precision="bf16", **options)(x, p)
        np.testing.assert_allclose(got["y"], oracle["y"], rtol=1e-4, atol=1e-5)


def test_llvm_bf16_gradients_on_a_team(team_calls) -> None:
    """The backward's g @ W^T products pack W^T, each thread its own panels, on a team of
    three: the gradients of x (24 columns: one partial panel) and h (40: two, one partial),
    from the 160 gate columns (K=160, five pair-row blocks)."""
    from rnnc.backends.schedule import LlvmSchedule

    schedule = LlvmSchedule(threads=3, team_min_work=0)  # the team at any size
    _agree(rnnc.cells.lstm(24, 40), "llvm", team=True, schedule=schedule)
    assert 3 in team_calls


def test_autodiff_and_gate_fusion_keep_the_precision() -> None:
    fn = rnnc.compile(rnnc.cells.gru(4, 8), backend="numpy", precision="bf16")
    for mode in ("inference", "forward", "backward"):
        text = fn.ir(mode)
        assert text.count("matmul[") == text.count("precision=bf16"), mode
    assert "precision" not in rnnc.compile(rnnc.cells.gru(4, 8), backend="numpy").ir("backward")


def _products_of_h(g):
    from rnnc.ir import ARG

    return [n for n in g.nodes() if n.op is ops.matmul and g.node(n.inputs[0]).op is ARG
            and g.node(n.inputs[0]).attrs["name"] == "h"]


def test_bf16_and_fp32_matmuls_never_share_a_gemm() -> None:
    from dataclasses import replace

    from rnnc import passes

    program = rnnc.cells.gru(4, 8).program()
    body = program.scan.body
    first = _products_of_h(body)[0]  # h @ W_hr in bf16, h @ W_hz and h @ W_hn in fp32
    body.nx.nodes[first.id]["node"] = replace(first, attrs={"precision": "bf16"})
    fused = passes.run(program, ["fuse-gate-matmuls"]).scan.body
    assert sorted((n.attrs.get("precision", "fp32"), n.shape[-1])
                  for n in _products_of_h(fused)) == [("bf16", 8), ("fp32", 16)]


def test_bfloat16_inputs_and_float32_outputs() -> None:
    cell = rnnc.cells.lstm(8, 16)
    x, p = _data(cell)
    fn = rnnc.compile(cell, backend="llvm", precision="bf16")
    y32, s32 = fn(x, p)
    yb, sb = fn(x.astype(BF16), {k: v.astype(BF16) for k, v in p.items()})
    assert yb["y"].dtype == np.float32 and sb["h"].dtype == np.float32
    want, _ = fn(x, {k: v.astype(BF16).astype(np.float32) for k, v in p.items()})
    np.testing.assert_array_equal(yb["y"], want["y"])
    # GEMM operands (x, the weight matrices) are rounded anyway; the biases are not
    weights = {k: v.astype(BF16).astype(np.float32) if v.ndim == 2 else v for k, v in p.items()}
    same, _ = fn(x.astype(BF16), weights)
    np.testing.assert_array_equal(y32["y"], same["y"])


def test_errors_name_the_fix() -> None:
    cell = rnnc.cells.lstm(2, 3)
    with pytest.raises(RnncValueError, match="precision must be one of 'fp32', 'tf32', 'bf16'"):
        rnnc.compile(cell, precision="fp16")
    with pytest.raises(RnncValueError, match="precision='tf32' is the CUDA backend's"):
        rnnc.compile(cell, backend="llvm", precision="tf32")
    x, p = _data(cell)
    fn = rnnc.compile(cell, backend="numpy", precision="bf16")
    with pytest.raises(RnncTypeError, match="precision='bf16' runs float32 programs"):
        fn(x.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()})
    with pytest.raises(RnncTypeError, match="or compile with precision=.bf16."):
        rnnc.compile(cell, backend="numpy")(x.astype(BF16), p)
    assert rnnc.compile(cell, backend="numpy", precision="highest").precision == "fp32"


@pytest.mark.slow
def test_check_runs_the_bf16_oracle() -> None:
    rnnc.compile(rnnc.cells.gru(3, 4), backend="llvm", precision="bf16", check=True)


def test_layer_takes_the_precision() -> None:
    layer = rnnc.RNN("lstm", 8, 16, num_layers=2, precision="bf16", backend="llvm")
    ref = rnnc.RNN("lstm", 8, 16, num_layers=2, backend="numpy", precision="bf16")
    ref.params = layer.params
    x, _ = _data(rnnc.cells.lstm(8, 16))
    y, _ = layer(x.astype(BF16))
    want, _ = ref(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def _twice_the_same_product() -> rnnc.Cell:
    c = rnnc.Cell("twice")
    x, h = c.input("x", 8), c.state("h", 16)
    W, U = c.param("W", (8, 16)), c.param("U", (16, 16))
    c.update(h=rnnc.tanh(x @ W + h @ U) * rnnc.sigmoid(h @ U))
    c.output("y", h)
    return c


@pytest.mark.parametrize("backend", ["numpy", pytest.param("llvm", marks=pytest.mark.slow)])
def test_equal_bf16_products_keep_their_own_gradients(backend) -> None:
    """CSE would merge the two h @ U, whose gradients round their cotangents apart."""
    _agree(_twice_the_same_product(), backend)


def test_a_pickled_function_keeps_its_precision() -> None:
    import pickle

    cell = rnnc.cells.gru(8, 16)
    x, p = _data(cell)
    fn = rnnc.compile(cell, backend="numpy", precision="bf16")
    again = pickle.loads(pickle.dumps(fn))
    assert again.precision == "bf16"
    np.testing.assert_array_equal(again(x, p)[0]["y"], fn(x, p)[0]["y"])
