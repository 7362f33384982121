"""Lower a whole program (pre graph, time loop, post graph) to one LLVM function, ``rnnc_run``
(its signature and buffers: :mod:`rnnc.backends.llvm.context`).

Every node gets its own buffer, except that a node whose value is a graph output is written
straight into the output's destination: a result buffer (when no later stage rewrites that
name), the next-value buffer of a carry, or the step's slice of a stacked output. Carries are
double-buffered: each step reads ``cur`` and writes ``nxt``, then the two swap. Summed outputs
are zeroed before the loop and accumulated after each step. Outside the loop a slot whose value
is dead (a node's, or a fused node's result once its ``get``'s users are emitted) is recycled.
A fused node in any graph is emitted by :mod:`rnnc.backends.llvm.fused`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm import gemm
from rnnc.backends.llvm.blas import Convention
from rnnc.backends.llvm.context import I64, Buffer, Context, Plan
from rnnc.backends.llvm.fused import emit_fused, fusible
from rnnc.backends.llvm.kernels import emit_accumulate, emit_loop, share_identical_functions
from rnnc.backends.llvm.region import KERNEL_NODES
from rnnc.backends.llvm.rules import RULES
from rnnc.backends.llvm.split import panel_work, unit_readers
from rnnc.backends.llvm.team import Team
from rnnc.backends.schedule import LlvmSchedule
from rnnc.backends.steps import GraphSteps, Step, program_steps
from rnnc.ir import ARG, FUSED, GET, Node, Program

_FUNCTION_ATTRIBUTES = '"prefer-vector-width"="512" "min-legal-vector-width"="512"'
# Kernels are inlined into ``rnnc_run`` while it calls at most this many: LLVM's optimizer and
# instruction selection grow faster than linearly with the size of one function (a cell of 300
# chained matmuls, all inlined, took minutes to compile), while a call costs nanoseconds.
INLINE_CALL_SITES = 64


def env_shapes(program: Program) -> dict[str, tuple]:
    """The shape of every name the program's environment ever holds (last writer wins)."""
    return {name: ty.shape for name, ty in program.env_types().items()}


def _last_stage(program: Program) -> dict[str, int]:
    """For each name, the stage that writes it last: 0 args, 1 pre, 2 scan, 3 post."""
    stage = {name: 0 for name in program.args}
    stage.update({name: 1 for name in program.pre.outputs})
    scan = program.scan
    stage.update({name: 2 for name in scan.stacked + scan.summed})
    stage.update({c.final: 2 for c in scan.carries if c.final is not None})
    stage.update({name: 3 for name in program.post.outputs})
    return stage


