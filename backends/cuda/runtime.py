"""Run a program with CUDA kernels and cuBLAS GEMMs, or the same host code in emulation.

The host code is written once against an array module ``xp`` and a kernel loader:

- on a GPU, ``xp`` is CuPy, kernels come from ``cupy.RawModule(code=source)`` (NVRTC) and
  ``xp.matmul`` is cuBLAS. The API's NumPy inputs are copied to the device with
  ``xp.asarray`` and results come back with ``.get()``.
- in emulation (``emulate=True``), ``xp`` is NumPy and the *same source string* is compiled for
  the CPU by :class:`~rnnc.backends.cuda.emulate.EmulatedModule`; inputs are used in place.

The time loop runs in Python: per step, each body kernel is launched and each GEMM writes into
a preallocated buffer (``out=``). Body values live in two buffers used on alternate steps, so a
carried value read at step t+1 is never the buffer being written at step t+1; a stacked output
computed by a kernel or GEMM is written straight into its slot of the (T, ...) result.

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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.backends.cuda.codegen import BLOCK, Gemm, Launch, Module, render
from rnnc.errors import BackendUnavailable, RnncValueError
from rnnc.ir import ARG, GET, Graph, Program

NP_DTYPES = {"f32": np.float32, "f64": np.float64}
MAX_BLOCKS = 8192  # grid-stride loops cover the rest; enough blocks to fill any current GPU



@dataclass(frozen=True)
class Schedule:
    """One graph as the host runs it: (node, kind, payload) in order, and its outputs."""

    items: tuple[tuple[int, str, Any], ...]
    outputs: tuple[tuple[str, int], ...]


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
        return Runner(self, program, render(program))


class Buffers:
    """Device arrays for one run; when ``keep`` is set, the same arrays on every run."""

    def __init__(self, xp: Any, dtype: Any, keep: bool) -> None:
        self.xp, self.dtype, self.keep = xp, dtype, keep
        self.arrays: list[Any] = []
        self.next = 0

    def restart(self) -> None:
        """Hand out the kept arrays again, in the same order, for the next run."""
        self.next = 0

    def empty(self, shape: tuple[int, ...]) -> Any:
        """An uninitialized array of ``shape`` (the next kept one when keeping)."""
        if self.keep and self.next < len(self.arrays):
            array = self.arrays[self.next]
            assert array.shape == shape, (array.shape, shape)
        else:
            array = self.xp.empty(shape, self.dtype)
            if self.keep:
                self.arrays.append(array)
        self.next += 1
        return array


def resolve(shape: tuple, dims: Mapping[str, int]) -> tuple[int, ...]:
    """Replace the symbols T and B by their sizes."""
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


class Runner:
    """A built program: ``runner(env, dims)`` runs it; ``runner.source`` is its kernel source."""

    def __init__(self, backend: CudaBackend, program: Program, module: Module) -> None:
        self.backend = backend
        self.program = program
        self.module = module
        self.source = module.source
        self.xp = backend.xp
        self.dtype = NP_DTYPES[program.dtype]
        loaded = backend.load(module.source, module.kernels)
        self.kernels = {name: loaded.get_function(name) for name in module.kernels}
        self.loaded = loaded
        # Constants outside fused regions, made once: nothing is allocated inside a capture.
        self.constants = {node.id: self.xp.full((), node.attrs["value"], self.dtype)
                          for g in program.graphs() for node in g.nodes()
                          if node.op is ops.constant}
        self._kept: dict[tuple[int, int], dict[str, Any]] = {}
        # Each graph's steps in order, built once here: nothing walks the IR during a call.
        self.schedules = {name: self._schedule(g, module.steps[name]) for name, g in
                          (("pre", program.pre), ("body", program.scan.body),
                           ("post", program.post))}

    def _schedule(self, g: Graph, steps: list[Launch | Gemm]) -> Schedule:
        """``g`` as a flat list of (node, kind, payload), plus its outputs by name."""
        steps_by_node = {s.node: s for s in steps}
        items: list[tuple[int, str, Any]] = []
        for node in g.nodes():
            if node.op is ARG:
                items.append((node.id, "arg", node.attrs["name"]))
            elif node.op is GET:
                items.append((node.id, "get", (node.inputs[0], node.attrs["index"])))
            elif node.id in self.constants:
                items.append((node.id, "constant", self.constants[node.id]))
            else:
                step = steps_by_node[node.id]
                items.append((node.id, "gemm" if isinstance(step, Gemm) else "launch", step))
        return Schedule(tuple(items), tuple(g.outputs.items()))

    # -- the API's entry point
    def __call__(self, env: Mapping[str, np.ndarray], dims: Mapping[str, int]
                 ) -> dict[str, np.ndarray]:
        """Run over ``env`` (NumPy arrays by name) for sizes ``dims``; NumPy results by name."""
        if self.backend.graph:
            return self._call_kept(env, dims)
        inputs = {name: self._to_device(value) for name, value in env.items()}
        buffers = Buffers(self.xp, self.dtype, keep=False)
        results = self.execute(inputs, dims, buffers)
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
            results = self.execute(inputs, dims, state["buffers"])
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
                results = self.execute(inputs, dims, state["buffers"])
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
            self.execute(inputs, dims, buffers)
        except Exception:
            try:
                stream.end_capture()
            except Exception:  # an invalidated capture cannot end cleanly; nothing to keep
                pass
            return None
        return stream.end_capture()

    # -- the program
    def execute(self, env: Mapping[str, Any], dims: Mapping[str, int], buffers: Buffers
                ) -> dict[str, Any]:
        """Run pre, scan and post over device arrays; the program's results as device arrays."""
        p = self.program
        env = dict(env)

        def once(key: tuple[int, int], shape: tuple) -> Any:
            return buffers.empty(resolve(shape, dims))

        env.update(self.run_graph(self.schedules["pre"], env, dims, once))
        env.update(self.run_scan(env, dims, buffers))
        env.update(self.run_graph(self.schedules["post"], env, dims, once))
        return {name: env[name] for name in p.results}

    def run_graph(self, schedule: Schedule, env: Mapping[str, Any], dims: Mapping[str, int],
                  destination: Callable[[tuple[int, int], tuple], Any]) -> dict[str, Any]:
        """Run one graph's schedule; ``destination((node, index), shape)`` gives result
        arrays."""
        vals: dict[int, Any] = {}
        size_args = (np.int64(dims["T"]), np.int64(dims["B"]))
        for nid, kind, payload in schedule.items:
            if kind == "arg":
                vals[nid] = env[payload]
            elif kind == "get":
                vals[nid] = vals[payload[0]][payload[1]]
            elif kind == "constant":
                vals[nid] = payload
            elif kind == "gemm":
                out = destination((nid, 0), payload.shape)
                self.gemm(vals[payload.a], vals[payload.b], out, payload.transpose_a,
                          payload.transpose_b)
                vals[nid] = out
            else:
                outs = [destination((nid, k), shape) for k, shape in enumerate(payload.shapes)]
                total = max(int(np.prod(o.shape)) for o in outs)
                if total:
                    grid = min((total + BLOCK - 1) // BLOCK, MAX_BLOCKS)
                    args = tuple(vals[i] for i in payload.inputs) + tuple(outs) + size_args
                    self.kernels[payload.kernel]((grid,), (BLOCK,), args)
                vals[nid] = tuple(outs) if payload.fused else outs[0]
        return {name: vals[o] for name, o in schedule.outputs}

    def gemm(self, a: Any, b: Any, out: Any, transpose_a: bool, transpose_b: bool) -> None:
        """``out = a @ b`` on 2-D views; transpose_a contracts every leading axis of a and b."""
        xp = self.xp
        a2 = a.reshape(-1, a.shape[-1])
        if transpose_a:
            xp.matmul(a2.T, b.reshape(-1, b.shape[-1]), out=out)
        else:
            xp.matmul(a2, b.T if transpose_b else b, out=out.reshape(-1, out.shape[-1]))

    def run_scan(self, env: Mapping[str, Any], dims: Mapping[str, int], buffers: Buffers
                 ) -> dict[str, Any]:
        """The time loop; stacked and summed outputs and final carries by name."""
        xp, scan = self.xp, self.program.scan
        body, steps = scan.body, self.module.steps["body"]
        T = dims["T"]
        out: dict[str, Any] = {}
        for name in scan.stacked:
            out[name] = buffers.empty((T,) + resolve(body.node(body.outputs[name]).shape, dims))
        for name in scan.summed:
            out[name] = buffers.empty(resolve(body.node(body.outputs[name]).shape, dims))
            out[name].fill(0)
        # Which results kernels and GEMMs make: (node, index) of every node and get.
        made = {(s.node, k): shape for s in steps for k, shape in
                enumerate(s.shapes if isinstance(s, Launch) else (s.shape,))}

        def source(nid: int) -> tuple[int, int]:
            node = body.node(nid)
            return (node.inputs[0], node.attrs["index"]) if node.op is GET else (nid, 0)

        into_stack: dict[tuple[int, int], str] = {}
        for name in scan.stacked:
            key = source(body.outputs[name])
            if key in made and key not in into_stack:
                into_stack[key] = name
        pairs = {key: (buffers.empty(resolve(shape, dims)), buffers.empty(resolve(shape, dims)))
                 for key, shape in made.items() if key not in into_stack}
        # A carry whose next value is not made in the loop (an input, a constant) is copied
        # into its own pair of buffers, so it too is never overwritten while still needed.
        copied = {c.name: (buffers.empty(resolve(body.node(body.outputs[c.name]).shape, dims)),
                           buffers.empty(resolve(body.node(body.outputs[c.name]).shape, dims)))
                  for c in scan.carries if source(body.outputs[c.name]) not in made}
        stacked_in_place = {name: into_stack.get(source(body.outputs[name])) == name
                            for name in scan.stacked}
        schedule = self.schedules["body"]
        local = {name: env[name] for name in scan.consts}
        carry = {c.name: env[c.init] for c in scan.carries}
        times = range(T - 1, -1, -1) if scan.reverse else range(T)
        for step, t in enumerate(times):
            local.update({name: env[name][t] for name in scan.seqs})
            local.update(carry)

            def destination(key: tuple[int, int], shape: tuple, t: int = t, step: int = step
                            ) -> Any:
                if key in into_stack:
                    return out[into_stack[key]][t]
                return pairs[key][step % 2]

            results = self.run_graph(schedule, local, dims, destination)
            for name in scan.stacked:
                if not stacked_in_place[name]:
                    xp.copyto(out[name][t], results[name])
            for name in scan.summed:
                xp.add(out[name], results[name], out=out[name])
            for c in scan.carries:
                if c.name in copied:
                    xp.copyto(copied[c.name][step % 2], results[c.name])
                    carry[c.name] = copied[c.name][step % 2]
                else:
                    carry[c.name] = results[c.name]
        for c in scan.carries:
            if c.final is not None:
                out[c.final] = carry[c.name]
        return out
