"""Lower a whole program (pre graph, time loop, post graph) to one LLVM function, ``rnnc_run``
(its signature and buffers: :mod:`rnnc.backends.llvm.context`).

Where each value lives is the program's buffer plan (:mod:`rnnc.backends.buffers`): a result
that is a graph output is written straight into the output's destination (a result buffer
when no later stage rewrites that name, the step's slice of a stacked output, the next-value
buffer of a carry), every other result into the workspace slot of its plan buffer, made on
first use, so a pre or post slot whose value is dead serves a later value. Carries are
double-buffered: each step reads ``cur`` and writes ``nxt``, then the two swap. Summed outputs
are zeroed before the loop and accumulated after each step. A fused node in any graph is
emitted by :mod:`rnnc.backends.llvm.fused`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from llvmlite import ir

from rnnc import ops
from rnnc.backends.buffers import GraphBuffers, plan_buffers, plan_graph, result_writers
from rnnc.backends.buffers import needed as needed_nodes
from rnnc.backends.llvm import bf16, bf16_matmul, gemm, tensor
from rnnc.backends.llvm.blas import Convention
from rnnc.backends.llvm.context import I64, Buffer, Context, Plan
from rnnc.backends.llvm.fused import emit_fused, fusible
from rnnc.backends.llvm.kernels import emit_accumulate, emit_loop, share_identical_functions
from rnnc.backends.llvm.rules import RULES
from rnnc.backends.llvm.split import panel_work, unit_readers
from rnnc.backends.llvm.team import Team
from rnnc.backends.schedule import LlvmSchedule
from rnnc.backends.steps import GraphSteps, Step, program_steps
from rnnc.ir import ARG, FUSED, GET, Node, Program

_FUNCTION_ATTRIBUTES = '"prefer-vector-width"="512" "min-legal-vector-width"="512"'


def env_shapes(program: Program) -> dict[str, tuple]:
    """The shape of every name the program's environment ever holds (last writer wins)."""
    return {name: ty.shape for name, ty in program.env_types().items()}


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
        self.ctx.schedule = schedule
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
        self.buffers = plan_buffers(self.steps)
        self.writers = result_writers(self.steps)
        # The graph being walked: its plan, the destinations of its outputs by name, and the
        # slot of each plan buffer made so far (the program's, or a region's own).
        self.graph_plan: GraphBuffers = self.buffers.pre
        self.dests: Mapping[str, Buffer | None] = {}
        self.slots: dict[int, Buffer] = {}

    def out(self, node: Node) -> Buffer:
        """The buffer ``node`` is written into: its destination or its plan buffer's slot."""
        return self.result((node.id, 0))

    def result(self, key: tuple[int, int]) -> Buffer:
        """The buffer result ``key`` (node, index) of the graph being walked is written into."""
        plan = self.graph_plan
        if key in plan.writes:
            return self.dests[plan.writes[key]]
        number = plan.buffers[key]
        if number not in self.slots:
            self.slots[number] = self.ctx.slot(plan.shape(number))
        return self.slots[number]

    def destination(self, name: str, stage: str) -> Buffer | None:
        """The result buffer when ``stage`` writes ``name`` last, else None."""
        if self.writers.get(name) == stage and name in self.result_buffers:
            return self.result_buffers[name]
        return None

    # -- graphs
    def lower_graph(self, graph: GraphSteps, plan: GraphBuffers, bound: Mapping[str, Buffer],
                    dests: Mapping[str, Buffer | None]) -> dict[str, Buffer]:
        """Emit ``graph`` with its buffer ``plan``; return the buffer of each output.

        ``dests`` gives the destination of each output the plan names in ``destinations``:
        a node that is two outputs is written into the first's and copied into the second's.
        """
        saved = self.ctx.nodes, self.graph_plan, self.dests
        self.ctx.nodes = {step.slot: step.node for step in graph.steps}
        self.graph_plan, self.dests = plan, dests
        values = self._emit_steps(graph, bound)
        out: dict[str, Buffer] = {}
        for name, output in graph.outputs.items():
            dest = dests.get(name)
            if name in plan.copies:  # settled: the loop's args are not written in its body
                self.copy(dest, values[output.slot], graph is self.steps.body
                          and self.ctx.nodes[output.slot].op is ARG)
            out[name] = values[output.slot] if dest is None else dest
        self.ctx.nodes, self.graph_plan, self.dests = saved
        return out

    def _emit_steps(self, graph: GraphSteps, bound: Mapping[str, Buffer]) -> dict[int, Any]:
        """Emit every step an output of ``graph`` needs; the value (a buffer, or a fused
        node's tuple of buffers) of each, by node id."""
        needed = needed_nodes(graph)
        live = [step for step in graph.steps if step.slot in needed or step.op is ARG]
        values: dict[int, Any] = {}
        # A product split by hidden units is emitted with its reader: (node, operands).
        readers = unit_readers(live, 2 * gemm.lanes(self.ctx),
                               self.ctx.schedule.kernel_nodes) \
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
                values[step.slot] = operands[0][step.attrs["index"]]
            else:
                values[step.slot] = self.out(step.node)
                if step.slot in deferred:
                    deferred[step.slot] = (step.node, operands)
                else:
                    self.lower_node(step.node, values[step.slot], operands)
        return values

    def lower_fused(self, step: Step, operands: list[Buffer], unit: tuple | None = None
                    ) -> tuple[Buffer, ...]:
        """The region's loops (:mod:`rnnc.backends.llvm.fused`), or node by node if its
        reductions have no common row shape; with ``unit`` (the product's node, operands and
        buffer, and the units of one gate), together with that product by hidden units."""
        region = step.region
        bufs = [self.result((step.slot, k)) for k in range(len(region.outputs))]
        if not fusible(region):
            bound = dict(zip(region.args, operands, strict=True))
            saved, self.slots = self.slots, {}  # the region's buffers are its own
            self.lower_graph(region, plan_graph(region, tuple(region.outputs)), bound,
                             dict(zip(region.outputs, bufs, strict=True)))
            self.slots = saved
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
            if self.splitting and len(region.steps) > self.ctx.schedule.kernel_nodes:
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
        build's ``linear_scan`` and bf16 products on every thread by columns."""
        ctx = self.ctx
        if bf16_matmul.emit_split(ctx, node, out, operands, self.team, self.splitting):
            return
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
        heads = tensor.heads_of(node, operands)
        if heads is not None and heads > 1:  # each thread reads only its heads' weights
            self.team.columns(lambda first, stop: tensor.emit_heads_of(ctx, node, out, operands,
                                                                       (first, stop)), heads)
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
            self.env.update(self.lower_graph(steps.pre, self.buffers.pre, self.env, {
                n: self.destination(n, "pre") for n in steps.pre.outputs}))
        self.lower_scan()
        with self.main_only():
            self.env.update(self.lower_graph(steps.post, self.buffers.post, self.env, {
                n: self.destination(n, "post") for n in steps.post.outputs}))
            for name, buf in self.result_buffers.items():
                ctx.copy(buf, self.env[name])
        ctx.builder.ret_void()
        ctx.entry.branch(ctx.function.blocks[1])
        calls = share_identical_functions(ctx.module, ctx.function)
        if calls > ctx.schedule.inline_call_sites:
            for fn in ctx.module.functions:
                if fn is not ctx.function and not fn.is_declaration:
                    fn.attributes.add("noinline")
        text = "\n".join(line + " " + _FUNCTION_ATTRIBUTES if line.startswith("define ") else line
                          for line in str(ctx.module).splitlines())
        return bf16.with_target_features(text)

    def lower_scan(self) -> None:
        """The time loop: one step of the body per iteration, over double-buffered carries."""
        scan, ctx, b = self.steps.scan, self.ctx, self.ctx.builder
        shape_of = {n: output.shape for n, output in self.steps.body.outputs.items()}
        stacked = {n: self.destination(n, "scan") or ctx.slot(("T",) + shape_of[n])
                   for n in scan.stacked}
        summed = {n: self.destination(n, "scan") or ctx.slot(shape_of[n]) for n in scan.summed}
        with self.main_only():
            for buf in summed.values():
                ctx.zero(buf)
        # Each carry's two buffers (the plan's double-buffering), the next one its step's
        # destination.
        slots = {c.name: self._carry_slots(self.env[c.init], c.shape)
                 for c in self.buffers.carries}
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
            values = self.lower_graph(self.steps.body, self.buffers.body, bound, dests)
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
                    final = self.destination(c.final, "scan") or ctx.slot(shape_of[c.name])
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


def lower(program: Program, convention: Convention, schedule: LlvmSchedule | None = None,
          team: bool = False) -> tuple[str, Plan]:
    """The LLVM IR text of ``rnnc_run`` for ``program`` and its buffer plan, as ``schedule``
    says (its fields that are not ``per_call``); ``team``: the build for a thread team
    (:mod:`rnnc.backends.llvm.team`), else the build that runs on the calling thread."""
    lowering = Lowering(program, convention, schedule, team)
    return lowering.lower(), lowering.ctx.plan
