"""The CUDA C kernel of a region that reduces over the feature axis: one block per row.

A region holding ``sum``, ``mean``, ``amax`` or ``amin`` whose results all have the same
leading (row) dims, and whose every value broadcasts to them, runs with one block of
:func:`row_threads` threads per row (a grid-stride loop over rows when they outnumber the
blocks). Each reduction of the row is computed once, in dependence order, before the loops that
write the row's results: every thread accumulates the columns ``threadIdx.x + j * RT``, then
the block combines the partial results through shared memory in a tree, and every thread reads
the result; a reduction that reads another's result reads that temporary (layer norm's mean,
then its variance)::

    __shared__ float red[128];
    for (long long row = blockIdx.x; row < total; row += gridDim.x) {
        float acc0 = 0.0f;
        for (long long k1 = threadIdx.x; k1 < 2048; k1 += 128) {
            const float v0 = in0[row * 2048 + k1];
            acc0 += v0;
        }
        red[threadIdx.x] = acc0;
        __syncthreads();
        for (int s2 = 64; s2 > 0; s2 >>= 1) {
            if (threadIdx.x < s2) red[threadIdx.x] = red[threadIdx.x] + red[threadIdx.x + s2];
            __syncthreads();
        }
        const float acc3 = red[0];
        __syncthreads();
        const float v1 = (acc3 / 2048.0f);                   // mean of the row
        ...                                                  // variance, reading v1
        for (long long col = threadIdx.x; col < 2048; col += 128) {
            const float v6 = in0[row * 2048 + col];
            ...
            out0[row * 2048 + col] = v9;
        }
    }

Every thread of a block reaches every barrier: the row loop's bounds are the block's, and the
reductions are computed at the row's level, outside any loop over columns (a loop nested in a
column's value, as an einsum's, stays a loop inside the thread). The emulator runs these
kernels on fibers (:mod:`.cooperative`). Any other region, and a region whose results have
different rows, gets the one-thread-per-element kernel of :mod:`.kernels` (which computes a
reduction per element that reads it).
"""

from __future__ import annotations

from collections.abc import Callable

from rnnc import ops
from rnnc.backends.cuda.kernels import (
    KernelWriter,
    Scope,
    broadcast_row,
    kernel_head,
    lead,
    product,
    width,
)
from rnnc.backends.cuda.rules import CudaRenderer
from rnnc.errors import ShapeError
from rnnc.ir import ARG, Graph, Node, Shape
from rnnc.op_types import broadcast_shapes

REDUCTIONS = frozenset({ops.sum_, ops.mean, ops.amax, ops.amin})
# The block of a row: at least a warp, at most this many threads, about four columns each.
MAX_ROW_THREADS = 256
SCRATCH = "red"  # the block's shared array of partial results
# The most bytes of a thread's local memory that kept operands may take: a GPU reserves a
# kernel's local memory for every thread it can hold, so it stays small.
STAGE_BYTES = 1024


def row_threads(region: Graph) -> int:
    """The threads of a row's block: a power of two from 32 to :data:`MAX_ROW_THREADS`, about
    a quarter of the widest value of ``region``."""
    widest = max(width(node.shape) for node in region.nodes())
    threads = 32
    while threads < MAX_ROW_THREADS and threads * 4 < widest:
        threads *= 2
    return threads