class Lowering:
    """Builds ``rnnc_run`` for one program as its schedule says: walks its steps and gives every
    node a buffer."""

    def __init__(self, program: Program, convention: Convention,
                 schedule: LlvmSchedule | None = None, team: bool = False) -> None:
        schedule, self.steps = schedule or LlvmSchedule(), program_steps(program)
        shapes = env_shapes(program)
        plan = Plan(program.dtype, tuple((n, t.shape) for n, (_, t) in program.args.items()),
                    tuple((n, shapes[n]) for n in program.results))
        self.ctx = Context.start(plan, convention, team)
        # A team's threads, and a backend of one thread, call the BLAS on one core.
        self.ctx.own_max_work = schedule.own_max_work(team or schedule.threads == 1)
        # A team build splits the step body's nodes between threads while ``splitting``, and
        # a linear_scan by columns, or over its steps below the schedule's limits.
        self.team = Team(self.ctx, schedule.scan_limits()) if team else None
        self.splitting = False
        self.units = schedule.team_split == "units"  # by hidden units (split.unit_readers)
        self.env: dict[str, Buffer] = {n: self.ctx.buffer(k, s)
                                       for k, (n, s) in enumerate(plan.args)}
        self.result_buffers: dict[str, Buffer] = {}
        for k, (name, shape) in enumerate(plan.results):
            self.result_buffers.setdefault(name, self.ctx.buffer(len(plan.args) + k, shape))
        self.last_stage = _last_stage(program)
        # The graph being walked: the buffers its outputs go to, by (node id, result index),
        # and the slots its nodes own.
        self.redirect: dict[tuple[int, int], Buffer] = {}
        self.owned: dict[int, Buffer] = {}
        # Slots of the pre and post graphs whose values are dead, by shape: sequence-sized
        # temporaries outside the loop are the big ones, so they are recycled.
        self.free: dict[tuple, list[Buffer]] = {}
        self.reusable: dict[tuple, list[Buffer]] | None = None

    def out(self, node: Node) -> Buffer:
        """The buffer ``node`` is written into: its destination, a freed slot, or a new one."""
        if (node.id, 0) in self.redirect:
            return self.redirect[(node.id, 0)]
        buf = self.out_slot(node.shape)
        self.owned[node.id] = buf
        return buf

    def out_slot(self, shape: tuple) -> Buffer:
        """A freed slot of ``shape`` where the graph recycles them, else a new one."""
        free = self.reusable.get(tuple(shape)) if self.reusable is not None else None
        return free.pop() if free else self.ctx.slot(shape)

    def destination(self, name: str, stage: int) -> Buffer | None:
        """The result buffer when this stage writes ``name`` last, else None."""
        if self.last_stage.get(name) == stage and name in self.result_buffers:
            return self.result_buffers[name]
        return None

    # -- graphs
    def lower_graph(self, graph: GraphSteps, bound: Mapping[str, Buffer],
                    dests: Mapping[str, Buffer | None], reuse: bool = False
                    ) -> dict[str, Buffer]:
        """Emit ``graph``; return the buffer of each output (``dests`` entries are honoured).

        Earlier entries of ``dests`` claim their node first: a node that is two outputs
        is written into the first destination and copied into the second. With ``reuse``,
        a node's slot is recycled once its last user has been emitted.
        """
        saved = self.ctx.nodes, self.redirect, self.reusable, self.owned
        self.ctx.nodes = {step.slot: step.node for step in graph.steps}
        self.redirect, self.owned = _redirects(graph, self.ctx.nodes, dests), {}
        self.reusable = self.free if reuse else None
        values = self._emit_steps(graph, bound, reuse)
        out: dict[str, Buffer] = {}
        for name, output in graph.outputs.items():
            dest = dests.get(name)
            if dest is not None:  # the loop's args are not written in its body
                self.copy(dest, values[output.slot], graph is self.steps.body
                          and self.ctx.nodes[output.slot].op is ARG)
            out[name] = values[output.slot] if dest is None else dest
        if reuse:
            kept = {output.slot for output in graph.outputs.values()}
            for nid, buf in self.owned.items():
                if nid not in kept:
                    self.free.setdefault(tuple(buf.shape), []).append(buf)
        self.ctx.nodes, self.redirect, self.reusable, self.owned = saved
        return out

    def _emit_steps(self, graph: GraphSteps, bound: Mapping[str, Buffer], reuse: bool
                    ) -> dict[int, Any]:
        """Emit every step an output of ``graph`` needs; the value (a buffer, or a fused
        node's tuple of buffers) of each, by node id."""
        needed = _needed(graph)
        live = [step for step in graph.steps if step.slot in needed or step.op is ARG]
        users = Counter(i for step in live for i in set(step.inputs))
        gets = Counter((step.inputs[0], step.attrs["index"]) for step in live if step.op is GET)
        kept = {output.slot for output in graph.outputs.values()}
        values: dict[int, Any] = {}
        # A product split by hidden units is emitted with its reader: (node, operands).
        readers = unit_readers(live, 2 * gemm.lanes(self.ctx)) \
            if self.splitting and self.units else {}
        deferred = {product: None for product, _ in readers.values()}
        for step in live:
            operands = [values[i] for i in step.inputs]
            if step.op is ARG:
                values[step.slot] = bound[step.name]
            elif step.op is FUSED:
                unit = readers.get(step.slot)
                product = None if unit is None else (*deferred[unit[0]], values[unit[0]], unit[1])
                values[step.slot] = self.lower_fused(step, operands, product)
            elif step.op is GET:
                result = (step.inputs[0], step.attrs["index"])
                values[step.slot] = operands[0][result[1]]
                if result not in self.redirect and gets[result] == 1:
                    # A fused result in a slot of its own: free once the get's users are done.
                    self.owned[step.slot] = values[step.slot]
            else:
                values[step.slot] = self.out(step.node)
                if step.slot in deferred:
                    deferred[step.slot] = (step.node, operands)
                else:
                    self.lower_node(step.node, values[step.slot], operands)
            for i in set(step.inputs):
                users[i] -= 1
                if users[i] == 0 and i in self.owned and i not in kept and reuse:
                    buf = self.owned.pop(i)
                    self.free.setdefault(tuple(buf.shape), []).append(buf)
        return values

    def lower_fused(self, step: Step, operands: list[Buffer], unit: tuple | None = None
                    ) -> tuple[Buffer, ...]:
        """The region's loops (:mod:`rnnc.backends.llvm.fused`), or node by node if its
        reductions have no common row shape; with ``unit`` (the product's node, operands and
        buffer, and the units of one gate), together with that product by hidden units."""
        region = step.region
        bufs = [self.redirect.get((step.slot, k)) or self.out_slot(output.shape)
                for k, output in enumerate(region.outputs.values())]
        if not fusible(region):
            bound = dict(zip(region.args, operands, strict=True))
            self.lower_graph(region, bound, dict(zip(region.outputs, bufs, strict=True)))
            return tuple(bufs)
        arg_slots = {s.name: s.slot for s in region.steps if s.op is ARG}
        leaves = {arg_slots[name]: buf for name, buf in zip(region.args, operands, strict=True)}
        outputs: dict[int, Buffer] = {}
        copies = []
        for buf, output in zip(bufs, region.outputs.values(), strict=True):
            if output.slot in leaves:
                copies.append((buf, leaves[output.slot]))
            elif output.slot in outputs:
                copies.append((buf, outputs[output.slot]))
            else:
                outputs[output.slot] = buf
        if unit is not None:
            self.team.by_units(*unit, list(outputs.values()), lambda span: emit_fused(
                self.ctx, region, leaves, outputs, span))
        elif outputs:
            keys, dests = list(leaves), list(outputs)
            if self.splitting and len(region.steps) > KERNEL_NODES:
                # A long region keeps values in whole-batch slots between its loops.
                self.team.serial(lambda: emit_fused(self.ctx, region, leaves, outputs))
            else:
                self.split([leaves[k] for k in keys], [outputs[k] for k in dests],
                           lambda i, o: emit_fused(self.ctx, region,
                                                   dict(zip(keys, i, strict=True)),
                                                   dict(zip(dests, o, strict=True))))
        for dst, src in copies:
            self.copy(dst, src)
        return tuple(bufs)

    # -- the team's split of the step body
    def split(self, inputs: Sequence[Buffer], outputs: Sequence[Buffer],
              emit: Callable[[list[Buffer], list[Buffer]], None]) -> None:
        """``emit(inputs, outputs)``: by blocks of batch rows in a team's step body."""
        if self.splitting:
            self.team.rows(inputs, outputs, emit)
        else:
            emit(list(inputs), list(outputs))

    def copy(self, dst: Buffer, src: Buffer, settled: bool = False) -> None:
        """``dst = src``, split in a team's step body (``settled``: ``src`` is not written in
        the step)."""
        if dst.ptr is src.ptr:
            return
        if self.splitting:
            self.team.copy(dst, src, settled)
        else:
            self.ctx.copy(dst, src)

    def lower_node(self, node: Node, out: Buffer, operands: list) -> None:
        """One node by its rule; in a team's step body, a recurrent product by column
        panels and any other node by batch rows where it can be split; outside it, a team
        build's ``linear_scan`` on every thread by columns (:meth:`Team.linear_scan`)."""
        ctx = self.ctx
        if not self.splitting:
            if node.op is ops.linear_scan and self.team is not None:
                self.team.linear_scan(node, out, operands)
            else:
                RULES[node.op](ctx, node, out, *operands)
            return
        if node.op is ops.matmul and panel_work(node, operands[0].shape, operands[1].shape,
                                                2 * gemm.lanes(ctx)):
            self.team.product(*operands, out, bool(node.attrs.get("transpose_b")))
            return
        if node.op is ops.matmul:
            self.team.serial(lambda: RULES[node.op](ctx, node, out, *operands))
            return
        self.split(operands, [out], lambda i, o: RULES[node.op](ctx, node, o[0], *i))

    @contextmanager
    def main_only(self) -> Iterator[None]:
        """Code emitted inside runs on thread 0 only (on every thread without a team), except
        a team's ``linear_scan`` nodes."""
        if self.team is None:
            yield
            return
        with self.team.main_only():
            yield

    # -- the program
    def lower(self) -> str:
        """The LLVM IR text of the whole program."""
        steps, ctx = self.steps, self.ctx
        with self.main_only():
            self.env.update(self.lower_graph(steps.pre, self.env, {
                n: self.destination(n, 1) for n in steps.pre.outputs}, reuse=True))
        self.lower_scan()
        with self.main_only():
            self.env.update(self.lower_graph(steps.post, self.env, {
                n: self.destination(n, 3) for n in steps.post.outputs}, reuse=True))
            for name, buf in self.result_buffers.items():
                ctx.copy(buf, self.env[name])
        ctx.builder.ret_void()
        ctx.entry.branch(ctx.function.blocks[1])
        calls = share_identical_functions(ctx.module, ctx.function)
        if calls > INLINE_CALL_SITES:
            for fn in ctx.module.functions:
                if fn is not ctx.function and not fn.is_declaration:
                    fn.attributes.add("noinline")
        text = str(ctx.module)
        return "\n".join(line + " " + _FUNCTION_ATTRIBUTES if line.startswith("define ") else line
                         for line in text.splitlines())

    def lower_scan(self) -> None:
        """The time loop: one step of the body per iteration, over double-buffered carries."""
        scan, ctx, b = self.steps.scan, self.ctx, self.ctx.builder
        shape_of = {n: output.shape for n, output in self.steps.body.outputs.items()}
        stacked = {n: self.destination(n, 2) or ctx.slot(("T",) + shape_of[n])
                   for n in scan.stacked}
        summed = {n: self.destination(n, 2) or ctx.slot(shape_of[n]) for n in scan.summed}
        with self.main_only():
            for buf in summed.values():
                ctx.zero(buf)
        slots = {c.name: self._carry_slots(self.env[c.init], shape_of[c.name])
                 for c in scan.carries}
        if self.team is not None:
            self.team.barrier()

        def carry(name: str, which: int) -> Buffer:
            return Buffer(b.load(slots[name][which]), shape_of[name])

        def step(i: ir.Value) -> None:
            t = b.sub(b.sub(ctx.T, ir.Constant(I64, 1)), i) if scan.reverse else i

            def at_step(buf: Buffer) -> Buffer:
                offset = b.mul(t, ctx.numel(buf.shape[1:]))
                return Buffer(b.gep(buf.ptr, [offset], inbounds=True), buf.shape[1:])

            bound = {n: self.env[n] for n in scan.consts}
            bound.update({n: at_step(self.env[n]) for n in scan.seqs})
            cur = {c.name: carry(c.name, 0) for c in scan.carries}
            nxt = {c.name: carry(c.name, 1) for c in scan.carries}
            bound.update(cur)
            dests: dict[str, Buffer | None] = dict(nxt)
            dests.update({n: at_step(stacked[n]) for n in scan.stacked})
            dests.update({n: None for n in scan.summed})
            self.splitting = ctx.one_thread = self.team is not None
            if self.team is not None:
                self.team.start_step(i)
            values = self.lower_graph(self.steps.body, bound, dests)
            for n in scan.summed:
                self.split([values[n]], [summed[n]],
                           lambda i, o: emit_accumulate(ctx, o[0], i[0]))
            if self.team is not None:
                self.team.end_step()
            self.splitting = ctx.one_thread = False
            for c in scan.carries:
                b.store(nxt[c.name].ptr, slots[c.name][0])
                b.store(cur[c.name].ptr, slots[c.name][1])

        emit_loop(b, ir.Constant(I64, 0), ctx.T, 1, step, ("loop", "step", "finish"))
        self.env.update(stacked)
        self.env.update(summed)
        with self.main_only():
            for c in scan.carries:
                if c.final is not None:
                    final = self.destination(c.final, 2) or ctx.slot(shape_of[c.name])
                    ctx.copy(final, carry(c.name, 0))
                    self.env[c.final] = final

    def _carry_slots(self, init: Buffer, shape: tuple) -> tuple[ir.Value, ir.Value]:
        """Two buffers for a carry, the first holding ``init``, and the stack slots holding
        the pointers of the current one and the next one, swapped after every step."""
        ctx = self.ctx
        first, second = ctx.slot(shape), ctx.slot(shape)
        with self.main_only():
            ctx.copy(first, init)
        slots = ctx.entry.alloca(first.ptr.type), ctx.entry.alloca(first.ptr.type)
        ctx.builder.store(first.ptr, slots[0])
        ctx.builder.store(second.ptr, slots[1])
        return slots


