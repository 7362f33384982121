"""``fused_step="auto"`` on a GPU, driven in emulation with a stand-in for CUDA events
(``backends/cuda/autotune.py``): the faster plan is kept, a path whose launch fails or overruns
its timing budget is dropped with a warning, the choice is cached on disk per device and shape
(a second process reads it without timing; a corrupt entry is ignored), and the first call's
tuning time is reported apart from the steady state (``Function.launch_report``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rnnc
from rnnc.backends.cuda import autotune
from tests.backends.test_cuda_fused_step import TOLERANCE, T, case, make, only_plan


class FakeClock:
    """A stand-in for CuPy's events: each plan's run advances a clock by its own cost."""

    def __init__(self) -> None:
        self.now = 0.0
        self.ends = True  # whether the last run has ended (a hanging kernel's never does)
        self.ndarray = np.ndarray
        clock = self

        class Event:
            @property
            def done(self) -> bool:
                return clock.ends

            def record(self, stream: object = None) -> None:
                self.at = clock.now

            def synchronize(self) -> None:
                pass

        self.cuda = type("cuda", (), {"Event": Event, "get_elapsed_time":
                                      staticmethod(lambda start, end: end.at - start.at)})

    @staticmethod
    def copyto(destination: np.ndarray, source: np.ndarray) -> None:
        np.copyto(destination, source)


class FakePlan:
    def __init__(self, clock: FakeClock, cost: float) -> None:
        self.clock, self.cost, self.runs = clock, cost, 0
        self.inputs = {"x": np.zeros(3)}

    def run(self) -> None:
        self.runs += 1
        self.clock.now += self.cost
        self.clock.ends = True


class FakeStream:
    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("costs, kept", [((1.0, 2.0), "fused"), ((3.0, 2.0), "gemm"),
                                         ((2.0, 2.0), "gemm")])
def test_auto_keeps_the_plan_with_the_smaller_median(costs: tuple, kept: str) -> None:
    clock = FakeClock()
    plans = {"fused": FakePlan(clock, costs[0]), "gemm": FakePlan(clock, costs[1])}
    x = np.arange(3.0).view(np.ndarray)
    assert autotune.faster(clock, FakeStream(), plans, {"x": x}) == kept
    for plan in plans.values():
        assert plan.runs == 1 + autotune.REPLAYS
        np.testing.assert_array_equal(plan.inputs["x"], x)


class FailingPlan(FakePlan):
    def run(self) -> None:
        raise RuntimeError("cudaErrorCooperativeLaunchTooLarge")


def test_auto_drops_a_path_whose_launch_fails_and_says_so() -> None:
    clock = FakeClock()
    plans = {"persistent": FailingPlan(clock, 0.5), "fused": FakePlan(clock, 2.0),
             "gemm": FakePlan(clock, 1.0)}
    with pytest.warns(RuntimeWarning, match="'persistent' plan.*LaunchTooLarge"):
        assert autotune.faster(clock, FakeStream(), plans, {"x": np.zeros(3)}) == "gemm"


def test_auto_does_not_hide_a_failing_gemm_path() -> None:
    clock = FakeClock()
    plans = {"fused": FakePlan(clock, 1.0), "gemm": FailingPlan(clock, 2.0)}
    with pytest.raises(RuntimeError, match="LaunchTooLarge"):
        autotune.faster(clock, FakeStream(), plans, {"x": np.zeros(3)})


@pytest.mark.parametrize("gemm_ms, kept", [(1.0, "gemm"), (3.0, "fused")])
def test_auto_on_a_gpu_times_both_plans_once_per_shape(monkeypatch: pytest.MonkeyPatch,
                                                       gemm_ms: float, kept: str) -> None:
    """What a runner does with "auto" on a GPU for a new shape, driven in emulation with a
    stand-in for CUDA events: both paths' plans are built and timed, the faster is kept."""
    cell = make("lstm", 5)
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    x, params, _, _ = case(cell, 2, np.float32)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    fn(x, params)
    runner = fn._runners[("inference", "f32", False)]
    assert set(runner.hosts) == {"fused", "gemm"} and not runner.timed and runner.paths == {}
    timed: list[str] = []

    def median_ms(cupy: object, plan: object, stream: object, **budget: object) -> float:
        path = "gemm" if "gemm" in plan.per_step(0) else "fused"
        timed.append(path)
        return gemm_ms if path == "gemm" else 2.0

    monkeypatch.setattr(autotune, "median_ms", median_ms)
    monkeypatch.setattr(runner, "backend", type("Backend", (), {"cupy": FakeClock()}))
    runner.timed, runner._stream = True, FakeStream()
    env = {name: array.copy() for name, array in only_plan(fn, "inference", np.float32,
                                                            False).inputs.items()}
    key = ("a new shape",)
    plan = runner._new_plan(key, env, {"T": T, "B": 2})
    assert sorted(timed) == ["fused", "gemm"] and runner.paths == {key: kept}
    assert ("gemm" in plan.per_step(0)) == (kept == "gemm")
    plan.run()
    np.testing.assert_allclose(plan.results["y"], want["y"], **TOLERANCE[np.float32])
    runner._new_plan(key, env, {"T": T, "B": 2})  # the choice is kept: no second timing
    assert len(timed) == 2


