"""The CUDA backend's launch plan, in emulation: built once per shape, then only replayed.

A call's work is recorded once per (T, B) (``backends/cuda/plan.py``); these tests count what a
step of the loop launches, check that running a plan enters no code that walks a schedule or
the IR, that the bytes copied to and from the device are counted, that plans are kept per
shape and bounded, and that calls on one runner from several threads still get their own
results. Every result is compared with the unoptimized oracle.
"""

from __future__ import annotations

import cProfile
import math
import pstats
import sys
import threading
import time
from functools import partial

import numpy as np
import pytest

import rnnc
from rnnc.backends.cuda import plan as plan_module
from rnnc.backends.cuda.graphs import EmulatedGraph, Replay
from rnnc.backends.schedule import CudaSchedule

SIZES = (3, 4)


def _inputs(cell: rnnc.Cell, T: int, B: int = 2, seed: int = 0
            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, SIZES[0])).astype(np.float32)
    return x, cell.init_params(seed=seed)


def _runner(fn: rnnc.Function, mode: str = "inference", masked: bool = False):
    return fn._runners[(mode, "f32", masked)]


def _plan(fn: rnnc.Function, mode: str = "inference", masked: bool = False) -> plan_module.Plan:
    plans = _runner(fn, mode, masked).plans.plans
    assert len(plans) == 1, len(plans)
    return next(iter(plans.values()))


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm"])
@pytest.mark.parametrize("fused_step, per_step", [
    ("auto", {"kernel": 1}),  # in emulation "always": h @ U and every gate and state, fused
    ("never", {"gemm": 1, "kernel": 1}),  # h @ U, then one fused kernel for every gate and state
])
def test_a_step_is_one_fused_kernel_or_one_gemm_and_one_kernel(name: str, fused_step: str,
                                                               per_step: dict) -> None:
    cell = getattr(rnnc.cells, name)(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step=fused_step)
    x, p = _inputs(cell, T=6)
    ys, finals = fn(x, p)
    want, want_finals = rnnc.compile(cell, optimize=False)(x, p)
    np.testing.assert_allclose(ys["y"], want["y"], rtol=1e-5, atol=1e-6)
    plan = _plan(fn)
    for step in range(6):
        assert plan.per_step(step) == per_step, (step, plan.per_step(step))
    assert plan.per_step(6) == {}


