"""The host side of a CUDA run: the program's schedule over device arrays, recorded once.

Written against an array module ``xp`` (CuPy on a GPU, NumPy in emulation) and kernels with
CuPy's ``RawKernel`` calling convention. :meth:`Host.plan` walks the schedule
(:mod:`rnnc.backends.steps`) once per shape and records every launch into a
:class:`~.plan.Plan`; each step that does work has a :class:`~.codegen.Launch` or
:class:`~.codegen.Gemm` (or :class:`~.batched.BatchedGemm`) from code generation. Where values
live is the program's buffer plan (:mod:`rnnc.backends.buffers`): outside the loop a result
takes its plan buffer's array, which a later result takes again once the value is dead; in the
loop (:class:`ScanPlan`, the plan's view for the kernels this host launches) body values live in
two arrays used on alternate steps, so a carried value read at step t+1 is never the array being
written at step t+1, and a stacked output computed by a kernel or GEMM is written straight into
its slot of the (T, ...) result. A kernel runs one thread per element of its largest result, or
one per row when its launch says so (a region that reduces over features), except a
``linear_scan`` that the sizes of the call give to its chunked kernel
(:func:`.scan.chunked_geometry`: a block per tile of columns and chunks of steps); fused nodes
run alike in every graph. A fused step (:mod:`.fused_step`) is one launch of a block per tile of
rows and hidden units; the product it absorbs has no buffer. A host runs one path of a module:
``fused=False`` takes the loop body of ``Module.gemm_body`` (GEMM and kernel) where the module
has both; a host given a ``persistent`` launch records the whole loop as one cooperative launch
where the shape suits it (:mod:`.persistent`), else its steps as the fused path does. A bfloat16
fused step or persistent kernel reads its weight as bfloat16 bits, and a bfloat16 GEMM of the
loop its loop-constant operands: the plan converts each such loop constant once per call,
before the loop (:meth:`Host.bf16_weights`, an ``Entry("pre", "convert")``; :mod:`.bf16_gemm`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.backends.buffers import BufferPlan, GraphBuffers, plan_buffers
from rnnc.backends.cuda import batched, bf16
from rnnc.backends.cuda.batched import BatchedGemm
from rnnc.backends.cuda.bf16_gemm import Bf16Gemm, Rounder, bf16_constants, convert_constants
from rnnc.backends.cuda.blas import Cublas, DeviceBatchedGemm, DeviceGemm
from rnnc.backends.cuda.codegen import Gemm, Module, Work
from rnnc.backends.cuda.fused_step import FusedStep
from rnnc.backends.cuda.persistent import PersistentLaunch, record_persistent
from rnnc.backends.cuda.plan import (
    Alternate,
    Entry,
    Loop,
    Plan,
    Previous,
    Slot,
    Until,
    at_step,
)
from rnnc.backends.cuda.scan import chunked_geometry
from rnnc.backends.schedule import CudaSchedule
from rnnc.backends.steps import GraphSteps, ProgramSteps, resolve
from rnnc.ir import ARG, GET, Shape
from rnnc.precision import BF16

Key = tuple[int, int]  # a result: (node, index)
Destination = Callable[[Key, Shape], Any]


class Buffers:
    """Allocates a plan's device arrays."""

    def __init__(self, xp: Any, dtype: Any) -> None:
        self.xp, self.dtype = xp, dtype

    def empty(self, shape: tuple[int, ...]) -> Any:
        """An uninitialized array of ``shape``."""
        return self.xp.empty(shape, self.dtype)

    def pair(self, shape: Shape, dims: Mapping[str, int]) -> tuple[Any, Any]:
        """Two arrays of the symbolic ``shape``, for alternate steps."""
        return self.empty(resolve(shape, dims)), self.empty(resolve(shape, dims))


