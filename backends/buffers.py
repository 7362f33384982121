"""The buffer plan of a program: where every value lives, decided once for every backend.

:func:`plan_buffers` reads a program's step lists (:mod:`rnnc.backends.steps`) and decides,
without allocating anything:

- **destinations**: which node result is written straight into the destination of a graph
  output (a result array, the step's slot of a stacked output, a carry's next buffer) and
  which outputs are copied there instead. Earlier outputs claim first: in the loop body the
  stacked outputs, then the carries; an arg is never written, so its outputs are copied;
- **liveness**: every other result gets a buffer, numbered in :attr:`BufferPlan.shapes`.
  Outside the loop a buffer whose value is dead (its last reader emitted; a fused node's
  result once its one ``get``'s readers are) goes back to a pool by shape, and a later
  result of that shape takes it, the one freed last first. The pre graph's dead buffers
  serve the post graph too; the loop body's buffers are never shared, as every step
  rewrites them;
- **carry double-buffering**: each carry alternates between two buffers, the current one
  that a step reads and the next one it writes (:class:`CarryBuffers`); its next value is
  made in that buffer, or made in a stacked output's step slot and copied, or, not made in
  the loop at all, copied in.

A backend maps buffer numbers to its own arrays, allocated on first use, so a buffer that
a backend never needs (a CUDA constant, a product a fused step absorbs) costs nothing. The
LLVM backend (:mod:`rnnc.backends.llvm.codegen`) turns each buffer into a workspace slot and
each carry into two slots whose pointers swap after a step. The CUDA backend
(:mod:`rnnc.backends.cuda.host`) keeps every loop buffer as two arrays used on alternate
steps (a step's carries are the previous step's results) and also reads :attr:`shifted` and
:attr:`behind`, which spare it the copy of a stacked previous carry value.

Example, an LSTM's loop body where ``h`` is both a carry and the stacked output ``y``::

    plan = plan_buffers(program_steps(program))
    plan.body.writes[key_of_h] == "y"     # made in y's step slot ...
    plan.body.copies == ("h",)            # ... and copied into h's next buffer
    plan.carry("c").in_place              # c is made in its next buffer: no copy
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rnnc.backends.steps import GraphSteps, ProgramSteps
from rnnc.ir import ARG, FUSED, GET, Shape

Key = tuple[int, int]  # a node result: (node id, result index)


@dataclass(frozen=True)
class GraphBuffers:
    """Where one graph's results go: into an output's destination, or into a buffer."""

    # The outputs that have a destination, in the order they claim the results that make them.
    destinations: tuple[str, ...]
    writes: dict[Key, str]  # results made straight in the destination of the output named
    copies: tuple[str, ...]  # outputs with a destination whose value is copied into it
    buffers: dict[Key, int]  # every other result the graph makes: its buffer's number
    shapes: tuple[Shape, ...]  # each buffer's symbolic shape, by number

    def shape(self, buffer: int) -> Shape:
        """The symbolic shape of buffer number ``buffer``."""
        return self.shapes[buffer]


@dataclass(frozen=True)
class CarryBuffers:
    """How one carry is double-buffered across steps."""

    name: str
    init: str  # the arg its first current buffer is filled from
    shape: Shape
    made: Key | None  # the body result that is its next value; None: not made in the loop
    in_place: bool  # that result is made in the carry's next buffer (no copy)


@dataclass(frozen=True)
class BufferPlan:
    """Where every value of a program lives (see the module docstring)."""

    pre: GraphBuffers
    body: GraphBuffers
    post: GraphBuffers
    carries: tuple[CarryBuffers, ...]
    shapes: tuple[Shape, ...]  # every buffer's symbolic shape, by number
    # A carry's next value (key) whose previous value is the stacked output named: it can be
    # made in that output's slot of the next step, which that step reads as its carry.
    shifted: dict[Key, str]
    # A stacked previous carry value (name) whose next value is itself the stacked output
    # named: the first is the second one step behind, copied once after the loop.
    behind: dict[str, str]

    def carry(self, name: str) -> CarryBuffers:
        """The double-buffering of carry ``name``."""
        return next(c for c in self.carries if c.name == name)


class _Pool:
    """Numbered buffers by shape: a freed one is taken again, the one freed last first."""

    def __init__(self) -> None:
        self.shapes: list[Shape] = []
        self.free: dict[Shape, list[int]] = {}

    def take(self, shape: Shape, reuse: bool) -> int:
        free = self.free.get(tuple(shape)) if reuse else None
        if free:
            return free.pop()
        self.shapes.append(tuple(shape))
        return len(self.shapes) - 1

    def release(self, buffer: int) -> None:
        self.free.setdefault(self.shapes[buffer], []).append(buffer)


def _claims(graph: GraphSteps, destinations: Sequence[str]) -> tuple[dict[Key, str],
                                                                      tuple[str, ...]]:
    """The results made in an output's destination, and the outputs copied into theirs."""
    kinds = {step.slot: step.op for step in graph.steps}
    writes: dict[Key, str] = {}
    for name in destinations:
        output = graph.outputs[name]
        if kinds[output.slot] is not ARG:
            writes.setdefault(output.source, name)
    copies = tuple(name for name in destinations
                   if writes.get(graph.outputs[name].source) != name)
    return writes, copies


def needed(graph: GraphSteps) -> set[int]:
    """The nodes some output of ``graph`` depends on: the only ones a backend emits."""
    inputs = {step.slot: step.inputs for step in graph.steps}
    found: set[int] = set()
    stack = [output.slot for output in graph.outputs.values()]
    while stack:
        slot = stack.pop()
        if slot not in found:
            found.add(slot)
            stack.extend(inputs[slot])
    return found