def test_a_cell_left_with_no_loop_launches_nothing_per_step() -> None:
    cell = rnnc.cells.min_gru(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    fn(*_inputs(cell, T=5))
    plan = _plan(fn)
    assert plan.count("body") == {}
    assert plan.count("pre").get("kernel", 0) >= 1  # the scan itself runs before the loop


def _profiled(call) -> pstats.Stats:
    profile = cProfile.Profile()
    profile.enable()
    call()
    profile.disable()
    return pstats.Stats(profile)


def _entered(stats: pstats.Stats, fragment: str) -> int:
    return sum(calls for (path, _, _), (calls, *_) in stats.stats.items()  # type: ignore[attr-defined]
               if fragment in path.replace("\\", "/"))


@pytest.mark.parametrize("mode", ["inference", "forward"])
def test_a_call_only_replays_its_plan(mode: str) -> None:
    """After the first call of a shape, a call enters no schedule walk, no host recording code
    and no networkx; it launches exactly the plan's kernels, one per recorded kernel entry."""
    cell = rnnc.cells.lstm(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    x, p = _inputs(cell, T=7)
    run = (lambda: fn(x, p)) if mode == "inference" else (lambda: fn.forward(x, p))
    run()
    stats = _profiled(run)
    assert _entered(stats, "backends/cuda/host.py") == 0
    assert _entered(stats, "backends/steps.py") == 0
    assert _entered(stats, "networkx") == 0
    launches = sum(calls for (path, _, name), (calls, *_) in stats.stats.items()  # type: ignore[attr-defined]
                   if name == "__call__" and path.endswith("cuda/launch.py"))
    kernels = _plan(fn, mode).count("pre").get("kernel", 0) + \
        _plan(fn, mode).count("body").get("kernel", 0) + \
        _plan(fn, mode).count("post").get("kernel", 0)
    assert launches == kernels, (launches, kernels)


def test_bytes_to_and_from_the_device_are_counted() -> None:
    cell = rnnc.cells.gru(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    x, p = _inputs(cell, T=5)
    ys, finals = fn(x, p)
    runner = _runner(fn)
    # In: x, the initial state, the packed parameters; out: y and the final state.
    n_params = sum(v.size for v in p.values())
    assert runner.transfers["to_device"] == 4 * (x.size + 2 * SIZES[1] + n_params)
    assert runner.transfers["to_host"] == ys["y"].nbytes + finals["h"].nbytes


def test_plans_are_kept_per_shape_and_bounded(monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "MAX_PLANS", 3)
    cell = rnnc.cells.lstm(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    oracle = rnnc.compile(cell, optimize=False)
    for T in (2, 3, 4, 5, 6, 2, 3):
        x, p = _inputs(cell, T=T, seed=T)
        ys, finals = fn(x, p)
        want, want_finals = oracle(x, p)
        np.testing.assert_allclose(ys["y"], want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(finals["c"], want_finals["c"], rtol=1e-5, atol=1e-6)
    plans = _runner(fn).plans
    assert len(plans) == 3
    assert [key[0] for key in plans.plans] == [6, 2, 3]


def test_results_are_the_caller_s_own() -> None:
    """A plan's buffers serve every call of its shape: results are copies, not views."""
    cell = rnnc.cells.gru(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    x, p = _inputs(cell, T=4)
    first, _ = fn(x, p)
    kept = first["y"].copy()
    fn(*_inputs(cell, T=4, seed=1))
    np.testing.assert_array_equal(first["y"], kept)


def test_threads_calling_one_runner_get_their_own_results() -> None:
    cell = rnnc.cells.lstm(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    oracle = rnnc.compile(cell, optimize=False)
    cases = [_inputs(cell, T=5, seed=s) for s in range(4)]
    wants = [oracle(x, p)[0]["y"] for x, p in cases]
    fn(*cases[0])
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(5):
            got = fn(*cases[k])[0]["y"]
            if not np.allclose(got, wants[k], rtol=1e-5, atol=1e-6):
                errors.append(f"thread {k}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("name", ["lstm", "gru", "mgu"])
def test_training_steps_copy_nothing_after_the_first(name: str, reverse: bool,
                                                     with_lengths: bool) -> None:
    """The values the backward needs from the previous step (the carries a step read) are
    written by the step before, or copied in one call after the loop, not copied per step;
    the gradients still match the oracle's."""
    T = 6
    cell = getattr(rnnc.cells, name)(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, reverse=reverse)
    oracle = rnnc.compile(cell, optimize=False, reverse=reverse)
    x, p = _inputs(cell, T=T)
    lengths = np.array([T, 3]) if with_lengths else None
    got, _, tape = fn.forward(x, p, lengths=lengths)
    want, _, want_tape = oracle.forward(x, p, lengths=lengths)
    d = {"y": np.random.default_rng(1).standard_normal(got["y"].shape).astype(np.float32)}
    grads, want_grads = fn.backward(tape, d_outputs=d), oracle.backward(want_tape, d_outputs=d)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    for key in want_grads.params:
        np.testing.assert_allclose(grads.params[key], want_grads.params[key], rtol=1e-4,
                                   atol=1e-5, err_msg=key)
    np.testing.assert_allclose(grads.x, want_grads.x, rtol=1e-4, atol=1e-5)
    plan = _plan(fn, "forward", with_lengths)
    for step in range(1, T):
        assert "copy" not in plan.per_step(step), (step, plan.per_step(step))


def _own_bytes(root) -> int:
    """The host bytes of the objects reachable from ``root``, each counted once: containers,
    calls and their arguments, per-step records. An array counts as its object only (its data
    is device memory on a GPU), a kernel or NumPy function as itself (code that plans share).
    Counted object by object: tracemalloc would also count the tuples that CPython's free
    lists keep after many have been made and dropped."""
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, np.ndarray):
            total += object.__sizeof__(value)
            continue
        total += sys.getsizeof(value)
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set):
            stack.extend(value)
        elif isinstance(value, partial):
            stack.extend((value.func, value.args, value.keywords))
        elif isinstance(value, plan_module.Plan | plan_module.Loop | plan_module.StepCall |
                        plan_module.PerStep | plan_module.Entry):
            for cls in type(value).__mro__:
                stack.extend(getattr(value, name) for name in getattr(cls, "__slots__", ())
                             if hasattr(value, name))
            stack.extend(getattr(value, "__dict__", {}).values())
    return total


def _plan_bytes(runner, steps: int) -> tuple[int, plan_module.Plan]:
    """The host bytes of ``runner``'s plan for ``steps`` steps (:func:`_own_bytes`), and the
    plan; the runner has a plan of two steps already."""
    ((_, batch, *inputs),) = runner.plans.plans  # the shape key of that plan (T = 2)
    arrays = {name: np.zeros((steps,) + shape[1:] if shape[:1] == (2,) else shape, dtype)
              for name, shape, dtype in inputs}
    plan = runner.host.plan(arrays, {"T": steps, "B": batch})
    return _own_bytes(plan), plan


@pytest.mark.parametrize("mode", ["inference", "forward", "backward"])
@pytest.mark.parametrize("name, reverse", [("lstm", False), ("gru", True)])
def test_a_plan_takes_the_same_host_memory_at_any_length(name: str, reverse: bool,
                                                         mode: str) -> None:
    """One step's calls are recorded once (the step's arrays picked by the step index), so a
    plan of 10**5 steps holds no more host objects than one of 10**3: within 10%."""
    cell = getattr(rnnc.cells, name)(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, reverse=reverse, fused_step="never")
    x, p = _inputs(cell, T=2, B=5)
    fn(x, p)
    got, _, tape = fn.forward(x, p)
    fn.backward(tape, d_outputs={"y": np.ones_like(got["y"])})
    runner = _runner(fn, mode)
    short, short_plan = _plan_bytes(runner, 10**3)
    long, long_plan = _plan_bytes(runner, 10**5)
    assert short > 0 and abs(long - short) <= 0.1 * short, (short, long)
    assert long_plan.per_step(0) == short_plan.per_step(0) != {}
    assert long_plan.count("body")["gemm"] == 10**5 * short_plan.per_step(1)["gemm"]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_the_first_and_last_steps_of_short_loops_match_the_oracle(reverse: bool) -> None:
    """At T = 0, 1, 2, 3 the first step reads the initial state and the last one writes its
    own buffers (no next slot): results, final states and gradients match the oracle's."""
    cell = rnnc.cells.lstm(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, reverse=reverse, fused_step="never")
    oracle = rnnc.compile(cell, optimize=False, reverse=reverse)
    for T in (0, 1, 2, 3):
        x, p = _inputs(cell, T=T, seed=T)
        got, got_finals, tape = fn.forward(x, p)
        want, want_finals, want_tape = oracle.forward(x, p)
        d = {"y": np.random.default_rng(T).standard_normal(got["y"].shape).astype(np.float32)}
        grads, want_grads = fn.backward(tape, d_outputs=d), oracle.backward(want_tape,
                                                                           d_outputs=d)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
        for key in want_finals:
            np.testing.assert_allclose(got_finals[key], want_finals[key], rtol=1e-5, atol=1e-6)
        for key in want_grads.params:
            np.testing.assert_allclose(grads.params[key], want_grads.params[key], rtol=1e-4,
                                       atol=1e-5, err_msg=f"T={T} {key}")


def _lstm_runner(mode: str = "inference", reverse: bool = False):
    """An LSTM function (GEMM path) and its runner of ``mode``, with a plan of T = 2."""
    cell = rnnc.cells.lstm(*SIZES)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, reverse=reverse, fused_step="never")
    x, p = _inputs(cell, T=2, B=5)
    got, _, tape = fn.forward(x, p)
    fn(x, p)
    return cell, fn, _runner(fn, mode)


def test_a_long_plan_is_built_as_fast_as_a_short_one() -> None:
    """A plan of 10**5 steps records as many calls as one of 10**3 (one step's, once), so
    building it costs about the same: no work per step."""
    _, _, runner = _lstm_runner()
    _plan_bytes(runner, 10**3)  # warm up
    seconds = {}
    for steps in (10**3, 10**5):
        start = time.perf_counter()
        _, plan = _plan_bytes(runner, steps)
        seconds[steps] = time.perf_counter() - start
        assert plan.loop is not None and plan.loop.steps == steps
        calls = (len(plan.calls), len(plan.loop.calls))
        if steps == 10**3:
            short_calls = calls
    assert calls == short_calls
    assert seconds[10**5] < 5 * seconds[10**3] + 0.5, seconds


class _Counted(EmulatedGraph):
    """An emulated graph that counts its launches and makes no call (sizes only)."""

    launches = 0

    def launch(self) -> None:
        _Counted.launches += 1


def _graph_bytes(replay: Replay) -> int:
    """The host bytes the graphs of ``replay`` hold (:func:`_own_bytes` of their nodes)."""
    return _own_bytes([graph.nodes for graph in replay.graphs()])


@pytest.mark.parametrize("mode", ["inference", "forward"])
def test_graphs_of_a_long_loop_hold_k_steps_whatever_t(mode: str) -> None:
    """A loop longer than graph_steps (K) replays a graph of K steps T / K
    times: its graphs (before the loop, the first span, the middle spans, the last span,
    after the loop) keep no more host memory at T = 10**5 than at 10**3."""
    _, _, runner = _lstm_runner(mode)
    graph_steps = CudaSchedule().graph_steps
    for steps in (10**3, 10**5):
        _Counted.launches = 0
        _, plan = _plan_bytes(runner, steps)
        replay = Replay(plan, _Counted)
        replay()
        size = _graph_bytes(replay)
        spans = math.ceil(steps / graph_steps)
        assert replay.whole is None and len(replay.spans) <= 3
        assert _Counted.launches == spans + sum(g is not None for g in replay.around)
        per_step = sum(replay.plan.per_step(1).values())
        assert all(len(g.nodes) <= graph_steps * (per_step + 1) for g in replay.spans.values())
        if steps == 10**3:
            short = size
    assert 0 < size <= 1.1 * short, (short, size)


@pytest.mark.parametrize("mode, reverse", [("inference", False), ("forward", True)])
def test_spans_of_graphs_replay_the_plan_s_results(mode: str, reverse: bool) -> None:
    """Graphs of 4 steps replayed over 11 steps (a first, a middle and a shorter last span),
    re-pointed at each span and again at the next call's: the oracle's results."""
    cell, fn, runner = _lstm_runner(mode, reverse)
    oracle = rnnc.compile(cell, optimize=False, reverse=reverse)
    replay = None
    for seed in (1, 2):
        x, p = _inputs(cell, T=11, B=3, seed=seed)
        fn(x, p) if mode == "inference" else fn.forward(x, p)  # fills the plan's inputs
        plan = next(plan for key, plan in runner.plans.plans.items() if key[:2] == (11, 3))
        for value in plan.results.values():
            value.fill(np.nan)
        replay = replay or Replay(plan, EmulatedGraph, steps=4)
        replay()
        assert len(replay.spans) == (2 if mode == "inference" else 3) and replay.whole is None
        want, want_finals = oracle(x, p)
        np.testing.assert_allclose(plan.results["y"], want["y"], rtol=1e-5, atol=1e-6)
        for name in ("h", "c"):
            np.testing.assert_allclose(plan.results[f"{name}.final"], want_finals[name],
                                       rtol=1e-5, atol=1e-6)


def test_the_schedule_s_graph_steps_sets_the_length_of_a_graph() -> None:
    """CudaSchedule(graph_steps=4): an emulated call of 11 steps replays graphs of 4 steps
    (a first, a middle and a last span), not one graph of the whole call as at the default
    K = 256, and returns the oracle's results."""
    cell = rnnc.cells.lstm(*SIZES)
    oracle = rnnc.compile(cell, optimize=False)
    fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step="never",
                      schedule=CudaSchedule(graph_steps=4))
    x, p = _inputs(cell, T=11, B=3, seed=3)
    for _ in range(2):
        got, finals = fn(x, p)
    (plan,) = [plan for key, plan in _runner(fn).plans.plans.items() if key[:2] == (11, 3)]
    assert plan.replay.steps == 4 and plan.replay.whole is None and len(plan.replay.spans) == 2
    want, want_finals = oracle(x, p)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    for name in ("h", "c"):
        np.testing.assert_allclose(finals[name], want_finals[name], rtol=1e-5, atol=1e-6)