class RowWriter(KernelWriter):
    """A kernel writer for one block per row: a reduction at the row's level is shared by the
    block's threads, each accumulating a strided part of the row, then combined in a tree.

    An operand of a reduction that other values of the region also read (and that is not an
    operand of the kernel) is kept while its reduction's loop runs, each thread storing its own
    columns (column ``c`` at ``c / RT``) in a small local array; a later read of it at one of
    the thread's columns (a loop of the row, strided alike) loads the array instead of
    computing it again, so a chain of normalizations (each reading the one before) stays
    linear in size. A read at any other column computes the value."""

    def __init__(self, renderer: CudaRenderer, region: Graph, pointers: dict[int, str],
                 threads: int) -> None:
        super().__init__(renderer, region, pointers)
        self.threads = threads
        self.candidates = _stage_candidates(region, 4 if renderer.dtype == "f32" else 8,
                                            threads)
        self.staged: dict[int, str] = {}  # node id -> its local array
        self.stage_next: str | None = None  # the array the next loop's terms go to
        self.strided = {"col"}  # the loop variables that take a thread's columns

    def _lookup(self, key: tuple[int, str, str]) -> str | None:
        if key[0] in self.staged and key[2] in self.strided:
            return f"{self.staged[key[0]]}[{key[2]} / {self.threads}]"
        return super()._lookup(key)

    def render(self, node: Node, row: str, col: str) -> str:
        operand = node.inputs[0] if node.op in REDUCTIONS else None
        if operand not in self.candidates or operand in self.staged or len(self.scopes) != 1:
            return super().render(node, row, col)
        array = self.fresh("stage")
        size = -(-width(self.region.node(operand).shape) // self.threads)
        self.emit(f"{self.r.ctype} {array}[{size}];")
        self.stage_next = array  # a reduction's rule opens its loop first
        expr = super().render(node, row, col)
        self.staged[operand] = array
        return expr

    def loop(self, count: str, term: Callable[[str], str],
             combine: Callable[[str, str], str] | None = None, init: str | None = None) -> str:
        if len(self.scopes) != 1:  # inside a column's value: the thread's own loop
            return super().loop(count, term, combine, init)
        array, self.stage_next = self.stage_next, None
        acc, k = self.fresh("acc"), self.fresh("k")
        self.emit(f"{self.r.ctype} {acc} = {self.r.zero if init is None else init};")
        block = Scope(f"for (long long {k} = threadIdx.x; {k} < {count}; {k} += "
                      f"{self.threads}) {{", k)
        root = self.scopes[0]
        root.open_loop(block)
        self.scopes.append(block)
        self.strided.add(k)
        value = term(k)
        if array is not None:
            self.emit(f"{array}[{k} / {self.threads}] = {value};")
        self.emit(f"{acc} += {value};" if combine is None else f"{acc} = {combine(acc, value)};")
        self.scopes.pop()
        root.close_loop()
        mine, other = f"{SCRATCH}[threadIdx.x]", f"{SCRATCH}[threadIdx.x + {{s}}]"
        step, total = self.fresh("s"), self.fresh("acc")
        both = (f"{mine} + {other}" if combine is None else combine(mine, other))
        for line in (f"{mine} = {acc};", "__syncthreads();",
                     f"for (int {step} = {self.threads // 2}; {step} > 0; {step} >>= 1) {{",
                     f"    if (threadIdx.x < {step}) {mine} = {both.format(s=step)};",
                     "    __syncthreads();", "}",
                     f"const {self.r.ctype} {total} = {SCRATCH}[0];",
                     "__syncthreads();"):  # before the scratch is written again
            self.emit(line)
        return total


def _stage_candidates(region: Graph, itemsize: int, threads: int) -> set[int]:
    """The reduction operands a row kernel keeps: computed in the region, read by more than
    their reduction (or a result), within :data:`STAGE_BYTES` of a thread's columns."""
    readers: dict[int, int] = {}
    for node in region.nodes():
        for i in set(node.inputs):
            readers[i] = readers.get(i, 0) + 1
    outputs = set(region.outputs.values())
    chosen: set[int] = set()
    room = STAGE_BYTES
    for node in region.nodes():
        if node.op not in REDUCTIONS:
            continue
        x = region.node(node.inputs[0])
        size = -(-width(x.shape) // threads) * itemsize
        if x.id in chosen or x.op in (ARG, ops.constant) or width(x.shape) == 1 or size > room:
            continue
        if readers[x.id] > 1 or x.id in outputs:
            chosen.add(x.id)
            room -= size
    return chosen


def row_shape(region: Graph) -> Shape | None:
    """The rows of a one-thread-per-row kernel for ``region``: the leading dims of its results
    when it reduces over the feature axis, all its results have them and every value's leading
    dims broadcast to them; else None."""
    nodes = [node for node in region.nodes() if node.op is not ARG]
    if not any(node.op in REDUCTIONS for node in nodes):
        return None
    rows = {lead(region.node(o).shape) for o in region.outputs.values()}
    if len(rows) != 1:
        return None
    try:
        together = broadcast_shapes((), *(lead(node.shape) for node in nodes))
    except ShapeError:
        return None
    return together if together in rows else None


def row_kernel_source(name: str, region: Graph, renderer: CudaRenderer, comment: str) -> str:
    """One kernel computing every output of ``region``, one block of :func:`row_threads`
    threads per row (:func:`row_shape` must not be None)."""
    rows = row_shape(region)
    assert rows is not None, "a row kernel needs a region that reduces, with one row shape"
    pointers = {nid: f"in{i}" for i, nid in enumerate(region.args().values())}
    threads = row_threads(region)
    writer = RowWriter(renderer, region, pointers, threads)
    outputs = list(region.outputs.values())
    root = Scope()
    writer.scopes = [root]
    for node in region.nodes():  # each reduction once, in dependence order, before any loop
        if node.op in REDUCTIONS:
            writer.value(node.id, broadcast_row(rows + (1,), node.shape, "row"), "0")
    widths: dict[int, list[int]] = {}
    for k, nid in enumerate(outputs):
        widths.setdefault(width(region.node(nid).shape), []).append(k)
    for w, members in widths.items():
        if w == 1:
            for k in members:
                value = writer.value(outputs[k], "row", "0")
                writer.emit(f"if (threadIdx.x == 0) out{k}[row] = {value};")
            continue
        # Values of the row (reductions and what reads only them) go before the loop.
        loop = Scope(f"for (long long col = threadIdx.x; col < {w}; col += {threads}) {{",
                     "col")
        root.open_loop(loop)
        writer.scopes.append(loop)
        for k in members:
            writer.emit(f"out{k}[row * {w} + col] = {writer.value(outputs[k], 'row', 'col')};")
        writer.scopes.pop()
        root.close_loop()
    body = [f"    __shared__ {renderer.ctype} {SCRATCH}[{threads}];",
            f"    const long long total = {product(rows)};",
            "    for (long long row = blockIdx.x; row < total; row += gridDim.x) {",
            *root.lines(2), "    }", "}"]
    return kernel_head(name, region, renderer, comment) + "\n".join(body) + "\n"