def _place(graph: GraphSteps, writes: dict[Key, str], pool: _Pool, reuse: bool
           ) -> dict[Key, int]:
    """A buffer for every result of ``graph`` not in ``writes``, freed after its last
    reader when ``reuse`` (walked in the order a backend emits the steps)."""
    live = [step for step in graph.steps if step.slot in needed(graph) or step.op is ARG]
    readers = Counter(i for step in live for i in set(step.inputs))
    gets = Counter((step.inputs[0], step.attrs["index"]) for step in live if step.op is GET)
    kept = {output.slot for output in graph.outputs.values()}
    buffers: dict[Key, int] = {}
    owned: dict[int, int] = {}  # node -> the buffer freed when its readers are done
    for step in live:
        if step.op is FUSED:
            for k, output in enumerate(step.region.outputs.values()):
                if (step.slot, k) not in writes:
                    buffers[(step.slot, k)] = pool.take(output.shape, reuse)
        elif step.op is GET:
            result = (step.inputs[0], step.attrs["index"])
            if result not in writes and gets[result] == 1:
                owned[step.slot] = buffers[result]
        elif step.op is not ARG and (step.slot, 0) not in writes:
            buffers[(step.slot, 0)] = owned[step.slot] = pool.take(step.node.shape, reuse)
        for i in set(step.inputs):
            readers[i] -= 1
            if reuse and readers[i] == 0 and i in owned and i not in kept:
                pool.release(owned.pop(i))
    if reuse:
        for slot, buffer in owned.items():
            if slot not in kept:
                pool.release(buffer)
    return buffers


def plan_graph(graph: GraphSteps, destinations: Sequence[str], reuse: bool = False
               ) -> GraphBuffers:
    """The buffers of ``graph`` alone (a fused region emitted node by node): ``destinations``
    claim in order; with ``reuse``, a dead buffer is taken again."""
    pool = _Pool()
    writes, copies = _claims(graph, destinations)
    buffers = _place(graph, writes, pool, reuse)
    return GraphBuffers(tuple(destinations), writes, copies, buffers, tuple(pool.shapes))


def _last_stage(steps: ProgramSteps) -> dict[str, str]:
    """For each name a stage writes, the stage that writes it last."""
    scan = steps.scan
    stage = {name: "pre" for name in steps.pre.outputs}
    stage.update({name: "scan" for name in scan.stacked + scan.summed})
    stage.update({c.final: "scan" for c in scan.carries if c.final is not None})
    stage.update({name: "post" for name in steps.post.outputs})
    return stage


def result_writers(steps: ProgramSteps) -> dict[str, str]:
    """The results and the stage ("pre", "scan" or "post") whose value of each is final: only
    that stage writes it into the result's array."""
    stage = _last_stage(steps)
    return {name: stage[name] for name in steps.results if name in stage}


def _carry_links(steps: ProgramSteps, writes: dict[Key, str]
                 ) -> tuple[dict[Key, str], dict[str, str]]:
    """The stacked previous carry values: ``shifted`` and ``behind`` of :class:`BufferPlan`."""
    body, scan = steps.body, steps.scan
    carries = {c.name for c in scan.carries}
    kinds = {step.slot: step.op for step in body.steps}
    reads = {(s.slot, 0): s.name for s in body.steps if s.op is ARG}
    shifted: dict[Key, str] = {}
    behind: dict[str, str] = {}
    for name in scan.stacked:
        carry = reads.get(body.outputs[name].source)
        if carry not in carries or kinds[body.outputs[carry].slot] is ARG:
            continue  # not a carry's previous value, or a carry not made in the loop
        key = body.outputs[carry].source
        if writes.get(key) in scan.stacked:
            behind[name] = writes[key]
        elif key not in shifted:
            shifted[key] = name
    return shifted, behind


def plan_buffers(steps: ProgramSteps) -> BufferPlan:
    """The buffer plan of the program whose step lists are ``steps``."""
    scan, pool = steps.scan, _Pool()
    writers = result_writers(steps)
    graphs: dict[str, tuple[dict[Key, str], tuple[str, ...], dict[Key, int], tuple]] = {}
    # Stacked outputs claim before carries: a value both stacked and carried is made in its
    # step slot, which the next step can read, so no step copies it into the stack.
    order = {"pre": tuple(n for n in steps.pre.outputs if writers.get(n) == "pre"),
             "body": scan.stacked + tuple(c.name for c in scan.carries),
             "post": tuple(n for n in steps.post.outputs if writers.get(n) == "post")}
    for where, graph in (("pre", steps.pre), ("body", steps.body), ("post", steps.post)):
        writes, copies = _claims(graph, order[where])
        graphs[where] = (writes, copies, _place(graph, writes, pool, where != "body"),
                         order[where])
    shapes = tuple(pool.shapes)
    pre, body, post = (GraphBuffers(names, writes, copies, buffers, shapes)
                       for writes, copies, buffers, names in graphs.values())
    kinds = {step.slot: step.op for step in steps.body.steps}
    carries = []
    for c in scan.carries:
        output = steps.body.outputs[c.name]
        made = None if kinds[output.slot] is ARG else output.source
        carries.append(CarryBuffers(c.name, c.init, output.shape, made,
                                    made is not None and body.writes.get(made) == c.name))
    shifted, behind = _carry_links(steps, body.writes)
    return BufferPlan(pre, body, post, tuple(carries), shapes, shifted, behind)
