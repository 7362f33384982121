"""The thread team in generated code: a barrier, and how each step of the time loop is split.

A team build of a program (``docs/threads.md``) is ``rnnc_run(buffers, T, B, gemms, team,
tid)``: every thread of the team calls it with the same buffers and its own index ``tid``.
``team`` points to :data:`STATE_WORDS` i64 words shared by the team: the barrier's arrival
counter, its generation, the team size, the addresses of ``sched_yield`` and ``usleep`` (0:
none), and the counter and generation of the barrier of threads 1 .. N-1 in a scan split over
its steps.

Thread 0 alone runs the pre-loop graph, the post-loop graph and the copies around the loop
(:meth:`Team.main_only`), except their ``linear_scan`` nodes (the parallel-scan pass's
recurrences over whole sequences): every thread scans its own block of the flattened
(rows x features) columns, in whole vectors, or, where each thread's columns of a step would
fill less than a page, its own chunk of the steps (:mod:`rnnc.backends.llvm.scan_chunks`),
between a barrier after thread 0 wrote the operands and one before thread 0 reads the result
(:meth:`Team.linear_scan`). The time loop
runs on every thread. Each node of the step body is one of:

- ``columns``: a recurrent product ``a @ w`` whose output columns are split in whole panels of
  rnnc's panel kernel (:mod:`rnnc.backends.llvm.gemm`); each thread packs and multiplies its
  own panels, or, beyond the schedule's ``one_core_panel_max_work`` multiply-adds per step,
  calls the BLAS on its own columns with the library set to one thread (by thread 0 at the
  first step); a head-wise einsum (``"...hd,hde->...he"``) is split so by its heads, each
  thread one one-thread BLAS call per head of its own (:func:`.tensor.emit_heads`);
- ``rows``: a node whose every buffer has the batch axis ``B`` first or not at all and whose
  results all have it (elementwise, layout, a reduction over features, a copy): each thread
  computes a contiguous block of batch rows;
- ``units``: a recurrent product together with the fused region that first reads it, when
  that region is unit-local in it (:mod:`rnnc.backends.llvm.split`): each thread computes the
  product's columns of its hidden units in every gate, then the region at those units, over
  all batch rows, with no barrier in between; a copy of a value written so goes the same way;
- ``serial``: anything else, on thread 0.

A barrier separates nodes of different kinds (a product reads every row of its operand, an
elementwise node every column of the product), and ends every step that wrote anything; a
gated cell's forward step is one ``units`` node and its closing barrier. The
partition of a node never depends on the step, so each element is always computed by the same
thread in the same order as in a one-thread run: the results are bitwise those of a team of one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from llvmlite import ir

from rnnc.backends.llvm import gemm
from rnnc.backends.llvm.context import I32, I64, Buffer, Context
from rnnc.backends.llvm.region import Span, emit_copy
from rnnc.backends.llvm.scan import emit_linear_scan_columns
from rnnc.backends.llvm.scan_chunks import BUFFERS_PER_THREAD, emit_chunked_scan
from rnnc.ir import Node

STATE_WORDS = 8
COUNT, GENERATION, SIZE, YIELD, SLEEP, SCAN_COUNT = 0, 1, 2, 3, 4, 5
# Spins on the generation before each wait starts calling sched_yield.
SPINS = 4000
# Calls of sched_yield before a wait sleeps NAP_US microseconds at a time: a thread waiting
# through a long phase (thread 0 alone in the pre-loop graph, its BLAS on every core) then
# leaves its core to the BLAS threads instead of competing for it.
YIELDS = 2000
NAP_US = 50


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def separable(buffers: Sequence[Buffer], outputs: Sequence[Buffer]) -> bool:
    """Whether a node over ``buffers`` can be split by batch rows: ``B`` is each buffer's
    first axis or none of its axes, and the first axis of every output."""
    def leading(shape: tuple) -> bool:
        return bool(shape) and shape[0] == "B" and "B" not in shape[1:]

    return all(leading(tuple(o.shape)) for o in outputs) and \
        all("B" not in b.shape or leading(tuple(b.shape)) for b in buffers)


def barrier_function(module: ir.Module) -> ir.Function:
    """``void rnnc_barrier(i64* state, i64 word, i64 size)``: a counter barrier of ``size``
    threads with a generation number, its counter at ``state[word]`` and its generation at
    ``state[word + 1]`` (the team's, or that of the threads 1 .. N-1 of a scan split over its
    steps, :mod:`rnnc.backends.llvm.scan_chunks`)."""
    fnty = ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64, I64])
    fn = ir.Function(module, fnty, "rnnc_barrier")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    state, first, size = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def word(k: int) -> ir.Value:
        return b.gep(state, [_c(k) if k in (YIELD, SLEEP) else b.add(first, _c(k))])

    with b.if_then(b.icmp_signed("<=", size, _c(1))):
        b.ret_void()
    generation = b.load_atomic(word(GENERATION), "acquire", 8)
    arrived = b.atomic_rmw("add", word(COUNT), _c(1), "acq_rel")
    last, wait = b.append_basic_block("last"), b.append_basic_block("wait")
    b.cbranch(b.icmp_signed("==", arrived, b.sub(size, _c(1))), last, wait)
    b.position_at_end(last)
    b.store_atomic(_c(0), word(COUNT), "monotonic", 8)
    b.store_atomic(b.add(generation, _c(1)), word(GENERATION), "release", 8)
    b.ret_void()
    b.position_at_end(wait)
    head, spin, done = (b.append_basic_block(n) for n in ("head", "spin", "done"))
    b.branch(head)
    b.position_at_end(head)
    spins = b.phi(I64)
    spins.add_incoming(_c(0), wait)
    now = b.load_atomic(word(GENERATION), "acquire", 8)
    b.cbranch(b.icmp_signed("!=", now, generation), done, spin)
    b.position_at_end(spin)
    address = b.load_atomic(word(YIELD), "monotonic", 8)
    nap = b.load_atomic(word(SLEEP), "monotonic", 8)
    sleepy = b.and_(b.icmp_signed(">", spins, _c(SPINS + YIELDS)),
                    b.icmp_signed("!=", nap, _c(0)))
    tired = b.and_(b.icmp_signed(">", spins, _c(SPINS)), b.icmp_signed("!=", address, _c(0)))
    with b.if_else(sleepy) as (sleep, other):
        with sleep:
            b.call(b.inttoptr(nap, ir.FunctionType(I32, [I32]).as_pointer()),
                   [ir.Constant(I32, NAP_US)])
        with other:
            with b.if_then(tired):
                b.call(b.inttoptr(address, ir.FunctionType(I32, []).as_pointer()), [])
    spins.add_incoming(b.add(spins, _c(1)), b.block)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    return fn


class Team:
    """Splits the nodes of one step body between the team's threads while it is lowered."""

    def __init__(self, ctx: Context, scan_limits: tuple[int, int, int] | None = None) -> None:
        self.ctx = ctx
        # (bytes, steps, weight): a linear_scan is split over its steps where each thread's
        # columns of a step make fewer bytes and there are at least that many steps a thread,
        # the first chunk ``weight`` sixteenths of the others (LlvmSchedule.
        # scan_thread_min_bytes, .scan_chunk_min_steps, .scan_first_chunk_weight); None: by
        # columns only.
        self.scan_limits = scan_limits
        # The workspace of the scans split over their steps, and how many were emitted.
        self.chunk_space: Buffer | None = None
        self.chunked_scans = 0
        self.state, self.tid = ctx.function.args[4], ctx.function.args[5]
        size_word = ctx.entry.gep(self.state, [_c(SIZE)])
        self.size = ctx.entry.load(size_word)
        self.barrier_fn = barrier_function(ctx.module)
        # The loop's step counter (0 at the first step) while the step body is emitted.
        self.step: ir.Value = _c(0)
        # The kinds of nodes emitted since the last barrier.
        self.pending: set[str] = set()
        # Barriers emitted so far, and those of one step body once it is emitted (not
        # counting the one at the first step before a BLAS call on each thread's columns).
        self.barriers = 0
        self.first_barrier = 0
        self.step_barriers: int | None = None
        # The units of one gate of each buffer the step body wrote by hidden units.
        self.written: dict[ir.Value, int] = {}
        # Where each open stretch of thread-0-only code (main_only) joins the other threads.
        self.joins: list[ir.Block] = []

    def is_main(self) -> ir.Value:
        return self.ctx.builder.icmp_signed("==", self.tid, _c(0))

    @contextmanager
    def main_only(self) -> Iterator[None]:
        """Code emitted inside runs on thread 0 only, except :meth:`linear_scan`."""
        self._enter_main()
        try:
            yield
        finally:
            self._leave_main()

    def _enter_main(self) -> None:
        b = self.ctx.builder
        main, join = b.append_basic_block("main"), b.append_basic_block("team")
        b.cbranch(self.is_main(), main, join)
        b.position_at_end(main)
        self.joins.append(join)

    def _leave_main(self) -> None:
        b = self.ctx.builder
        b.branch(self.joins[-1])
        b.position_at_end(self.joins.pop())

    def linear_scan(self, node: Node, out: Buffer, operands: Sequence[Buffer]) -> None:
        """``out = linear_scan(*operands)`` outside the time loop, on every thread: each its
        share of the flattened (rows x features) columns in whole vectors, after a barrier
        (thread 0 wrote the operands) and before one (thread 0 alone reads ``out``). Emitted
        in a :meth:`main_only` stretch, it closes the stretch and opens another after it."""
        ctx, b = self.ctx, self.ctx.builder
        work = ctx.slot(operands[2].shape)
        depth = len(self.joins)
        for _ in range(depth):
            self._leave_main()
        self.barrier()
        total = ctx.numel(out.shape[1:])
        if self.scan_limits is None:
            self._scan_columns(node, (out, *operands), work, total)
        else:
            if self.chunk_space is None:
                self.chunk_space = ctx.slot((ctx.schedule.scan_workspace_bytes // ctx.itemsize,))
            self.chunked_scans += 1
            with b.if_else(self._by_steps(total)) as (by_steps, by_columns):
                with by_steps:
                    emit_chunked_scan(ctx, node, (out, *operands), self.chunk_space,
                                      (self.tid, self.size), self._scan_barrier,
                                      self.scan_limits[2])
                with by_columns:
                    self._scan_columns(node, (out, *operands), work, total)
        self.barrier()
        for _ in range(depth):
            self._enter_main()

    def everyone(self, emit: Callable[[], None]) -> None:
        """``emit()`` outside the time loop on every thread, between a barrier (thread 0
        wrote the operands) and one (thread 0 alone reads the results); emitted in a
        :meth:`main_only` stretch, it closes the stretch and opens another after it."""
        depth = len(self.joins)
        for _ in range(depth):
            self._leave_main()
        self.barrier()
        emit()
        self.barrier()
        for _ in range(depth):
            self._enter_main()

    def _scan_columns(self, node: Node, buffers: tuple[Buffer, ...], work: Buffer,
                      total: ir.Value) -> None:
        """This thread's block of the ``total`` columns of a ``linear_scan``, whole vectors."""
        b = self.ctx.builder
        width = gemm.lanes(self.ctx)
        first, stop = self.share(b.sdiv(b.add(total, _c(width - 1)), _c(width)))
        columns = [b.mul(end, _c(width)) for end in (first, stop)]
        columns = [b.select(b.icmp_signed("<", end, total), end, total) for end in columns]
        emit_linear_scan_columns(self.ctx, node, buffers, work, (columns[0], columns[1]))

    def _by_steps(self, total: ir.Value) -> ir.Value:
        """Whether a scan of ``total`` columns is split over its steps: the generated form of
        :func:`rnnc.backends.llvm.split.scan_form`."""
        b, ctx = self.ctx.builder, self.ctx
        least_bytes, least_steps, _ = self.scan_limits
        size_bytes = b.mul(total, _c(ctx.itemsize))
        narrow = b.icmp_signed("<", size_bytes, b.mul(self.size, _c(least_bytes)))
        long = b.icmp_signed(">=", ctx.T, b.mul(self.size, _c(least_steps)))
        space = b.mul(b.mul(self.size, _c(BUFFERS_PER_THREAD)), size_bytes)
        fits = b.icmp_signed("<=", space, _c(ctx.schedule.scan_workspace_bytes))
        return b.and_(narrow, b.and_(long, fits))

    def _scan_barrier(self) -> None:
        """The barrier of threads 1 .. N-1 in a scan split over its steps."""
        b = self.ctx.builder
        b.call(self.barrier_fn, [self.state, _c(SCAN_COUNT), b.sub(self.size, _c(1))])

    def barrier(self) -> None:
        self.ctx.builder.call(self.barrier_fn, [self.state, _c(COUNT), self.size])
        self.pending = set()
        self.barriers += 1

    def _before(self, kind: str) -> None:
        if self.pending - ({"rows"} if kind == "rows" else set()):
            self.barrier()

    def serial(self, emit: Callable[[], None]) -> None:
        """``emit`` on thread 0 only."""
        self._before("serial")
        with self.ctx.builder.if_then(self.is_main()):
            emit()
        self.pending.add("serial")

    def rows(self, inputs: Sequence[Buffer], outputs: Sequence[Buffer],
             emit: Callable[[list[Buffer], list[Buffer]], None], settled: bool = False) -> None:
        """``emit(inputs, outputs)`` on each thread's block of batch rows, or on thread 0
        when the node cannot be split (:func:`separable`); with no barrier first when
        ``settled``: no buffer it reads is written in this step."""
        if not separable(list(inputs) + list(outputs), outputs):
            self.serial(lambda: emit(list(inputs), list(outputs)))
            return
        if not settled:
            self._before("rows")
        ctx, b = self.ctx, self.ctx.builder
        first, stop = self.share(ctx.B)

        def block(buf: Buffer) -> Buffer:
            if "B" not in buf.shape:
                return buf
            offset = b.mul(first, ctx.numel(buf.shape[1:]))
            return Buffer(b.gep(buf.ptr, [offset], inbounds=True), buf.shape)

        ins, outs = [block(x) for x in inputs], [block(x) for x in outputs]
        ctx.rows = b.sub(stop, first)
        try:
            emit(ins, outs)
        finally:
            ctx.rows = None
        self.pending.add("rows")

    def columns(self, emit: Callable[[ir.Value, ir.Value], None], units: int) -> None:
        """``emit(first, stop)`` for this thread's share of ``units`` (panels of a product)."""
        self._before("columns")
        first, stop = self.share(_c(units))
        emit(first, stop)
        self.pending.add("columns")

    def product(self, a: Buffer, w: Buffer, out: Buffer, transposed: bool) -> None:
        """``out = a @ w`` (``a @ w.T``) split by the panel kernel's column panels."""
        self.columns(lambda first, stop: self.panel_product(a, w, out, transposed,
                                                            (first, stop)),
                     gemm.panels(self.ctx, w, transposed))

    def panel_product(self, a: Buffer, w: Buffer, out: Buffer, transposed: bool,
                      panels: tuple[ir.Value, ir.Value], gates: int = 1) -> None:
        """The column panels ``panels`` of each of ``gates`` equal blocks of columns of
        ``out = a @ w`` (``a @ w.T``): on the panel kernel up to the schedule's
        ``one_core_panel_max_work`` multiply-adds, beyond it one one-thread BLAS call per
        block."""
        ctx, b = self.ctx, self.ctx.builder
        k_size, n = w.shape[::-1] if transposed else w.shape
        per_gate = gemm.panels(ctx, w, transposed) // gates
        large = b.icmp_signed(">", b.mul(ctx.B, _c(n * k_size)), _c(ctx.own_max_work))
        with b.if_else(large) as (by_blas, own):
            with by_blas:
                for gate in range(gates):
                    shift = _c(gate * per_gate)
                    gemm.emit_blas_columns(ctx, a, w, out, transposed,
                                           (b.add(panels[0], shift), b.add(panels[1], shift)),
                                           self._at_first_step)
            with own:
                gemm.emit_panel_gemm(ctx, ctx.B, a, w, out, transposed, panels, gates)

    def by_units(self, node: Node, operands: Sequence[Buffer], out: Buffer, units: int,
                 outputs: Sequence[Buffer], emit: Callable[[Span], None]) -> None:
        """The product ``out = node(*operands)`` at each thread's hidden units in every gate,
        then ``emit`` (writing ``outputs``) at the same units, with no barrier in between
        (:mod:`rnnc.backends.llvm.split`)."""
        transposed, gates = bool(node.attrs.get("transpose_b")), out.shape[-1] // units

        def both(panels: tuple[ir.Value, ir.Value], span: Span) -> None:
            self.panel_product(*operands, out, transposed, panels, gates)
            emit(span)

        self.units(units, both)
        self.written.update((buf.ptr, units) for buf in outputs)

    def copy(self, dst: Buffer, src: Buffer, settled: bool) -> None:
        """``dst = src``: by hidden units if the step wrote ``src`` by them (each thread
        copies what it wrote), else by rows, with no barrier first when ``settled``
        (``src`` is not written in the step)."""
        units = self.written.get(src.ptr)
        if units is not None:
            self.units(units, lambda _, span: emit_copy(self.ctx, dst, src, span), True)
        else:
            self.rows([src], [dst], lambda i, o: self.ctx.copy(o[0], i[0]), settled)

    def units(self, units: int, emit: Callable[[tuple[ir.Value, ir.Value], Span], None],
              settled: bool = False) -> None:
        """``emit(panels, span)`` for this thread's share of the hidden units of gates
        ``units`` columns wide, in whole panels of the panel kernel: ``panels`` in one gate,
        ``span`` the same units as columns, over every batch row. A barrier comes first if
        anything is pending, unless ``settled``: what ``emit`` reads was written by this
        thread at these units, or not in this step."""
        if not settled:
            self._before("units")
        width = 2 * gemm.lanes(self.ctx)
        first, stop = self.share(_c(units // width))
        b = self.ctx.builder
        emit((first, stop), Span(b.mul(first, _c(width)), b.mul(stop, _c(width)), units))
        self.pending.add("units")

    def _at_first_step(self, emit: Callable[[], None]) -> None:
        """``emit`` on thread 0 at the loop's first step, the others waiting at a barrier."""
        b = self.ctx.builder
        with b.if_then(b.icmp_signed("==", self.step, _c(0))):
            with b.if_then(self.is_main()):
                emit()
            b.call(self.barrier_fn, [self.state, _c(COUNT), self.size])

    def share(self, total: ir.Value) -> tuple[ir.Value, ir.Value]:
        """This thread's contiguous share ``[first, stop)`` of ``total`` items."""
        b = self.ctx.builder
        first = b.sdiv(b.mul(total, self.tid), self.size)
        stop = b.sdiv(b.mul(total, b.add(self.tid, _c(1))), self.size)
        return first, stop

    def start_step(self, step: ir.Value) -> None:
        """Before the step body is emitted: ``step`` is the loop's step counter."""
        self.step, self.written, self.first_barrier = step, {}, self.barriers

    def end_step(self) -> None:
        """The barrier closing a step that wrote anything."""
        if self.pending:
            self.barrier()
        self.step_barriers = self.barriers - self.first_barrier
