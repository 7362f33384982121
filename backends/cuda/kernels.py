"""The CUDA C kernel of one region: every output, written element by element.

Every kernel has one thread per output element in a grid-stride loop, no shared memory and no
warp intrinsics, so the emulator can run it thread after thread. Its parameters are one
``const T* __restrict__`` per operand, one ``T* __restrict__`` per result, then ``long long T,
long long B``, the sizes of the symbolic dims: every other size is a literal. An operand is
read at element (row, col) of its own shape, so broadcasting is index arithmetic::

    extern "C" __global__ void k_0(const float* __restrict__ in0, const float* __restrict__ in1,
                                   float* __restrict__ out0, long long T, long long B) {
        const long long n0 = B * 4;
        ...
        for (long long idx = ...; idx < total; idx += stride) {
            if (idx < n0) {
                const long long row = idx / 4;
                const long long col = idx % 4;
                const float v0 = in0[row * 4 + col];   // (B, 4) operand
                const float v1 = in1[col];             // (4,) operand, broadcast over rows
                const float v2 = (v0 + v1);
                out0[idx] = v2;
            }
        }
    }

A fused node's region becomes the body of one kernel; its results are grouped by shape and each
group computes its elements under ``if (idx < n_group)``, sharing temporaries. A reduction loops
over the reduced axis inside the thread (a lone ``sum``/``mean``: one thread per row). A region
that reduces over features and whose results share one row shape gets the one-block-per-row
kernel of :mod:`.rows` instead, built on the same writer. The source is deterministic text
without node ids.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rnnc import ops
from rnnc.backends.cuda.rules import RULES, CudaRenderer
from rnnc.ir import ARG, Graph, Node, Shape

IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def dim(d: int | str) -> str:
    """A dim as C: a literal, or the kernel parameter ``T``/``B``."""
    return str(d)


def product(dims: Shape) -> str:
    """The product of ``dims`` as C (``"1"`` for none)."""
    if not dims:
        return "1"
    literal = math.prod(d for d in dims if isinstance(d, int))
    symbols = [d for d in dims if isinstance(d, str)]
    if not symbols:
        return str(literal)
    parts = symbols + ([str(literal)] if literal != 1 else [])
    return "(" + " * ".join(parts) + ")" if len(parts) > 1 else parts[0]


def lead(shape: Shape) -> Shape:
    """The leading (row) dims of a shape; a scalar and a vector have none."""
    return tuple(shape[:-1])


def width(shape: Shape) -> int:
    """The last dim (1 for a scalar)."""
    return shape[-1] if shape else 1


def broadcast_row(consumer: Shape, operand: Shape, row: str) -> str:
    """The operand's own row index at row ``row`` of a consumer it broadcasts to."""
    c, o = lead(consumer), lead(operand)
    while o and o[0] == 1:
        o = o[1:]
    if all(d == 1 for d in o):
        return "0"
    if o == c:
        return row
    if len(o) <= len(c) and c[len(c) - len(o):] == o:
        return f"({row} % {product(o)})"
    # General broadcasting: split the row into coordinates, drop the broadcast ones.
    terms = []
    shift = len(c) - len(o)
    for i, d in enumerate(o):
        if d == 1:
            continue
        a = i + shift
        coordinate = f"(({row} / {product(c[a + 1:])}) % {dim(c[a])})"
        inner = product(o[i + 1:])
        terms.append(coordinate if inner == "1" else f"{coordinate} * {inner}")
    return "(" + " + ".join(terms) + ")"


@dataclass
class Scope:
    """A block of statements: the kernel body, or a reduction loop (``head`` opens it)."""

    head: str = ""
    var: str | None = None  # the loop variable
    items: list[str | Scope] = field(default_factory=list)
    memo: dict[tuple[int, str, str], str] = field(default_factory=dict)
    # Positions in ``items`` of the loops still being written, the newest (and first) last.
    writing: list[int] = field(default_factory=list)

    def add(self, item: str | Scope) -> None:
        """Add a statement or loop at the end, but before any loop still being written."""
        if not self.writing:
            self.items.append(item)
            return
        self.items.insert(self.writing[-1], item)
        self.writing = [at + 1 for at in self.writing]

    def open_loop(self, block: Scope) -> None:
        """Add ``block``; statements go before it until :meth:`close_loop`."""
        at = self.writing[-1] if self.writing else len(self.items)
        self.add(block)
        self.writing.append(at)

    def close_loop(self) -> None:
        self.writing.pop()

    def lines(self, depth: int) -> list[str]:
        """The block as indented source lines."""
        out = []
        for item in self.items:
            if isinstance(item, Scope):
                out += ["    " * depth + item.head, *item.lines(depth + 1), "    " * depth + "}"]
            else:
                out.append("    " * depth + item)
        return out


