"""Run a program with CUDA kernels and cuBLAS GEMMs, or the same host code in emulation.

The host code is written once against an array module ``xp`` and a kernel loader:

- on a GPU, ``xp`` is CuPy, kernels come from ``cupy.RawModule(code=source)`` (NVRTC) and
  ``xp.matmul`` is cuBLAS. The API's NumPy inputs are copied to the device with
  ``xp.asarray`` and results come back with ``.get()``.
- in emulation (``emulate=True``), ``xp`` is NumPy and the *same source string* is compiled for
  the CPU by :class:`~rnnc.backends.cuda.emulate.EmulatedModule`; inputs are used in place.

A call runs a launch plan (:mod:`.plan`), built the first time a shape is seen and kept (the
:data:`~.plan.MAX_PLANS` most recently used per runner): the device arrays of the inputs, of
every intermediate and of the results, and every kernel launch and GEMM already resolved. A
call copies its NumPy inputs into the plan's input arrays (on a GPU through page-locked host
buffers the plan keeps), makes the plan's calls in order (on a GPU on the runner's own stream)
and copies the results out. Calls on one runner take turns.

``graph=True`` (the default): after a shape's first call (which also compiles CuPy's own
kernels and creates the cuBLAS handle, which cannot happen inside a capture) the plan is
captured as CUDA graphs of at most ``CudaSchedule.graph_steps`` loop steps, replayed span by
span (:mod:`.graphs`), so their size does not grow with T. If the capture fails, that shape runs
its plan call by call (``launch_report()`` says why); emulation replays the same graphs from
host memory. ``graph=False`` launches every call of the plan from Python on every call.

``fused_step`` chooses how a step of the loop runs its recurrent product where the region
reading it is unit-local (:mod:`.fused_step`): ``"never"`` keeps a cuBLAS GEMM and an
elementwise kernel; ``"always"`` runs one fused kernel (product tile and epilogue) instead;
``"auto"`` (the default) is ``"always"`` in emulation, and on a GPU times the plans on the first
call of each shape and keeps the fastest (:mod:`.autotune`, docs/backends.md);
``Runner.launch_report()`` says, per shape, which path runs and how it was chosen.
``"persistent"`` runs the whole time loop as one cooperative launch (:mod:`.persistent`) where
the body and the shape allow it, else the fused steps. The fused kernel computes the product in
full float32, so TF32 (:mod:`.precision`) and backward programs keep the GEMM path; bfloat16
products take every path, the fused kernels reading bfloat16 weights (:mod:`.bf16`). Where a
module has barrier kernels, emulation loads it through :mod:`.mixed`.

``schedule=`` takes a :class:`~rnnc.backends.schedule.CudaSchedule`, every decision of how to
run (``precision=`` and ``fused_step=`` fill its None fields); :meth:`CudaBackend.schedule`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from rnnc import process
from rnnc.backends import is_backward
from rnnc.backends.cuda import autotune
from rnnc.backends.cuda import precision as precision_module
from rnnc.backends.cuda.codegen import Module, render
from rnnc.backends.cuda.device import CudaDevice, EmulatedArray
from rnnc.backends.cuda.graphs import EmulatedGraph, Replay, capture, replay
from rnnc.backends.cuda.host import Host
from rnnc.backends.cuda.persistent import PersistentLaunch, resident_blocks
from rnnc.backends.cuda.plan import Plan, Plans, shape_key
from rnnc.backends.schedule import CudaSchedule, gemm_precision, given
from rnnc.backends.steps import ProgramSteps, program_steps
from rnnc.errors import BackendUnavailable, RnncValueError
from rnnc.ir import Program

UNAVAILABLE = ("backend 'cuda' needs CuPy and an NVIDIA GPU: {why}. Pass emulate=True "
               "(rnnc.compile(cell, backend='cuda', emulate=True)) to run the same host code "
               "and generated kernels on the CPU.")


# The fixed fused_step of each path a runner may launch: autotune's candidate schedules.
FUSED_STEPS = {"gemm": "never", "fused": "always", "persistent": "persistent"}


def load_cupy() -> Any:
    """The cupy module with at least one device, or raise BackendUnavailable saying why."""
    try:
        import cupy
    except ImportError as err:
        raise BackendUnavailable(UNAVAILABLE.format(why=f"cupy is not installed ({err})")) \
            from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # CUDARuntimeError without a driver; its type lives in cupy
        raise BackendUnavailable(UNAVAILABLE.format(why=f"no CUDA device ({err})")) from None
    if count == 0:
        raise BackendUnavailable(UNAVAILABLE.format(why="no CUDA device found"))
    return cupy


class CudaBackend:
    """Builds runners that launch generated kernels (CuPy, or emulated on the CPU)."""

    name = "cuda"

    def __init__(self, emulate: bool = False, graph: bool = True, precision: str | None = None,
                 fused_step: str | None = None, schedule: CudaSchedule | None = None,
                 **options: Any) -> None:
        if options:
            raise RnncValueError(f"backend 'cuda' takes emulate=, graph=, precision=, "
                                 f"fused_step= and schedule=, got {sorted(options)}")
        self.emulate = bool(emulate)
        self.graph = bool(graph)
        asked = given(schedule, CudaSchedule, self.name).merged(
            {"precision": precision, "fused_step": fused_step})  # each checked by CudaSchedule
        # What every program of this backend starts from (schedule() derives a program's).
        self.base_schedule = dataclasses.replace(asked, precision=asked.precision or "fp32",
                                                 fused_step=asked.fused_step or "auto")
        self.cupy = None if self.emulate else load_cupy()
        # Device calls (docs/device-calls.md): how the API adopts and makes device arrays.
        self.device = CudaDevice(self.xp, self.emulate)

    @property
    def xp(self) -> Any:
        """The array module: CuPy on a GPU, NumPy in emulation."""
        return np if self.cupy is None else self.cupy

    def load(self, source: str, names: list[str], barriers: list[str] | None = None) -> Any:
        """Compile ``source``; return an object whose ``get_function(name)`` gives kernels.
        ``barriers`` names the kernels that use shared memory and ``__syncthreads()``."""
        if self.cupy is None:
            if barriers:
                from rnnc.backends.cuda.mixed import MixedModule

                return MixedModule(source, names, barriers)
            from rnnc.backends.cuda.emulate import EmulatedModule

            return EmulatedModule(source, names)
        return self.cupy.RawModule(code=source, options=("--std=c++17",))

    def load_cooperative(self, source: str, names: list[str]) -> Any:
        """Compile ``source`` as a module whose every launch is cooperative (all blocks
        resident at once, ``this_grid().sync()`` allowed): the persistent kernel's."""
        if self.cupy is None:
            from rnnc.backends.cuda.cooperative import CooperativeModule

            return CooperativeModule(source, names, enable_cooperative_groups=True)
        return self.cupy.RawModule(code=source, options=("--std=c++17",),
                                   enable_cooperative_groups=True)

    def schedule(self, program: Program, mode: str) -> CudaSchedule:
        """How ``program`` (of ``mode``) runs: the backend's schedule, with the GEMM path for
        TF32 in float32 (the fused kernel computes in full float32) and for a backward program
        (.fused_step). "auto" is resolved per shape on a GPU (:mod:`.autotune`)."""
        base = self.base_schedule
        if gemm_precision(program) == "bf16":  # bfloat16 GEMMs; the fused kernels read them
            base = dataclasses.replace(base, precision="bf16")
        tf32 = base.precision == "tf32" and program.dtype == "f32"
        return dataclasses.replace(base, fused_step="never") \
            if tf32 or is_backward(mode) else base

    def build(self, program: Program, mode: str) -> Runner:
        """A callable ``(env, dims) -> results`` for ``program`` (of ``mode``), as scheduled."""
        return Runner(self, program, self.schedule(program, mode))


