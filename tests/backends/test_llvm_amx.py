"""bfloat16 GEMMs on LLVM: each kernel tier (AMX, AVX512-BF16, emulation) against a float64
NumPy product of the operands rounded to bf16 by hand, the weight packing cache, and LSTM/GRU
programs whose matmuls run in bf16 against a float64 NumPy cell with hand-rounded GEMMs."""

from __future__ import annotations

import functools

import numpy as np
import pytest

pytest.importorskip("llvmlite")

import rnnc  # noqa: E402
from rnnc import ops  # noqa: E402
from rnnc.backends.llvm import bf16  # noqa: E402
from rnnc.backends.llvm.bf16_jit import Bf16Gemm  # noqa: E402
from rnnc.backends.schedule import LlvmSchedule  # noqa: E402
from rnnc.errors import RnncError, RnncValueError  # noqa: E402
from tests.strategies import random_data  # noqa: E402

HOST = bf16.host_tier()
RUNNABLE = {"amx": HOST == "amx", "avx512bf16": HOST in ("amx", "avx512bf16"), "emulate": True}
# Not multiples of the AMX tile (16 rows x 32 bf16) nor of the 32-column panel.
# The first in the default suite, the others (seconds of compiling each) marked slow.
SHAPES = [(17, 45, 70)] + [pytest.param(*shape, marks=pytest.mark.slow)
                           for shape in ((1, 3, 5), (40, 64, 48), (70, 33, 31))]


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even; finite values), as float64."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def assert_fp32_accumulation(out: np.ndarray, a: np.ndarray, w: np.ndarray) -> None:
    """``out`` equals bf16(a) @ bf16(w) up to the rounding of a float32 sum of K terms."""
    ra, rw = round_bf16(a), round_bf16(w)
    bound = 2 * a.shape[1] * 2.0 ** -24 * (np.abs(ra) @ np.abs(rw)) + 1e-30
    error = np.abs(out - ra @ rw)
    assert np.all(error <= bound), f"worst error / bound {np.max(error / bound):.3g}"


@functools.cache
def kernels(tier: str, k: int, n: int) -> Bf16Gemm:
    """The tier's kernels for K x N weights, compiled once per test session."""
    return Bf16Gemm(tier, k, n)


def product(tier: str, a: np.ndarray, w: np.ndarray, threads: int = 1) -> np.ndarray:
    """``a @ w`` on the tier's kernels, packing ``w`` (a new array may reuse the address of
    one packed before)."""
    gemm = kernels(tier, *w.shape)
    gemm.new_run()
    return gemm(a, w, threads)


def runnable(tier: str) -> None:
    if not RUNNABLE[tier]:
        pytest.skip(f"this CPU cannot run the {tier} tier (host tier {HOST}); its code is "
                    f"checked by test_kernels_assemble_to_their_instructions")


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("tier", bf16.TIERS)
def test_kernel_matches_rounded_float64_product(tier, m, k, n) -> None:
    runnable(tier)
    rng = np.random.default_rng(m * k * n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    out = product(tier, a, w)
    assert_fp32_accumulation(out, a, w)
    # Against the float32 product the error is bf16's, far above float32 rounding: the
    # operands really were rounded.
    assert np.max(np.abs(out - a.astype(np.float64) @ w)) > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["avx512bf16", "emulate"])
def test_kernel_splits_columns_between_threads(tier) -> None:
    runnable(tier)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 50)).astype(np.float32)
    w = rng.standard_normal((50, 130)).astype(np.float32)
    np.testing.assert_array_equal(product(tier, a, w, threads=3), product(tier, a, w))


@pytest.mark.parametrize("tier", ["avx512bf16", "emulate"])
def test_few_rows_and_column_shares(tier) -> None:
    # One to three rows (the per-step GEMV at batch 1-3: tiles shorter than the kernel's),
    # 10 panels, the last partial, on one thread and split 5/5 between two.
    runnable(tier)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((45, 315)).astype(np.float32)
    for rows in (1, 2, 3):
        a = rng.standard_normal((rows, 45)).astype(np.float32)
        for threads in (1, 2):
            assert_fp32_accumulation(product(tier, a, w, threads), a, w)


