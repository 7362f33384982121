"""CUDA C for a program: one kernel per elementwise, layout, reduce or fused node; GEMM steps.

A region that reduces over the feature axis gets a kernel with one block per row
(:mod:`.rows`), any other one thread per element (:mod:`.kernels`).

:func:`render` walks the program's schedule (:mod:`rnnc.backends.steps`) and gives each step
that does work a :class:`Launch` of a kernel (written by :mod:`.kernels`) or a :class:`Gemm`.
Matmuls are not kernels: the runtime runs them as GEMMs, except a loop body's product that a
fused step computes together with the region reading it (:mod:`.fused_step`): that pair becomes
one :class:`~.fused_step.FusedStep`. An einsum that is a batched matrix product (a head-wise
one) is a :class:`~.batched.BatchedGemm`, one strided-batched GEMM. ``fused_step`` chooses:
"never" renders the GEMM path only, "always" the fused path only, "auto" both (the body's GEMM
path in ``Module.gemm_body``, the fused one in ``Module.steps``), so a runner can time them.
"auto" and "persistent" also write the persistent kernel of the whole loop where it applies
(:mod:`.persistent`, ``Module.persistent``): a source of its own, for a cooperative module. The
source is deterministic text without node ids, and identical kernels are emitted once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rnnc import ops
from rnnc.backends.cuda import bf16
from rnnc.backends.cuda.batched import BatchedGemm, batched_gemm
from rnnc.backends.cuda.fused_step import (
    FusedStep,
    Pair,
    fused_kernel_source,
    fused_mode,
    fused_pairs,
    region_operands,
)
from rnnc.backends.cuda.kernels import kernel_source
from rnnc.backends.cuda.persistent import PersistentKernel, persistent_kernel
from rnnc.backends.cuda.rows import row_kernel_source, row_shape, row_threads
from rnnc.backends.cuda.rules import CudaRenderer
from rnnc.backends.cuda.scan import chunked_kernel, scan_kernel
from rnnc.backends.schedule import CudaSchedule
from rnnc.backends.steps import GraphSteps, ProgramSteps, Step, program_steps
from rnnc.ir import ARG, FUSED, GET, Graph, Node, Program, Shape

# Ops computed by a kernel of their own when no fused region holds them.
KERNEL_KINDS = frozenset({ops.OpKind.ELEMENTWISE, ops.OpKind.LAYOUT, ops.OpKind.REDUCE,
                          ops.OpKind.TENSOR})


@dataclass(frozen=True)
class Launch:
    """Run kernel ``kernel`` on ``inputs`` (node ids); results are the outputs of ``node``."""

    node: int
    kernel: str
    inputs: tuple[int, ...]
    shapes: tuple[Shape, ...]  # one per result
    fused: bool  # results form a tuple that ``get`` nodes pick from
    per_row: int = 0  # the threads of a block per row of the results (a region that reduces)
    # A linear_scan's chunked kernel (same arguments), which the host launches instead where
    # the sizes of a call favour it (scan.chunked_geometry); "" for every other launch.
    chunked: str = ""


@dataclass(frozen=True)
class Gemm:
    """``node = matmul(a, b)`` through the array module's matmul (cuBLAS on a GPU)."""

    node: int
    a: int
    b: int
    transpose_a: bool
    transpose_b: bool
    shape: Shape
    precision: str | None = None  # "bf16": bfloat16 operands, float32 sums (.bf16)


Work = Launch | Gemm | BatchedGemm | FusedStep


@dataclass
class Module:
    """A program's kernel source and, per graph, the steps that run it."""

    dtype: str
    source: str  # header + prelude + kernels: what NVRTC (or the emulator) compiles
    kernels: list[str]
    steps: dict[str, list[Work]] = field(default_factory=dict)
    prelude: str = ""  # the helper functions, shared by every module of the same dtype
    kernel_text: str = ""  # the kernels alone
    # "auto" with a fused step: the loop body as GEMMs and kernels, the other path to time.
    gemm_body: list[Work] | None = None
    barriers: list[str] = field(default_factory=list)  # kernels that wait at __syncthreads
    # "auto" or "persistent": the whole loop as one kernel, in a cooperative module of its own.
    persistent: PersistentKernel | None = None

    @property
    def fused(self) -> bool:
        """Whether ``steps`` holds a fused step."""
        return any(isinstance(s, FusedStep) for s in self.steps.get("body", ()))


