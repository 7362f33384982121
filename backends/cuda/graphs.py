"""A plan replayed as CUDA graphs of at most ``CudaSchedule.graph_steps`` loop steps each.

A plan (:mod:`.plan`) records one step of the time loop; a graph holds resolved calls, so a
graph of every step would grow with T. :class:`Replay` keeps graphs of constant size instead:

- a loop of at most ``graph_steps`` (K) steps: one graph of the whole call, launched once per
  call (what CUDA graphs did before);
- a longer loop: a graph of the calls before the loop, a graph of K steps
  launched T / K times, each time re-pointed at the arrays of its steps (the same
  calls, other slots of the sequences), and a graph of the calls after the loop. The first
  span of steps and the last, shorter one make other calls (the first step copies what later
  ones do not), so each topology keeps its own graph: at most four per plan.

A graph is made by a factory from its nodes (:data:`~.plan.Node`, a call with its arguments
resolved). On a GPU, :class:`DeviceGraph` captures the nodes on the runner's stream,
instantiates them once and re-points the instance with the driver's ``cuGraphExecUpdate``
(a kernel node keeps its launch and takes new arguments); an update the driver refuses
instantiates again. In emulation, :class:`EmulatedGraph` keeps the nodes in host memory and
makes their calls when launched, which is what a replay does.
"""

from __future__ import annotations

import ctypes
import functools
import types
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from rnnc.backends.cuda.plan import Node, Plan
from rnnc.backends.schedule import CudaSchedule


class Graph(Protocol):
    """A CUDA graph of some calls: launched whole, re-pointed at calls of the same kinds."""

    def launch(self) -> None: ...

    def update(self, nodes: list[Node]) -> bool:
        """Make the graph's calls those of ``nodes`` (the same functions in the same order,
        other arguments); False where it cannot."""
        ...


class EmulatedGraph:
    """A graph in host memory: its nodes, called in order when launched."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.functions = [func for func, _, _ in nodes]

    def update(self, nodes: list[Node]) -> bool:
        if [func for func, _, _ in nodes] != self.functions:
            return False
        self.nodes = nodes
        return True

    def launch(self) -> None:
        for func, args, kwargs in self.nodes:
            func(*args, **kwargs)


class Replay:
    """``plan`` as graphs of at most ``steps`` loop steps (None: the schedule's default,
    ``CudaSchedule.graph_steps``), made by ``make(nodes)``; calling it launches them in
    order."""

    def __init__(self, plan: Plan, make: Callable[[list[Node]], Graph],
                 steps: int | None = None) -> None:
        self.plan, self.make = plan, make
        self.steps = CudaSchedule().graph_steps if steps is None else steps
        self.whole: Graph | None = None
        self.around: tuple[Graph | None, Graph | None] | None = None
        self.spans: dict[Hashable, Graph] = {}  # the loop's graphs by topology

    def prepare(self) -> None:
        """Make the graphs of the calls around the loop (of the whole call, for a short
        loop) and of the loop's first span, launching nothing: a capture that fails, fails
        here."""
        loop = self.plan.loop
        if loop is None or loop.steps <= self.steps:
            if self.whole is None:
                before, after = self.plan.around_loop()
                middle = [] if loop is None else loop.nodes(0, loop.steps)
                self.whole = self.make(before + middle + after)
            return
        if self.around is None:
            before, after = self.plan.around_loop()
            self.around = (self.make(before) if before else None,
                           self.make(after) if after else None)
            self.span(0)

    def span(self, start: int) -> Graph:
        """The graph of the loop's steps from ``start``, re-pointed at them."""
        loop = self.plan.loop
        stop = min(start + self.steps, loop.steps)
        nodes, topology = loop.nodes(start, stop), loop.topology(start, stop)
        graph = self.spans.get(topology)
        if graph is None or not graph.update(nodes):
            graph = self.spans[topology] = self.make(nodes)
        return graph

    def __call__(self) -> None:
        """Launch the plan's graphs in order: one, or the loop's spans between two."""
        self.prepare()
        if self.whole is not None:
            self.whole.launch()
            return
        before, after = self.around
        if before is not None:
            before.launch()
        for start in range(0, self.plan.loop.steps, self.steps):
            self.span(start).launch()
        if after is not None:
            after.launch()

    def graphs(self) -> list[Graph]:
        """Every graph made so far."""
        made = [self.whole, *(self.around or ()), *self.spans.values()]
        return [graph for graph in made if graph is not None]


