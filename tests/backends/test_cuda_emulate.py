"""CUDA emulation: hand-written kernels in rnnc's generated style, run on the CPU vs NumPy."""

from pathlib import Path

import numpy as np
import pytest

from rnnc.backends.cuda.emulate import EmulatedModule, parse_kernels

# The kernels below are also compiled to PTX by test_cuda_ptx.py, which imports KERNELS.

# One LSTM step's elementwise part: gate pre-activations come in one (B, 4H) buffer in
# i, f, g, o column order, as after gate-matmul fusion. Grid-stride over B * H.
LSTM_FLOAT = r"""
extern "C" __global__ void lstm_pointwise(
    const float* __restrict__ gates, const float* __restrict__ c_prev,
    float* __restrict__ h, float* __restrict__ c, long long batch, int hidden) {
    long long n = batch * hidden;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += stride) {
        long long b = idx / hidden;
        int j = (int)(idx % hidden);
        const float* g = gates + b * 4 * hidden;
        float i = 1.0f / (1.0f + expf(-g[j]));
        float f = __frcp_rn(1.0f + __expf(-g[hidden + j]));
        float cand = tanhf(g[2 * hidden + j]);
        float o = __fdividef(1.0f, 1.0f + expf(-g[3 * hidden + j]));
        float c_new = f * c_prev[idx] + i * cand;
        c[idx] = c_new;
        h[idx] = o * tanhf(c_new);
    }
}
"""

LSTM_DOUBLE = r"""
extern "C" __global__ void lstm_pointwise_f64(
    const double* gates, const double* c_prev, double* h, double* c,
    long long batch, int hidden) {
    long long n = batch * hidden;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        long long b = idx / hidden;
        int j = (int)(idx % hidden);
        const double* g = gates + b * 4 * hidden;
        double i = 1.0 / (1.0 + exp(-g[j]));
        double f = 1.0 / (1.0 + exp(-g[hidden + j]));
        double cand = tanh(g[2 * hidden + j]);
        double o = 1.0 / (1.0 + exp(-g[3 * hidden + j]));
        double c_new = f * c_prev[idx] + i * cand;
        c[idx] = c_new;
        h[idx] = o * tanh(c_new);
    }
}
"""

# Scalars of every supported kind, an int buffer of lengths, and the masked state
# update of variable-length sequences: state = t < length[b] ? new : old.
MASKED_UPDATE = r"""
// A comment mentioning extern "C" __global__ void not_a_kernel(char* x) is ignored.
extern "C" __global__ void masked_update(
    const int* __restrict__ lengths, const float* __restrict__ new_state,
    float* __restrict__ state, int t, int batch, int hidden, float scale, double shift) {
    int n = batch * hidden;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += gridDim.x * blockDim.x) {
        int b = idx / hidden;
        float candidate = scale * new_state[idx] + (float)shift;
        state[idx] = t < lengths[b] ? candidate : state[idx];
    }
}
"""

# Every CUDA math function the shim maps, so a missing or misnamed mapping shows up
# in emulation while the same text must also compile with nvcc/NVRTC.
MATH = r"""
extern "C" __global__ void math_functions(const float* x, const double* y, float* out,
                                          double* out64, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        double w = y[i];
        out[8 * i + 0] = expf(v) + logf(v) + sqrtf(v) + rsqrtf(v) + fabsf(-v) + tanhf(v);
        out[8 * i + 1] = __expf(v) + __frcp_rn(v) + __fdividef(v, 2.0f);
        out[8 * i + 2] = fminf(v, 1.0f) + fmaxf(v, 1.0f) + copysignf(v, -1.0f);
        out[8 * i + 3] = __saturatef(v - 1.0f);
        out[8 * i + 4] = isnan(v) ? 1.0f : 0.0f;
        out[8 * i + 5] = isinf(v) ? 1.0f : 0.0f;
        out[8 * i + 6] = tanh(v) + exp(v);
        out[8 * i + 7] = v * 0.0f;
        out64[i] = exp(w) + log(w) + sqrt(w) + rsqrt(w) + fabs(-w) + tanh(w) + fmin(w, 1.0)
                   + fmax(w, 1.0);
    }
}
"""

