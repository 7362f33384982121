"""A persistent kernel: the whole time loop of a small recurrent cell as one cooperative launch.

A fused step (:mod:`.fused_step`) is one launch per time step; each launch reads the
recurrent weights ``U`` again from global memory. Where a loop body is exactly one fused pair
(the product ``h @ U`` of a carried state and the unit-local region reading it) and nothing
else but what the region writes, one kernel can run every step: each block loads its slice of
``U`` (the columns ``g*H + [u0, u0 + units)`` of every gate, all K rows) into shared memory
once, then for each step in the scan's order computes its tiles of ``h_{t-1} @ U_slice``
(:func:`.fused_tile.tile_function` with ``b_shared``) and the epilogue
(:func:`.fused_step.epilogue_lines`, the fused step's own writer), writes its units of the new
carries, and waits at ``cooperative_groups::this_grid().sync()`` before the next step reads
them. This is cuDNN's persistent RNN and haste's approach for small hidden sizes.

:func:`persistent_kernel` decides whether a program's body qualifies and writes the kernel
(module doc of :mod:`.fused_step` for the pair). It qualifies when the body's only work is one
fused step whose product operand ``a`` is a carry and ``b`` a loop constant, every carry's
next value and every stacked output is a result of the region (or, for a stacked output, the
previous value of such a carry: a value saved for the backward), nothing is summed, and the
block's slice of ``U`` with one stage of ``a`` fits in static shared memory
(:data:`.fused_tile.SHARED_BYTES`, 48 KiB): the units per block shrink (32, 16, ... 1) until
``K * G * units`` values fit. So LSTM, GRU, peephole LSTM and Elman inference and training
forward qualify (an f32 LSTM's H = 256 with 8 units per block, up to about H = 2900 with one);
MGU does not (two dependent products per step). A bfloat16 product (:mod:`.bf16`) keeps its
slice of ``U`` as 16-bit bfloat16 bits, which the host converts once before the launch, so
twice the units fit; each loaded element of ``h`` is rounded to bfloat16 and the sums are
float32, as in the fused step.

Where the results live (host side, :func:`record_persistent`): a result stacked as an output,
or whose previous value is stacked, is written at its step's slot of a (T, B, w) array (the
output itself, else one of the plan's own); every other result alternates between two (B, w)
buffers by step parity. A carry's value at step s > 0 is the previous step's slot; step 0
reads its initial value. Previous values stacked for the backward are copied from the
history after the kernel. The kernel loops over the row tiles a block owns, so the grid is
``unit_blocks`` times as many row groups as are resident at once: the grid is sized before the
launch to what fits (:func:`resident_blocks`: the occupancy API on a GPU, the emulator's
:data:`~.cooperative.MAX_COOPERATIVE_BLOCKS` and ``THREADS`` in emulation), and a shape where
not even one row group fits, or with T = 0 or B = 0, records the per-step plan instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc import ops
from rnnc.backends.cuda import bf16, cooperative
from rnnc.backends.cuda.fused_step import ITEMSIZE, FusedStep, epilogue_lines
from rnnc.backends.cuda.fused_tile import (
    SHARED_BYTES,
    Tile,
    load_b_lines,
    padded_depth,
    tile_function,
)
from rnnc.backends.cuda.kernels import width
from rnnc.backends.cuda.plan import Entry, Plan
from rnnc.backends.cuda.rules import CudaRenderer
from rnnc.backends.schedule import CudaSchedule
from rnnc.backends.steps import ProgramSteps, Step, resolve
from rnnc.ir import ARG, GET, Shape

KERNEL = "persistent"


@dataclass(frozen=True)
class Operand:
    """A pointer the kernel reads: a carry (its initial value), a whole sequence (T, ...), a
    loop constant or a constant; ``result`` is the region result a carry's next value is."""

    slot: int
    kind: str  # "carry", "seq", "const"
    name: str  # the environment name; "" for a constant
    per_step: str  # C expression: elements of one step's value (a carry's or a sequence's)
    result: int | None = None


@dataclass(frozen=True)
class PersistentKernel:
    """The kernel ``kernel`` in its own cooperative module ``source``, and what the host needs
    to record its launch: operands, then one pointer per result, then T and B."""

    kernel: str
    source: str  # the module's whole source: CUDA_PRELUDE, the helper functions, ``text``
    text: str  # the tile function and the kernel alone
    node: int  # the region's slot in the body: its results are the kernel's
    tile: Tile
    operands: tuple[Operand, ...]
    shapes: tuple[Shape, ...]  # one (B, w) per region result
    stacked: tuple[bool, ...]  # per result: a (T, B, w) history, else two alternating buffers
    reverse: bool
    bf16: bool = False  # the weight operand is bfloat16 bits, converted before the launch
    weight: int | None = None  # with bf16: the weight's slot


