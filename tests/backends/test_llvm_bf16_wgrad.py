"""bfloat16 weight gradients ``x^T @ g`` on LLVM (backends/llvm/bf16_wgrad.py): the kernels of
each tier at depths known only at the call (odd, one, past a tile, large) against a float64
NumPy product of the operands rounded by hand, and whole programs' weight gradients against
the bf16 oracle (``optimize=False``) at several ``T * B``, with lengths and on a team."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc.backends.llvm import bf16, bf16_wgrad  # noqa: E402
from rnnc.backends.llvm.bf16_jit import Bf16WeightGradient  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402
from rnnc.errors import RnncValueError  # noqa: E402
from tests.backends.test_llvm_amx import round_bf16, runnable  # noqa: E402

TIERS = ("avx512bf16", "emulate")  # the AMX tier's code is checked as assembly below
# m not a multiple of the 16 columns converted at once, n not of the 32-column panel.
M, N = 37, 70


@functools.cache
def kernels(tier: str, m: int = M, n: int = N) -> Bf16WeightGradient:
    """The tier's weight-gradient kernels for an m x n result, compiled once per session."""
    return Bf16WeightGradient(tier, m, n)


def assert_fp32_sum(out: np.ndarray, a: np.ndarray, g: np.ndarray) -> None:
    """``out`` equals bf16(a)^T @ bf16(g) up to the rounding of a float32 sum of K terms."""
    ra, rg = round_bf16(a), round_bf16(g)
    bound = 2 * max(a.shape[0], 1) * 2.0 ** -24 * (np.abs(ra).T @ np.abs(rg)) + 1e-30
    error = np.abs(out - ra.T @ rg)
    assert np.all(error <= bound), f"worst error / bound {np.max(error / bound):.3g}"


@pytest.mark.parametrize("k", [1, 2, 15, 31, 32, 33, 97, 6400])
@pytest.mark.parametrize("tier", TIERS)
def test_kernel_matches_rounded_float64_product(tier, k) -> None:
    # Odd K (the last pair half zero), K = 1, K around and past the 32-deep tile, and the
    # depth of C1's hoisted weight gradient (T * B = 6400).
    runnable(tier)
    rng = np.random.default_rng(k)
    a = rng.standard_normal((k, M)).astype(np.float32)
    g = rng.standard_normal((k, N)).astype(np.float32)
    out = kernels(tier)(a, g)
    assert_fp32_sum(out, a, g)
    if k > 1:  # the operands really were rounded: far from the float32 product
        assert np.max(np.abs(out - a.astype(np.float64).T @ g)) > 1e-4


@pytest.mark.parametrize("tier", TIERS)
def test_no_rows_give_zero(tier) -> None:
    runnable(tier)
    out = kernels(tier)(np.zeros((0, M), np.float32), np.zeros((0, N), np.float32))
    np.testing.assert_array_equal(out, np.zeros((M, N), np.float32))


@pytest.mark.parametrize("tier", TIERS)
def test_shares_of_rows_and_panels_give_the_same_product(tier) -> None:
    # The split of a thread team: abuf's rows converted and the panels packed and multiplied
    # in three shares; each value is computed the same way, so bitwise equal.
    runnable(tier)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((45, M)).astype(np.float32)
    g = rng.standard_normal((45, N)).astype(np.float32)
    np.testing.assert_array_equal(kernels(tier)(a, g, parts=3), kernels(tier)(a, g))


@pytest.mark.parametrize("tier", TIERS)
def test_one_column_and_whole_panels(tier) -> None:
    # m = 1 (the summed ones^T @ g of a broadcast's gradient: no whole vector of columns to
    # convert) and n = 64 (whole panels: stores without a mask), odd K past one tile.
    runnable(tier)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((33, 1)).astype(np.float32)
    g = rng.standard_normal((33, 64)).astype(np.float32)
    assert_fp32_sum(kernels(tier, 1, 64)(a, g), a, g)


def test_native_and_emulated_tiers_agree() -> None:
    runnable("avx512bf16")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((99, M)).astype(np.float32)
    g = rng.standard_normal((99, N)).astype(np.float32)
    np.testing.assert_allclose(kernels("avx512bf16")(a, g), kernels("emulate")(a, g),
                               rtol=1e-5, atol=1e-5)


def test_kernels_assemble_to_their_instructions() -> None:
    amx = Bf16WeightGradient("amx", M, N, load=False).assembly("sapphirerapids",
                                                               bf16.AMX_FEATURES)
    for instruction in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"):
        assert instruction in amx
    native = Bf16WeightGradient("avx512bf16", M, N, load=False).assembly(
        "sapphirerapids", "+avx512bf16,+avx512f,+avx512bw,+avx512vl")
    assert "vdpbf16ps" in native and "tileloadd" not in native
    emulated = Bf16WeightGradient("emulate", M, N, load=False).assembly("haswell", "")
    assert "vfmadd" in emulated and "dpbf16" not in emulated and "bf2" not in emulated