@dataclass(frozen=True)
class ScanPlan:
    """Where the loop body's results live, by symbolic shape; allocated per plan. The
    program's buffer plan, less what this host's kernels do not make (constants, absorbed
    products): those values are copied like args."""

    into_stack: dict[Key, str]  # results written straight into a stacked output's step slot
    pairs: dict[Key, Shape]  # every other result a kernel or GEMM makes: two buffers each
    # Carries whose next value is not made in the loop (an input, a constant): copied into
    # their own pair of buffers, so they too are never overwritten while still needed.
    copied: dict[str, Shape]
    copy_stacked: tuple[str, ...]  # stacked outputs copied into their step slot after a step
    # A carry's next value (key) whose previous value is stacked (name, e.g. a value saved for
    # the backward): written straight into the slot of the next step, which the next step
    # reads as its carry, so only the first step copies; the last step writes its pair.
    shifted: dict[Key, str]
    # A stacked previous carry value (name) whose next value is itself stacked (value): the
    # previous values are that stack one step behind, copied in one call after the loop.
    behind: dict[str, str]


def plan_scan(plan: BufferPlan, steps: list[Work], stacked: tuple[str, ...]) -> ScanPlan:
    """The loop's buffers where the loop body's work is ``steps``, read from ``plan``."""
    made = {(s.node, k): shape for s in steps for k, shape in
            enumerate((s.shape,) if isinstance(s, (Gemm, BatchedGemm)) else s.shapes)}
    into_stack = {key: name for key, name in plan.body.writes.items()
                  if name in stacked and key in made}
    pairs = {key: shape for key, shape in made.items() if key not in into_stack}
    copied = {c.name: c.shape for c in plan.carries if c.made not in made}
    shifted = {key: name for key, name in plan.shifted.items() if key in pairs}
    behind = {name: value for name, value in plan.behind.items()
              if value in into_stack.values()}
    copy_stacked = tuple(name for name in stacked if name not in into_stack.values())
    return ScanPlan(into_stack, pairs, copied, copy_stacked, shifted, behind)


