"""The CUDA C kernels of the ops over the time axis: ``linear_scan`` and ``last_step``.

``linear_scan`` has two kernels with the same parameters (``in0, in1, ..., out0, T, B``, the
order of every other kernel). Both are rendered, and the host picks one when it plans a call
(:func:`chunked_geometry`), not when rendering: the columns are ``B * n`` and ``B``, like T,
is known only then.

- **One thread per column** (a batch row and a feature, an element of a step), which loops over
  all T steps in the scan's direction with the running value in a register, in grid-stride
  form::

      for (long long idx = ...; idx < n; idx += stride) {      // n = B * 4: one step's columns
          const long long row = idx / 4;
          const long long col = idx % 4;
          float c = in2[row * 4 + col];
          for (long long k = 0; k < T; ++k) {
              const long long t = k;                            // T - 1 - k when reverse
              const float next = in0[t * (B * 4) + row * 4 + col] * c + in1[col];
              out0[t * n + idx] = next;                         // c before it when exclusive
              c = next;
          }
      }

  Its critical path is T dependent steps, which is right where the columns alone fill the GPU.

- **Chunked** (:func:`chunked_kernel`): a block of ``COLUMNS * CHUNKS`` threads takes
  ``COLUMNS`` adjacent columns (thread ``x`` has column ``x % COLUMNS``, so a warp reads one
  step's columns coalesced) and splits the steps into ``CHUNKS`` chunks of ``ceil(T / CHUNKS)``
  steps (chunk ``x / COLUMNS``; an empty chunk is the identity, A = 1 and Bv = 0). Pass 1: chunk
  0 runs from ``c0`` and writes its results, ending with the carry into chunk 1; every later
  chunk but the last composes its aggregate (the product of its A, the value it maps 0 to) in
  registers, and all go to shared memory. ``__syncthreads()``. The first warp turns the
  aggregates into each chunk's carry-in, serially over the chunks per column: CHUNKS - 2
  multiply-adds, as short as a chunk and without the log2(CHUNKS) barriers a tree scan would
  need. ``__syncthreads()``. Pass 2: every chunk but the first rescans its steps from its
  carry-in, writing its results. The critical path is about ``2 T / CHUNKS + CHUNKS`` steps
  instead of T, for reading A and Bv twice; blocks never talk to each other.

Operands broadcast to the ``(T, rows..., n)`` result through strides of 0 (a ``(n,)`` decay,
a ``(T, B, 1)`` mask), read by :func:`_read`; a constant operand is a literal in the source.
``last_step`` copies one step's slice.

The geometry (``COLUMNS``, ``CHUNKS``: ``CudaSchedule.scan_columns``, ``.scan_chunks``) and
the thresholds of the choice (``.scan_chunked_max_columns``, ``.scan_chunked_min_steps``) are
untuned: chosen from the shape of the work, not yet measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

from rnnc import ops
from rnnc.backends.cuda.kernels import product
from rnnc.backends.cuda.rules import CudaRenderer
from rnnc.backends.schedule import CudaSchedule
from rnnc.backends.steps import Step
from rnnc.ir import Node, Shape

_GRID_LOOP = [
    "    const long long stride = (long long)gridDim.x * blockDim.x;",
    "    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;",
    "         idx += stride) {",
]


def chunked_geometry(steps: int, columns: int, schedule: CudaSchedule | None = None
                     ) -> tuple[int, int] | None:
    """The (grid, block) of the chunked ``linear_scan`` kernel for ``steps`` steps of
    ``columns`` columns (batch rows x features), or None where one thread per column is the
    better form, as ``schedule`` (None: the defaults) says: many columns, or few steps."""
    schedule = schedule or CudaSchedule()
    if columns >= schedule.scan_chunked_max_columns or columns <= 0 \
            or steps < schedule.scan_chunked_min_steps:
        return None
    return -(-columns // schedule.scan_columns), schedule.scan_columns * schedule.scan_chunks


def _read(pointer: str, shape: Shape, out: Shape) -> str:
    """Operand ``pointer`` of ``shape`` at step ``t``, row ``row`` and column ``col`` of a
    ``(T, rows..., n)`` result it broadcasts to."""
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    terms = []
    if full[0] != 1:
        terms.append(f"t * {product(full[1:])}")
    if any(d != 1 for d in full[1:-1]):
        terms.append(f"row * {full[-1]}")
    if full[-1] != 1:
        terms.append("col")
    return f"{pointer}[{' + '.join(terms) or '0'}]"


def _operands(step: Step, nodes: Mapping[int, Node], renderer: CudaRenderer
              ) -> tuple[list[str], tuple[int, ...]]:
    """Each operand's C value at the element being computed (a literal for a constant) and
    the node ids passed to the kernel, in order."""
    out = step.node.shape
    values, passed = [], []
    for nid in step.inputs:
        node = nodes[nid]
        if node.op is ops.constant:
            values.append(renderer.literal(node.attrs["value"]))
        else:
            values.append(_read(f"in{len(passed)}", node.shape, out))
            passed.append(nid)
    return values, tuple(passed)


def _head(renderer: CudaRenderer, comment: str, inputs: int, threads: int = 0) -> list[str]:
    """The kernel's comment and signature; ``threads``: the block size it is always launched
    with, which nvcc must fit the registers to (a 1024-thread block allows 64 per thread)."""
    t = renderer.ctype
    params = [f"const {t}* __restrict__ in{i}" for i in range(inputs)]
    params += [f"{t}* __restrict__ out0", "long long T", "long long B"]
    bounds = f"__launch_bounds__({threads}) " if threads else ""
    return [f"// {comment}", f'extern "C" __global__ void {bounds}@KERNEL@(',
            ",\n".join("    " + p for p in params) + ") {"]


def _direction(step: Step) -> tuple[bool, bool, str]:
    """reverse, exclusive, and the C value written at a step: before it or after it."""
    reverse, exclusive = bool(step.attrs.get("reverse")), bool(step.attrs.get("exclusive"))
    return reverse, exclusive, "c" if exclusive else "next"


def _linear_scan(step: Step, nodes: Mapping[int, Node], renderer: CudaRenderer
                 ) -> tuple[str, tuple[int, ...]]:
    out = step.node.shape
    (a, b, c0), passed = _operands(step, nodes, renderer)
    reverse, exclusive, written = _direction(step)
    t = renderer.ctype
    lines = _head(renderer, f"linear_scan[reverse={reverse}, exclusive={exclusive}], one "
                            f"thread per element of a step", len(passed))
    lines += [f"    const long long n = {product(out[1:])};", *_GRID_LOOP,
              f"        const long long row = idx / {out[-1]};",
              f"        const long long col = idx % {out[-1]};",
              f"        {t} c = {c0};",
              "        for (long long k = 0; k < T; ++k) {",
              f"            const long long t = {'T - 1 - k' if reverse else 'k'};",
              f"            const {t} next = {a} * c + {b};",
              f"            out0[t * n + idx] = {written};",
              "            c = next;",
              "        }", "    }", "}"]
    return "\n".join(lines) + "\n", passed


def _chunk_loop(reverse: bool, body: list[str], indent: str = "        ") -> list[str]:
    """A loop over this chunk's steps ``[first, last)`` in scan order, step ``t`` in time."""
    return [f"{indent}for (long long k = first; k < last; ++k) {{",
            f"{indent}    const long long t = {'T - 1 - k' if reverse else 'k'};",
            *(indent + "    " + line for line in body), f"{indent}}}"]