def single_node_region(nodes: Mapping[int, Node], step: Step, dtype: str
                       ) -> tuple[Graph, tuple[int, ...]]:
    """A one-node region for ``step`` (``nodes``: its graph's nodes by id); constant operands
    are inlined, others become args."""
    region = Graph(dtype)
    operands: list[int] = []
    mapped: list[int] = []
    for src in step.inputs:
        source = nodes[src]
        if source.op is ops.constant:
            mapped.append(region.add(ops.constant, (), dict(source.attrs)))
            continue
        if src not in operands:
            operands.append(src)
            region.arg(f"in{len(operands) - 1}", source.shape)
        mapped.append(list(region.args().values())[operands.index(src)])
    out = region.add(step.op, mapped, dict(step.attrs))
    region.outputs = {"out": out}
    return region, tuple(operands)


class _Kernels:
    """The distinct kernels of a module, named in order of first use."""

    def __init__(self, renderer: CudaRenderer, prefix: str,
                 scan_geometry: tuple[int, int] | None = None) -> None:
        self.renderer, self.prefix = renderer, prefix
        self.scan_geometry = scan_geometry  # the chunked linear_scan's block (the schedule's)
        self.names: dict[str, str] = {}  # kernel text with a placeholder name -> name
        self.barriers: set[str] = set()

    def name(self, text: str) -> str:
        """The kernel name of ``text``, a new one the first time."""
        return self.names.setdefault(text, f"{self.prefix}{len(self.names)}")

    def fused(self, step: Step, pair: Pair) -> FusedStep:
        """The fused step computing ``pair``'s product and the region ``step``."""
        region = step.attrs["region"]
        name = self.name(fused_kernel_source(region, pair, self.renderer))
        self.barriers.add(name)
        a, b = pair.matmul.inputs
        shapes = tuple(tuple(region.node(o).shape) for o in region.outputs.values())
        return FusedStep(step.slot, pair.matmul.slot, name, region_operands(step, pair), a, b,
                         shapes, pair.tile, bf16=pair.bf16)

    def launch(self, nodes: Mapping[int, Node], step: Step) -> Launch:
        """The launch computing ``step``: its fused region, or the step alone."""
        if step.op is FUSED:
            region, operands = step.attrs["region"], step.inputs
            comment = f"fused: {len(region)} nodes, {len(region.outputs)} results"
        else:
            region, operands = single_node_region(nodes, step, self.renderer.dtype)
            comment = step.op.name
        per_row = row_threads(region) if row_shape(region) is not None else 0
        if per_row:
            text = row_kernel_source("@KERNEL@", region, self.renderer,
                                     comment + ", one block per row")
        else:
            text = kernel_source("@KERNEL@", region, self.renderer, comment)
        shapes = tuple(tuple(region.node(o).shape) for o in region.outputs.values())
        name = self.name(text)
        if per_row:
            self.barriers.add(name)
        return Launch(step.slot, name, tuple(operands), shapes, step.op is FUSED, per_row)