@dataclass(frozen=True)
class PersistentLaunch:
    """A loaded persistent kernel: ``function`` (called like ``cupy.RawKernel``) and how many
    of its blocks can be resident at once (:func:`resident_blocks`)."""

    kernel: PersistentKernel
    function: Any
    resident: int


def persistent_tile(H: int, G: int, K: int, itemsize: int, weight_itemsize: int | None = None,
                    how: CudaSchedule | None = None) -> Tile | None:
    """The tile of a persistent kernel: the most units per block (a power of two, at most
    ``how.tile_max_units``) whose slice of ``U`` (``weight_itemsize`` bytes a value, by default
    ``itemsize``) and one stage of ``a`` fit in static shared memory; None when not even one
    unit's does."""
    weight_itemsize = weight_itemsize or itemsize
    how = how or CudaSchedule()
    units = min(how.tile_max_units, 1 << max(H - 1, 0).bit_length())
    rows_per_thread = 4 if G <= 8 else 2 if G <= 16 else 1
    depth = next(d for d in how.tile_depths if d <= max(1, 1 << max(K - 1, 0).bit_length()))
    while units >= 1:
        tile = Tile(H, G, K, units, rows_per_thread, depth, how.tile_row_threads)
        if tile.rows * depth * itemsize + padded_depth(tile) * G * units * weight_itemsize \
                <= SHARED_BYTES:
            return tile
        units //= 2
    return None


def _analyse(schedule: ProgramSteps, fused: FusedStep) -> tuple | None:
    """The operands and per-result history flags of a qualifying body, else None."""
    scan, body = schedule.scan, schedule.body
    steps = {s.slot: s for s in body.steps}
    if scan.summed or any(s.op not in (ARG, GET, ops.constant) and s.slot not in
                          (fused.node, fused.product) for s in body.steps):
        return None
    carries = {c.name for c in scan.carries}
    next_result = {}
    for name in carries:
        node, index = body.outputs[name].source
        if node != fused.node:
            return None
        next_result[name] = index
    stacked = [False] * len(fused.shapes)
    for name in scan.stacked:
        node, index = body.outputs[name].source
        step = steps[node]
        if node == fused.node:
            stacked[index] = True
        elif step.op is ARG and step.name in carries:
            stacked[next_result[step.name]] = True  # a saved previous value: from the history
        else:
            return None
    operands = []
    for slot in dict.fromkeys(fused.inputs + (fused.a, fused.b)):
        operand = _operand(steps[slot], scan.seqs, scan.consts, next_result, fused.b)
        if operand is None:
            return None
        operands.append(operand)
    kinds = {o.slot: o.kind for o in operands}
    if kinds[fused.a] != "carry" or kinds[fused.b] != "const":
        return None
    return tuple(operands), tuple(stacked)


def _operand(step: Step, seqs: tuple[str, ...], consts: tuple[str, ...],
             next_result: Mapping[str, int], weight: int) -> Operand | None:
    """What the kernel reads for one body value; None for one it cannot read (the weight must
    be a loop constant)."""
    if step.op is ops.constant:
        return None if step.slot == weight else Operand(step.slot, "const", "", "0")
    if step.op is not ARG:
        return None
    shape = tuple(step.node.shape)
    per_step = " * ".join(["B" if d == "B" else str(d) for d in shape]) or "1"
    if step.name in next_result:
        return Operand(step.slot, "carry", step.name, per_step, next_result[step.name])
    if step.name in seqs and step.slot != weight:
        return Operand(step.slot, "seq", step.name, per_step)
    if step.name in consts:
        return Operand(step.slot, "const", step.name, per_step)
    return None


def persistent_kernel(schedule: ProgramSteps, body: list, renderer: CudaRenderer,
                      name: str = KERNEL, how: CudaSchedule | None = None
                      ) -> PersistentKernel | None:
    """The persistent kernel of a program whose rendered loop ``body`` is one fused step, or
    None where it does not qualify (module doc)."""
    if len(body) != 1 or not isinstance(body[0], FusedStep):
        return None
    fused = body[0]
    region_step = next(s for s in schedule.body.steps if s.slot == fused.node)
    matmul = next(s for s in schedule.body.steps if s.slot == fused.product)
    found = _analyse(schedule, fused)
    tile = persistent_tile(fused.tile.H, fused.tile.G, fused.tile.K,
                           ITEMSIZE[schedule.dtype], 2 if fused.bf16 else None, how)
    if found is None or tile is None or (fused.bf16 and fused.b in fused.inputs):
        return None  # (a bf16 weight the region reads too would need it in float32 as well)
    operands, stacked = found
    text = _kernel_text(name, region_step, matmul, operands, stacked, tile, renderer,
                        schedule.scan.reverse, fused.bf16)
    source = cooperative.CUDA_PRELUDE + renderer.prelude() + \
        (bf16.DEVICE_HELPERS if fused.bf16 else "") + text
    return PersistentKernel(name, source, text, fused.node, tile, operands, fused.shapes, stacked,
                            schedule.scan.reverse, fused.bf16,
                            fused.b if fused.bf16 else None)


