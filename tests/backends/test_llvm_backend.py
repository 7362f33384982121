"""The LLVM backend against the NumPy interpreter: cells, training, fused regions, threads, and
bad inputs."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rnnc  # noqa: E402
from rnnc import ops  # noqa: E402
from rnnc.backends.llvm import autotune, blas  # noqa: E402
from rnnc.backends.llvm.runtime import LlvmBackend  # noqa: E402
from rnnc.backends.numpy.runtime import run_program  # noqa: E402
from rnnc.ir import Carry, Graph, Program, Scan, Type, retype  # noqa: E402
from rnnc.names import Role
from rnnc.verify import verify  # noqa: E402
from tests.strategies import random_cells, random_data  # noqa: E402

TOL = {np.float32: 1e-5, np.float64: 1e-10}
GRAD_TOL = {np.float32: 1e-4, np.float64: 1e-9}
_compiled: dict[tuple, tuple[rnnc.Cell, rnnc.Function, rnnc.Function]] = {}


# The minimal gated unit of the README's "Your own cell", as rnnc ships it.
mgu = rnnc.cells.mgu


CELLS = {
    "rnn": rnnc.cells.rnn,
    "rnn_relu": lambda i, h: rnnc.cells.rnn(i, h, nonlinearity="relu"),
    "lstm": rnnc.cells.lstm,
    "gru": rnnc.cells.gru,
    "gru_v3": lambda i, h: rnnc.cells.gru(i, h, reset_after=False),
    "mgu": mgu,
}


def pair(name: str, size: tuple[int, int]) -> tuple[rnnc.Cell, rnnc.Function, rnnc.Function]:
    """A cell with its NumPy and LLVM functions, compiled once per test session."""
    if (name, size) not in _compiled:
        cell = CELLS[name](*size)
        _compiled[(name, size)] = (cell, rnnc.compile(cell, optimize=False),
                                   rnnc.compile(cell, backend="llvm", cache_dir=False))
    return _compiled[(name, size)]


def close(actual: np.ndarray, expected: np.ndarray, rtol: float) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


def data(cell: rnnc.Cell, T: int, B: int, dtype: type, seed: int = 0):
    x, params, states = random_data(cell, T, B, seed, dtype)
    return x, params, states


def test_fused_step_loop_is_vectorized() -> None:
    import llvmlite.binding as llvm

    from rnnc.backends.llvm import cache, codegen

    program = rnnc.compile(rnnc.cells.lstm(8, 64), backend="numpy").program()
    text, plan = codegen.lower(program, blas.get().convention)
    assert text.count("define ") >= 2 and "prefer-vector-width" in text
    optimized = str(cache.optimize(text))
    features = llvm.get_host_cpu_features()
    lanes = 16 if features.get("avx512f") else 8 if features.get("avx2") else 4
    assert f"<{lanes} x float>" in optimized
    assert [n for n, _ in plan.args] == list(program.args)
    assert [n for n, _ in plan.results] == list(program.results)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_standard_and_custom_cells(name: str, dtype: type) -> None:
    # Size (1, 1) for float32 covers H = 1; (5, 6) for float64 covers a general shape.
    size = (1, 1) if dtype is np.float32 else (5, 6)
    cell, ref, fn = pair(name, size)
    for T, B in ((1, 1), (7, 3)):
        x, params, states = data(cell, T, B, dtype)
        for given_states in (None, states):
            ys, st = fn(x, params, states=given_states)
            ys0, st0 = ref(x, params, states=given_states)
            for k in ys0:
                close(ys[k], ys0[k], TOL[dtype])
            for k in st0:
                close(st[k], st0[k], TOL[dtype])
        lengths = np.arange(B, 0, -1) % T + 1
        ys, st = fn(x, params, states=states, lengths=lengths)
        ys0, st0 = ref(x, params, states=states, lengths=lengths)
        for k in ys0:
            close(ys[k], ys0[k], TOL[dtype])
        for k in st0:
            close(st[k], st0[k], TOL[dtype])


@pytest.mark.parametrize("name, dtype", [("lstm", np.float32), ("gru", np.float64),
                                         ("mgu", np.float32), ("rnn", np.float64)])
def test_training_gradients(name: str, dtype: type) -> None:
    cell, ref, fn = pair(name, (3, 4))
    T, B = 5, 2
    x, params, states = data(cell, T, B, dtype, seed=1)
    rng = np.random.default_rng(2)
    results = []
    for f in (ref, fn):
        ys, st, tape = f.forward(x, params, states=states)
        d_out = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in ys.items()}
        d_st = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in st.items()}
        rng = np.random.default_rng(2)
        g = f.backward(tape, d_outputs=d_out, d_states=d_st)
        results.append((ys, st, g))
    (ys0, st0, g0), (ys, st, g) = results
    for k in ys0:
        close(ys[k], ys0[k], TOL[dtype])
    close(g.x, g0.x, GRAD_TOL[dtype])
    for k in g0.params:
        close(g.params[k], g0.params[k], GRAD_TOL[dtype])
    for k in g0.states:
        close(g.states[k], g0.states[k], GRAD_TOL[dtype])


@pytest.mark.parametrize("library", sorted(blas.available()))
def test_every_installed_blas(library: str) -> None:
    # openblas and mkl use the CBLAS convention, scipy the Fortran one.
    cell = CELLS["gru"](3, 5)
    ref, fn = rnnc.compile(cell, optimize=False), rnnc.compile(cell, backend="llvm", blas=library,
                                               cache_dir=False)
    x, params, states = data(cell, 4, 3, np.float64, seed=4)
    grads = []
    for f in (ref, fn):
        ys, _, tape = f.forward(x, params, states=states)
        grads.append((ys, f.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})))
    (ys0, g0), (ys, g) = grads
    close(ys["y"], ys0["y"], TOL[np.float64])
    close(g.x, g0.x, GRAD_TOL[np.float64])
    for k in g0.params:
        close(g.params[k], g0.params[k], GRAD_TOL[np.float64])


def test_each_gemm_shape_gets_a_measured_choice(tmp_path, monkeypatch) -> None:
    # Two names for the installed library make the per-shape choice measure on any machine.
    library = blas.get()
    twin = blas.Blas("twin", library.sgemm_addr, library.dgemm_addr, library.convention,
                     library.set_threads, library.threads_addr)
    monkeypatch.setattr(autotune, "_CHOICES", {})
    monkeypatch.setattr(autotune, "_default_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(blas, "_load", {library.name: library, "twin": twin}.get)
    backend = LlvmBackend(cache_dir=False)
    backend.libraries = [library, twin]
    cell = CELLS["lstm"](3, 5)
    fn, ref = rnnc.Function(cell, "numpy"), rnnc.Function(cell, "numpy")
    fn.backend = backend
    x, params, states = data(cell, 6, 4, np.float64, seed=5)
    close(fn(x, params, states=states)[0]["y"], ref(x, params, states=states)[0]["y"],
          TOL[np.float64])
    runner = fn.runner("inference", "f64", False)
    choice = runner.gemm_choice(6, 4)
    assert len(choice) == len(runner.plan.gemms) >= 2  # the input projection and the step
    assert {c.partition("@")[0] for c in choice} <= {library.name, "twin"}
    stored = json.loads((tmp_path / "blas.json").read_text())
    # One measured entry per distinct (m, n, k): (T*B, 4H, I) and (B, 4H, H); the candidates
    # are each library at one thread and at all of them.
    assert sorted(k.rsplit(":", 1)[0] for k in stored) == ["float64:24x20x3", "float64:4x20x5"]
    for key, best in stored.items():
        candidates = key.rsplit(":", 1)[1].split(",")
        assert {c.partition("@")[0] for c in candidates} == {library.name, "twin"}
        assert best in candidates


def _fused_program(reverse: bool) -> Program:
    """A hand-built program: pre and post graphs, a fused region using every layout op with
    outputs of two widths (one output twice), a region holding a reduction, summed outputs."""
    region = Graph("f32")
    x, h = region.arg("x", ("B", 6)), region.arg("h", ("B", 3))
    v, m = region.arg("v", (3,)), region.arg("m", ("B", 1))
    a = region.add(ops.slice_, [x], {"start": 0, "stop": 3})
    b = region.add(ops.slice_, [x], {"start": 3, "stop": 6})
    c = region.add(ops.concat, [a, h])
    d = region.add(ops.pad, [h], {"before": 1, "after": 2})
    e = region.add(ops.expand, [m], {"size": 6})
    one = region.add(ops.constant, [], {"value": 1.0})
    o1 = region.add(ops.mul, [region.add(ops.tanh, [c]), region.add(ops.add, [d, e])])
    o2 = region.add(ops.add, [region.add(ops.mul, [region.add(ops.sigmoid, [a]), v]), one])
    o3 = region.add(ops.where, [b, region.add(ops.relu, [b]),
                                region.add(ops.neg, [region.add(ops.exp, [b])])])
    region.outputs = {"o1": o1, "o2": o2, "o3": o3, "o2b": o2, "h": h}

    reducing = Graph("f32")
    r = reducing.arg("r", ("B", 3))
    reducing.outputs = {"n": reducing.add(ops.sub, [r, reducing.add(ops.mean, [r])])}

    body = Graph("f32")
    bx, bh = body.arg("x", ("B", 6)), body.arg("h", ("B", 3))
    bv = body.arg("v2", (3,))
    bm = body.add(ops.sum_, [bh])
    fused = body.add_fused(region, [bx, bh, bv, bm], "test")
    o1, o2, o3, o2b, hh = (body.get(fused, k, "test") for k in range(5))
    norm = body.get(body.add_fused(reducing, [o2b], "test"), 0, "test")
    h_next = body.add(ops.tanh, [body.add(ops.add, [norm, body.add(ops.sqrt, [
        body.add(ops.mul, [hh, hh])])])])
    body.outputs = {"h": h_next, "y": o1, "z": o3, "s": o1, "w": o2}

    pre = Graph("f32")
    pv = pre.arg("v", (3,))
    pre.outputs = {"v2": pre.add(ops.add, [pv, pre.add(ops.constant, [], {"value": 0.5})])}
    post = Graph("f32")
    py = post.arg("y", ("T", "B", 6))
    post.outputs = {"q": post.add(ops.sum_rows, [py]),
                    "y2": post.add(ops.rsqrt, [post.add(ops.add, [
                        post.add(ops.mul, [py, py]), post.add(ops.constant, [], {"value": 1.0})])])}
    scan = Scan(body, seqs=("x",), consts=("v2",), carries=(Carry("h", "h", "h.final"),),
                stacked=("y", "z"), summed=("s", "w"), reverse=reverse)
    args = {"x": (Role.INPUT, Type("f32", ("T", "B", 6))), "h": (Role.STATE, Type("f32", ("B", 3))),
            "v": (Role.PARAM, Type("f32", (3,)))}
    program = Program(args, pre, scan, post, ("y", "z", "s", "w", "h.final", "q", "y2", "v2",
                                              "v"))
    verify(program)
    return program


@pytest.mark.parametrize("reverse", [False, True])
def test_fused_regions_layout_ops_and_stages(reverse: bool) -> None:
    base = _fused_program(reverse)
    rng = np.random.default_rng(3)
    for dtype, program in ((np.float32, base), (np.float64, retype(base, "f64"))):
        runner = LlvmBackend(cache_dir=False).build(program, "inference")
        for T, B in ((1, 1), (4, 3)):
            env = {"x": rng.standard_normal((T, B, 6)).astype(dtype),
                   "h": rng.uniform(-1, 1, (B, 3)).astype(dtype),
                   "v": rng.uniform(-1, 1, 3).astype(dtype)}
            got = runner(env, {"T": T, "B": B})
            want = run_program(program, env, {"T": T, "B": B})
            assert set(got) == set(want)
            for k in want:
                close(got[k], want[k], TOL[dtype])


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(cell=random_cells(max_ops=6), seed=st.integers(0, 100), masked=st.booleans())
def test_random_cells(cell: rnnc.Cell, seed: int, masked: bool) -> None:
    ref = rnnc.compile(cell, optimize=False)
    fn = rnnc.compile(cell, backend="llvm", cache_dir=False)
    x, params, states = random_data(cell, 4, 3, seed, np.float64)
    lengths = np.array([4, 1, 3]) if masked else None
    ys, st_ = fn(x, params, states=states, lengths=lengths)
    ys0, st0 = ref(x, params, states=states, lengths=lengths)
    for k in ys0:
        close(ys[k], ys0[k], TOL[np.float64])
    for k in st0:
        close(st_[k], st0[k], TOL[np.float64])
    grads = []
    for f in (ref, fn):
        outs, _, tape = f.forward(x, params, states=states, lengths=lengths)
        grads.append(f.backward(tape, d_outputs={k: np.ones_like(v) for k, v in outs.items()}))
    g0, g = grads
    for k in g0.params:
        close(g.params[k], g0.params[k], GRAD_TOL[np.float64])
    for k in g0.states:
        close(g.states[k], g0.states[k], GRAD_TOL[np.float64])
    gx0, gx = (v if isinstance(v, dict) else {"x": v} for v in (g0.x, g.x))
    for k in gx0:
        close(gx[k], gx0[k], GRAD_TOL[np.float64])


def test_four_threads_share_one_function() -> None:
    cell, ref, fn = pair("lstm", (3, 4))
    jobs = [data(cell, T, B, np.float32, seed=T) for T, B in ((9, 2), (3, 5), (9, 2), (6, 1))]
    expected = [ref(x, p, states=s) for x, p, s in jobs]
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(k: int) -> None:
        try:
            start.wait()
            for _ in range(20):
                ys, st = fn(*jobs[k][:2], states=jobs[k][2])
                close(ys["y"], expected[k][0]["y"], TOL[np.float32])
                close(st["c"], expected[k][1]["c"], TOL[np.float32])
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _mutate(draw, x: np.ndarray) -> np.ndarray:
    kind = draw(st.sampled_from(["ok", "fortran", "strided", "dtype", "int", "features",
                                 "nan", "rank", "empty"]))
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "strided":
        return np.repeat(x, 2, axis=-1)[..., ::2]
    if kind == "dtype":
        return x.astype(draw(st.sampled_from([np.float16, np.float64, np.complex64])))
    if kind == "int":
        return x.astype(np.int32)
    if kind == "features":
        return np.zeros(x.shape[:-1] + (x.shape[-1] + 1,), x.dtype)
    if kind == "nan":
        return np.full_like(x, np.nan)
    if kind == "rank":
        return x.reshape(-1)
    if kind == "empty":
        return x[:0]
    return x


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(T=st.integers(0, 4), B=st.integers(1, 3), seed=st.integers(0, 9), what=st.data())
def test_bad_inputs_raise_or_match(T: int, B: int, seed: int, what: st.DataObject) -> None:
    cell, ref, fn = pair("gru", (3, 4))
    x, params, states = data(cell, max(T, 1), B, np.float32, seed)
    x = x[:T]
    x = _mutate(what.draw, x)
    name = what.draw(st.sampled_from(sorted(params)))
    params = dict(params, **{name: _mutate(what.draw, params[name])})
    states = {"h": _mutate(what.draw, states["h"])}
    try:
        expected = ref(x, params, states=states)
    except rnnc.RnncError:
        with pytest.raises(rnnc.RnncError):
            fn(x, params, states=states)
        return
    ys, st_ = fn(x, params, states=states)
    np.testing.assert_allclose(ys["y"], expected[0]["y"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(st_["h"], expected[1]["h"], rtol=1e-5, atol=1e-5)


def test_runner_checks_buffers_as_a_last_line() -> None:
    cell = CELLS["rnn"](2, 3)
    program = rnnc.compile(cell, optimize=False).program()
    runner = LlvmBackend(cache_dir=False).build(program, "inference")
    x, params, states = data(cell, 2, 2, np.float32)
    env = {"x": x, **params, **states}
    good = runner(env, {"T": 2, "B": 2})
    close(good["y"], run_program(program, env, {"T": 2, "B": 2})["y"], 1e-5)
    bad = [dict(env, x=x.astype(np.float64)), dict(env, x=np.asfortranarray(x)),
           dict(env, x=x[:1]), dict(env, h=[[0.0] * 3] * 2)]
    for e in bad:
        with pytest.raises(rnnc.RnncError):
            runner(e, {"T": 2, "B": 2})
    with pytest.raises(rnnc.RnncError):
        runner(env, {"T": -1, "B": 2})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("B", [3, 6, 7, 13])
def test_own_step_gemm_tiles_and_leftover_rows(B: int, dtype: type) -> None:
    # H = 16: the gate width 64 is a whole number of column panels, so the per-step products
    # (h @ U forward, dG @ U^T backward) run on rnnc's register-tiled kernel: full 6-row tiles
    # plus a block of the leftover rows.
    cell, ref, fn = pair("lstm", (5, 16))
    x, params, states = data(cell, 4, B, dtype, seed=B)
    results = []
    for f in (ref, fn):
        ys, _, tape = f.forward(x, params, states=states)
        results.append((ys, f.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})))
    (ys0, g0), (ys1, g1) = results
    close(ys1["y"], ys0["y"], TOL[dtype])
    close(g1.x, g0.x, GRAD_TOL[dtype])
    for k in g0.params:
        close(g1.params[k], g0.params[k], GRAD_TOL[dtype])
