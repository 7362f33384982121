"""``fused_step="auto"`` on a GPU: time a shape's launch plans once, keep the fastest, remember it.

Which is faster, a step as cuBLAS GEMM + elementwise kernel, as one fused kernel
(:mod:`.fused_step`), or the whole loop as one persistent kernel (:mod:`.persistent`, where it
applies), depends on the GPU, the batch and the sizes of the cell, so the runner measures it:
the first call of a shape builds every plan, fills each with the call's inputs, runs each once
to warm up, then :data:`REPLAYS` more times between two CUDA events recorded on the runner's
stream, and keeps the plan with the smaller median. Only the kept plan stays allocated. Ties
keep the GEMM path.

Tuning cannot cost a run:

- a candidate whose launch raises (a cooperative launch too large, a kernel over the
  registers) is dropped with a ``RuntimeWarning``;
- a candidate that takes longer than its budget (:data:`BUDGET_MS`: the GPU time of its timed
  runs, and the host's wait for any one run) is dropped with a ``RuntimeWarning``: it could
  not win. The wait polls the run's end event, so a slow kernel stops the timing rather than
  the process (a kernel that never ends still holds the GPU: nothing on the host can end it);
- the GEMM path is the fallback: the runner times it first, it is never dropped for time, and
  its own launch failing is an error of the call, raised as before. (A run abandoned at its
  budget still runs on the stream: the candidates timed after it wait behind it, and may
  themselves overrun; so the fallback goes first and the persistent kernel last.)

The choice is cached on disk (:class:`TuningCache`, entries of :mod:`rnnc.diskcache` under
``<rnnc cache root>/cuda-tuning``: private directory, size bound, a MAC per entry), keyed by
the device (:func:`device_identity`: name, compute capability, driver, CUDA runtime and CuPy
versions), the program's kernels, the shape and the candidates, so a second process takes
the choice without timing. Each choice is described by a :class:`Tuning`: the path, whether it
was timed or read from disk, the seconds it cost the first call, and every candidate's median
or the reason it was dropped.

The functions take the array module as ``cupy`` (its ``cuda.Event`` and
``cuda.get_elapsed_time``), so tests can drive them with a stand-in clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rnnc import diskcache
from rnnc.backends.cuda.plan import Plan

# How autotune measures, not how a program runs: a candidate is a CudaSchedule, and these
# set how long its timing takes and how sure it is (the schedule chosen names no count of
# replays), so they stay with the tuner. Timed runs per candidate after one warm-up.
REPLAYS = 5
# Per candidate: its timed runs' GPU time in total, and the host's wait for any one run.
# Several times what a C1-C4 call takes even on a slow path: a candidate over it cannot win.
BUDGET_MS = 2000.0
_POLL_S = 2e-4
CACHE_SUBDIRECTORY = "cuda-tuning"


class TuningTimeout(Exception):
    """A candidate's runs took longer than its timing budget."""


@dataclass
class Tuning:
    """How ``fused_step="auto"`` chose one shape's path."""

    path: str  # "gemm", "fused" or "persistent"
    source: str  # "timed", or "disk cache" (another process timed it)
    seconds: float = 0.0  # host time the choice added to the shape's first call
    times_ms: dict[str, float] = field(default_factory=dict)  # median per timed candidate
    dropped: dict[str, str] = field(default_factory=dict)  # candidate -> why it was dropped


def fill(cupy: Any, plan: Plan, env: Mapping[str, Any], stream: Any) -> None:
    """Copy a call's inputs (host or device arrays) into ``plan``'s input arrays."""
    for name, value in env.items():
        if isinstance(value, cupy.ndarray):
            cupy.copyto(plan.inputs[name], value)
        else:
            plan.inputs[name].set(value, stream=stream)


def _wait(event: Any, seconds: float, path: str) -> None:
    """Wait for ``event`` at most ``seconds`` of host time, polling: a run that is still going
    then raises :class:`TuningTimeout` instead of holding the call."""
    deadline = time.perf_counter() + max(seconds, 0.0)
    while not event.done:
        if time.perf_counter() > deadline:
            raise TuningTimeout(f"a run of the {path!r} plan did not end within "
                                f"{seconds * 1e3:.0f} ms")
        time.sleep(_POLL_S)


def median_ms(cupy: Any, plan: Plan, stream: Any, replays: int = REPLAYS,
              budget_ms: float = BUDGET_MS, path: str = "") -> float:
    """The median time in milliseconds of ``replays`` runs of ``plan`` on ``stream``, after
    one run that warms up (CuPy's own kernels compile, cuBLAS creates its handle); raises
    :class:`TuningTimeout` once the runs take longer than ``budget_ms``."""
    spent, times = 0.0, []
    for run in range(1 + replays):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        plan.run()
        end.record(stream)
        _wait(end, (budget_ms - spent) / 1e3, path)
        if run == 0:
            continue  # the warm-up's events also span host work (compiling CuPy's kernels)
        times.append(cupy.cuda.get_elapsed_time(start, end))
        spent += times[-1]
        if spent > budget_ms:
            raise TuningTimeout(f"{len(times)} timed runs of the {path!r} plan took "
                                f"{spent:.0f} ms, over the budget of {budget_ms:.0f} ms")
    return statistics.median(times)


