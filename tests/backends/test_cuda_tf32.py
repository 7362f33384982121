"""TF32 GEMMs of the CUDA backend (``precision="tf32"``), in emulation: the rounding itself,
the size of the error it gives an LSTM against a float64 oracle, and what it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc.backends.cuda.precision import round_tf32
from rnnc.backends.schedule import CudaSchedule
from rnnc.errors import RnncValueError

ULP_TF32 = 2.0 ** -10  # the spacing of TF32 values in [1, 2)


def test_rounding_keeps_ten_mantissa_bits_to_nearest_even() -> None:
    values = np.array([1.0, 1 + ULP_TF32, 1 + ULP_TF32 / 2, 1 + 3 * ULP_TF32 / 2,
                       1 + ULP_TF32 / 4, -(1 + 0.75 * ULP_TF32), 3.0e-39, 0.0],
                      np.float32)
    want = np.array([1.0, 1 + ULP_TF32, 1.0, 1 + 2 * ULP_TF32, 1.0, -(1 + ULP_TF32),
                     np.float32(3.0e-39), 0.0])
    # 1 + ulp/2 is a tie: to the even neighbour 1; 1 + 3ulp/2 ties up to 1 + 2ulp.
    got = round_tf32(values)
    np.testing.assert_array_equal(got[:6], want[:6].astype(np.float32))
    assert got[7] == 0.0
    # a subnormal loses its low bits like any other value
    assert abs(got[6] - values[6]) <= 2.0 ** -136


def test_rounding_keeps_inf_and_nan() -> None:
    got = round_tf32(np.array([np.inf, -np.inf, np.nan], np.float32))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


def test_every_float_moves_by_at_most_half_a_tf32_step() -> None:
    a = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    rel = np.abs(round_tf32(a).astype(np.float64) - a) / np.abs(a)
    assert rel.max() <= 2.0 ** -11


def _lstm_errors(dtype) -> dict[str, float]:
    cell = rnnc.cells.lstm(16, 16)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 4, 16))
    p = {k: v.astype(np.float64) for k, v in cell.init_params(seed=0).items()}
    want, _ = rnnc.compile(cell, optimize=False)(x, p)
    errors = {}
    for precision in ("highest", "tf32"):
        fn = rnnc.compile(cell, backend="cuda", emulate=True, precision=precision)
        got, _ = fn(x.astype(dtype), {k: v.astype(dtype) for k, v in p.items()})
        errors[precision] = float(np.abs(got["y"] - want["y"]).max())
    return errors


def test_tf32_costs_an_lstm_about_three_decimal_digits() -> None:
    errors = _lstm_errors(np.float32)
    assert errors["highest"] < 1e-6
    # TF32 must change the GEMMs (far above float32 rounding) and stay within 2e-3
    # (docs/device-calls.md gives the measured 2e-4)
    assert 10 * errors["highest"] < errors["tf32"] < 2e-3, errors


def test_tf32_leaves_float64_programs_alone() -> None:
    errors = _lstm_errors(np.float64)
    assert errors["tf32"] == errors["highest"] < 1e-12


@pytest.mark.parametrize("bad", ["TF32", "fp16", 32])
def test_an_unknown_precision_is_named(bad) -> None:
    with pytest.raises(RnncValueError, match="precision must be one of 'fp32', 'tf32', 'bf16'"):
        rnnc.compile(rnnc.cells.lstm(2, 2), backend="cuda", emulate=True, precision=bad)
    with pytest.raises(RnncValueError, match="precision must be one of 'fp32', 'bf16', 'tf32'"):
        CudaSchedule(precision=bad)


def test_precision_none_is_the_default_and_a_schedule_may_carry_it() -> None:
    """precision=None, like every backend option, means the default ("fp32", also called
    "highest"); a schedule carries the precision too, and giving it both ways is refused."""
    cell = rnnc.cells.lstm(2, 2)
    program = rnnc.compile(cell, backend="numpy").program("inference", "f32")
    backend = rnnc.backends.get("cuda", emulate=True, precision=None)
    assert backend.schedule(program, "inference").precision == "fp32"
    tf32 = rnnc.backends.get("cuda", emulate=True, schedule=CudaSchedule(precision="tf32"))
    # TF32 keeps the GEMM path: the fused kernel computes its product in full float32.
    assert tf32.schedule(program, "inference") == CudaSchedule(precision="tf32",
                                                               fused_step="never")
    with pytest.raises(RnncValueError, match="precision is given both"):
        rnnc.backends.get("cuda", emulate=True, precision="tf32",
                          schedule=CudaSchedule(precision="tf32"))