class KernelWriter:
    """Emits the statements computing elements of a region's nodes, memoized by index.

    A value whose index does not use a loop's variable is computed before that loop, so a
    reduction never recomputes its loop-invariant operands (layer norm's mean) per iteration.
    """

    def __init__(self, renderer: CudaRenderer, region: Graph, pointers: dict[int, str]) -> None:
        self.r = renderer
        self.region = region
        self.pointers = pointers
        self.scopes = [Scope()]
        self.count = 0

    def fresh(self, prefix: str) -> str:
        """A new local name; numbered per kernel so equal kernels get equal text."""
        self.count += 1
        return f"{prefix}{self.count - 1}"

    def emit(self, line: str) -> None:
        """Add one statement to the innermost block being written."""
        self.scopes[-1].add(line)

    def value(self, nid: int, row: str, col: str) -> str:
        """A C expression (a temporary's name) for element (row, col) of node ``nid``."""
        key = self._key(nid, row, col)
        found = self._lookup(key)
        if found is not None:
            return found
        self._operands_first(key)
        return self._emit_value(key)

    def _key(self, nid: int, row: str, col: str) -> tuple[int, str, str]:
        shape = self.region.node(nid).shape
        row = row if lead(shape) and any(d != 1 for d in lead(shape)) else "0"
        col = col if width(shape) != 1 else "0"
        return nid, row, col

    def _lookup(self, key: tuple[int, str, str]) -> str | None:
        for scope in reversed(self.scopes):
            if key in scope.memo:
                return scope.memo[key]
        return None

    def _operands_first(self, key: tuple[int, str, str]) -> None:
        """Emit every element ``key``'s rule reads (outside reduction loops) before it, deepest
        first, with an explicit stack: a chain of thousands of ops must not recurse."""
        stack: list[tuple[tuple[int, str, str], bool]] = [(key, False)]
        while stack:
            item, expanded = stack.pop()
            if self._lookup(item) is not None:
                continue
            if expanded:
                if item != key:
                    self._emit_value(item)
                continue
            stack.append((item, True))
            stack.extend((read, False) for read in reversed(self._reads(item))
                         if self._lookup(read) is None)

    def _reads(self, key: tuple[int, str, str]) -> list[tuple[int, str, str]]:
        """The elements the rule of ``key`` reads before any loop, found by running it on a
        site that records reads instead of emitting them."""
        node = self.region.node(key[0])
        if node.op is ARG:
            return []
        site = _RecordingSite(self, node, key[1], key[2])
        try:
            RULES[node.op](site)
        except _LoopReached:
            pass
        return site.reads

    def _emit_value(self, key: tuple[int, str, str]) -> str:
        nid, row, col = key
        node = self.region.node(nid)
        used = set(IDENTIFIER.findall(f"{row} {col}"))
        level = max(i for i, scope in enumerate(self.scopes) if i == 0 or scope.var in used)
        if level < len(self.scopes) - 1:
            # Loop-invariant here: compute it in the block of the outermost loop it needs.
            inner = self.scopes[level + 1:]
            del self.scopes[level + 1:]
            name = self.value(nid, row, col)
            self.scopes += inner
            return name
        if node.op is ARG:
            expr = self.load(nid, row, col)
        else:
            expr = self.render(node, row, col)
            if IDENTIFIER.fullmatch(expr) or node.op is ops.constant:
                # A literal, or another element already named (a layout op reading one
                # operand): no temporary.
                self.scopes[-1].memo[key] = expr
                return expr
        name = self.fresh("v")
        self.emit(f"const {self.r.ctype} {name} = {expr};")
        self.scopes[-1].memo[key] = name
        return name

    def load(self, nid: int, row: str, col: str) -> str:
        """The C expression reading element (row, col) of the region argument ``nid``: its
        kernel operand in global memory (a fused step's epilogue reads the product from the
        accumulators instead, :mod:`.fused_step`)."""
        w = width(self.region.node(nid).shape)
        index = col if row == "0" else (f"{row} * {w} + {col}" if col != "0" else f"{row} * {w}")
        return f"{self.pointers[nid]}[{index}]"

    def render(self, node: Node, row: str, col: str) -> str:
        """The C expression of ``node``'s rule at element (row, col)."""
        return RULES[node.op](ElementSite(self, node, row, col))

    def loop(self, count: str, term: Callable[[str], str],
             combine: Callable[[str, str], str] | None = None, init: str | None = None) -> str:
        """Accumulate ``term(k)`` over ``k < count`` into a new temporary: its sum, or with
        ``combine``, ``acc = combine(acc, term(k))`` starting from ``init``."""
        acc, k = self.fresh("acc"), self.fresh("k")
        self.emit(f"{self.r.ctype} {acc} = {self.r.zero if init is None else init};")
        block = Scope(f"for (long long {k} = 0; {k} < {count}; ++{k}) {{", k)
        parent = self.scopes[-1]
        parent.open_loop(block)
        self.scopes.append(block)
        value = term(k)
        self.emit(f"{acc} += {value};" if combine is None else f"{acc} = {combine(acc, value)};")
        self.scopes.pop()
        parent.close_loop()
        return acc