def capture(cupy: Any, stream: Any, plan: Plan, steps: int) -> Replay | None:
    """The plan as CUDA graphs of at most ``steps`` loop steps on ``stream`` (the first ones
    captured now, the loop's other spans on first use), or None, saying why in
    ``plan.capture_error``, where they cannot be captured."""
    stream.synchronize()
    graphs = Replay(plan, lambda nodes: DeviceGraph(cupy, stream, nodes), steps)
    try:
        graphs.prepare()
    except Exception as err:
        plan.capture_error = _why(err)
        return None
    return graphs


def replay(plan: Plan) -> None:
    """Launch the plan's graphs; where a span's capture fails, run the plan call by call from
    its start (it reads only its inputs) and keep doing so for this shape."""
    try:
        plan.graph()
    except Exception as err:
        plan.graph, plan.capture_error = None, _why(err)
        plan.run()


def _why(err: Exception) -> str:
    """A failed capture's error and the call it failed in (its notes), on one line."""
    return " ".join([f"{type(err).__name__}: {err}", *getattr(err, "__notes__", [])])


class DeviceGraph:
    """A CUDA graph captured on ``stream`` from ``nodes`` and instantiated (GPU only)."""

    def __init__(self, cupy: Any, stream: Any, nodes: list[Node],
                 exec_update: Callable[[int, int], bool] | None = None) -> None:
        self.runtime, self.stream = cupy.cuda.runtime, stream
        # The driver's cuGraphExecUpdate (None: none found, every span instantiated anew).
        self.exec_update = exec_update or _driver_update()
        graph = self._capture(nodes)
        try:
            self.instance = self.runtime.graphInstantiate(graph)
        finally:
            self.runtime.graphDestroy(graph)

    def _capture(self, nodes: list[Node]) -> int:
        """The graph of ``nodes`` captured on the stream (relaxed: CuPy may query memory)."""
        runtime, stream = self.runtime, self.stream.ptr
        runtime.streamBeginCapture(stream, getattr(runtime, "streamCaptureModeRelaxed", 2))
        try:
            for func, args, kwargs in nodes:
                try:
                    func(*args, **kwargs)
                except Exception as err:
                    err.add_note(f"capturing {describe(func)}")
                    raise
        except BaseException:
            try:
                runtime.graphDestroy(runtime.streamEndCapture(stream))
            except Exception:  # an invalidated capture cannot end cleanly; nothing to keep
                pass
            raise
        return runtime.streamEndCapture(stream)

    def update(self, nodes: list[Node]) -> bool:
        if self.exec_update is None:
            return False
        graph = self._capture(nodes)
        try:
            return self.exec_update(self.instance, graph)
        finally:
            self.runtime.graphDestroy(graph)

    def launch(self) -> None:
        self.runtime.graphLaunch(self.instance, self.stream.ptr)

    def __del__(self) -> None:
        instance = getattr(self, "instance", None)
        if instance:
            try:
                self.runtime.graphExecDestroy(instance)
            except Exception:  # the context may be gone at interpreter exit
                pass


def describe(func: Any) -> str:
    """A graph node's function in words: a kernel's name, a function's, a method's with its
    class, else the callable's type."""
    name = getattr(func, "name", None)
    if isinstance(name, str):
        return name
    name = getattr(func, "__name__", None)
    if name is None:
        return type(func).__name__
    owner = getattr(func, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        return name
    return f"{type(owner).__name__}.{name}"


class _UpdateResultInfo(ctypes.Structure):
    """CUgraphExecUpdateResultInfo (CUDA 12)."""

    _fields_ = [("result", ctypes.c_int), ("error_node", ctypes.c_void_p),
                ("error_from_node", ctypes.c_void_p)]


@functools.cache
def _driver_update() -> Callable[[int, int], bool] | None:
    """``update(instance, graph)``: the driver's ``cuGraphExecUpdate`` (True where it took
    the graph's arguments), or None where the driver library has none."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if hasattr(driver, "cuGraphExecUpdate_v2"):
        function = driver.cuGraphExecUpdate_v2
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(_UpdateResultInfo)]

        def update(instance: int, graph: int) -> bool:
            return function(instance, graph, ctypes.byref(_UpdateResultInfo())) == 0
        return update
    if hasattr(driver, "cuGraphExecUpdate"):  # CUDA 11: error node and result apart
        old = driver.cuGraphExecUpdate
        old.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                        ctypes.POINTER(ctypes.c_int)]

        def update_11(instance: int, graph: int) -> bool:
            node, result = ctypes.c_void_p(), ctypes.c_int()
            return old(instance, graph, ctypes.byref(node), ctypes.byref(result)) == 0
        return update_11
    return None
