"""A launch plan: every kernel launch, GEMM and copy of one call, prepared once per shape.

:meth:`rnnc.backends.cuda.host.Host.plan` walks the program's schedule once for given sizes,
as a call would, but allocates every buffer and resolves every argument instead of launching:
the inputs' arrays (owned by the plan; a call copies its inputs into them), the results of
every step, the loop body's alternating buffers and the stacked outputs. Each launch before
and after the time loop is recorded, in call order, as a ready-to-call ``functools.partial``:
a kernel with its grid, block and argument tuple, a GEMM as the array module's ``matmul`` on
2-D views with ``out=``, and copies. The time loop is one :class:`Loop` in that list: the
calls of *one* step, recorded once, each with the steps it runs at. An argument that is
another array at each step (a step's slice of a sequence or of a stacked output, one of a pair
of alternating buffers, the previous step's carry) is a :class:`PerStep`, which the loop
resolves from the step index when it makes the call. So a plan's host memory does not grow
with T (``tests/backends/test_cuda_plan.py`` measures it at T = 10**3 and 10**5), and
building it costs the same at any T. :meth:`Plan.run` is one loop over the list: no graph
walk, no dict, no allocation of arrays, and on a GPU it is exactly what a CUDA graph captures.

Every call has an :class:`Entry` saying where it runs (``pre``, ``body``, ``post``) and what
it is (``kernel``, ``gemm``, ``copy``, ``add``, ``fill``, ``convert``: a weight to bfloat16
bits), so tests and ``rnnc`` users can count the work of a step (:meth:`Plan.per_step`) or
of a whole graph (:meth:`Plan.count`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

# Plans kept per runner, most recently used last: each holds its buffers on the device.
MAX_PLANS = 8

Node = tuple[Callable[..., Any], tuple, dict[str, Any]]  # a call: function, args, keywords


@dataclass(frozen=True)
class Entry:
    """What one recorded call is: its graph and kind."""

    where: str  # "pre", "body" or "post"
    kind: str  # "kernel", "gemm", "copy", "add", "fill", "convert", "persistent" or "loop"


class PerStep:
    """An argument that is another array at each step of the loop: ``at(step)``, with step 0
    the first step run whatever the direction. Subclasses say which array; its shape is the
    same at every step."""

    __slots__ = ()

    def at(self, step: int) -> Any:
        """The array at loop step ``step``."""
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, the same at every step (that of the first step's array)."""
        return tuple(self.at(0).shape)

    def reshape(self, *shape: int) -> PerStep:
        """The same reshape of every step's array."""
        return View(self, lambda a: a.reshape(*shape))

    @property
    def T(self) -> PerStep:  # noqa: N802 - the array attribute it stands for
        """Every step's array transposed."""
        return View(self, lambda a: a.T)


class View(PerStep):
    """``view`` (a reshape or a transpose) of every step's array of ``base``."""

    __slots__ = ("base", "view")

    def __init__(self, base: PerStep, view: Callable[[Any], Any]) -> None:
        self.base, self.view = base, view

    def at(self, step: int) -> Any:
        return self.view(self.base.at(step))


class Slot(PerStep):
    """A step's slot of a (T, ...) array, ``ahead`` slots on in the loop's direction (the
    next step's slot with ``ahead=1``); step 0 is slot T - 1 of a reverse loop."""

    __slots__ = ("stack", "last", "reverse", "ahead")

    def __init__(self, stack: Any, steps: int, reverse: bool, ahead: int = 0) -> None:
        self.stack, self.last, self.reverse, self.ahead = stack, steps - 1, reverse, ahead

    def at(self, step: int) -> Any:
        if self.reverse:
            return self.stack[self.last - step - self.ahead]
        return self.stack[step + self.ahead]


class Alternate(PerStep):
    """One of two buffers used on alternate steps."""

    __slots__ = ("pair",)

    def __init__(self, pair: tuple[Any, Any]) -> None:
        self.pair = pair

    def at(self, step: int) -> Any:
        return self.pair[step % 2]


class Until(PerStep):
    """``before`` at the steps before ``step``, ``after`` from there on."""

    __slots__ = ("step", "before", "after")

    def __init__(self, step: int, before: PerStep, after: PerStep) -> None:
        self.step, self.before, self.after = step, before, after

    def at(self, step: int) -> Any:
        return (self.before if step < self.step else self.after).at(step)


class Previous(PerStep):
    """What ``source`` was at the previous step; ``first`` at step 0. ``source`` is set once
    the step that makes it is recorded (a carry read before it is made)."""

    __slots__ = ("first", "source")

    def __init__(self, first: Any) -> None:
        self.first, self.source = first, None

    def at(self, step: int) -> Any:
        return self.first if step == 0 else at_step(self.source, step - 1)


def at_step(value: Any, step: int) -> Any:
    """``value`` at loop step ``step``: resolved if it is a :class:`PerStep`, else itself."""
    return value.at(step) if isinstance(value, PerStep) else value


class StepCall:
    """One call of the loop body: ``func(*args, **kwargs)`` at every step of ``steps``, each
    :class:`PerStep` argument resolved for that step, also inside a tuple argument (a
    kernel's argument tuple)."""

    __slots__ = ("func", "args", "kwargs", "steps", "varying")

    def __init__(self, steps: range, func: Callable[..., Any], args: tuple,
                 kwargs: dict[str, Any]) -> None:
        self.func, self.args, self.kwargs, self.steps = func, args, kwargs, steps
        self.varying = any(_varies(a) for a in (*args, *kwargs.values()))

    def __call__(self, step: int) -> Any:
        """Make the call of step ``step``."""
        if not self.varying:
            return self.func(*self.args, **self.kwargs)
        return self.func(*(_resolve(a, step) for a in self.args),
                         **{k: _resolve(v, step) for k, v in self.kwargs.items()})


