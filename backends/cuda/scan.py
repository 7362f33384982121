"""The CUDA C kernels of the ops over the time axis: ``linear_scan`` and ``last_step``.

``linear_scan`` has one thread per element of a step (a batch row and a feature), which loops
over the steps in the scan's direction with the running value in a register, in the same
grid-stride form and parameter order as every other kernel (``in0, in1, ..., out0, T, B``)::

    for (long long idx = ...; idx < n; idx += stride) {      // n = B * 4: one step's elements
        const long long row = idx / 4;
        const long long col = idx % 4;
        float c = in2[idx];
        for (long long k = 0; k < T; ++k) {
            const long long t = k;                            // T - 1 - k when reverse
            const float a = in0[t * (B * 4) + row * 4 + col];  // A, broadcast: stride 0
            const float next = a * c + in1[col];               // Bv a (4,) vector here
            out0[t * n + idx] = next;                          // c before it when exclusive
            c = next;
        }
    }

A constant operand is a literal in the source. ``last_step`` copies one step's slice.
"""

from __future__ import annotations

from collections.abc import Mapping

from rnnc import ops
from rnnc.backends.cuda.kernels import product
from rnnc.backends.cuda.rules import CudaRenderer
from rnnc.backends.schedule import Step
from rnnc.ir import Node, Shape

_GRID_LOOP = [
    "    const long long stride = (long long)gridDim.x * blockDim.x;",
    "    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;",
    "         idx += stride) {",
]


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


def _head(renderer: CudaRenderer, comment: str, inputs: int) -> list[str]:
    t = renderer.ctype
    params = [f"const {t}* __restrict__ in{i}" for i in range(inputs)]
    params += [f"{t}* __restrict__ out0", "long long T", "long long B"]
    return [f"// {comment}", 'extern "C" __global__ void @KERNEL@(',
            ",\n".join("    " + p for p in params) + ") {"]


def _linear_scan(step: Step, nodes: Mapping[int, Node], renderer: CudaRenderer
                 ) -> tuple[str, tuple[int, ...]]:
    out = step.node.shape
    (a, b, _), passed = _operands(step, nodes, renderer)
    c0 = f"in{len(passed) - 1}[idx]"  # a per-step value of the result's step shape
    reverse, exclusive = bool(step.attrs.get("reverse")), bool(step.attrs.get("exclusive"))
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
              f"            out0[t * n + idx] = {'c' if exclusive else 'next'};",
              "            c = next;",
              "        }", "    }", "}"]
    return "\n".join(lines) + "\n", passed


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
    its operands in order (constants are literals in the source)."""
    return KERNELS[step.op](step, nodes, renderer)
