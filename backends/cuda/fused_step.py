"""A fused recurrent step: one kernel for a step's product ``P = a @ b`` and the region reading it.

Without it a step of the loop is a GEMM (cuBLAS) writing ``P`` (B, G*H) to global memory and a
kernel for the fused elementwise region that reads it back. Where the region is *unit-local* in
``P`` (:func:`rnnc.backends.units.unit_width`: column ``j`` of every result reads only the
columns ``g*H + j`` of ``P``), a block that owns the batch rows ``[r0, r0 + rows)`` and the
hidden units ``[u0, u0 + units)`` can compute exactly the product columns of its units for every
gate (:mod:`.fused_tile`) and then the region for those units straight from the accumulators:
``P`` never reaches global memory and the step is one launch.

:func:`fused_pairs` finds the (matmul, region) pairs of a loop body where this applies: the
region is the product's only reader (the product is no output of the body either), the product
is ``a @ b`` or ``a @ b^T`` with ``a`` (B, K) and a weight ``b``, the region reduces over
nothing (a layer norm over the gates is not unit-local anyway), every result is (B, m*H), and
the tile fits in static shared memory. ``transpose_a`` (a weight gradient) never occurs in a
forward step and is refused. Backward programs keep the GEMM path: their products
``dG @ U^T`` could be fused later as a prologue. The runner reads that from the mode it is
built for (``CudaBackend.build(program, mode)``); :func:`fused_mode` reads it from a program's
cotangent arguments, for :func:`.codegen.render` given a program alone.

:func:`fused_kernel_source` writes the kernel: the tile, then the epilogue, whose expressions
come from :class:`~.kernels.KernelWriter` (the element-wise kernels' writer) with the argument
``P`` read from the accumulators (:class:`EpilogueWriter`). Operands other than ``P`` are read
from global memory at the thread's (row, unit) as in every other kernel: a bias (N,) at its
column, the input projection (B, G*H) at its row and gate column, a carried state (B, H), a
mask (B, 1). Sizes H, K and G are literals; T and B are the kernel's last two parameters.

A bfloat16 product (``matmul[precision=bf16]`` of a float32 program) fuses too: its kernel
takes ``gemm_b`` as bfloat16 bits, which the host converts once before the loop, and the tile
rounds ``a`` as it loads it (:mod:`.fused_tile`, :mod:`.bf16`); the epilogue stays float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rnnc import ops
from rnnc.backends.cuda.fused_tile import Tile, choose_tile, tile_function
from rnnc.backends.cuda.kernels import KernelWriter, Scope, width
from rnnc.backends.cuda.rules import CudaRenderer
from rnnc.backends.schedule import CudaSchedule
from rnnc.backends.steps import GraphSteps, Step
from rnnc.backends.units import unit_width
from rnnc.ir import ARG, FUSED, Graph, Program, Shape
from rnnc.names import Role
from rnnc.precision import BF16

ITEMSIZE = {"f32": 4, "f64": 8}
_ROWS_ONLY = ((), (1,), ("B",))  # the row dims an operand of a fused step may have


def fused_mode(program: Program, requested: str) -> str:
    """The mode a program is rendered with: "never" for a backward program (it takes a
    cotangent), whose steps keep their GEMMs, else ``requested``."""
    if any(role == Role.COTANGENT for role, _ in program.args.values()):
        return "never"
    return requested


@dataclass(frozen=True)
class Pair:
    """A product a region fuses with: the matmul step, the region's argument that reads it,
    and the tile of the fused kernel."""

    matmul: Step
    argument: str
    tile: Tile
    bf16: bool = False  # a bfloat16 product: ``b`` as bfloat16 bits, ``a`` rounded


@dataclass(frozen=True)
class FusedStep:
    """Run kernel ``kernel``: the product ``product = a @ b`` and the region ``node`` reading
    it; results are the region's outputs. ``inputs`` are the region's other operands."""

    node: int
    product: int
    kernel: str
    inputs: tuple[int, ...]
    a: int
    b: int
    shapes: tuple[Shape, ...]
    tile: Tile
    fused: bool = True  # results form a tuple that ``get`` nodes pick from, like a Launch's
    bf16: bool = False  # the kernel reads ``b`` as bfloat16 bits (the host converts it)


def fused_pairs(body: GraphSteps, dtype: str, constants: tuple[str, ...] = (),
                how: CudaSchedule | None = None) -> dict[int, Pair]:
    """The fusable pairs of a loop body, by the region's slot (see the module doc), their
    tiles within ``how``'s limits; a bfloat16 product fuses where its weight is one of the
    loop ``constants`` (the host converts those before the loop)."""
    readers: dict[int, list[Step]] = {}
    for step in body.steps:
        for slot in step.inputs:
            readers.setdefault(slot, []).append(step)
    outputs = {o.slot for o in body.outputs.values()} | {o.source[0] for o in body.outputs.values()}
    shapes = {step.slot: tuple(step.node.shape) for step in body.steps if step.op is not FUSED}
    by_slot = {step.slot: step for step in body.steps}
    pairs: dict[int, Pair] = {}
    for step in body.steps:
        users = readers.get(step.slot, [])
        if step.op is not ops.matmul or step.slot in outputs or len(users) != 1:
            continue
        region_step = users[0]
        if region_step.op is not FUSED or region_step.inputs.count(step.slot) != 1:
            continue
        weight = by_slot.get(step.inputs[1])
        if step.attrs.get("precision") == BF16 and not (
                weight is not None and weight.op is ARG and weight.name in constants):
            continue
        pair = _pair(step, region_step, shapes, dtype, how)
        if pair is not None:
            pairs[region_step.slot] = pair
    return pairs


def _pair(matmul: Step, region_step: Step, shapes: Mapping[int, Shape], dtype: str,
          how: CudaSchedule | None = None) -> Pair | None:
    """The pair of ``matmul`` and the region reading it, or None where it does not fuse."""
    bf16 = matmul.attrs.get("precision") == BF16
    if matmul.attrs.get("transpose_a") or (bf16 and dtype != "f32"):
        return None
    a, b = (shapes.get(i, ()) for i in matmul.inputs)
    if len(a) != 2 or a[0] != "B" or len(b) != 2 or not all(isinstance(d, int) for d in b):
        return None
    K, N = (b[1], b[0]) if matmul.attrs.get("transpose_b") else b
    region: Graph = region_step.attrs["region"]
    argument = list(region.args())[region_step.inputs.index(matmul.slot)]
    if any(node.op.kind is ops.OpKind.REDUCE for node in region.nodes()):
        return None
    if any(tuple(region.node(nid).shape[:-1]) not in _ROWS_ONLY
           for nid in region.args().values()):
        return None
    H = unit_width(region, argument)
    if H is None or a[1] != K or N % H:
        return None
    if any(tuple(region.node(o).shape) != ("B", width(region.node(o).shape))
           for o in region.outputs.values()):
        return None
    tile = choose_tile(H, N // H, K, ITEMSIZE[dtype], how)
    return None if tile is None else Pair(matmul, argument, tile, bf16)


class EpilogueWriter(KernelWriter):
    """The element-wise writer, reading the product from the thread's accumulators.

    Element (row, col) of the product is ``acc[g][i]`` for ``col = g*H + j``, where ``j`` is
    the thread's unit and ``i`` the row's index among the thread's rows. A unit-local region
    reads only such columns where the value is used; a layout op may also read a clamped
    column of a piece it does not select, which lies in [0, G*H) and so still picks some
    accumulator: ``(col - j) / H`` is in [0, G) for every col there."""

    def __init__(self, renderer: CudaRenderer, region: Graph, pointers: dict[int, str],
                 product: int, H: int) -> None:
        super().__init__(renderer, region, pointers)
        self.product, self.H = product, H

    def load(self, nid: int, row: str, col: str) -> str:
        if nid != self.product:
            return super().load(nid, row, col)
        return f"acc[(({col}) - j) / {self.H}][i]"


def _epilogue(region: Graph, renderer: CudaRenderer, argument: str, H: int) -> list[str]:
    """The statements computing and storing every result at (row, unit j)."""
    args = region.args()
    pointers = {nid: f"in{i}" for i, (name, nid) in enumerate(args.items()) if name != argument}
    writer = EpilogueWriter(renderer, region, pointers, args[argument], H)
    writer.scopes = [Scope()]
    stores = []
    for k, nid in enumerate(region.outputs.values()):
        w = width(region.node(nid).shape)
        for q in range(w // H):
            col = "j" if q == 0 else f"({q * H} + j)"
            stores.append(f"out{k}[row * {w} + {col}] = {writer.value(nid, 'row', col)};")
    return writer.scopes[0].lines(3) + ["            " + s for s in stores]


def epilogue_lines(region: Graph, renderer: CudaRenderer, argument: str, tile: Tile
                   ) -> list[str]:
    """After a tile: each of the thread's rows computes and stores every result at its unit
    ``j``, reading the product from ``acc``, the operands from ``in<i>`` (region argument i)
    and writing ``out<k>`` (result k), all (B, m*H) or broadcast pointers of this step."""
    return [
        f"    const long long j = u0 + threadIdx.x % {tile.units};",
        "    #pragma unroll",
        f"    for (int i = 0; i < {tile.rows_per_thread}; ++i) {{",
        f"        const long long row = r0 + (long long)(threadIdx.x / {tile.units}) * "
        f"{tile.rows_per_thread} + i;",
        f"        if (row < B && j < {tile.H}) {{",
        *_epilogue(region, renderer, argument, tile.H),
        "        }",
        "    }",
    ]


def _head(region: Graph, renderer: CudaRenderer, argument: str, pair: Pair, comment: str
          ) -> list[str]:
    t, tile = renderer.ctype, pair.tile
    params = [f"const {t}* __restrict__ in{i}" for i, name in enumerate(region.args())
              if name != argument]
    params += [f"const {t}* __restrict__ gemm_a",
               f"const {'unsigned short' if pair.bf16 else t}* __restrict__ gemm_b"]
    params += [f"{t}* __restrict__ out{k}" for k in range(len(region.outputs))]
    params += ["long long T", "long long B"]
    return [f"// {comment}",
            f'extern "C" __global__ void __launch_bounds__({tile.threads}) @KERNEL@(',
            ",\n".join("    " + p for p in params) + ") {"]


def fused_kernel_source(region: Graph, pair: Pair, renderer: CudaRenderer) -> str:
    """The tile function and the kernel of one fused step, named ``@KERNEL@`` (and
    ``@KERNEL@_tile``) for codegen to number."""
    tile, t = pair.tile, renderer.ctype
    transpose_b = bool(pair.matmul.attrs.get("transpose_b"))
    comment = (f"fused step: P = a @ b{'^T' if transpose_b else ''}"
               f"{' in bfloat16' if pair.bf16 else ''} ({tile.G} gates of "
               f"{tile.H} units, K = {tile.K}) and its epilogue ({len(region)} nodes, "
               f"{len(region.outputs)} results); blocks of {tile.rows} rows x {tile.units} "
               f"units")
    body = [
        f"    __shared__ {t} tile_a[{tile.rows * tile.depth}];",
        f"    __shared__ {t} tile_b[{tile.depth * tile.G * tile.units}];",
        f"    const long long r0 = (long long)(blockIdx.x / {tile.unit_blocks}) * {tile.rows};",
        f"    const long long u0 = (long long)(blockIdx.x % {tile.unit_blocks}) * {tile.units};",
        f"    {t} acc[{tile.G}][{tile.rows_per_thread}];",
        "    @KERNEL@_tile(gemm_a, gemm_b, B, r0, u0, acc, tile_a, tile_b);",
        *epilogue_lines(region, renderer, pair.argument, tile),
        "}",
    ]
    tile_text = tile_function("@KERNEL@_tile", tile, t, transpose_b, bf16=pair.bf16)
    head = _head(region, renderer, pair.argument, pair, comment)
    return tile_text + "\n".join(head + body) + "\n"


def region_operands(region_step: Step, pair: Pair) -> tuple[int, ...]:
    """The region's operands but the product, in the kernel's parameter order."""
    skip = region_step.inputs.index(pair.matmul.slot)
    return tuple(slot for i, slot in enumerate(region_step.inputs) if i != skip)