def _redirects(graph: GraphSteps, nodes: Mapping[int, Node],
               dests: Mapping[str, Buffer | None]) -> dict[tuple[int, int], Buffer]:
    """The destination of each node result that is an output of ``graph`` with one, by
    (node id, result index); the first output claims a result, and args keep their own."""
    redirect: dict[tuple[int, int], Buffer] = {}
    for name, dest in dests.items():
        output = graph.outputs[name]
        if dest is not None and nodes[output.slot].op is not ARG:
            redirect.setdefault(output.source, dest)
    return redirect


def _needed(graph: GraphSteps) -> set[int]:
    """The nodes some output of ``graph`` depends on: one walk from all outputs at once."""
    inputs = {step.slot: step.inputs for step in graph.steps}
    needed: set[int] = set()
    stack = [output.slot for output in graph.outputs.values()]
    while stack:
        nid = stack.pop()
        if nid not in needed:
            needed.add(nid)
            stack.extend(inputs[nid])
    return needed


def lower(program: Program, convention: Convention, schedule: LlvmSchedule | None = None,
          team: bool = False) -> tuple[str, Plan]:
    """The LLVM IR text of ``rnnc_run`` for ``program`` and its buffer plan, as ``schedule``
    says (its fields that are not ``per_call``); ``team``: the build for a thread team
    (:mod:`rnnc.backends.llvm.team`), else the build that runs on the calling thread."""
    lowering = Lowering(program, convention, schedule, team)
    return lowering.lower(), lowering.ctx.plan