class HangingPlan(FakePlan):
    """A plan whose kernel does not end while it is timed."""

    def run(self) -> None:
        self.runs += 1
        self.clock.ends = False


def test_auto_drops_a_path_over_its_timing_budget_and_says_so() -> None:
    clock = FakeClock()
    plans = {"fused": FakePlan(clock, 300.0), "gemm": FakePlan(clock, 40.0)}
    with pytest.warns(RuntimeWarning, match="'fused' plan of this shape is not used: over the "
                                            "timing budget: 1 timed runs .* 300 ms"):
        times, dropped = autotune.measure(clock, FakeStream(), plans, {"x": np.zeros(3)},
                                          budget_ms=250.0)
    assert plans["fused"].runs == 2  # the warm-up and one timed run: then it stops
    assert plans["gemm"].runs == 1 + autotune.REPLAYS
    assert times == {"gemm": 40.0} and set(dropped) == {"fused"}


def test_auto_abandons_a_run_that_does_not_end_within_the_budget() -> None:
    clock = FakeClock()
    plans = {"persistent": HangingPlan(clock, 0.0), "gemm": FakePlan(clock, 1.0)}
    with pytest.warns(RuntimeWarning, match="'persistent' plan.*did not end within 50 ms"):
        assert autotune.faster(clock, FakeStream(), plans, {"x": np.zeros(3)},
                               budget_ms=50.0) == "gemm"
    assert plans["persistent"].runs == 1