def _chunk_setup(out: Shape, renderer: CudaRenderer, geometry: tuple[int, int]) -> list[str]:
    """The chunked kernel's shared buffers and this thread's column and chunk of steps."""
    (COLUMNS, CHUNKS), t = geometry, renderer.ctype  # noqa: N806 - the names the module doc uses
    width = COLUMNS * CHUNKS
    return [
        "    // Per chunk and column: its aggregate (product of A, value it maps 0 to), then",
        "    // its carry-in. Slot threadIdx.x = chunk * COLUMNS + lane.",
        f"    __shared__ {t} chunk_a[{width}];",
        f"    __shared__ {t} chunk_b[{width}];",
        f"    const long long n = {product(out[1:])};",
        f"    const int lane = threadIdx.x % {COLUMNS};",
        f"    const int chunk = threadIdx.x / {COLUMNS};",
        f"    const long long idx = (long long)blockIdx.x * {COLUMNS} + lane;",
        "    const bool live = idx < n;  // a column past the last still reaches the barriers",
        f"    const long long row = idx / {out[-1]};",
        f"    const long long col = idx % {out[-1]};",
        f"    const long long length = (T + {CHUNKS - 1}) / {CHUNKS};",
        "    const long long first = chunk * length;  // in scan order; empty past T",
        "    const long long last = first + length < T ? first + length : T;",
    ]


