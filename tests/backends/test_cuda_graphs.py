"""CUDA graphs of a plan (backends/cuda/graphs.py) without a GPU: the device path's capture,
instantiation, re-pointing and launches against a recording stand-in for CuPy's runtime.

The stand-in runs nothing on a device: a capture records the calls made on the stream, an
instance holds a copy of its graph's calls, an update copies a graph of the same calls into
an instance, and a launch replays an instance's calls into the device's log. The device's log
must be the calls the plan makes call by call, in order."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from rnnc.backends.cuda.graphs import DeviceGraph, Replay, capture
from rnnc.backends.cuda.plan import Entry, Plan, Slot


class _Runtime:
    """What DeviceGraph calls of ``cupy.cuda.runtime``, recording instead of running."""

    streamCaptureModeRelaxed = 2  # noqa: N815 - CuPy's name

    def __init__(self) -> None:
        self.capturing: list | None = None
        self.graphs: dict[int, list] = {}
        self.instances: dict[int, list] = {}
        self.device_log: list = []
        self.instantiated = self.destroyed = self.launched = 0
        self.next_id = 1

    def _new(self) -> int:
        self.next_id += 1
        return self.next_id

    def streamBeginCapture(self, stream: int, mode: int) -> None:  # noqa: N802
        assert self.capturing is None and mode == 2
        self.capturing = []

    def streamEndCapture(self, stream: int) -> int:  # noqa: N802
        graph = self._new()
        self.graphs[graph], self.capturing = self.capturing, None
        return graph

    def graphInstantiate(self, graph: int) -> int:  # noqa: N802
        self.instantiated += 1
        instance = self._new()
        self.instances[instance] = list(self.graphs[graph])
        return instance

    def graphDestroy(self, graph: int) -> None:  # noqa: N802
        del self.graphs[graph]
        self.destroyed += 1

    def graphExecDestroy(self, instance: int) -> None:  # noqa: N802
        del self.instances[instance]

    def graphLaunch(self, instance: int, stream: int) -> None:  # noqa: N802
        self.launched += 1
        self.device_log.extend(self.instances[instance])

    def exec_update(self, instance: int, graph: int) -> bool:
        """cuGraphExecUpdate: the same calls, other arguments."""
        if [call[0] for call in self.instances[instance]] != \
                [call[0] for call in self.graphs[graph]]:
            return False
        self.instances[instance] = list(self.graphs[graph])
        return True


def _plan(runtime: _Runtime, steps: int, log: list) -> Plan:
    """A plan of a call before the loop, a loop whose first step makes one more call and
    whose every step reads its slot of a sequence, and a call after the loop; on the host a
    call appends to ``log``, inside a capture to the capture."""
    def call(name: str):
        def make(*args):
            (log if runtime.capturing is None else runtime.capturing).append(
                (name, *(int(a) for a in args)))
        return make

    sequence = np.arange(steps)
    plan = Plan({})
    plan.record(Entry("pre", "fill"), call("before"))
    loop = plan.record_loop(steps)
    loop.record_at(range(1), Entry("body", "copy"), call("first"), Slot(sequence, steps, False))
    loop.record(Entry("body", "kernel"), call("step"), Slot(sequence, steps, False))
    plan.record(Entry("post", "copy"), call("after"))
    return plan


@pytest.mark.parametrize("steps, span", [(19, 4), (16, 4), (3, 4)])
def test_the_device_replays_the_plan_s_calls_in_order(steps: int, span: int) -> None:
    runtime = _Runtime()
    stream = SimpleNamespace(ptr=7)
    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=runtime))
    host_log: list = []
    plan = _plan(runtime, steps, host_log)
    plan.run()  # the first call of a shape runs on the host
    expected = list(host_log)

    replay = Replay(plan, lambda nodes: DeviceGraph(cupy, stream, nodes, runtime.exec_update),
                    steps=span)
    for _ in range(2):  # the second call re-points the graphs the first made
        runtime.device_log = []
        replay()
        assert runtime.device_log == expected
    spans = math.ceil(steps / span)
    if steps <= span:
        assert replay.whole is not None and runtime.instantiated == 1
    else:
        # Before, after, and the first, middle and shorter last spans' topologies.
        assert runtime.instantiated == 2 + len(replay.spans) <= 5
        assert len(replay.spans) == (3 if steps % span else 2)
    assert not runtime.graphs  # every captured graph destroyed once instantiated or used
    launches = 1 if steps <= span else 2 + spans
    assert runtime.launched == 2 * launches


def test_a_capture_that_fails_says_why_and_the_plan_runs_call_by_call() -> None:
    """A call that refuses to be captured (as CuPy's cuBLAS binding does) leaves no graph, the
    stream not capturing, and the error with the call's name in ``plan.capture_error``."""
    runtime = _Runtime()
    stream = SimpleNamespace(ptr=7, synchronize=lambda: None)
    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=runtime))
    host_log: list = []

    def refuse_in_capture(*args):
        if runtime.capturing is not None:
            raise NotImplementedError("calling cuBLAS API during stream capture is unsupported")
        host_log.append("gemm")

    plan = _plan(runtime, 3, host_log)
    plan.record(Entry("post", "gemm"), refuse_in_capture)
    plan.run()
    assert capture(cupy, stream, plan, 4) is None
    assert runtime.capturing is None and not runtime.graphs
    assert plan.capture_error.startswith("NotImplementedError: calling cuBLAS API")
    assert "capturing refuse_in_capture" in plan.capture_error