def _pointer_lines(region_step: Step, matmul: Step, operands: tuple[Operand, ...],
                   stacked: tuple[bool, ...], shapes: list[Shape], t: str,
                   weight: int | None = None) -> list[str]:
    """This step's pointers: ``in<i>`` per region argument, ``out<k>`` per result, ``gemm_a``."""
    def slot_of(k: int, step: str, time: str) -> str:
        return time if stacked[k] else f"(({step}) & 1)"

    pointer: dict[int, str] = {}
    lines = []
    for n, o in enumerate(operands):
        if o.slot == weight:
            continue  # read by the tile function alone, through ``b``
        if o.kind == "seq":
            value = f"src{n} + t * ({o.per_step})"
        elif o.kind == "carry":
            previous = f"res{o.result} + {slot_of(o.result, 'step - 1', 'previous')} * " \
                       f"({o.per_step})"
            value = f"step == 0 ? src{n} : {previous}"
        else:
            value = f"src{n}"
        lines.append(f"        const {t}* op{n} = {value};")
        pointer[o.slot] = f"op{n}"
    for i, slot in enumerate(region_step.inputs):
        if slot != matmul.slot:
            lines.append(f"        const {t}* in{i} = {pointer[slot]};")
    for k, shape in enumerate(shapes):
        lines.append(f"        {t}* out{k} = res{k} + {slot_of(k, 'step', 't')} * "
                     f"(B * {width(shape)});")
    lines.append(f"        const {t}* gemm_a = {pointer[matmul.inputs[0]]};")
    return lines


def _kernel_text(name: str, region_step: Step, matmul: Step, operands: tuple[Operand, ...],
                 stacked: tuple[bool, ...], tile: Tile, renderer: CudaRenderer,
                 reverse: bool, bf16: bool = False) -> str:
    """The tile function and the persistent kernel ``name``; with ``bf16`` its weight and
    slice hold bfloat16 bits."""
    t, region = renderer.ctype, region_step.attrs["region"]
    transpose_b = bool(matmul.attrs.get("transpose_b"))
    argument = list(region.args())[region_step.inputs.index(matmul.slot)]
    shapes = [tuple(region.node(o).shape) for o in region.outputs.values()]
    weight = next(n for n, o in enumerate(operands) if o.slot == matmul.inputs[1])
    w = "unsigned short" if bf16 else t  # the weight's and the slice's element type
    params = [f"const {w if n == weight else t}* src{n}" for n in range(len(operands))]
    params += [f"{t}* res{k}" for k in range(len(shapes))] + ["long long T", "long long B"]
    slice_size = padded_depth(tile) * tile.G * tile.units
    epilogue = ["        " + line for line in epilogue_lines(region, renderer, argument, tile)]
    lines = [
        f"// persistent: every step of P = h @ U{'^T' if transpose_b else ''} ({tile.G} gates "
        f"of {tile.H} units, K = {tile.K}) and its epilogue, {'reverse' if reverse else 'forward'}"
        f"; blocks of {tile.units} units keep their slice of U in shared memory",
        f'extern "C" __global__ void __launch_bounds__({tile.threads}) {name}(',
        ",\n".join("    " + p for p in params) + ") {",
        f"    __shared__ {w} slice[{slice_size}];",
        f"    __shared__ {t} tile_a[{tile.rows * tile.depth}];",
        f"    const {w}* b = src{weight};",
        f"    const long long u0 = (long long)(blockIdx.x % {tile.unit_blocks}) * {tile.units};",
        *(line[4:] for line in load_b_lines("slice", "0", padded_depth(tile), tile, w,
                                            transpose_b)),
        "    __syncthreads();",
        f"    const long long row_blocks = (B + {tile.rows - 1}) / {tile.rows};",
        f"    const long long row_groups = gridDim.x / {tile.unit_blocks};",
        "    for (long long step = 0; step < T; ++step) {",
        f"        const long long t = {'T - 1 - step' if reverse else 'step'};",
        f"        const long long previous = {'t + 1' if reverse else 't - 1'};",
        "        (void)previous;",
        *_pointer_lines(region_step, matmul, operands, stacked, shapes, t,
                        matmul.inputs[1] if bf16 else None),
        f"        for (long long rb = blockIdx.x / {tile.unit_blocks}; rb < row_blocks; "
        "rb += row_groups) {",
        f"            const long long r0 = rb * {tile.rows};",
        f"            {t} acc[{tile.G}][{tile.rows_per_thread}];",
        f"            {name}_tile(gemm_a, slice, B, r0, u0, acc, tile_a);",
        *epilogue,
        "        }",
        "        cooperative_groups::this_grid().sync();",
        "    }",
        "}",
    ]
    return tile_function(f"{name}_tile", tile, t, transpose_b, b_shared=True, bf16=bf16) + \
        "\n".join(lines) + "\n"