class Host:
    """Runs one program's schedule over device arrays with its loaded kernels."""

    def __init__(self, xp: Any, schedule: ProgramSteps, module: Module,
                 kernels: Mapping[str, Any], fused: bool = True,
                 persistent: PersistentLaunch | None = None,
                 how: CudaSchedule | None = None) -> None:
        self.xp = xp
        self.how = how or CudaSchedule()  # launch geometry, when a scan takes its chunked kernel
        self.blas: Cublas | bool | None = None  # the GEMMs' handle on a GPU (False: none)
        self.rounder: Rounder | None = None  # every bfloat16 rounding (.bf16_gemm), made once
        self.persistent = persistent
        self.schedule = schedule
        self.kernels = kernels
        self.dtype = schedule.numpy_dtype
        steps = dict(module.steps)
        if not fused and module.gemm_body is not None:
            steps["body"] = module.gemm_body
        self.work = {where: {s.node: s for s in work} for where, work in steps.items()}
        # Products a fused step computes in its own registers: no step of their own.
        self.absorbed = {s.product for s in steps["body"] if isinstance(s, FusedStep)}
        # Constants outside fused regions, made once: nothing is allocated inside a capture.
        self.constants = {step.slot: xp.full((), step.attrs["value"], self.dtype)
                          for graph in (schedule.pre, schedule.body, schedule.post)
                          for step in graph.steps if step.op is ops.constant}
        self.buffer_plan = plan_buffers(schedule)
        self.scan_plan = plan_scan(self.buffer_plan, steps["body"], schedule.scan.stacked)

    def plan(self, inputs: Mapping[str, Any], dims: Mapping[str, int]) -> Plan:
        """The launch plan of a call on ``inputs`` (device arrays the plan keeps, by name) for
        sizes ``dims``: pre, scan and post, recorded in call order (:mod:`.plan`)."""
        schedule, buffers = self.schedule, Buffers(self.xp, self.dtype)
        plan = Plan(dict(inputs))
        env = dict(inputs)
        arrays: dict[int, Any] = {}  # the plan's buffers outside the loop, made on first use

        def pooled(graph: GraphBuffers) -> Destination:
            def destination(key: Key, shape: Shape) -> Any:
                number = graph.buffers.get(key)
                if number is None:  # a result's own array
                    return buffers.empty(resolve(shape, dims))
                if number not in arrays:
                    arrays[number] = buffers.empty(resolve(graph.shape(number), dims))
                return arrays[number]
            return destination

        pre, post = self.buffer_plan.pre, self.buffer_plan.post
        env.update(self.run_graph(plan, Entry("pre", ""), schedule.pre, env, dims, pooled(pre)))
        env.update(self.run_scan(plan, env, dims, buffers))
        env.update(self.run_graph(plan, Entry("post", ""), schedule.post, env, dims,
                                  pooled(post)))
        plan.results = {name: env[name] for name in schedule.results}
        return plan

    def run_graph(self, plan: Plan | Loop, at: Entry, graph: GraphSteps,
                  env: Mapping[str, Any], dims: Mapping[str, int], destination: Destination,
                  weights: Mapping[int, Any] | None = None) -> dict[str, Any]:
        """Record one graph (``at``: where; the loop body into the plan's loop, once);
        ``destination((node, index), shape)`` gives result arrays; ``weights`` the bfloat16
        bits of weights converted before the loop, by their slot."""
        vals: dict[int, Any] = {}
        work = self.work[at.where]
        absorbed = self.absorbed if at.where == "body" else frozenset()
        size_args = (np.int64(dims["T"]), np.int64(dims["B"]))
        for step in graph.steps:
            op = step.op
            if op is ARG:
                vals[step.slot] = env[step.name]
            elif op is GET:
                vals[step.slot] = vals[step.inputs[0]][step.attrs["index"]]
            elif op is ops.constant:
                vals[step.slot] = self.constants[step.slot]
            elif step.slot not in absorbed:
                vals[step.slot] = self.record_step(plan, at, work[step.slot], vals, destination,
                                                   size_args, weights or {})
        return {name: vals[output.slot] for name, output in graph.outputs.items()}

    def record_step(self, plan: Plan | Loop, at: Entry, step: Work,
                    vals: Mapping[int, Any], destination: Destination,
                    size_args: tuple[np.int64, np.int64],
                    weights: Mapping[int, Any] | None = None) -> Any:
        """Record one kernel or GEMM; its result, or the tuple of a fused kernel's results."""
        if isinstance(step, FusedStep):
            return self.record_fused(plan, at, step, vals, destination, size_args,
                                     weights or {})
        if isinstance(step, Gemm):
            out = destination((step.node, 0), step.shape)
            # A bfloat16 GEMM reads a loop constant as the bits converted before the loop.
            a, b = ((weights or {}).get(i, vals[i]) if step.precision == BF16 else vals[i]
                    for i in (step.a, step.b))
            self.record_gemm(plan, replace(at, kind="gemm"), a, b, out, step.transpose_a,
                             step.transpose_b, step.precision)
            return out
        if isinstance(step, BatchedGemm):
            out = destination((step.node, 0), step.shape)
            dims = {"T": int(size_args[0]), "B": int(size_args[1])}
            a, b, result = (batched.view(value, layout, dims, written)
                            for value, layout, written in zip(
                                (vals[step.a], vals[step.b], out), step.layouts,
                                (False, False, True), strict=True))
            plan.record(replace(at, kind="gemm"), self.batched_matmul(), a, b, out=result)
            return out
        outs = [destination((step.node, k), shape) for k, shape in enumerate(step.shapes)]
        # One thread per element, or a block per row (a row kernel's results share their rows).
        total = max(int(np.prod(o.shape[:-1] if step.per_row else o.shape)) for o in outs)
        if total:
            block = step.per_row or self.how.block_threads
            total *= block if step.per_row else 1
            kernel, grid = step.kernel, min((total + block - 1) // block, self.how.max_blocks)
            # A linear_scan: its chunked kernel where these sizes favour it (scan.py).
            chunked = step.chunked and chunked_geometry(int(size_args[0]),
                                                        int(np.prod(outs[0].shape[1:])), self.how)
            if chunked:
                kernel, (grid, block) = step.chunked, chunked
            args = tuple(vals[i] for i in step.inputs) + tuple(outs) + size_args
            plan.record(replace(at, kind="kernel"), self.kernels[kernel], (grid,), (block,),
                        args)
        return tuple(outs) if step.fused else outs[0]

    def record_fused(self, plan: Plan | Loop, at: Entry, step: FusedStep,
                     vals: Mapping[int, Any], destination: Destination,
                     size_args: tuple[np.int64, np.int64], weights: Mapping[int, Any]
                     ) -> tuple[Any, ...]:
        """Record a fused step: one block per tile of rows and units; its results. A bfloat16
        step reads its weight's bits from ``weights``."""
        outs = tuple(destination((step.node, k), shape) for k, shape in enumerate(step.shapes))
        batch = int(size_args[1])
        if batch:
            b = weights[step.b] if step.bf16 else vals[step.b]
            args = tuple(vals[i] for i in step.inputs) + (vals[step.a], b) + outs + size_args
            plan.record(replace(at, kind="kernel"), self.kernels[step.kernel],
                        (step.tile.blocks(batch),), (step.tile.threads,), args)
        return outs

    def weight_bits(self, plan: Plan | Loop, at: Entry, weight: Any) -> Any:
        """A new uint16 array that ``plan`` fills with the bfloat16 bits of ``weight`` (a call
        recorded at ``at``, kind "convert")."""
        bits = self.xp.empty(tuple(weight.shape), np.uint16)
        plan.record(replace(at, kind="convert"), self.rounding(), weight, bits)
        return bits

    def bf16_weights(self, plan: Plan, env: Mapping[str, Any]) -> dict[int, Any]:
        """The bfloat16 bits of each loop constant that a bfloat16 product of the loop reads
        (a fused step's weight, a GEMM's constant operand), by its body slot, each converted
        once before the loop (:mod:`.bf16_gemm`)."""
        constants = bf16_constants(self.schedule, self.work["body"].values())
        return convert_constants(constants, env,
                                 lambda weight: self.weight_bits(plan, Entry("pre", ""), weight))

    def rounding(self) -> Rounder:
        """The host's bfloat16 rounding: the rounding kernel where ``xp`` is CuPy, NumPy in
        emulation; made on first use, outside any capture."""
        if self.rounder is None:
            cupy = getattr(self.xp, "__name__", "") == "cupy"
            self.rounder = Rounder(self.xp, bf16.matmul_for(self.xp).round if cupy else None)
        return self.rounder

    def _cublas(self) -> Cublas | bool | None:
        """The GEMMs' cuBLAS handle where ``xp`` is CuPy, made on first use; else None."""
        if self.blas is None and getattr(self.xp, "__name__", "") == "cupy":
            self.blas = Cublas.make(self.xp) or False
        return self.blas

    def batched_matmul(self) -> Any:
        """``matmul(a, b, out=)`` over 3-D views, the batch in one call: one
        cublasGemmStridedBatchedEx on a GPU (TF32 where the schedule says), ``xp.matmul``
        in emulation."""
        if self._cublas():
            tf32 = self.how.precision == "tf32" and self.dtype == np.float32
            return DeviceBatchedGemm(self.blas, self.dtype, "tf32" if tf32 else None,
                                     self.xp.matmul)
        return self.xp.matmul

    def record_gemm(self, plan: Plan | Loop, at: Entry, a: Any, b: Any, out: Any,
                    transpose_a: bool, transpose_b: bool, precision: str | None = None) -> None:
        """``out = a @ b`` on 2-D views; transpose_a contracts every leading axis of a and b;
        ``precision="bf16"`` in bfloat16 with float32 sums (:mod:`.bf16`)."""
        matmul = self.xp.matmul
        if precision == BF16:  # cuBLAS on a GPU, xp.matmul without it (.bf16_gemm)
            matmul = Bf16Gemm(self.xp, self.rounding(), self._cublas() or None,
                              bf16.matmul_for(self.xp))
        elif self._cublas():  # a GPU: cuBLAS that CUDA graphs capture (.blas)
            tf32 = self.how.precision == "tf32" and self.dtype == np.float32
            matmul = DeviceGemm(self.blas, self.dtype, "tf32" if tf32 else None, matmul)
        a2 = a.reshape(-1, a.shape[-1])
        if transpose_a:
            plan.record(at, matmul, a2.T, b.reshape(-1, b.shape[-1]), out=out)
        else:
            plan.record(at, matmul, a2, b.T if transpose_b else b,
                        out=out.reshape(-1, out.shape[-1]))

    def scan_outputs(self, plan: Plan, dims: Mapping[str, int], buffers: Buffers
                     ) -> dict[str, Any]:
        """The loop's stacked outputs (uninitialized) and summed outputs (zeroed by a call)."""
        scan, body = self.schedule.scan, self.schedule.body
        out: dict[str, Any] = {}
        for name in scan.stacked:
            out[name] = buffers.empty((dims["T"],) + resolve(body.outputs[name].shape, dims))
        for name in scan.summed:
            out[name] = buffers.empty(resolve(body.outputs[name].shape, dims))
            plan.record(Entry("pre", "fill"), out[name].fill, 0)
        return out

    def record_loop(self, loop: Loop, env: Mapping[str, Any], dims: Mapping[str, int],
                    buffers: Buffers, out: Mapping[str, Any], weights: Mapping[int, Any]
                    ) -> dict[str, Any]:
        """Record one step of the time loop into ``loop``, every array that changes from step
        to step a :class:`~.plan.PerStep` of the step index; the final carries. ``weights``:
        :meth:`bf16_weights`."""
        xp, scan, scan_plan = self.xp, self.schedule.scan, self.scan_plan
        T = loop.steps
        pairs = {key: buffers.pair(shape, dims) for key, shape in scan_plan.pairs.items()}
        copied = {name: buffers.pair(shape, dims) for name, shape in scan_plan.copied.items()}
        shifted, behind = scan_plan.shifted, scan_plan.behind
        later = set(shifted.values()) | set(behind)

        def slot(stack: Any, ahead: int = 0) -> Slot:
            return Slot(stack, T, scan.reverse, ahead)

        def destination(key: Key, shape: Shape) -> Any:
            if key in scan_plan.into_stack:
                return slot(out[scan_plan.into_stack[key]])
            if key in shifted:  # the next step's slot, but the last step's own pair
                return Until(T - 1, slot(out[shifted[key]], 1), Alternate(pairs[key]))
            return Alternate(pairs[key])

        # A step reads the carries the previous step made (set once that step is recorded).
        previous = {c.name: Previous(env[c.init]) for c in scan.carries}
        local = {name: env[name] for name in scan.consts}
        local.update({name: slot(env[name]) for name in scan.seqs})
        local.update(previous)
        at = Entry("body", "")
        results = self.run_graph(loop, at, self.schedule.body, local, dims, destination,
                                 weights)
        for name in scan_plan.copy_stacked:
            # Where the previous step wrote it already, or the copy after the loop does,
            # only the first step copies.
            steps = range(1) if name in later else range(T)
            loop.record_at(steps, replace(at, kind="copy"), xp.copyto, slot(out[name]),
                           results[name])
        for name in scan.summed:
            loop.record(replace(at, kind="add"), xp.add, out[name], results[name],
                        out=out[name])
        for c in scan.carries:
            made = results[c.name]
            if c.name in copied:
                made = Alternate(copied[c.name])
                loop.record(replace(at, kind="copy"), xp.copyto, made, results[c.name])
            previous[c.name].source = made
        return {name: at_step(carry.source, T - 1) for name, carry in previous.items()}

    def run_scan(self, plan: Plan, env: Mapping[str, Any], dims: Mapping[str, int],
                 buffers: Buffers) -> dict[str, Any]:
        """Record the time loop; stacked and summed outputs and final carries by name."""
        xp, scan, scan_plan = self.xp, self.schedule.scan, self.scan_plan
        out = self.scan_outputs(plan, dims, buffers)
        if not (scan.carries or scan.stacked or scan.summed):
            return out  # parallel-scan left an empty loop: no step has anything to launch
        launch = self.persistent
        if launch is not None and record_persistent(
                launch.kernel, launch.function, launch.resident, plan, self.schedule, env, dims,
                buffers.empty, out, self.constants,
                lambda weight: self.weight_bits(plan, Entry("pre", ""), weight)):
            return out
        T = dims["T"]
        carry: dict[str, Any] = {c.name: env[c.init] for c in scan.carries}
        if T:
            weights = self.bf16_weights(plan, env)
            carry = self.record_loop(plan.record_loop(T), env, dims, buffers, out, weights)
        for name, value in scan_plan.behind.items():
            if T > 1:
                dst, src = (out[name][:-1], out[value][1:]) if scan.reverse else \
                    (out[name][1:], out[value][:-1])
                plan.record(Entry("post", "copy"), xp.copyto, dst, src)
        for c in scan.carries:
            if c.final is not None:
                out[c.final] = carry[c.name]
        return out