def measure(cupy: Any, stream: Any, plans: Mapping[str, Plan], env: Mapping[str, Any],
            budget_ms: float = BUDGET_MS) -> tuple[dict[str, float], dict[str, str]]:
    """Every plan's median milliseconds on ``stream`` with the inputs ``env``, and the plans
    dropped (a launch that failed, a budget overrun) with the reason, each warned about."""
    times, dropped = {}, {}
    with stream:
        for path, plan in plans.items():
            try:
                fill(cupy, plan, env, stream)
                times[path] = median_ms(cupy, plan, stream, budget_ms=budget_ms, path=path)
            except TuningTimeout as err:
                if path == "gemm":  # the fallback: kept, ranked last
                    times[path] = math.inf
                    continue
                dropped[path] = f"over the timing budget: {err}"
            except Exception as err:
                if path == "gemm":
                    raise
                dropped[path] = f"its launch failed ({type(err).__name__}: {err})"
            if path in dropped:
                warnings.warn(f"rnnc: the {path!r} plan of this shape is not used: "
                              f"{dropped[path]}", RuntimeWarning, stacklevel=3)
    return times, dropped


def fastest(times: Mapping[str, float]) -> str:
    """The path of the smallest time; "gemm" wins ties."""
    return min(sorted(times), key=lambda path: (times[path], path != "gemm"))


def faster(cupy: Any, stream: Any, plans: Mapping[str, Plan], env: Mapping[str, Any],
           budget_ms: float = BUDGET_MS) -> str:
    """The key of the fastest plan of ``plans`` ("gemm", "fused", "persistent") that neither
    fails nor overruns its budget, run on ``stream`` with the inputs ``env``."""
    return fastest(measure(cupy, stream, plans, env, budget_ms)[0])


def choose(cupy: Any, stream: Any, key: Any, env: Mapping[str, Any],
           build: Callable[[str], Plan | None], candidates: list[str],
           cache: TuningCache | None) -> tuple[Plan, Tuning]:
    """The plan of the path chosen for the shape ``key`` among ``candidates`` and how it was
    chosen: read from ``cache``, else timed (and stored). ``build(path)`` makes a path's
    plan, or None where the path does not apply to this shape."""
    started = time.perf_counter()
    cached = None if cache is None else cache.load(key, candidates)
    if cached is not None:
        plan = build(cached)
        if plan is not None:
            return plan, Tuning(cached, "disk cache", time.perf_counter() - started)
    plans = {path: plan for path in candidates if (plan := build(path)) is not None}
    times, dropped = measure(cupy, stream, plans, env)
    path = fastest(times)
    if cache is not None:
        cache.store(key, candidates, path)
    return plans[path], Tuning(path, "timed", time.perf_counter() - started, times, dropped)


def device_identity(cupy: Any) -> str | None:
    """The current GPU as tuning depends on it: name, compute capability, driver, CUDA runtime
    and CuPy versions; None where CuPy cannot say (nothing is then cached on disk)."""
    try:
        device = cupy.cuda.Device()
        runtime = cupy.cuda.runtime
        name = runtime.getDeviceProperties(device.id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        return (f"{name} sm_{device.compute_capability} driver {runtime.driverGetVersion()} "
                f"runtime {runtime.runtimeGetVersion()} cupy {cupy.__version__}")
    except Exception:  # an old CuPy, a driver without the query: tune in memory only
        return None


class TuningCache:
    """Choices of one program's kernels on one device, in rnnc's disk cache."""

    def __init__(self, device: str, program: str, root: Any = None) -> None:
        self.device, self.program = device, program
        self.entries = diskcache.DiskCache(diskcache.default_root() if root is None else root,
                                          "cuda-tuning", CACHE_SUBDIRECTORY)

    def _key(self, key: Any, candidates: list[str]) -> str:
        text = json.dumps([self.device, repr(key), sorted(candidates)])
        return hashlib.sha256(text.encode()).hexdigest()

    def load(self, key: Any, candidates: list[str]) -> str | None:
        """The stored path for shape ``key``, or None (missing, corrupt, not a candidate)."""
        entry = self.entries.load(self._key(key, candidates), self.program)
        path = None if entry is None else entry.meta.get("path")
        return path if path in candidates else None

    def store(self, key: Any, candidates: list[str], path: str) -> None:
        """Remember ``path`` for shape ``key`` (best effort: never raises)."""
        self.entries.store(self._key(key, candidates), self.program,
                          {"path": path, "device": self.device}, b"")