def resident_blocks(cupy: Any, kernel: Any, threads: int) -> int:
    """How many blocks of ``threads`` threads of ``kernel`` a cooperative launch may have:
    the emulator's limits, or on a GPU the occupancy API's blocks per multiprocessor times
    the multiprocessors (0 where the query fails: the caller then keeps the per-step plan)."""
    if cupy is None:
        return min(cooperative.MAX_COOPERATIVE_BLOCKS,
                   cooperative.MAX_COOPERATIVE_THREADS // threads)
    try:
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernel.kernel.ptr, threads, 0)
        return int(per_sm) * int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    except Exception:  # an old CuPy or driver without the query: no persistent launch
        return 0


def record_persistent(kernel: PersistentKernel, function: Any, resident: int, plan: Plan,
                      schedule: ProgramSteps, env: Mapping[str, Any],
                      dims: Mapping[str, int], empty: Callable[[tuple[int, ...]], Any],
                      out: dict[str, Any], constants: Mapping[int, Any],
                      weight_bits: Callable[[Any], Any] | None = None) -> bool:
    """Record the whole loop as one cooperative launch of ``function`` (the loaded kernel)
    and the copies of saved previous values after it, filling ``out`` (stacked outputs,
    already allocated, and final carries); False, recording nothing, where the shape does
    not suit it (T or B is 0, or not one row group of blocks is resident at once). A bfloat16
    kernel's weight is ``weight_bits(weight)``: its bits, converted by a call that records
    before the launch."""
    T, B, tile = dims["T"], dims["B"], kernel.tile
    row_groups = min(-(-B // tile.rows), resident // tile.unit_blocks)
    if T == 0 or B == 0 or row_groups < 1:
        return False
    scan, body = schedule.scan, schedule.body
    results: list[Any] = [None] * len(kernel.shapes)
    for name in scan.stacked:
        node, index = body.outputs[name].source
        if node == kernel.node and results[index] is None:
            results[index] = out[name]
    for k, shape in enumerate(kernel.shapes):
        if results[k] is None:
            results[k] = empty(((T,) if kernel.stacked[k] else (2,)) + resolve(shape, dims))
    initial = {c.name: env[c.init] for c in scan.carries}
    pointers = []
    for operand in kernel.operands:
        if operand.kind == "carry":
            pointers.append(initial[operand.name])
        elif operand.name and operand.slot == kernel.weight and weight_bits:
            pointers.append(weight_bits(env[operand.name]))
        elif operand.name:
            pointers.append(env[operand.name])
        else:
            pointers.append(constants[operand.slot])
    args = tuple(pointers) + tuple(results) + (np.int64(T), np.int64(B))
    plan.record(Entry("body", "persistent"), function, (row_groups * tile.unit_blocks,),
                (tile.threads,), args)
    _record_after(kernel, plan, schedule, initial, results, out, T)
    return True


def _record_after(kernel: PersistentKernel, plan: Plan, schedule: ProgramSteps,
                  initial: Mapping[str, Any], results: list[Any], out: dict[str, Any],
                  T: int) -> None:
    """The copies after the kernel: a stacked output that another one's array holds, saved
    previous carry values (the initial value, then the history one step behind), and the
    final carries (views of the last step's slot)."""
    scan, body = schedule.scan, schedule.body
    steps = {s.slot: s for s in body.steps}
    following = {c.name: body.outputs[c.name].source[1] for c in scan.carries}
    first, last = (T - 1, 0) if kernel.reverse else (0, T - 1)
    copy = Entry("post", "copy")
    for name in scan.stacked:
        node, index = body.outputs[name].source
        if node == kernel.node:
            if out[name] is not results[index]:
                plan.record(copy, _copy, out[name], results[index])
            continue
        history = results[following[steps[node].name]]
        plan.record(copy, _copy, out[name][first], initial[steps[node].name])
        if T > 1:
            target, source = (out[name][:-1], history[1:]) if kernel.reverse else \
                (out[name][1:], history[:-1])
            plan.record(copy, _copy, target, source)
    for carry in scan.carries:
        if carry.final is not None:
            k = following[carry.name]
            out[carry.final] = results[k][last if kernel.stacked[k] else (T - 1) % 2]


def _copy(target: Any, source: Any) -> None:
    """``target[...] = source`` for NumPy and CuPy arrays alike."""
    target[...] = source
