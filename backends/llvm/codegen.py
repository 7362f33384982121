"""Lower a whole program (pre graph, time loop, post graph) to one LLVM function.

The function is ``void rnnc_run(i8** buffers, i64 T, i64 B, i8* gemm)``. ``buffers`` holds one
pointer per array, in the order of the :class:`Plan`: the program's args (``program.args``
order), then its results (``program.results`` order), then workspace slots. ``gemm`` points
to one BLAS ``sgemm``/``dgemm`` address per GEMM call site (``Plan.gemms``), chosen by the
runtime per shape among libraries of one calling convention, fixed at code generation.
Every buffer is C-contiguous of the program's dtype; the runtime computes each slot's size
from its symbolic shape.

Every node gets its own buffer, except that a node whose value is a graph output is written
straight into the output's destination: a result buffer (when no later stage rewrites that
name), the next-value buffer of a carry, or the step's slice of a stacked output. Carries are
double-buffered: each step reads ``cur`` and writes ``nxt``, then the two swap. Summed outputs
are zeroed before the loop and accumulated after each step.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llvmlite import ir

from rnnc import ops
from rnnc.backends.llvm.blas import Blas
from rnnc.backends.llvm.kernels import I8P, I64, Buffer, emit_accumulate, emit_region, numel
from rnnc.backends.llvm.rules import RULES, SCALAR
from rnnc.ir import ARG, FUSED, GET, Graph, Program

ENTRY = "rnnc_run"
NP_DTYPES = {"f32": np.float32, "f64": np.float64}
# Per-element evaluation handles these inside a fused region; anything else (reductions)
# makes the region run node by node.
_PER_ELEMENT = frozenset(SCALAR) | {ops.slice_, ops.pad, ops.concat, ops.expand, ops.constant}
_FUNCTION_ATTRIBUTES = '"prefer-vector-width"="512" "min-legal-vector-width"="512"'
# Kernels are inlined into ``rnnc_run`` while it calls at most this many: LLVM's optimizer and
# instruction selection grow faster than linearly with the size of one function (a cell of 300
# chained matmuls, all inlined, took minutes to compile), while a call costs nanoseconds.
INLINE_CALL_SITES = 64
# A fused region of more nodes is emitted as several loops, each at most this many nodes: the
# compile time of one loop body grows faster than linearly with its size (a 1,000-op body took
# 17 s), while storing and reloading a value between loops costs little.
KERNEL_NODES = 128


@dataclass
class Plan:
    """The buffers of ``rnnc_run`` in order, with their symbolic shapes."""

    dtype: str
    args: tuple[tuple[str, tuple], ...]
    results: tuple[tuple[str, tuple], ...]
    slots: list[tuple] = field(default_factory=list)
    # One entry per GEMM call site: (transpose_a, transpose_b, (m, n, k)), each size a tuple
    # of dims whose product it is. The runner fills one BLAS address per site.
    gemms: list[tuple] = field(default_factory=list)


def env_shapes(program: Program) -> dict[str, tuple]:
    """The shape of every name the program's environment ever holds (last writer wins)."""
    shapes = {name: ty.shape for name, (_, ty) in program.args.items()}
    shapes.update({n: program.pre.node(o).shape for n, o in program.pre.outputs.items()})
    body = program.scan.body
    for name in program.scan.stacked:
        shapes[name] = ("T",) + body.node(body.outputs[name]).shape
    for name in program.scan.summed:
        shapes[name] = body.node(body.outputs[name]).shape
    for c in program.scan.carries:
        if c.final is not None:
            shapes[c.final] = shapes[c.init]
    shapes.update({n: program.post.node(o).shape for n, o in program.post.outputs.items()})
    return shapes


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
    """Builds ``rnnc_run`` for one program; the ``ctx`` every rule receives."""

    def __init__(self, program: Program, blas: Blas) -> None:
        self.program = program
        self.blas = blas
        self.np_dtype = NP_DTYPES[program.dtype]
        self.scalar = ir.FloatType() if program.dtype == "f32" else ir.DoubleType()
        self.module = ir.Module(name="rnnc")
        fnty = ir.FunctionType(ir.VoidType(), [I8P.as_pointer(), I64, I64, I8P])
        self.fn = ir.Function(self.module, fnty, ENTRY)
        self.fn.attributes.add("nounwind")
        self.buffers, self.T, self.B, self.gemm = self.fn.args
        entry = self.fn.append_basic_block("entry")
        self.entry = ir.IRBuilder(entry)
        self.builder = ir.IRBuilder(self.fn.append_basic_block("start"))
        shapes = env_shapes(program)
        self.plan = Plan(program.dtype, tuple((n, t.shape) for n, (_, t) in program.args.items()),
                         tuple((n, shapes[n]) for n in program.results))
        self._next = itertools.count()
        self.env: dict[str, Buffer] = {n: self._pointer(s) for n, s in self.plan.args}
        self.result_buffers = {}
        for name, shape in self.plan.results:
            buf = self._pointer(shape)
            self.result_buffers.setdefault(name, buf)
        self.last_stage = _last_stage(program)
        self.graph: Graph = program.pre
        self.redirect: dict[Any, Buffer] = {}
        # Slots of the pre and post graphs whose values are dead, by shape: sequence-sized
        # temporaries outside the loop are the big ones, so they are recycled.
        self.free: dict[tuple, list[Buffer]] = {}
        self.reusable: dict[tuple, list[Buffer]] | None = None
        self.owned: dict[int, Buffer] = {}

    # -- buffers and sizes
    def _pointer(self, shape: tuple) -> Buffer:
        index = next(self._next)
        slot = self.entry.gep(self.buffers, [ir.Constant(I64, index)], inbounds=True)
        return Buffer(self.entry.bitcast(self.entry.load(slot), self.scalar.as_pointer()), shape)

    def slot(self, shape: tuple) -> Buffer:
        """A new workspace buffer of ``shape``."""
        self.plan.slots.append(tuple(shape))
        return self._pointer(tuple(shape))

    def dim(self, d: Any) -> ir.Value:
        if d == "T":
            return self.T
        if d == "B":
            return self.B
        return ir.Constant(I64, d)

    def numel_value(self, shape: tuple) -> ir.Value:
        return numel(shape, self.dim, self.builder)

    def bytes(self, shape: tuple) -> ir.Value:
        n = self.numel_value(shape)
        return self.builder.mul(n, ir.Constant(I64, self.np_dtype().itemsize))

    def entry_alloca(self, ty: ir.Type) -> ir.Value:
        return self.entry.alloca(ty)

    def out(self, node: Any) -> Buffer:
        """The buffer a rule writes ``node`` into: its destination, a freed slot, or a new one."""
        if node.id in self.redirect:
            return self.redirect[node.id]
        free = self.reusable.get(tuple(node.shape)) if self.reusable is not None else None
        buf = free.pop() if free else self.slot(node.shape)
        self.owned[node.id] = buf
        return buf

    def copy(self, dst: Buffer, src: Buffer) -> None:
        if dst.ptr is src.ptr:
            return
        b = self.builder
        memcpy = self.module.declare_intrinsic("llvm.memcpy", [I8P, I8P, I64])
        b.call(memcpy, [b.bitcast(dst.ptr, I8P), b.bitcast(src.ptr, I8P), self.bytes(dst.shape),
                        ir.Constant(ir.IntType(1), 0)])

    def zero(self, dst: Buffer) -> None:
        b = self.builder
        memset = self.module.declare_intrinsic("llvm.memset", [I8P, I64])
        b.call(memset, [b.bitcast(dst.ptr, I8P), ir.Constant(ir.IntType(8), 0),
                        self.bytes(dst.shape), ir.Constant(ir.IntType(1), 0)])

    def destination(self, name: str, stage: int) -> Buffer | None:
        """The result buffer when this stage writes ``name`` last, else None."""
        if self.last_stage.get(name) == stage and name in self.result_buffers:
            return self.result_buffers[name]
        return None

    # -- graphs
    def lower_graph(self, g: Graph, bound: Mapping[str, Buffer],
                    dests: Mapping[str, Buffer | None], reuse: bool = False
                    ) -> dict[str, Buffer]:
        """Emit ``g``; return the buffer of each output (``dests`` entries are honoured).

        Earlier entries of ``dests`` claim their node first: a node that is two outputs
        is written into the first destination and copied into the second. With ``reuse``,
        a node's slot is recycled once its last user has been emitted.
        """
        saved = self.graph, self.redirect, self.reusable, self.owned
        self.graph, self.redirect, self.owned = g, {}, {}
        self.reusable = self.free if reuse else None
        for name, dest in dests.items():
            nid = g.outputs[name]
            node = g.node(nid)
            key = (node.inputs[0], node.attrs["index"]) if node.op is GET else nid
            if dest is not None and node.op is not ARG and key not in self.redirect:
                self.redirect[key] = dest
        needed = _needed(g)
        live = [node for node in g.nodes() if node.id in needed or node.op is ARG]
        users = Counter(i for node in live for i in set(node.inputs))
        kept = set(g.outputs.values())
        vals: dict[int, Any] = {}
        for node in live:
            if node.op is ARG:
                vals[node.id] = bound[node.attrs["name"]]
            elif node.op is FUSED:
                vals[node.id] = self.lower_fused(node, [vals[i] for i in node.inputs])
            elif node.op is GET:
                vals[node.id] = vals[node.inputs[0]][node.attrs["index"]]
            else:
                vals[node.id] = RULES[node.op](self, node, *(vals[i] for i in node.inputs))
            for i in set(node.inputs):
                users[i] -= 1
                if users[i] == 0 and i in self.owned and i not in kept and reuse:
                    self.free.setdefault(tuple(g.node(i).shape), []).append(self.owned.pop(i))
        out: dict[str, Buffer] = {}
        for name, nid in g.outputs.items():
            dest = dests.get(name)
            if dest is None:
                out[name] = vals[nid]
            else:
                self.copy(dest, vals[nid])
                out[name] = dest
        if reuse:
            for nid, buf in self.owned.items():
                if nid not in kept:
                    self.free.setdefault(tuple(buf.shape), []).append(buf)
        self.graph, self.redirect, self.reusable, self.owned = saved
        return out

    def lower_fused(self, node: Any, operands: list[Buffer]) -> tuple[Buffer, ...]:
        """One loop per output shape over the region, or node by node if it reduces."""
        region: Graph = node.attrs["region"]
        names = list(region.args())
        bufs = [self.redirect.get((node.id, k)) or self.slot(region.node(o).shape)
                for k, o in enumerate(region.outputs.values())]
        if any(n.op not in _PER_ELEMENT for n in region.nodes() if n.op is not ARG):
            bound = dict(zip(names, operands, strict=True))
            self.lower_graph(region, bound, dict(zip(region.outputs, bufs, strict=True)))
            return tuple(bufs)
        leaves = dict(zip(region.args().values(), operands, strict=True))
        outputs: dict[int, Buffer] = {}
        copies = []
        for buf, nid in zip(bufs, region.outputs.values(), strict=True):
            if nid in leaves:
                copies.append((buf, leaves[nid]))
            elif nid in outputs:
                copies.append((buf, outputs[nid]))
            else:
                outputs[nid] = buf
        if outputs:
            self.emit_in_parts(region, leaves, outputs)
        for dst, src in copies:
            self.copy(dst, src)
        return tuple(bufs)

    def emit_in_parts(self, region: Graph, leaves: dict[int, Buffer],
                      outputs: dict[int, Buffer]) -> None:
        """Emit a per-element region as loops of at most ``KERNEL_NODES`` nodes each.

        The nodes are cut into consecutive parts of their topological order; a value that a
        later part reads is stored by its own part into a workspace slot, which the later
        part loads. A typical cell's region is one part: one loop, nothing stored."""
        order = [n for n in region.topo() if n not in leaves
                 and region.node(n).op not in (ARG, ops.constant)]
        if len(order) <= KERNEL_NODES:
            emit_region(self, region, leaves, outputs, "fused")
            return
        part = {nid: k // KERNEL_NODES for k, nid in enumerate(order)}
        stored: dict[int, Buffer] = dict(leaves)
        for first in range(0, len(order), KERNEL_NODES):
            members = order[first:first + KERNEL_NODES]
            here = part[members[0]]
            reads = {i for nid in members for i in region.node(nid).inputs if i in stored}
            # Outputs that are no part's node (a constant) are written with the first part.
            writes = {} if first else {n: b for n, b in outputs.items() if n not in part}
            for nid in members:
                later = any(part.get(u, here) > here for u in region.users(nid))
                if nid in outputs:
                    writes[nid] = outputs[nid]
                elif later:
                    writes[nid] = self.slot(region.node(nid).shape)
            if writes:
                emit_region(self, region, {i: stored[i] for i in sorted(reads)}, writes,
                            "fused")
            stored.update(writes)

    # -- the program
    def lower(self) -> str:
        p = self.program
        self.env.update(self.lower_graph(p.pre, self.env, {
            n: self.destination(n, 1) for n in p.pre.outputs}, reuse=True))
        self.lower_scan()
        self.env.update(self.lower_graph(p.post, self.env, {
            n: self.destination(n, 3) for n in p.post.outputs}, reuse=True))
        for name, buf in self.result_buffers.items():
            self.copy(buf, self.env[name])
        self.builder.ret_void()
        self.entry.branch(self.builder.function.blocks[1])
        calls = share_identical_functions(self.module, self.fn)
        if calls > INLINE_CALL_SITES:
            for fn in self.module.functions:
                if fn is not self.fn and not fn.is_declaration:
                    fn.attributes.add("noinline")
        text = str(self.module)
        return "\n".join(line + " " + _FUNCTION_ATTRIBUTES if line.startswith("define ") else line
                         for line in text.splitlines())

    def lower_scan(self) -> None:
        scan, b = self.program.scan, self.builder
        body = scan.body
        shape_of = {n: body.node(o).shape for n, o in body.outputs.items()}
        stacked = {n: self.destination(n, 2) or self.slot(("T",) + shape_of[n])
                   for n in scan.stacked}
        summed = {n: self.destination(n, 2) or self.slot(shape_of[n]) for n in scan.summed}
        for buf in summed.values():
            self.zero(buf)
        cur_slot, nxt_slot = {}, {}
        for c in scan.carries:
            first, second = self.slot(shape_of[c.name]), self.slot(shape_of[c.name])
            self.copy(first, self.env[c.init])
            cur_slot[c.name], nxt_slot[c.name] = self.entry.alloca(first.ptr.type), \
                self.entry.alloca(first.ptr.type)
            b.store(first.ptr, cur_slot[c.name])
            b.store(second.ptr, nxt_slot[c.name])

        pre = b.block
        head, step, done = (self.fn.append_basic_block(n) for n in ("loop", "step", "finish"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, "i")
        i.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, self.T), step, done)
        b.position_at_end(step)
        t = b.sub(b.sub(self.T, ir.Constant(I64, 1)), i) if scan.reverse else i

        def at_step(buf: Buffer) -> Buffer:
            offset = b.mul(t, self.numel_value(buf.shape[1:]))
            return Buffer(b.gep(buf.ptr, [offset], inbounds=True), buf.shape[1:])

        bound = {n: self.env[n] for n in scan.consts}
        bound.update({n: at_step(self.env[n]) for n in scan.seqs})
        cur = {c.name: Buffer(b.load(cur_slot[c.name]), shape_of[c.name]) for c in scan.carries}
        nxt = {c.name: Buffer(b.load(nxt_slot[c.name]), shape_of[c.name]) for c in scan.carries}
        bound.update(cur)
        dests: dict[str, Buffer | None] = dict(nxt)
        dests.update({n: at_step(stacked[n]) for n in scan.stacked})
        dests.update({n: None for n in scan.summed})
        values = self.lower_graph(body, bound, dests)
        for n in scan.summed:
            emit_accumulate(self, summed[n], values[n])
        for c in scan.carries:
            b.store(nxt[c.name].ptr, cur_slot[c.name])
            b.store(cur[c.name].ptr, nxt_slot[c.name])
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)

        self.env.update(stacked)
        self.env.update(summed)
        for c in scan.carries:
            if c.final is not None:
                final = self.destination(c.final, 2) or self.slot(shape_of[c.name])
                self.copy(final, Buffer(b.load(cur_slot[c.name]), shape_of[c.name]))
                self.env[c.final] = final