def _varies(value: Any) -> bool:
    """Whether an argument is, or is a tuple holding, a :class:`PerStep`."""
    return isinstance(value, PerStep) or \
        isinstance(value, tuple) and any(isinstance(v, PerStep) for v in value)


def _resolve(value: Any, step: int) -> Any:
    """An argument at step ``step``: a :class:`PerStep` resolved, also inside a tuple."""
    if isinstance(value, tuple):
        return tuple(at_step(v, step) for v in value)
    return at_step(value, step)


class Loop:
    """The time loop of a plan: one step's calls, recorded once and made at every step."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.calls: list[StepCall] = []
        self.entries: list[Entry] = []

    def record(self, entry: Entry, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Make ``fn(*args, **kwargs)`` at every step, described by ``entry``."""
        self.record_at(range(self.steps), entry, fn, *args, **kwargs)

    def record_at(self, steps: range, entry: Entry, fn: Callable[..., Any], *args: Any,
                  **kwargs: Any) -> None:
        """Make ``fn(*args, **kwargs)`` at the steps of ``steps`` only."""
        self.calls.append(StepCall(steps, fn, args, kwargs))
        self.entries.append(entry)

    def __call__(self) -> None:
        """Run every step in order: each step's calls in the order they were recorded."""
        calls = self.calls
        for step in range(self.steps):
            for call in calls:
                if step in call.steps:
                    call(step)

    def nodes(self, start: int, stop: int) -> list[Node]:
        """The calls of steps ``start`` to ``stop`` (excluded) in the order they run, each
        with its arguments resolved: what a CUDA graph of those steps holds."""
        return [(call.func, tuple(_resolve(a, step) for a in call.args),
                 {k: _resolve(v, step) for k, v in call.kwargs.items()})
                for step in range(start, stop) for call in self.calls if step in call.steps]

    def topology(self, start: int, stop: int) -> Hashable:
        """What the calls of steps ``start`` to ``stop`` are, whatever their arrays: two spans
        of one topology make the same calls in the same order (the first step copies what
        later ones do not, so the first span differs)."""
        spans = []
        for call in self.calls:
            first, last = max(call.steps.start, start), min(call.steps.stop, stop)
            spans.append((first - start, last - start) if first < last else None)
        return stop - start, tuple(spans)

    def per_step(self, step: int) -> Counter:
        """How many calls of each kind step ``step`` makes."""
        return Counter(e.kind for c, e in zip(self.calls, self.entries, strict=True)
                       if step in c.steps)

    def count(self) -> Counter:
        """How many calls of each kind all the steps make together."""
        counts: Counter = Counter()
        for call, entry in zip(self.calls, self.entries, strict=True):
            counts[entry.kind] += len(call.steps)
        return +counts


@dataclass
class Plan:
    """One call's work for one shape: input arrays, the calls in order, and the results."""

    inputs: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    calls: list[Callable[[], Any]] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    graph: Any = None  # the captured CUDA graph, once there is one (GPU only)
    captured: bool = False  # capture was tried (it may have failed: graph stays None)
    capture_error: str = ""  # why the capture failed: the call and the error
    staging: dict[tuple[str, str], Any] = field(default_factory=dict)  # pinned host buffers
    path: str = ""  # the launch path that made it: "gemm", "fused" or "persistent"
    loop: Loop | None = None  # the time loop's steps, where they run one by one
    replay: Any = None  # emulation's graphs of the plan (graphs.Replay), once it has them

    def record(self, entry: Entry, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Append ``fn(*args, **kwargs)`` to the calls, described by ``entry``."""
        self.calls.append(partial(fn, *args, **kwargs))
        self.entries.append(entry)

    def record_loop(self, steps: int) -> Loop:
        """Append a time loop of ``steps`` steps to the calls; the caller records its body."""
        self.loop = Loop(steps)
        self.calls.append(self.loop)
        self.entries.append(Entry("body", "loop"))
        return self.loop

    def run(self) -> None:
        """Make every call in order."""
        for call in self.calls:
            call()

    def around_loop(self) -> tuple[list[Node], list[Node]]:
        """The calls before the time loop and after it, as graph nodes (all of them before,
        where the plan has no loop)."""
        nodes = [(c.func, c.args, c.keywords) if isinstance(c, partial) else c
                 for c in self.calls]
        at = next((k for k, c in enumerate(self.calls) if c is self.loop), len(nodes))
        return nodes[:at], nodes[at + 1:]

    def functions(self) -> list[Callable[..., Any]]:
        """Every function the plan calls (kernels, ``matmul``, copies), the loop's included."""
        body = [c.func for c in self.loop.calls] if self.loop is not None else []
        return [c.func for c in self.calls if isinstance(c, partial)] + body

    def per_step(self, step: int = 0) -> dict[str, int]:
        """How many calls of each kind step ``step`` of the loop makes."""
        return dict(self.loop.per_step(step)) if self.loop is not None else {}

    def count(self, where: str) -> dict[str, int]:
        """How many calls of each kind the graph ``where`` makes (the loop: all its steps)."""
        counts = Counter(e.kind for e in self.entries if e.where == where and e.kind != "loop")
        if where == "body" and self.loop is not None:
            counts += self.loop.count()
        return dict(counts)


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
