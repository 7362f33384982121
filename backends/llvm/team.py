"""The thread team in generated code: a barrier, and how each step of the time loop is split.

A team build of a program (``docs/threads.md``) is ``rnnc_run(buffers, T, B, gemms, team,
tid)``: every thread of the team calls it with the same buffers and its own index ``tid``.
``team`` points to :data:`STATE_WORDS` i64 words shared by the team: the barrier's arrival
counter, its generation, the team size and the addresses of ``sched_yield`` and ``usleep``
(0: none).

Thread 0 alone runs the pre-loop graph, the post-loop graph and the copies around the loop;
the time loop runs on every thread. Each node of the step body is one of:

- ``columns``: a recurrent product ``a @ w`` whose output columns are split in whole panels of
  rnnc's panel kernel (:mod:`rnnc.backends.llvm.gemm`); each thread packs and multiplies its
  own panels, or, where one thread would call the BLAS (beyond ``gemm.MAX_WORK``), calls the
  BLAS on its own columns with the library set to one thread (by thread 0 at the first step);
- ``rows``: a node whose every buffer has the batch axis ``B`` first or not at all and whose
  results all have it (elementwise, layout, a reduction over features, a copy): each thread
  computes a contiguous block of batch rows;
- ``serial``: anything else, on thread 0.

A barrier separates nodes of different kinds (a product reads every row of its operand, an
elementwise node every column of the product), and ends every step that wrote anything. The
partition of a node never depends on the step, so each element is always computed by the same
thread in the same order as in a one-thread run: the results are bitwise those of a team of one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from rnnc.backends.llvm import gemm
from rnnc.backends.llvm.context import I32, I64, Buffer, Context

STATE_WORDS = 8
COUNT, GENERATION, SIZE, YIELD, SLEEP = 0, 1, 2, 3, 4
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
    """``void rnnc_barrier(i64* state)``: a counter barrier with a generation number."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer()]), "rnnc_barrier")
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    fn.attributes.add("nounwind")
    state = fn.args[0]
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def word(k: int) -> ir.Value:
        return b.gep(state, [_c(k)])

    size = b.load_atomic(word(SIZE), "monotonic", 8)
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

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.state, self.tid = ctx.function.args[4], ctx.function.args[5]
        size_word = ctx.entry.gep(self.state, [_c(SIZE)])
        self.size = ctx.entry.load(size_word)
        self.barrier_fn = barrier_function(ctx.module)
        # The loop's step counter (0 at the first step) while the step body is emitted.
        self.step: ir.Value = _c(0)
        # The kinds of nodes emitted since the last barrier.
        self.pending: set[str] = set()

    def is_main(self) -> ir.Value:
        return self.ctx.builder.icmp_signed("==", self.tid, _c(0))

    def barrier(self) -> None:
        self.ctx.builder.call(self.barrier_fn, [self.state])
        self.pending = set()

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
             emit: Callable[[list[Buffer], list[Buffer]], None]) -> None:
        """``emit(inputs, outputs)`` on each thread's block of batch rows, or on thread 0
        when the node cannot be split (:func:`separable`)."""
        if not separable(list(inputs) + list(outputs), outputs):
            self.serial(lambda: emit(list(inputs), list(outputs)))
            return
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
        """``out = a @ w`` (``a @ w.T``) split by the panel kernel's column panels: on the
        panel kernel up to :data:`gemm.MAX_WORK` multiply-adds, beyond it (where one thread
        would call the BLAS) a one-thread BLAS call on each thread's columns."""
        ctx = self.ctx
        k_size, n = w.shape[::-1] if transposed else w.shape

        def emit(first: ir.Value, stop: ir.Value) -> None:
            b = ctx.builder
            large = b.icmp_signed(">", b.mul(ctx.B, _c(n * k_size)), _c(gemm.MAX_WORK))
            with b.if_else(large) as (by_blas, own):
                with by_blas:
                    gemm.emit_blas_columns(ctx, a, w, out, transposed, (first, stop),
                                           self._at_first_step)
                with own:
                    gemm.emit_panel_gemm(ctx, ctx.B, a, w, out, transposed, (first, stop))

        self.columns(emit, gemm.panels(ctx, w, transposed))

    def _at_first_step(self, emit: Callable[[], None]) -> None:
        """``emit`` on thread 0 at the loop's first step, the others waiting at a barrier."""
        b = self.ctx.builder
        with b.if_then(b.icmp_signed("==", self.step, _c(0))):
            with b.if_then(self.is_main()):
                emit()
            b.call(self.barrier_fn, [self.state])

    def share(self, total: ir.Value) -> tuple[ir.Value, ir.Value]:
        """This thread's contiguous share ``[first, stop)`` of ``total`` items."""
        b = self.ctx.builder
        first = b.sdiv(b.mul(total, self.tid), self.size)
        stop = b.sdiv(b.mul(total, b.add(self.tid, _c(1))), self.size)
        return first, stop

    def end_step(self) -> None:
        """The barrier closing a step that wrote anything."""
        if self.pending:
            self.barrier()