@pytest.mark.parametrize("tier", ["avx512bf16", "emulate"])
def test_transposed_weights_pack_as_their_transpose(tier) -> None:
    # g @ W^T, the input gradient of a product: W stored (N, K) is packed as W^T, once per
    # run like W; odd K (a pair half outside W) and a partial last panel.
    runnable(tier)
    rng = np.random.default_rng(6)
    wt = rng.standard_normal((70, 45)).astype(np.float32)
    gemm = Bf16Gemm(tier, 45, 70, transposed=True)
    for rows in (1, 9):
        a = rng.standard_normal((rows, 45)).astype(np.float32)
        gemm.new_run()
        out = gemm(a, wt)
        assert_fp32_accumulation(out, a, np.ascontiguousarray(wt.T))
        np.testing.assert_array_equal(out, product(tier, a, np.ascontiguousarray(wt.T)))
    with pytest.raises(RnncValueError, match=r"\(70, 45\)"):
        gemm(a, np.ascontiguousarray(wt.T))


@pytest.mark.parametrize("tier", ["avx512bf16", "emulate"])
def test_operands_round_to_nearest_even(tier) -> None:
    runnable(tier)
    ulp = 2.0 ** -7  # of bf16 at 1
    values = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2.0 ** -20, -(1 + ulp / 4),
                       3.4e38, np.inf, -np.inf, np.nan], np.float32)
    expected = np.array([1.0, 1 + 2 * ulp, 1 + ulp, -1.0, np.inf, np.inf, -np.inf, np.nan])
    # Column 0 of a times w[0, 0] = 1, every other product zero: out[:, 0] = bf16(values).
    a = np.zeros((values.size, 45), np.float32)
    a[:, 0] = values
    w = np.zeros((45, 70), np.float32)
    w[0, 0] = 1
    np.testing.assert_array_equal(product(tier, a, w)[:, 0], expected.astype(np.float32))


def test_kernels_assemble_to_their_instructions() -> None:
    amx = Bf16Gemm("amx", 45, 70, load=False).assembly("sapphirerapids", bf16.AMX_FEATURES)
    for instruction in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"):
        assert instruction in amx
    native = Bf16Gemm("avx512bf16", 45, 70, load=False).assembly(
        "sapphirerapids", "+avx512bf16,+avx512f,+avx512bw,+avx512vl")
    assert "vdpbf16ps" in native and "tileloadd" not in native
    # The emulation needs no bf16 instruction: it builds for a plain AVX2 core.
    emulated = Bf16Gemm("emulate", 45, 70, load=False).assembly("haswell", "")
    assert "vfmadd" in emulated and "dpbf16" not in emulated
    # Nor a runtime library: a JIT could not resolve LLVM's __truncsfbf2.
    assert "bf2" not in emulated


def test_weights_are_packed_once_while_unchanged() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((9, 45)).astype(np.float32)
    w1, w2 = (rng.standard_normal((45, 70)).astype(np.float32) for _ in range(2))
    gemm = kernels("emulate", 45, 70)
    gemm.new_run()
    assert_fp32_accumulation(gemm(a, w1), a, w1)
    assert_fp32_accumulation(gemm(a, w2), a, w2)  # another matrix: packed again
    stale = gemm(a, w2)
    w2 *= 2  # the same matrix, written in place: within a run the packed copy is kept
    np.testing.assert_array_equal(gemm(a, w2), stale)
    gemm.new_run()  # a new run packs again
    assert_fp32_accumulation(gemm(a, w2), a, w2)


def test_bad_arguments_raise_rnnc_errors() -> None:
    with pytest.raises(RnncValueError, match="tier must be one of"):
        Bf16Gemm("fp8", 4, 4)
    gemm = kernels("emulate", 45, 70)
    with pytest.raises(RnncValueError, match=r"float32 a \(M, 45\)"):
        gemm(np.zeros((2, 3), np.float32), np.zeros((45, 70), np.float32))
    with pytest.raises(RnncValueError, match="float32"):
        gemm(np.zeros((2, 45)), np.zeros((45, 70), np.float32))
    if not bf16.request_amx():
        with pytest.raises(RnncError, match="AMX tiles"):
            Bf16Gemm("amx", 4, 4)


def test_host_tier_falls_back_without_amx_grant(monkeypatch) -> None:
    bf16.request_amx.cache_clear()
    monkeypatch.setattr(bf16, "_ARCH_REQ_XCOMP_PERM", -1)  # a request the kernel refuses
    try:
        assert not bf16.request_amx()
        assert bf16.host_tier() in ("avx512bf16", "emulate")
    finally:
        bf16.request_amx.cache_clear()


