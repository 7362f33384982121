"""The CUDA C kernel of a region that reduces over the feature axis: one thread per row.

A region holding ``sum``, ``mean``, ``amax`` or ``amin`` whose results all have the same
leading (row) dims, and whose every value broadcasts to them, runs with one thread per row.
The thread computes each reduction of its row once, in a loop over the row inside the thread,
before the loops that write the row's results; a reduction that reads another's result reads
the temporary the first left (layer norm's mean, then its variance)::

    for (long long idx = ...; idx < total; idx += stride) {
        const long long row = idx;
        float acc0 = 0.0f;
        for (long long k1 = 0; k1 < 16; ++k1) {
            const float v0 = in0[row * 16 + k1];
            acc0 += v0;
        }
        const float v1 = (acc0 / 16.0f);                     // mean of the row
        ...                                                  // variance, reading v1
        for (long long col = 0; col < 16; ++col) {
            const float v6 = in0[row * 16 + col];
            const float v7 = (v6 - v1);
            ...
            out0[row * 16 + col] = v9;
        }
    }

No shared memory and no warp intrinsics: the emulator runs the threads one after another.
The elementwise operands of a reduction are recomputed inside its loop, except one that other
values of the region read too, which the loop also stores in a small local array of the row
(:class:`RowWriter`). Any other region, and a region whose results have different rows, gets
the one-thread-per-element kernel of :mod:`.kernels` (which computes a reduction per element
that reads it).
"""

from __future__ import annotations

from collections.abc import Callable

from rnnc import ops
from rnnc.backends.cuda.kernels import (
    GRID_LOOP,
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
# The most bytes of a thread's local memory that staged rows may take: a GPU reserves a
# kernel's local memory for every thread it can hold, so it stays small.
STAGE_BYTES = 1024


class RowWriter(KernelWriter):
    """A kernel writer for one row per thread that keeps some reductions' operands.

    An operand of a reduction that other values of the region also read (and that is not an
    operand of the kernel) is stored in a local array of the row while its reduction's loop
    runs; every later read of it loads the array instead of computing it again, so a chain of
    normalizations (each reading the one before) stays linear in size."""

    def __init__(self, renderer: CudaRenderer, region: Graph, pointers: dict[int, str]) -> None:
        super().__init__(renderer, region, pointers)
        self.candidates = _stage_candidates(region, 4 if renderer.dtype == "f32" else 8)
        self.staged: dict[int, str] = {}  # node id -> its local array
        self.stage_next: str | None = None  # the array the next loop's terms go to

    def _lookup(self, key: tuple[int, str, str]) -> str | None:
        if key[0] in self.staged:
            return f"{self.staged[key[0]]}[{key[2]}]"
        return super()._lookup(key)

    def render(self, node: Node, row: str, col: str) -> str:
        operand = node.inputs[0] if node.op in REDUCTIONS else None
        if operand not in self.candidates or operand in self.staged:
            return super().render(node, row, col)
        array = self.fresh("stage")
        self.emit(f"{self.r.ctype} {array}[{width(self.region.node(operand).shape)}];")
        self.stage_next = array  # a reduction's rule opens its loop first
        expr = super().render(node, row, col)
        self.staged[operand] = array
        return expr

    def loop(self, count: str, term: Callable[[str], str],
             combine: Callable[[str, str], str] | None = None, init: str | None = None) -> str:
        array, self.stage_next = self.stage_next, None
        if array is None:
            return super().loop(count, term, combine, init)

        def staged(k: str) -> str:
            value = term(k)
            self.emit(f"{array}[{k}] = {value};")
            return value

        return super().loop(count, staged, combine, init)


def _stage_candidates(region: Graph, itemsize: int) -> set[int]:
    """The reduction operands a row kernel keeps: computed in the region, read by more than
    their reduction (or a result), within :data:`STAGE_BYTES` together."""
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
        size = width(x.shape) * itemsize
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
    """One kernel computing every output of ``region``, one thread per row
    (:func:`row_shape` must not be None)."""
    rows = row_shape(region)
    assert rows is not None, "a row kernel needs a region that reduces, with one row shape"
    pointers = {nid: f"in{i}" for i, nid in enumerate(region.args().values())}
    writer = RowWriter(renderer, region, pointers)
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
                writer.emit(f"out{k}[row] = {writer.value(outputs[k], 'row', '0')};")
            continue
        # Values of the row (reductions and what reads only them) go before the loop.
        loop = Scope(f"for (long long col = 0; col < {w}; ++col) {{", "col")
        root.open_loop(loop)
        writer.scopes.append(loop)
        for k in members:
            writer.emit(f"out{k}[row * {w} + col] = {writer.value(outputs[k], 'row', 'col')};")
        writer.scopes.pop()
        root.close_loop()
    body = [f"    const long long total = {product(rows)};", *GRID_LOOP,
            "        const long long row = idx;", *root.lines(2), "    }", "}"]
    return kernel_head(name, region, renderer, comment) + "\n".join(body) + "\n"