class Runner:
    """A built program: ``runner(env, dims)`` runs it; ``runner.source`` is its kernel source.

    ``runner.transfers`` holds the bytes the last call copied to the device and back
    (``to_device``, ``to_host``), counted alike on a GPU and in emulation. ``runner.hosts``
    holds a host per path the module has ("fused", "gemm", "persistent"); ``runner.paths`` the path
    ``fused_step="auto"`` chose for each shape on a GPU and ``runner.tunings`` how
    (:mod:`.autotune`)."""

    def __init__(self, backend: CudaBackend, program: Program, how: CudaSchedule) -> None:
        schedule = program_steps(program)
        self.backend = backend
        self.schedule = how
        self.dtype = schedule.numpy_dtype
        # TF32 GEMMs (backends/cuda/precision.py): float32 programs only.
        self.tf32 = how.precision == "tf32" and self.dtype == np.float32
        mode = how.fused_step
        module = render(schedule, fused_step=mode, schedule=how)
        self.source = module.source
        self.xp = backend.xp
        self.loaded = backend.load(module.source, module.kernels, module.barriers)
        kernels = {name: self.loaded.get_function(name) for name in module.kernels}
        xp = precision_module.Tf32Numpy() if self.tf32 and backend.cupy is None else self.xp
        self.hosts = _hosts(xp, schedule, module, kernels, how)
        self.host = self.hosts.get("fused", self.hosts.get("gemm"))
        # The persistent path: asked for, or timed beside the others by "auto" on a GPU.
        persistent = module.persistent
        if persistent is not None and (mode == "persistent" or
                                       (mode == "auto" and backend.cupy is not None)):
            function = backend.load_cooperative(persistent.source, [persistent.kernel]) \
                .get_function(persistent.kernel)
            resident = resident_blocks(backend.cupy, function, persistent.tile.threads)
            if how.persistent_max_blocks:
                resident = min(resident, how.persistent_max_blocks)
            launch = PersistentLaunch(persistent, function, resident)
            self.hosts["persistent"] = Host(xp, schedule, module, kernels, True, launch, how)
            if mode == "persistent":
                self.host = self.hosts["persistent"]
        self.timed = mode == "auto" and backend.cupy is not None and len(self.hosts) >= 2
        self.paths: dict[Hashable, str] = {}
        self.tunings: dict[Hashable, autotune.Tuning] = {}
        self.schedules: dict[Hashable, CudaSchedule] = {}  # what "auto" chose, per shape
        # What a tuning choice on disk is valid for: every kernel this runner may launch and
        # the schedule it searched from, every field included.
        kernels = module.source + (persistent.source if persistent is not None else "") \
            + how.key(per_call=True)
        self.fingerprint = hashlib.sha256(kernels.encode()).hexdigest()
        self.plans = Plans()
        self.transfers = {"to_device": 0, "to_host": 0}
        # One call at a time: a plan's buffers serve every call of its shape. A forked child
        # finds it released (rnnc.process), whatever call was in flight in the parent.
        self._lock = process.Lock()
        self._stream: Any = None

    # -- the API's entry points
    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
        """Run over ``env`` (NumPy arrays by name) for sizes ``dims``; NumPy results by name."""
        return self._call(env, dims, on_device=False)

    def on_device(self, env: Mapping[str, Any], dims: Mapping[str, int]) -> dict[str, Any]:
        """Run a device call: ``env`` holds device arrays (copied on the device into the
        plan's inputs) and host arrays (uploaded); the results are new device arrays."""
        return self._call(env, dims, on_device=True)

    def _call(self, env: Mapping[str, Any], dims: Mapping[str, int], on_device: bool
              ) -> dict[str, Any]:
        with self._lock:
            key = shape_key(env, dims)
            cupy = self.backend.cupy
            if cupy is None:
                plan = self.plans.get(key, lambda: self._new_plan(key, env, dims))
                return self._emulated(plan, env, on_device)
            if self._stream is None:
                self._stream = cupy.cuda.Stream(non_blocking=True)
            stream, caller = self._stream, cupy.cuda.get_current_stream()
            # The caller's stream may still be writing its device inputs: wait for it there,
            # and make it wait for the results, without stopping the host.
            stream.wait_event(caller.record())
            plan = self.plans.get(key, lambda: self._new_plan(key, env, dims))
            with stream, precision_module.tf32_gemms(cupy, self.tf32):
                results = self._on_device(plan, env, stream, on_device)
            if on_device:
                caller.wait_event(stream.record())
            return results

    def _new_plan(self, key: Hashable, env: Mapping[str, Any], dims: Mapping[str, int]
                  ) -> Plan:
        """The plan of a new shape; with ``auto`` on a GPU, the faster of both paths' plans
        (timed once per shape, the choice kept in ``paths``)."""
        def inputs() -> dict[str, Any]:
            return {n: self.xp.empty(tuple(v.shape), v.dtype) for n, v in env.items()}

        path = self.paths.get(key)
        if path is None and self.timed:
            cupy = self.backend.cupy
            device = autotune.device_identity(cupy)
            cache = None if device is None else autotune.TuningCache(device, self.fingerprint)
            # The search: the runner's schedule with each path its hosts can launch, GEMM first.
            candidates = {name: dataclasses.replace(self.schedule, fused_step=FUSED_STEPS[name])
                          for name in sorted(self.hosts, key=lambda name: (name != "gemm", name))}
            plan, tuning = autotune.choose(
                cupy, self._stream, key, env, lambda name: self._path_plan(name, inputs(), dims),
                list(candidates), cache)
            self.paths[key], self.tunings[key] = tuning.path, tuning
            self.schedules[key] = candidates[tuning.path]
            return plan
        if path is None:
            path = next(name for name, host in self.hosts.items() if host is self.host)
        return self._path_plan(path, inputs(), dims, fallback=True)

    def _path_plan(self, path: str, inputs: dict[str, Any], dims: Mapping[str, int],
                   fallback: bool = False) -> Plan | None:
        """The plan of ``path`` for these sizes, its ``path`` set to what it launches; None
        where a persistent plan fell back to the fused steps, unless ``fallback``."""
        plan = self.hosts[path].plan(inputs, dims)
        plan.path = path
        if path == "persistent" and "persistent" not in plan.count("body"):
            if not fallback:
                return None  # this shape runs the fused steps: nothing else to time
            plan.path = "fused"
        return plan

    def launch_report(self) -> list[dict[str, Any]]:
        """Per shape this runner keeps a plan for: its sizes, the launch path, how the path
        was chosen ("timed", "disk cache", or "fused_step" for a fixed mode), the host seconds
        choosing added to the first call, each timed candidate's median and each dropped one's
        reason, and whether a CUDA graph replays the plan (or why its capture failed)."""
        with self._lock:
            kept = list(self.plans.plans.items())
        rows = []
        for key, plan in kept:
            tuning = self.tunings.get(key)
            rows.append({"T": key[0], "B": key[1], "path": plan.path,
                         "chosen_by": tuning.source if tuning else "fused_step",
                         "tuning_s": tuning.seconds if tuning else 0.0,
                         "times_ms": dict(tuning.times_ms) if tuning else {},
                         "dropped": dict(tuning.dropped) if tuning else {},
                         "graph": plan.graph is not None,
                         "capture_failed": plan.captured and plan.graph is None,
                         "capture_error": plan.capture_error})
        return rows

    def _emulated(self, plan: Plan, env: Mapping[str, Any], on_device: bool) -> dict[str, Any]:
        """Copy in, run the plan, copy out: what a GPU call does, in host memory."""
        for name, value in env.items():
            np.copyto(plan.inputs[name], value)
        if self.backend.graph:
            if plan.replay is None:
                plan.replay = Replay(plan, EmulatedGraph, self.schedule.graph_steps)
            plan.replay()
        else:
            plan.run()
        kind = EmulatedArray if on_device else np.ndarray
        results = {name: np.array(value).view(kind) for name, value in plan.results.items()}
        self._count(env, {} if on_device else results)
        return results

    def _on_device(self, plan: Plan, env: Mapping[str, Any], stream: Any, on_device: bool
                   ) -> dict[str, Any]:
        """Copy in on ``stream`` (host arrays through pinned buffers, device arrays on the
        device), launch the plan (replaying its CUDA graph with graph=True, capturing it after
        the first call), copy out (device calls: into new device arrays)."""
        for name, value in env.items():
            if isinstance(value, np.ndarray) and on_device:
                # No host synchronization ends a device call, so a pinned staging buffer could
                # be refilled by the next call while this copy is still queued: copy from the
                # caller's array (pageable; the driver has read it when set() returns).
                plan.inputs[name].set(value, stream=stream)
            elif isinstance(value, np.ndarray):
                staged = self._pinned(plan, ("in", name), plan.inputs[name])
                np.copyto(staged, value)
                plan.inputs[name].set(staged, stream=stream)
            else:
                self.backend.cupy.copyto(plan.inputs[name], value)
        if plan.graph is not None:
            replay(plan)
        else:
            plan.run()
            if self.backend.graph and not plan.captured:
                plan.captured = True
                plan.graph = capture(self.backend.cupy, stream, plan, self.schedule.graph_steps)
        if on_device:
            results = {name: value.copy() for name, value in plan.results.items()}
            self._count(env, {})
            return results
        staged = {name: value.get(stream=stream, out=self._pinned(plan, ("out", name), value))
                  for name, value in plan.results.items()}
        stream.synchronize()
        results = {name: np.array(value) for name, value in staged.items()}
        self._count(env, results)
        return results

    def _pinned(self, plan: Plan, key: tuple[str, str], like: Any) -> np.ndarray:
        """The plan's page-locked host buffer ``key`` shaped like the device array ``like``:
        copies from and to it run at full speed and asynchronously on the stream."""
        buffer = plan.staging.get(key)
        if buffer is None:
            import cupyx

            buffer = plan.staging[key] = cupyx.empty_pinned(like.shape, like.dtype)
        return buffer

    def _count(self, env: Mapping[str, Any], results: Mapping[str, np.ndarray]) -> None:
        """Bytes copied to the device (host arrays of ``env``) and back (``results``)."""
        self.transfers = {"to_device": sum(v.nbytes for v in env.values() if _on_host(v)),
                          "to_host": sum(v.nbytes for v in results.values())}


def _hosts(xp: Any, schedule: ProgramSteps, module: Module, kernels: Mapping[str, Any],
           how: CudaSchedule) -> dict[str, Host]:
    """A host per path ``module`` renders: "fused" (its steps hold a fused step) and "gemm"
    (no fused step, or the GEMM body ``fused_step="auto"`` keeps beside it)."""
    hosts = {}
    if module.fused:
        hosts["fused"] = Host(xp, schedule, module, kernels, True, None, how)
    if not module.fused or module.gemm_body is not None:
        hosts["gemm"] = Host(xp, schedule, module, kernels, False, None, how)
    return hosts


def _on_host(value: Any) -> bool:
    """Whether a call's array is host memory (emulated device arrays are not)."""
    return isinstance(value, np.ndarray) and not isinstance(value, EmulatedArray)