def graph_steps(graph: GraphSteps, kernels: _Kernels,
                pairs: Mapping[int, Pair] | None = None) -> list[Work]:
    """The launches and GEMMs of one graph, in schedule order; a region in ``pairs`` (by its
    slot) becomes a fused step with its product, at the region's place."""
    pairs = pairs or {}
    absorbed = {pair.matmul.slot for pair in pairs.values()}
    steps: list[Work] = []
    nodes = {step.slot: step.node for step in graph.steps}
    for step in graph.steps:
        if step.op in (ARG, GET, ops.constant) or step.slot in absorbed:
            continue  # values, not work: read from the environment, picked, or made once
        if step.slot in pairs:
            steps.append(kernels.fused(step, pairs[step.slot]))
        elif step.op is ops.matmul:
            attrs = step.attrs
            steps.append(Gemm(step.slot, *step.inputs, bool(attrs.get("transpose_a")),
                              bool(attrs.get("transpose_b")), step.node.shape,
                              attrs.get("precision")))
        elif step.op is ops.einsum and (product := batched_gemm(
                step.slot, step.attrs["spec"], step.inputs,
                [nodes[i].shape for i in step.inputs], step.node.shape)) is not None:
            steps.append(product)
        elif step.op is FUSED or step.op.kind in KERNEL_KINDS:
            steps.append(kernels.launch(nodes, step))
        elif step.op.kind is ops.OpKind.SCAN:  # over the time axis, outside the loop: scan.py
            text, operands = scan_kernel(step, nodes, kernels.renderer)
            name, chunked = kernels.name(text), ""
            if step.op is ops.linear_scan:
                chunked = kernels.name(chunked_kernel(step, nodes, kernels.renderer,
                                                      kernels.scan_geometry))
                kernels.barriers.add(chunked)
            steps.append(Launch(step.slot, name, operands, (step.node.shape,), False,
                                chunked=chunked))
        else:
            raise NotImplementedError(f"cuda: no lowering for {step.op.name}")
    return steps


def render(program: Program | ProgramSteps, prefix: str = "k_", fused_step: str = "auto",
           schedule: CudaSchedule | None = None) -> Module:
    """The kernel source and steps of ``program``; deterministic for a given program.

    Kernels are named ``prefix`` + a number; distinct prefixes let several programs' kernels
    share one module (``prelude`` once, then each ``kernel_text``). ``fused_step``: "auto",
    "always" or "never" (module doc); a backward :class:`Program` renders as "never" (a
    schedule does not say what it computes: the caller decides, :func:`.fused_step.fused_mode`).
    ``schedule`` gives the chunked scan's block and the fused step's tile limits (None: the
    defaults).
    """
    if isinstance(program, Program):
        fused_step = fused_mode(program, fused_step)
    how = schedule or CudaSchedule()
    schedule = program if isinstance(program, ProgramSteps) else program_steps(program)
    renderer = CudaRenderer(schedule.dtype)
    kernels = _Kernels(renderer, prefix, (how.scan_columns, how.scan_chunks))
    module = Module(schedule.dtype, "", [])
    pairs = {} if fused_step == "never" else fused_pairs(schedule.body, schedule.dtype,
                                                              schedule.scan.consts, how)
    module.steps["pre"] = graph_steps(schedule.pre, kernels)
    if pairs and fused_step == "auto":
        module.gemm_body = graph_steps(schedule.body, kernels)
    module.steps["body"] = graph_steps(schedule.body, kernels, pairs)
    if fused_step in ("auto", "persistent"):
        module.persistent = persistent_kernel(schedule, module.steps["body"], renderer,
                                              f"{prefix}persistent", how)
    module.steps["post"] = graph_steps(schedule.post, kernels)
    module.kernels = list(kernels.names.values())
    module.barriers = sorted(kernels.barriers)
    header = (f"// rnnc: CUDA kernels of one program ({renderer.ctype}).\n"
              f"// One thread per output element, grid-stride loops; sizes T and B at run time.\n")
    if module.barriers:
        header += ("// Kernels with shared memory and __syncthreads(): a reducing region's (one "
                   "block per row), a fused\n// step's (one block per tile of rows and hidden "
                   "units) and a chunked linear_scan's (one block\n// per tile of columns and "
                   "chunks of steps).\n")
    module.prelude = renderer.prelude()
    if any(pair.bf16 for pair in pairs.values()):
        module.prelude += bf16.DEVICE_HELPERS  # the fused steps' bfloat16 loads
    module.kernel_text = "".join("\n" + text.replace("@KERNEL@", name)
                                 for text, name in kernels.names.items())
    module.source = header + module.prelude + module.kernel_text
    return module