def _carry_ins(renderer: CudaRenderer, geometry: tuple[int, int]) -> list[str]:
    """The first warp turns the aggregates into carry-ins: ``chunk_b`` of chunk k becomes the
    value before its first step (chunk 0's slot holds its end value, chunk 1's carry-in)."""
    (COLUMNS, CHUNKS), t = geometry, renderer.ctype  # noqa: N806
    return [
        "    if (chunk == 0) {  // serially over the chunks, one thread per column",
        f"        {t} c = chunk_b[lane];",
        f"        for (int k = 1; k < {CHUNKS - 1}; ++k) {{",
        f"            const {t} next = chunk_a[k * {COLUMNS} + lane] * c + "
        f"chunk_b[k * {COLUMNS} + lane];",
        f"            chunk_b[k * {COLUMNS} + lane] = c;",
        "            c = next;",
        "        }",
        f"        chunk_b[{(CHUNKS - 1) * COLUMNS} + lane] = c;",
        "    }",
    ]


def chunked_kernel(step: Step, nodes: Mapping[int, Node], renderer: CudaRenderer,
                   geometry: tuple[int, int] | None = None) -> str:
    """The source of the chunked ``linear_scan`` kernel of ``step`` (module doc), named
    ``@KERNEL@``, for blocks of ``geometry`` = (``COLUMNS``, ``CHUNKS``) (the schedule's
    ``scan_columns``, ``scan_chunks``); its operands are :func:`scan_kernel`'s."""
    default = CudaSchedule()
    geometry = geometry or (default.scan_columns, default.scan_chunks)
    COLUMNS, CHUNKS = geometry  # noqa: N806
    (a, b, c0), passed = _operands(step, nodes, renderer)
    reverse, exclusive, written = _direction(step)
    t = renderer.ctype
    apply = [f"const {t} next = {a} * c + {b};", f"out0[t * n + idx] = {written};", "c = next;"]
    compose = [f"const {t} a = {a};", "aggregate_a = a * aggregate_a;",
               f"aggregate_b = a * aggregate_b + {b};"]
    lines = _head(renderer, f"linear_scan[reverse={reverse}, exclusive={exclusive}], chunked: "
                            f"blocks of {COLUMNS} columns x {CHUNKS} chunks of the steps",
                  len(passed), COLUMNS * CHUNKS)
    lines += [
        *_chunk_setup(step.node.shape, renderer, geometry),
        f"    {t} aggregate_a = {renderer.one};",
        f"    {t} aggregate_b = {renderer.zero};",
        "    if (live && chunk == 0) {  // from c0: final results, and chunk 1's carry-in",
        f"        {t} c = {c0};",
        *_chunk_loop(reverse, apply),
        "        aggregate_b = c;",
        f"    }} else if (live && chunk < {CHUNKS - 1}) {{  // the last chunk's is never used",
        *_chunk_loop(reverse, compose),
        "    }",
        "    chunk_a[threadIdx.x] = aggregate_a;",
        "    chunk_b[threadIdx.x] = aggregate_b;",
        "    __syncthreads();",
        *_carry_ins(renderer, geometry),
        "    __syncthreads();",
        "    if (live && chunk > 0) {  // rescan from the carry-in",
        f"        {t} c = chunk_b[threadIdx.x];",
        *_chunk_loop(reverse, apply),
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _last_step(step: Step, nodes: Mapping[int, Node], renderer: CudaRenderer
               ) -> tuple[str, tuple[int, ...]]:
    at = "idx" if step.attrs.get("reverse") else "(T - 1) * n + idx"
    lines = _head(renderer, f"last_step[reverse={bool(step.attrs.get('reverse'))}]", 1)
    lines += [f"    const long long n = {product(step.node.shape)};", *_GRID_LOOP,
              f"        out0[idx] = in0[{at}];", "    }", "}"]
    return "\n".join(lines) + "\n", tuple(step.inputs)


KERNELS = {ops.linear_scan: _linear_scan, ops.last_step: _last_step}


def scan_kernel(step: Step, nodes: Mapping[int, Node], renderer: CudaRenderer
                ) -> tuple[str, tuple[int, ...]]:
    """The source of the kernel computing ``step``, named ``@KERNEL@``, and the node ids of
    its operands in order (constants are literals in the source). For ``linear_scan`` this
    is the one-thread-per-column kernel; :func:`chunked_kernel` is the other."""
    return KERNELS[step.op](step, nodes, renderer)