@dataclass
class ElementSite:
    """The rules' view of one element of ``node``'s result (see rules.Site)."""

    writer: KernelWriter
    node: Node
    row: str
    col: str

    @property
    def r(self) -> CudaRenderer:
        return self.writer.r

    @property
    def attrs(self) -> dict:
        return dict(self.node.attrs)

    @property
    def arity(self) -> int:
        return len(self.node.inputs)

    def _shape(self, i: int) -> Shape:
        return self.writer.region.node(self.node.inputs[i]).shape

    def at(self, i: int, row: str | None = None, col: str | None = None) -> str:
        if row is None:
            row = broadcast_row(self.node.shape, self._shape(i), self.row)
        return self.writer.value(self.node.inputs[i], row, self.col if col is None else col)

    def width(self, i: int) -> int:
        return width(self._shape(i))

    def operand_shape(self, i: int) -> Shape:  # the tensor ops' rules read whole shapes
        return tuple(self._shape(i))

    def rows(self, i: int) -> str:
        return product(lead(self._shape(i)))

    def loop(self, count: str, term: Callable[[str], str],
             combine: Callable[[str, str], str] | None = None, init: str | None = None) -> str:
        return self.writer.loop(count, term, combine, init)


class _LoopReached(Exception):
    """A rule being recorded started a reduction loop: reads inside it are made later."""


class _RecordingSite(ElementSite):
    """An element site that notes the elements a rule reads and emits nothing."""

    def __init__(self, writer: KernelWriter, node: Node, row: str, col: str) -> None:
        super().__init__(writer, node, row, col)
        self.reads: list[tuple[int, str, str]] = []

    def at(self, i: int, row: str | None = None, col: str | None = None) -> str:
        if row is None:
            row = broadcast_row(self.node.shape, self._shape(i), self.row)
        key = self.writer._key(self.node.inputs[i], row, self.col if col is None else col)
        self.reads.append(key)
        return f"read{len(self.reads) - 1}"

    def loop(self, count: str, term: Callable[[str], str],
             combine: Callable[[str, str], str] | None = None, init: str | None = None) -> str:
        raise _LoopReached


def kernel_head(name: str, region: Graph, renderer: CudaRenderer, comment: str) -> str:
    """A kernel's comment line and signature, through its opening brace: one pointer per
    operand of ``region`` (args in order), one per result, then the sizes ``T`` and ``B``."""
    t = renderer.ctype
    params = [f"const {t}* __restrict__ in{i}" for i in range(len(region.args()))]
    params += [f"{t}* __restrict__ out{k}" for k in range(len(region.outputs))]
    params += ["long long T", "long long B"]
    head = [f"// {comment}", f'extern "C" __global__ void {name}(']
    return "\n".join(head) + "\n" + ",\n".join("    " + p for p in params) + ") {\n"


GRID_LOOP = [
    "    const long long stride = (long long)gridDim.x * blockDim.x;",
    "    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;",
    "         idx += stride) {",
]


def writer_for(region: Graph, renderer: CudaRenderer) -> KernelWriter:
    """A writer for ``region`` whose args read the kernel's operands ``in0, in1, ...``."""
    pointers = {nid: f"in{i}" for i, nid in enumerate(region.args().values())}
    return KernelWriter(renderer, region, pointers)


def kernel_source(name: str, region: Graph, renderer: CudaRenderer, comment: str) -> str:
    """One kernel computing every output of ``region`` (args in order are the operands), one
    thread per element."""
    writer = writer_for(region, renderer)
    outputs = list(region.outputs.values())
    groups: dict[Shape, list[int]] = {}
    for k, nid in enumerate(outputs):
        groups.setdefault(tuple(region.node(nid).shape), []).append(k)
    sizes = [product(shape) for shape in groups]
    body = [f"    const long long n{g} = {size};" for g, size in enumerate(sizes)]
    total = "n0"
    for g in range(1, len(sizes)):
        total = f"rnnc_max({total}, n{g})"
    body += [f"    const long long total = {total};", *GRID_LOOP]
    for g, (shape, members) in enumerate(groups.items()):
        writer.scopes = [Scope()]
        values = [writer.value(outputs[k], "row", "col") for k in members]
        lines = writer.scopes[0].lines(3)
        used = " ".join(lines)
        body.append(f"        if (idx < n{g}) {{")
        w = width(shape)
        if re.search(r"\brow\b", used):
            body.append(f"            const long long row = idx / {w};" if w != 1
                        else "            const long long row = idx;")
        if re.search(r"\bcol\b", used):
            body.append(f"            const long long col = idx % {w};")
        body += lines
        body += [f"            out{k}[idx] = {v};" for k, v in zip(members, values, strict=True)]
        body.append("        }")
    body += ["    }", "}"]
    return kernel_head(name, region, renderer, comment) + "\n".join(body) + "\n"