KERNELS = {
    "lstm_pointwise": LSTM_FLOAT,
    "lstm_pointwise_f64": LSTM_DOUBLE,
    "masked_update": MASKED_UPDATE,
    "math_functions": MATH,
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda-emulate")


@pytest.fixture(scope="module")
def module(cache_dir: Path) -> EmulatedModule:
    """All test kernels in one module, as rnnc's CUDA backend compiles one per program."""
    return EmulatedModule("\n".join(KERNELS.values()), list(KERNELS), cache_dir=cache_dir)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def lstm_reference(gates: np.ndarray, c_prev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    i, f, g, o = np.split(gates, 4, axis=1)
    c = sigmoid(f) * c_prev + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


@pytest.mark.parametrize(
    "name, dtype, rtol",
    [
        ("lstm_pointwise", np.float32, 1e-5),
        ("lstm_pointwise_f64", np.float64, 1e-13),
    ],
)
def test_lstm_kernel_matches_numpy(
    module: EmulatedModule, name: str, dtype: type, rtol: float
) -> None:
    rng = np.random.default_rng(0)
    batch, hidden = 3, 50
    gates = (2 * rng.standard_normal((batch, 4 * hidden))).astype(dtype)
    c_prev = rng.standard_normal((batch, hidden)).astype(dtype)
    h = np.full((batch, hidden), np.nan, dtype)
    c = np.full((batch, hidden), np.nan, dtype)
    # 2 blocks of 32 threads cover 64 of the 150 elements: the grid-stride loop does the rest.
    kernel = module.get_function(name)
    kernel((2,), (32,), (gates, c_prev, h, c, np.int64(batch), np.int32(hidden)))
    h_ref, c_ref = lstm_reference(gates.astype(np.float64), c_prev.astype(np.float64))
    np.testing.assert_allclose(c, c_ref, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(h, h_ref, rtol=rtol, atol=rtol)


def test_masked_update_with_int_and_scalar_arguments(module: EmulatedModule) -> None:
    rng = np.random.default_rng(1)
    batch, hidden, t = 5, 7, 2
    lengths = np.array([1, 2, 3, 4, 5], dtype=np.int32)
    new_state = rng.standard_normal((batch, hidden)).astype(np.float32)
    state = rng.standard_normal((batch, hidden)).astype(np.float32)
    expected = np.where((t < lengths)[:, None], 0.5 * new_state + 0.25, state)
    kernel = module.get_function("masked_update")
    # Python ints for int parameters and a Python float for the double one reach the GPU
    # intact through CuPy, so emulation accepts them too.
    kernel(3, (4, 1, 1), (lengths, new_state, state, t, batch, hidden, np.float32(0.5), 0.25))
    np.testing.assert_allclose(state, expected, rtol=1e-6)


def test_math_functions_keep_ieee_semantics(module: EmulatedModule) -> None:
    x = np.array([0.5, 1.0, 2.5, np.inf, np.nan], dtype=np.float32)
    y = np.array([0.5, 1.0, 2.5, 4.0, 9.0])
    out = np.zeros((x.size, 8), np.float32)
    out64 = np.zeros_like(y)
    module.get_function("math_functions")((1,), (2,), (x, y, out, out64, np.int32(x.size)))
    with np.errstate(invalid="ignore"):
        finite = x[:3]
        first = (
            np.exp(finite)
            + np.log(finite)
            + np.sqrt(finite)
            + 1 / np.sqrt(finite)
            + np.abs(finite)
            + np.tanh(finite)
        )
        np.testing.assert_allclose(out[:3, 0], first, rtol=1e-6)
        np.testing.assert_allclose(out[:3, 1], np.exp(finite) + 1 / finite + finite / 2, rtol=1e-6)
        np.testing.assert_allclose(
            out[:3, 2], np.minimum(finite, 1) + np.maximum(finite, 1) - finite, rtol=1e-6
        )
    np.testing.assert_array_equal(out[:, 3], [0, 0, 1, 1, 0])  # __saturatef(NaN) is 0
    np.testing.assert_array_equal(out[:, 4], [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(out[:, 5], [0, 0, 0, 1, 0])
    # Fast math would fold isnan to false and v * 0 to 0; emulation must not enable it.
    np.testing.assert_array_equal(out[:, 7], [0, 0, 0, np.nan, np.nan])
    expected64 = (
        np.exp(y)
        + np.log(y)
        + np.sqrt(y)
        + 1 / np.sqrt(y)
        + y
        + np.tanh(y)
        + np.minimum(y, 1)
        + np.maximum(y, 1)
    )
    np.testing.assert_allclose(out64, expected64, rtol=1e-14)


def test_parses_parameter_lists() -> None:
    kernels = parse_kernels(MASKED_UPDATE)
    assert list(kernels) == ["masked_update"]
    params = kernels["masked_update"]
    assert [p.name for p in params] == [
        "lengths",
        "new_state",
        "state",
        "t",
        "batch",
        "hidden",
        "scale",
        "shift",
    ]
    assert [(p.base, p.pointer, p.const, p.restrict) for p in params[:3]] == [
        ("int", True, True, True),
        ("float", True, True, True),
        ("float", True, False, True),
    ]
    assert [p.dtype for p in params[3:]] == [np.int32] * 3 + [np.float32, np.float64]


def test_reuses_the_cached_library(cache_dir: Path, module: EmulatedModule) -> None:
    # A rebuilt entry is written to a new file renamed into place (a new inode); a read only
    # refreshes the entry's modification time (rnnc/diskcache.py).
    before = {p: p.stat().st_ino for p in cache_dir.rglob("*") if p.is_file()}
    assert any(p.suffix == ".entry" for p in before), sorted(before)
    EmulatedModule("\n".join(KERNELS.values()), list(KERNELS), cache_dir=cache_dir)
    after = {p: p.stat().st_ino for p in cache_dir.rglob("*") if p.is_file()}
    assert after == before, "the library was built again instead of loaded from the cache"


def lstm_args(dtype: type = np.float32) -> list:
    gates = np.zeros((2, 16), dtype)
    return [
        gates,
        np.zeros((2, 4), dtype),
        np.zeros((2, 4), dtype),
        np.zeros((2, 4), dtype),
        np.int64(2),
        np.int32(4),
    ]


@pytest.mark.parametrize(
    "position, value, error, match",
    [
        (0, np.zeros((2, 16), np.float64), TypeError, "expected dtype float32, got float64"),
        (0, np.zeros((16, 2), np.float32).T, ValueError, "C-contiguous"),
        (0, [0.0] * 32, TypeError, "expected a numpy array"),
        (2, np.zeros((2, 4), np.int32), TypeError, "expected dtype float32, got int32"),
        (4, np.int32(2), TypeError, "expected a int64 scalar"),
        (5, np.int64(4), TypeError, "expected a int32 scalar"),
        (5, 2**40, ValueError, "does not fit in int32"),
        (5, 4.0, TypeError, "pass np.int32"),
        (5, True, TypeError, "bool"),
    ],
)
def test_rejects_bad_arguments(
    module: EmulatedModule, position: int, value: object, error: type, match: str
) -> None:
    args = lstm_args()
    args[position] = value
    with pytest.raises(error, match=match):
        module.get_function("lstm_pointwise")((1,), (32,), tuple(args))


def test_rejects_read_only_output_and_python_float_for_float(module: EmulatedModule) -> None:
    args = lstm_args()
    args[2].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        module.get_function("lstm_pointwise")((1,), (32,), tuple(args))
    # CuPy passes a Python float as a double, which a float parameter misreads.
    state = np.zeros((1, 1), np.float32)
    args = (np.ones(1, np.int32), state, state.copy(), 0, 1, 1, 0.5, 0.0)
    with pytest.raises(TypeError, match="pass np.float32"):
        module.get_function("masked_update")((1,), (1,), args)


def test_rejects_aliased_restrict_buffers(module: EmulatedModule) -> None:
    args = lstm_args()
    args[1] = args[3]  # c_prev and c are both __restrict__ and c is written
    with pytest.raises(ValueError, match="'c_prev' and 'c' get overlapping arrays"):
        module.get_function("lstm_pointwise")((1,), (32,), tuple(args))
    # Without __restrict__ aliasing is defined, so updating c in place is allowed.
    args = lstm_args(np.float64)
    args[1] = args[3] = np.ones((2, 4))
    module.get_function("lstm_pointwise_f64")((1,), (32,), tuple(args))
    np.testing.assert_allclose(args[3], 0.5)  # f * c_prev with f = sigmoid(0)


def test_rejects_bad_launches(module: EmulatedModule) -> None:
    kernel = module.get_function("lstm_pointwise")
    with pytest.raises(TypeError, match="takes 6 arguments"):
        kernel((1,), (32,), tuple(lstm_args()[:5]))
    with pytest.raises(ValueError, match="block x must be in 1..1024"):
        kernel((1,), (2048,), tuple(lstm_args()))
    with pytest.raises(ValueError, match="1-D launches"):
        kernel((1, 2), (32,), tuple(lstm_args()))
    with pytest.raises(ValueError, match="shared memory"):
        kernel((1,), (32,), tuple(lstm_args()), shared_mem=1024)
    with pytest.raises(ValueError, match="no kernel 'missing'"):
        module.get_function("missing")


def test_compile_error_shows_stderr_and_numbered_source(cache_dir: Path) -> None:
    source = 'extern "C" __global__ void broken(float* y, int n) {\n    y[0] = undefined_name;\n}\n'
    with pytest.raises(RuntimeError) as caught:
        EmulatedModule(source, ["broken"], cache_dir=cache_dir)
    message = str(caught.value)
    assert "undefined_name" in message and "error" in message
    assert "kernels.cu:2" in message  # the kernel's own line number, not the wrapper's
    assert "   2 |     y[0] = undefined_name;" in message


def test_rejects_missing_kernels_and_unsupported_parameters(cache_dir: Path) -> None:
    with pytest.raises(ValueError, match="not found in source"):
        EmulatedModule(MASKED_UPDATE, ["lstm_pointwise"], cache_dir=cache_dir)
    with pytest.raises(ValueError, match="only plain pointers"):
        parse_kernels('extern "C" __global__ void k(float** p) {}')
    with pytest.raises(ValueError, match="has type 'char'"):
        parse_kernels('extern "C" __global__ void k(char* p) {}')
