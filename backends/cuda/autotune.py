"""``fused_step="auto"`` on a GPU: time a shape's launch plans once and keep the fastest.

Which is faster, a step as cuBLAS GEMM + elementwise kernel, as one fused kernel
(:mod:`.fused_step`), or the whole loop as one persistent kernel (:mod:`.persistent`, where it
applies), depends on the GPU, the batch and the sizes of the cell, so the runner measures it:
the first call of a shape builds every plan, fills each with the call's inputs, runs each once
to warm up, then :data:`REPLAYS` more times between two CUDA events recorded on
the runner's stream, and keeps the plan with the smaller median. The decision is cached per
shape in the runner; only the kept plan stays allocated. Ties keep the GEMM path.

:func:`faster` takes the array module as ``cupy`` (its ``cuda.Event`` and
``cuda.get_elapsed_time``), so tests can drive it with a stand-in clock.
"""

from __future__ import annotations

import statistics
import warnings
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
    """The key of the fastest plan of ``plans`` ("gemm", "fused", "persistent"), run on
    ``stream`` with the inputs ``env``; "gemm" wins ties."""
    with stream:
        times = {}
        for path, plan in plans.items():
            try:
                fill(cupy, plan, env, stream)
                times[path] = median_ms(cupy, plan, stream)
            except Exception as err:
                # A fused or persistent launch this GPU or CuPy refuses (a cooperative launch
                # too large, a kernel over the registers): the call goes on without that path.
                if path == "gemm":
                    raise
                warnings.warn(f"rnnc: the {path!r} plan of this shape failed on this GPU "
                              f"({type(err).__name__}: {err}); it is not used", RuntimeWarning,
                              stacklevel=2)
    return min(sorted(times), key=lambda path: (times[path], path != "gemm"))
