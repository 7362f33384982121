"""What lowering one program to LLVM IR keeps: the function being built and its buffers.

The function is ``void rnnc_run(i8** buffers, i64 T, i64 B, i8* gemms)``. ``buffers`` holds one
pointer per array, in the order of the :class:`Plan`: the program's args (``program.args``
order), then its results (``program.results`` order), then workspace slots. ``gemms`` points
to one entry per GEMM call site (``Plan.gemms``), filled by the runtime. Every buffer is
C-contiguous of the program's dtype; the runtime computes each slot's size from its symbolic
shape.

:class:`Context` is what codegen, the rules, the kernels and the GEMM emitters share: the
module, the builders of ``rnnc_run``, the dtype, the BLAS calling convention and the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llvmlite import ir

from rnnc.backends.llvm.blas import Convention
from rnnc.backends.schedule import LlvmSchedule
from rnnc.ir import Node

ENTRY = "rnnc_run"
I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
I8P = I8.as_pointer()
Shape = tuple[Any, ...]


@dataclass(frozen=True)
class Buffer:
    """A contiguous array: an element pointer in the current function and a symbolic shape."""

    ptr: ir.Value
    shape: Shape


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


def dim_value(d: Any, T: ir.Value, B: ir.Value) -> ir.Value:
    """A dim as an i64 value: the symbol ``T`` or ``B``, or a constant."""
    if d == "T":
        return T
    if d == "B":
        return B
    return ir.Constant(I64, d)


def numel(shape: Shape, T: ir.Value, B: ir.Value, builder: ir.IRBuilder) -> ir.Value:
    """The element count of ``shape`` as an i64 value."""
    n: ir.Value = ir.Constant(I64, 1)
    for d in shape:
        n = builder.mul(n, dim_value(d, T, B))
    return n


@dataclass
class Context:
    """The state of lowering one program, shared by codegen, rules, kernels and GEMMs."""

    module: ir.Module
    function: ir.Function  # rnnc_run
    entry: ir.IRBuilder  # its first block, run once per call: buffer pointers, stack slots
    builder: ir.IRBuilder  # where the program's code goes now
    dtype: str  # "f32" or "f64"
    scalar: ir.Type  # float or double
    convention: Convention  # how the BLAS the runner passes is called
    plan: Plan
    # The nodes of the graph being lowered, by id: what a rule's node and operands are.
    nodes: Mapping[int, Node] = field(default_factory=dict)
    own_gemms: dict[tuple, ir.Function] = field(default_factory=dict)  # by kernel shape
    # Stack slots of the (set_num_threads address, thread count) the GEMM sites set last.
    threads_state: tuple[ir.Value, ir.Value] | None = None
    # While a thread team's node is emitted on a block of batch rows: the block's row count,
    # which ``B`` then stands for (:mod:`rnnc.backends.llvm.team`).
    rows: ir.Value | None = None
    # While a thread team's step body is emitted: every BLAS call runs on one thread.
    one_thread: bool = False
    # The most multiply-adds per step a recurrent product runs on rnnc's panel kernel rather
    # than the BLAS (LlvmSchedule.own_max_work).
    own_max_work: int = 12 << 20
    # The schedule of the build (its compiled fields: LlvmSchedule.for_build), which kernels
    # read their tile sizes and limits from.
    schedule: LlvmSchedule = field(default_factory=LlvmSchedule)

    @classmethod
    def start(cls, plan: Plan, convention: Convention, team: bool = False) -> Context:
        """An empty ``rnnc_run`` in a new module, for the buffers of ``plan``; a team build
        also takes the team's shared state (``i64*``) and the thread's index (``i64``)."""
        module = ir.Module(name="rnnc")
        extra = [I64.as_pointer(), I64] if team else []
        fnty = ir.FunctionType(ir.VoidType(), [I8P.as_pointer(), I64, I64, I8P] + extra)
        function = ir.Function(module, fnty, ENTRY)
        function.attributes.add("nounwind")
        entry = ir.IRBuilder(function.append_basic_block("entry"))
        builder = ir.IRBuilder(function.append_basic_block("start"))
        scalar = ir.FloatType() if plan.dtype == "f32" else ir.DoubleType()
        return cls(module, function, entry, builder, plan.dtype, scalar, convention, plan)

    @property
    def T(self) -> ir.Value:  # noqa: N802 - the symbol's name
        return self.function.args[1]

    @property
    def B(self) -> ir.Value:  # noqa: N802 - the symbol's name
        return self.function.args[2] if self.rows is None else self.rows

    @property
    def gemm_table(self) -> ir.Value:
        return self.function.args[3]

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "f32" else 8

    def dim(self, d: Any) -> ir.Value:
        return dim_value(d, self.T, self.B)

    def numel(self, shape: Shape) -> ir.Value:
        return numel(shape, self.T, self.B, self.builder)

    def buffer(self, index: int, shape: Shape) -> Buffer:
        """Buffer ``index`` of the plan, its pointer loaded in the entry block."""
        slot = self.entry.gep(self.function.args[0], [ir.Constant(I64, index)], inbounds=True)
        return Buffer(self.entry.bitcast(self.entry.load(slot), self.scalar.as_pointer()),
                      tuple(shape))

    def slot(self, shape: Shape) -> Buffer:
        """A new workspace buffer of ``shape``."""
        self.plan.slots.append(tuple(shape))
        plan = self.plan
        return self.buffer(len(plan.args) + len(plan.results) + len(plan.slots) - 1, shape)

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """``dst = src``, both of ``dst``'s shape; nothing when they are the same buffer."""
        if dst.ptr is not src.ptr:
            self._call_memory("llvm.memcpy", [I8P, I8P, I64],
                              [self.builder.bitcast(src.ptr, I8P)], dst)

    def zero(self, dst: Buffer) -> None:
        self._call_memory("llvm.memset", [I8P, I64], [ir.Constant(I8, 0)], dst)

    def _call_memory(self, name: str, types: list[ir.Type], source: list[ir.Value],
                     dst: Buffer) -> None:
        b = self.builder
        size = b.mul(self.numel(dst.shape), ir.Constant(I64, self.itemsize))
        b.call(self.module.declare_intrinsic(name, types),
               [b.bitcast(dst.ptr, I8P), *source, size, ir.Constant(I1, 0)])