def test_bad_arguments_raise_rnnc_errors() -> None:
    with pytest.raises(RnncValueError, match="tier must be one of"):
        Bf16WeightGradient("fp8", 4, 4)
    gemm = kernels("emulate")
    with pytest.raises(RnncValueError, match=r"a \(K, 37\) and g \(K, 70\)"):
        gemm(np.zeros((3, M), np.float32), np.zeros((4, N), np.float32))
    with pytest.raises(RnncValueError, match="float32"):
        gemm(np.zeros((3, M)), np.zeros((3, N), np.float32))


# -- whole programs: the weight gradient of y = x @ W, K = T * B rows contracted
def projection() -> rnnc.Cell:
    """``y = x @ W + h`` with ``h`` carried: the gradient of W is ``x^T @ dy`` over every
    step, whose cotangent is exactly the given ``dy`` (no recurrence to round it apart)."""
    c = rnnc.Cell("projection")
    x, h = c.input("x", M), c.state("h", N)
    W = c.param("W", (M, N))
    c.update(h=h)
    c.output("y", x @ W + h)
    return c


@pytest.fixture
def wgrad_calls(monkeypatch) -> list[bool]:
    """Whether each weight gradient lowered on the bf16 kernels was split by a team (the code
    cache emptied, so that the test's program is built)."""
    from rnnc.backends.llvm import cache

    monkeypatch.setattr(cache, "_CACHES", {})
    calls: list[bool] = []
    emit = bf16_wgrad.emit_wgrad

    def spy(ctx, out, a, g, tier=None, team=None):
        calls.append(team is not None)
        emit(ctx, out, a, g, tier, team)

    monkeypatch.setattr(bf16_wgrad, "emit_wgrad", spy)
    return calls


def weight_gradient(fn: rnnc.Function, x, params, dy, lengths=None) -> np.ndarray:
    _, _, tape = fn.forward(x, params, lengths=lengths)
    return fn.backward(tape, {"y": dy}).params["W"]


def check_against_oracle(fn: rnnc.Function, T: int, B: int, lengths=None) -> None:
    cell = fn.cell
    rng = np.random.default_rng(T * 100 + B)
    x = rng.standard_normal((T, B, M)).astype(np.float32)
    dy = rng.standard_normal((T, B, N)).astype(np.float32)
    params = cell.init_params(seed=1)
    got = weight_gradient(fn, x, params, dy, lengths)
    want = weight_gradient(rnnc.compile(cell, optimize=False, precision="bf16"), x, params, dy,
                           lengths)
    assert got.dtype == np.float32
    # Both sum the same bf16 products in float32, in other orders (the oracle step by step).
    bound = 4 * T * B * 2.0 ** -24 * (np.abs(round_bf16(x.reshape(-1, M))).T
                                      @ np.abs(round_bf16(dy.reshape(-1, N)))) + 1e-30
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) / bound)
    assert np.max(np.abs(want - weight_gradient(rnnc.compile(cell, optimize=False), x, params,
                                                dy, lengths))) > 1e-4  # rounded to bf16


def test_program_weight_gradient_matches_oracle(wgrad_calls) -> None:
    fn = rnnc.compile(projection(), backend="llvm", precision="bf16", cache_dir=False)
    # T * B = 1, 15 (odd), 33 (past one 32-deep tile), 800: one build, the depth the call's.
    for T, B in [(1, 1), (3, 5), (11, 3), (40, 20)]:
        check_against_oracle(fn, T, B)
    assert wgrad_calls == [False]
    # Lengths: the masked build; steps past a sequence's end contribute nothing.
    check_against_oracle(fn, 6, 5, lengths=np.array([6, 1, 3, 5, 2]))
    assert wgrad_calls == [False, False]


def test_team_splits_the_weight_gradient(wgrad_calls, team_calls) -> None:
    # An Elman cell with 64 units: its backward's step products run on a team of three, and
    # the weight gradients after the loop are split between the threads (each thread its
    # share of x^T and its panels of g).
    cell = rnnc.cells.rnn(M, 64)
    team = rnnc.compile(cell, backend="llvm", precision="bf16", cache_dir=False, team=True,
                        schedule=LlvmSchedule(threads=3, team_min_work=0))
    oracle = rnnc.compile(cell, optimize=False, precision="bf16")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((7, 9, M)).astype(np.float32)
    dy = {"y": rng.standard_normal((7, 9, 64)).astype(np.float32)}
    params = cell.init_params(seed=2)
    grads = []
    for fn in (team, oracle):
        _, _, tape = fn.forward(x, params)
        grads.append(fn.backward(tape, dy).params)
    assert True in wgrad_calls and 3 in team_calls
    for name in ("W_ih", "W_hh"):
        np.testing.assert_allclose(grads[0][name], grads[1][name], rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_program_weight_gradient_at_c1_depth(wgrad_calls) -> None:
    fn = rnnc.compile(projection(), backend="llvm", precision="bf16", cache_dir=False)
    check_against_oracle(fn, 100, 64)  # T * B = 6400, C1's
    assert wgrad_calls == [False]