def _needed(g: Graph) -> set[int]:
    """The nodes some output of ``g`` depends on: one walk from all outputs at once."""
    needed: set[int] = set()
    stack = list(g.outputs.values())
    while stack:
        nid = stack.pop()
        if nid not in needed:
            needed.add(nid)
            stack.extend(g.node(nid).inputs)
    return needed


def share_identical_functions(module: ir.Module, entry: ir.Function) -> int:
    """Make ``entry`` call one copy of each set of identical internal functions (the kernels
    of the same loop at different call sites), delete the others, and return how many calls
    ``entry`` makes to internal functions."""
    canonical: dict[str, ir.Function] = {}
    same: dict[str, ir.Function] = {}
    for fn in module.functions:
        if fn is entry or fn.is_declaration:
            continue
        head, _, body = str(fn).partition("\n")
        text = head.replace(f'@"{fn.name}"', "@", 1) + "\n" + body
        first = canonical.setdefault(text, fn)
        if first is not fn:
            same[fn.name] = first
    calls = 0
    for fn in module.functions:
        for block in fn.blocks:
            for instr in block.instructions:
                if not (isinstance(instr, ir.CallInstr) and isinstance(instr.callee, ir.Function)
                        and not instr.callee.is_declaration):
                    continue
                calls += fn is entry
                if instr.callee.name in same:
                    instr.replace_callee(same[instr.callee.name])
    for name in same:
        del module.globals[name]
    return calls


def lower(program: Program, blas: Blas) -> tuple[str, Plan]:
    """The LLVM IR text of ``rnnc_run`` for ``program`` and its buffer plan."""
    lowering = Lowering(program, blas)
    return lowering.lower(), lowering.plan