@pytest.mark.parametrize("fused", [FailingPlan, FakePlan])
def test_a_gemm_path_over_the_budget_stays_the_fallback(fused: type) -> None:
    """The GEMM path is never dropped for time: it runs where nothing else can, and loses to
    any path that kept within the budget."""
    clock = FakeClock()
    plans = {"fused": fused(clock, 1.0), "gemm": FakePlan(clock, 300.0)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        times, _ = autotune.measure(clock, FakeStream(), plans, {"x": np.zeros(3)},
                                    budget_ms=250.0)
    assert len(caught) == (fused is FailingPlan)  # the failed launch's warning only
    assert times["gemm"] == np.inf
    assert autotune.fastest(times) == ("gemm" if fused is FailingPlan else "fused")


def timed_runner(monkeypatch: pytest.MonkeyPatch, fn: rnnc.Function, device: str | None,
                 costs: dict[str, float], timed: list[str]):
    """``fn``'s inference runner made to tune as on a GPU called ``device``: plans cost
    ``costs`` milliseconds on a stand-in clock; ``timed`` collects every path timed."""
    runner = fn._runners[("inference", "f32", False)]

    def median_ms(cupy: object, plan, stream: object, **budget: object) -> float:
        timed.append(plan.path)
        return costs[plan.path]

    monkeypatch.setattr(autotune, "median_ms", median_ms)
    monkeypatch.setattr(autotune, "device_identity", lambda cupy: device)
    monkeypatch.setattr(runner, "backend", type("Backend", (), {"cupy": FakeClock()}))
    runner.timed, runner._stream = True, FakeStream()
    return runner


def new_process(cell: rnnc.Cell, x: np.ndarray, params: dict) -> rnnc.Function:
    """A fresh compiled function that has run once (emulated: its path fixed by the mode)."""
    fn = rnnc.compile(cell, backend="cuda", emulate=True)
    fn(x, params)
    return fn


def test_a_tuned_choice_is_cached_on_disk_per_device_and_read_without_timing(
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    cell = make("lstm", 5)
    x, params, _, _ = case(cell, 2, np.float32)
    want, _ = rnnc.compile(cell, optimize=False)(x, params)
    device = f"Fake GPU sm_90 ({request.node.name})"  # a cache key no other test uses
    costs = {"fused": 2.0, "gemm": 1.0}
    timed: list[str] = []
    key, dims = (T, 2, "a new shape"), {"T": T, "B": 2}

    def tune(fn: rnnc.Function, device: str | None):
        runner = timed_runner(monkeypatch, fn, device, costs, timed)
        env = {name: a.copy() for name, a in only_plan(fn, "inference", np.float32,
                                                        False).inputs.items()}
        plan = runner._new_plan(key, env, dims)
        runner.plans.get(key, lambda: plan)
        for name, array in env.items():  # what a call does next
            np.copyto(plan.inputs[name], array)
        return runner, plan

    first, plan = tune(new_process(cell, x, params), device)
    assert timed == ["gemm", "fused"] and plan.path == "gemm"  # the fallback is timed first
    tuning = first.tunings[key]
    assert (tuning.source, tuning.times_ms, tuning.dropped) == ("timed", costs, {})
    assert tuning.seconds > 0

    second, plan = tune(new_process(cell, x, params), device)
    assert len(timed) == 2 and plan.path == "gemm"  # read from disk: nothing timed
    assert second.tunings[key].source == "disk cache" and second.tunings[key].times_ms == {}
    plan.run()
    np.testing.assert_allclose(plan.results["y"], want["y"], **TOLERANCE[np.float32])
    rows = [row for row in second.launch_report() if row["chosen_by"] != "fused_step"]
    assert [(r["path"], r["chosen_by"], r["graph"]) for r in rows] == [
        ("gemm", "disk cache", False)]

    tune(new_process(cell, x, params), device + " driver 2")  # another device: timed again
    assert len(timed) == 4
    tune(new_process(cell, x, params), None)  # a device CuPy cannot name: nothing cached
    tune(new_process(cell, x, params), None)
    assert len(timed) == 8


def test_a_corrupt_cached_choice_is_ignored_and_timed_again(
        monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    cell = make("gru", 5)
    x, params, _, _ = case(cell, 2, np.float32)
    device = f"Fake GPU sm_90 ({request.node.name})"
    timed: list[str] = []
    key, dims = (T, 2, "a new shape"), {"T": T, "B": 2}

    def tune() -> str:
        fn = new_process(cell, x, params)
        runner = timed_runner(monkeypatch, fn, device, {"fused": 1.0, "gemm": 2.0}, timed)
        env = {n: a.copy() for n, a in only_plan(fn, "inference", np.float32, False)
               .inputs.items()}
        runner._new_plan(key, env, dims)
        return runner

    runner = tune()
    cache = autotune.TuningCache(device, runner.fingerprint)
    entry = cache.entries.path(cache._key(key, sorted(runner.hosts)))
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert tune().tunings[key].source == "timed" and len(timed) == 4
    assert tune().tunings[key].source == "disk cache" and len(timed) == 4  # rewritten


def test_a_cached_path_that_is_no_candidate_is_ignored(request: pytest.FixtureRequest) -> None:
    cache = autotune.TuningCache(f"Fake GPU ({request.node.name})", "0" * 64)
    cache.store(("shape",), ["fused", "gemm", "persistent"], "persistent")
    assert cache.load(("shape",), ["fused", "gemm", "persistent"]) == "persistent"
    assert cache.load(("shape",), ["fused", "gemm"]) is None  # another candidate set: a miss


def test_launch_report_names_each_shapes_path() -> None:
    """Emulated, the mode fixes the path: fused where the step fuses, else GEMM + kernel."""
    cell = make("lstm", 5)
    x, params, _, _ = case(cell, 2, np.float32)
    for mode, path in (("auto", "fused"), ("never", "gemm")):
        fn = rnnc.compile(cell, backend="cuda", emulate=True, fused_step=mode)
        fn(x, params)
        fn(x[:2], params)
        assert fn.launch_report() == [
            {"program": "inference", "dtype": "f32", "lengths": False, "T": steps, "B": 2,
             "path": path, "chosen_by": "fused_step", "tuning_s": 0.0, "times_ms": {},
             "dropped": {}, "graph": False, "capture_failed": False, "capture_error": ""}
            for steps in (T, 2)]
    assert rnnc.compile(cell).launch_report() == []