# -- whole programs
def in_bf16(f: rnnc.Function, dtype: str = "f32") -> rnnc.Function:
    """``f`` with every matmul of its inference program in bfloat16."""
    count = 0
    for graph in f.program("inference", dtype).graphs():
        for node in graph.nodes():
            if node.op is ops.matmul:
                node.attrs["precision"] = "bf16"
                count += 1
    assert count
    return f


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def exact(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float64)


def lstm_oracle(x, p, s, state_dtype, rnd=round_bf16):
    """A float64 LSTM whose GEMM operands are rounded to bf16, states kept in ``state_dtype``
    between steps (the program's dtype: their rounding decides their bf16 values); ``rnd``
    rounds the GEMM operands."""
    h, c, ys = s["h"].astype(np.float64), s["c"].astype(np.float64), []
    for xt in x:
        pre = {g: rnd(xt) @ rnd(p[f"W_i{g}"]) + p[f"b_i{g}"]
               + rnd(h) @ rnd(p[f"W_h{g}"]) + p[f"b_h{g}"] for g in "ifgo"}
        c = sigmoid(pre["f"]) * c + sigmoid(pre["i"]) * np.tanh(pre["g"])
        h = sigmoid(pre["o"]) * np.tanh(c)
        h, c = (v.astype(state_dtype).astype(np.float64) for v in (h, c))
        ys.append(h)
    return np.array(ys)


def gru_oracle(x, p, s, state_dtype, rnd=round_bf16):
    """A float64 GRU (reset after, as torch) with bf16-rounded GEMM operands."""
    h, ys = s["h"].astype(np.float64), []
    for xt in x:
        xi = {g: rnd(xt) @ rnd(p[f"W_i{g}"]) + p[f"b_i{g}"] for g in "rzn"}
        hh = {g: rnd(h) @ rnd(p[f"W_h{g}"]) + p[f"b_h{g}"] for g in "rzn"}
        r, z = sigmoid(xi["r"] + hh["r"]), sigmoid(xi["z"] + hh["z"])
        n = np.tanh(xi["n"] + r * hh["n"])
        h = ((1 - z) * n + z * h).astype(state_dtype).astype(np.float64)
        ys.append(h)
    return np.array(ys)


@pytest.mark.parametrize("name,dtype", [
    ("lstm", np.float32), pytest.param("gru", np.float32, marks=pytest.mark.slow),
    pytest.param("lstm", np.float64, marks=pytest.mark.slow)])
def test_program_with_bf16_matmuls_matches_rounded_oracle(name, dtype) -> None:
    # float64 programs round their operands and keep the float32 lowering's GEMMs.
    cell = getattr(rnnc.cells, name)(20, 48)
    oracle = {"lstm": lstm_oracle, "gru": gru_oracle}[name]
    f = in_bf16(rnnc.compile(cell, backend="llvm", cache_dir=False),
                "f64" if dtype == np.float64 else "f32")
    for seed in (0, 1):  # new weights in the second run: packed again
        x, params, states = random_data(cell, 6, 5, seed, dtype)
        y = f(x, params, states=states)[0]["y"]
        expected = oracle(x, params, states, dtype)
        np.testing.assert_allclose(y, expected, rtol=0, atol=2e-6 if dtype == np.float32
                                   else 1e-12)
        # bf16 moved the result away from the exact cell by far more than that.
        assert np.max(np.abs(y - oracle(x, params, states, np.float64, exact))) > 1e-4



def test_team_splits_bf16_products_by_columns(team_calls) -> None:
    cell = rnnc.cells.lstm(20, 80)  # 320 gate columns: 10 panels, the last one half full
    x, params, states = random_data(cell, 5, 7, 3, np.float32)
    team = in_bf16(rnnc.compile(cell, backend="llvm", team=True, cache_dir=False,
                                schedule=LlvmSchedule(threads=3, team_min_work=0)))
    y = team(x, params, states=states)[0]["y"]
    assert team_calls == [3]
    np.testing.assert_allclose(y, lstm_oracle(x, params, states, np.float32), rtol=0,
                               atol=2e-6)
    # Each element is computed by one thread in the same order as on one: bitwise equal.
    alone = in_bf16(rnnc.compile(cell, backend="llvm", threads=1, cache_dir=False))
    np.testing.assert_array_equal(alone(x, params, states=states)[0]["y"], y)
