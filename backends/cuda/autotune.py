"""``fused_step="auto"`` on a GPU: time a shape's two launch plans once and keep the faster.

Which is faster, a step as cuBLAS GEMM + elementwise kernel or as one fused kernel
(:mod:`.fused_step`), depends on the GPU, the batch and the sizes of the cell, so the runner
measures it: the first call of a shape builds both plans, fills each with the call's inputs,
runs each once to warm up, then :data:`REPLAYS` more times between two CUDA events recorded on
the runner's stream, and keeps the plan with the smaller median. The decision is cached per
shape in the runner; only the kept plan stays allocated. Ties keep the GEMM path.

:func:`faster` takes the array module as ``cupy`` (its ``cuda.Event`` and
``cuda.get_elapsed_time``), so tests can drive it with a stand-in clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from rnnc.backends.cuda.plan import Plan

REPLAYS = 5


def fill(cupy: Any, plan: Plan, env: Mapping[str, Any], stream: Any) -> None:
    """Copy a call's inputs (host or device arrays) into ``plan``'s input arrays."""
    for name, value in env.items():
        if isinstance(value, cupy.ndarray):
            cupy.copyto(plan.inputs[name], value)
        else:
            plan.inputs[name].set(value, stream=stream)


def median_ms(cupy: Any, plan: Plan, stream: Any, replays: int = REPLAYS) -> float:
    """The median time in milliseconds of ``replays`` runs of ``plan`` on ``stream``, after
    one run that warms up (CuPy's own kernels compile, cuBLAS creates its handle)."""
    plan.run()
    times = []
    for _ in range(replays):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        plan.run()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def faster(cupy: Any, stream: Any, plans: Mapping[str, Plan], env: Mapping[str, Any]) -> str:
    """The key of the fastest plan of ``plans`` ("gemm" and "fused"), run on ``stream`` with
    the inputs ``env``; "gemm" wins ties."""
    with stream:
        times = {}
        for path, plan in plans.items():
            fill(cupy, plan, env, stream)
            times[path] = median_ms(cupy, plan, stream)
    return min(sorted(times), key=lambda path: (times[path], path != "gemm"))
