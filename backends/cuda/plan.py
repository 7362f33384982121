"""A launch plan: every kernel launch, GEMM and copy of one call, prepared once per shape.

:meth:`rnnc.backends.cuda.host.Host.plan` walks the program's schedule once for given sizes,
as a call would, but allocates every buffer and resolves every argument instead of launching:
the inputs' arrays (owned by the plan; a call copies its inputs into them), the results of
every step, the loop body's alternating buffers and the step slots of stacked outputs. Each
launch is recorded, in call order, as a ready-to-call ``functools.partial``: a kernel with its
grid, block and argument tuple, a GEMM as the array module's ``matmul`` on 2-D views with
``out=``, and the time loop's copies and accumulations. :meth:`Plan.run` is one loop over that
list: no graph walk, no dict, no allocation of arrays, and on a GPU it is exactly what a CUDA
graph captures.

Every entry has a :class:`Entry` saying where it runs (``pre``, ``body``, ``post``), what it
is (``kernel``, ``gemm``, ``copy``, ``add``, ``fill``) and, in the loop, at which step, so tests
and ``rnnc`` users can count the work of a step (:meth:`Plan.per_step`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

# Plans kept per runner, most recently used last: each holds its buffers on the device.
MAX_PLANS = 8


@dataclass(frozen=True)
class Entry:
    """What one recorded call is: its graph, kind and (in the loop) step number."""

    where: str  # "pre", "body" or "post"
    kind: str  # "kernel", "gemm", "copy", "add" or "fill"
    step: int | None = None


@dataclass
class Plan:
    """One call's work for one shape: input arrays, the calls in order, and the results."""

    inputs: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    calls: list[Callable[[], Any]] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    graph: Any = None  # the captured CUDA graph, once there is one (GPU only)
    captured: bool = False  # capture was tried (it may have failed: graph stays None)
    staging: dict[tuple[str, str], Any] = field(default_factory=dict)  # pinned host buffers
    path: str = ""  # the launch path that made it: "gemm", "fused" or "persistent"

    def record(self, entry: Entry, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Append ``fn(*args, **kwargs)`` to the calls, described by ``entry``."""
        self.calls.append(partial(fn, *args, **kwargs))
        self.entries.append(entry)

    def run(self) -> None:
        """Make every call in order."""
        for call in self.calls:
            call()

    def per_step(self, step: int = 0) -> dict[str, int]:
        """How many calls of each kind step ``step`` of the loop makes."""
        return dict(Counter(e.kind for e in self.entries if e.where == "body" and e.step == step))

    def count(self, where: str) -> dict[str, int]:
        """How many calls of each kind the graph ``where`` makes (the loop: all its steps)."""
        return dict(Counter(e.kind for e in self.entries if e.where == where))


class Plans:
    """A runner's plans by shape key, the least recently used dropped beyond ``MAX_PLANS``."""

    def __init__(self) -> None:
        self.plans: OrderedDict[Hashable, Plan] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Plan]) -> Plan:
        """The plan for ``key``, built by ``build()`` the first time."""
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = build()
            while len(self.plans) > MAX_PLANS:
                self.plans.popitem(last=False)
        else:
            self.plans.move_to_end(key)
        return plan

    def __len__(self) -> int:
        return len(self.plans)


def shape_key(env: Mapping[str, Any], dims: Mapping[str, int]) -> tuple:
    """What a plan depends on: the sizes and every input's name, shape and dtype."""
    return (dims["T"], dims["B"]) + tuple(
        (name, tuple(value.shape), str(value.dtype)) for name, value in sorted(env.items()))
