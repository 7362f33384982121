"""Run a program with CUDA kernels and cuBLAS GEMMs, or the same host code in emulation.

The host code is written once against an array module ``xp`` and a kernel loader:

- on a GPU, ``xp`` is CuPy, kernels come from ``cupy.RawModule(code=source)`` (NVRTC) and
  ``xp.matmul`` is cuBLAS. The API's NumPy inputs are copied to the device with
  ``xp.asarray`` and results come back with ``.get()``.
- in emulation (``emulate=True``), ``xp`` is NumPy and the *same source string* is compiled for
  the CPU by :class:`~rnnc.backends.cuda.emulate.EmulatedModule`; inputs are used in place.

The time loop runs in Python (:mod:`.host`): per step, each body kernel is launched and each
GEMM writes into a preallocated buffer (``out=``).

``graph=True`` (GPU only in effect): per (T, B) the buffers and device copies of the inputs
are kept, the first call runs eagerly (compiling CuPy's own kernels and creating the cuBLAS
handle, which cannot happen inside a capture), and then the whole program, all T steps, is
captured once with ``Stream.begin_capture``/``end_capture`` and replayed with one
``graph.launch`` per later call, after copying the new inputs into the kept buffers. If the
capture fails (a CuPy or driver that cannot capture cuBLAS), that size runs eagerly instead. In
emulation ``graph=True`` keeps the same buffers and reruns the steps, which is what a replay
does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rnnc.backends.cuda.codegen import render
from rnnc.backends.cuda.host import Buffers, Host
from rnnc.backends.schedule import schedule_program
from rnnc.errors import BackendUnavailable, RnncValueError
from rnnc.ir import Program

UNAVAILABLE = ("backend 'cuda' needs CuPy and an NVIDIA GPU: {why}. Pass emulate=True "
               "(rnnc.compile(cell, backend='cuda', emulate=True)) to run the same host code "
               "and generated kernels on the CPU.")


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

    def __init__(self, emulate: bool = False, graph: bool = False, **options: Any) -> None:
        if options:
            raise RnncValueError(f"backend 'cuda' takes emulate= and graph=, got "
                                 f"{sorted(options)}")
        self.emulate = bool(emulate)
        self.graph = bool(graph)
        self.cupy = None if self.emulate else load_cupy()

    @property
    def xp(self) -> Any:
        """The array module: CuPy on a GPU, NumPy in emulation."""
        return np if self.cupy is None else self.cupy

    def load(self, source: str, names: list[str]) -> Any:
        """Compile ``source``; return an object whose ``get_function(name)`` gives kernels."""
        if self.cupy is None:
            from rnnc.backends.cuda.emulate import EmulatedModule

            return EmulatedModule(source, names)
        return self.cupy.RawModule(code=source, options=("--std=c++17",))

    def build(self, program: Program) -> Runner:
        """A callable ``(env, dims) -> results`` for ``program``."""
        return Runner(self, program)


class Runner:
    """A built program: ``runner(env, dims)`` runs it; ``runner.source`` is its kernel source."""

    def __init__(self, backend: CudaBackend, program: Program) -> None:
        schedule = schedule_program(program)
        module = render(schedule)
        self.backend = backend
        self.source = module.source
        self.xp = backend.xp
        self.dtype = schedule.numpy_dtype
        self.loaded = backend.load(module.source, module.kernels)
        kernels = {name: self.loaded.get_function(name) for name in module.kernels}
        self.host = Host(self.xp, schedule, module, kernels)
        self._kept: dict[tuple[int, int], dict[str, Any]] = {}

    # -- the API's entry point
    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
        """Run over ``env`` (NumPy arrays by name) for sizes ``dims``; NumPy results by name."""
        if self.backend.graph:
            return self._call_kept(env, dims)
        inputs = {name: self._to_device(value) for name, value in env.items()}
        buffers = Buffers(self.xp, self.dtype, keep=False)
        results = self.host.execute(inputs, dims, buffers)
        return {name: self._to_host(value, inputs) for name, value in results.items()}

    def _to_device(self, value: np.ndarray) -> Any:
        """A contiguous device copy on a GPU; the array itself in emulation."""
        return self.xp.ascontiguousarray(self.xp.asarray(value))

    def _to_host(self, value: Any, inputs: Mapping[str, Any]) -> np.ndarray:
        """A NumPy result the caller owns."""
        if self.backend.cupy is not None:
            return value.get()
        # Emulation allocates results per call; only a pass-through input needs a copy.
        if any(np.may_share_memory(value, v) for v in inputs.values()):
            return np.array(value)
        return value

    def _call_kept(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                   ) -> dict[str, np.ndarray]:
        """Run with buffers kept per (T, B); on a GPU, capture once and replay a CUDA graph."""
        key = (dims["T"], dims["B"])
        state = self._kept.get(key)
        if state is None:
            inputs = {n: self.xp.empty(np.shape(v), np.asarray(v).dtype) for n, v in env.items()}
            state = {"inputs": inputs, "buffers": Buffers(self.xp, self.dtype, keep=True),
                     "graph": None, "results": None}
            self._kept[key] = state
        inputs = state["inputs"]
        if set(env) != set(inputs):
            raise RnncValueError(f"inputs changed between calls: {sorted(env)} vs "
                                 f"{sorted(inputs)}")
        cupy = self.backend.cupy
        if cupy is None:
            for name, value in env.items():
                np.copyto(inputs[name], value)
            state["buffers"].restart()
            results = self.host.execute(inputs, dims, state["buffers"])
            return {name: np.array(value) for name, value in results.items()}
        stream = state.setdefault("stream", cupy.cuda.Stream(non_blocking=True))
        with stream:
            for name, value in env.items():
                inputs[name].set(np.ascontiguousarray(value), stream=stream)
            if state["graph"] is not None:
                state["graph"].launch(stream)
                results = state["results"]
            else:
                state["buffers"].restart()
                results = self.host.execute(inputs, dims, state["buffers"])
                if state["results"] is None:
                    state["results"] = results
                    state["graph"] = self._capture(stream, inputs, dims, state["buffers"])
            stream.synchronize()
            return {name: value.get(stream=stream) for name, value in results.items()}

    def _capture(self, stream: Any, inputs: Mapping[str, Any], dims: Mapping[str, int],
                 buffers: Buffers) -> Any:
        """The program as a CUDA graph on ``stream``, or None if this CuPy cannot capture it."""
        stream.synchronize()
        buffers.restart()
        # Relaxed mode: CuPy may query (not allocate) memory while the loop is recorded.
        runtime = self.backend.cupy.cuda.runtime
        stream.begin_capture(getattr(runtime, "streamCaptureModeRelaxed", None))
        try:
            self.host.execute(inputs, dims, buffers)
        except Exception:
            try:
                stream.end_capture()
            except Exception:  # an invalidated capture cannot end cleanly; nothing to keep
                pass
            return None
        return stream.end_capture()
