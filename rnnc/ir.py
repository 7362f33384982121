"""The IR: typed nodes in a networkx graph, and programs made of a pre-loop graph, a scan, and a
post-loop graph.

A program runs over an environment of named arrays. Each graph reads its ``arg`` nodes from the
environment by name and writes its outputs back by name; the scan reads per-step slices of
sequences, loop constants and carried values, and writes stacked per-step outputs and final
carried values. Every analysis a pass needs (topological order, ancestors, users, components)
comes from the networkx ``MultiDiGraph`` whose edge key is the operand position.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx

from rnnc import ops
from rnnc.errors import RnncValueError, ShapeError
from rnnc.ops import Op, Shape

DTYPES = ("f32", "f64")


@dataclass(frozen=True)
class Type:
    """A dtype and a shape whose dims are ints or the symbols "T" and "B"."""

    dtype: str
    shape: Shape

    def __str__(self) -> str:
        return self.dtype + ops.fmt_shape(self.shape)


@dataclass(frozen=True)
class TupleType:
    """The type of a node with several results (a fused region)."""

    items: tuple[Type, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.items)) + ")"


def _structural(name: str) -> Op:
    return Op(name, ops.OpKind.STRUCTURAL, None, lambda *a, **k: None, lambda *a, **k: None)


ARG = _structural("arg")  # a graph input, read from the environment by name
GET = _structural("get")  # one result of a multi-result node
FUSED = _structural("fused")  # an elementwise region, emitted as one loop or one kernel
STRUCTURAL = {op.name: op for op in (ARG, GET, FUSED)}  # by name, for op_types.op_named


@dataclass(frozen=True)
class Node:
    """One equation: ``id = op[attrs](inputs) : type``."""

    id: int
    op: Op
    inputs: tuple[int, ...]
    attrs: Mapping[str, Any]
    type: Type | TupleType
    origin: str = "dsl"  # the pass (or "dsl") that made this node
    loc: str | None = None  # user source line, for error messages

    @property
    def shape(self) -> Shape:
        assert isinstance(self.type, Type), self
        return self.type.shape


class Graph:
    """A DAG of nodes with named inputs (``arg`` nodes) and named outputs."""

    _ids = itertools.count()

    def __init__(self, dtype: str = "f32") -> None:
        self.dtype = dtype
        self.nx = nx.MultiDiGraph()
        self.outputs: dict[str, int] = {}
        self._order: list[int] | None = None  # topological order, until the next edit
        self._args: dict[str, int] | None = None

    def _edited(self) -> None:
        """Forget the cached order: every structural edit goes through here."""
        self._order = None

    # -- construction
    def _insert(self, node: Node) -> int:
        self._edited()
        if node.op is ARG and self._args is not None:
            self._args[node.attrs["name"]] = node.id
        self.nx.add_node(node.id, node=node)
        for pos, src in enumerate(node.inputs):
            self.nx.add_edge(src, node.id, key=pos)
        return node.id

    def arg(self, name: str, shape: Shape, role: str, origin: str = "dsl") -> int:
        """Add an input read from the environment under ``name``."""
        if name in self._arg_index():
            raise RnncValueError(f"graph already has an input named {name!r}")
        node = Node(next(self._ids), ARG, (), {"name": name, "role": role},
                    Type(self.dtype, tuple(shape)), origin)
        return self._insert(node)

    def add(self, op: Op, inputs: Iterable[int] = (), attrs: Mapping[str, Any] | None = None,
            origin: str = "dsl", loc: str | None = None) -> int:
        """Add ``op(inputs)`` with its type inferred by the op's shape rule."""
        inputs = tuple(inputs)
        attrs = dict(attrs or {})
        if op.arity is not None and len(inputs) != op.arity:
            raise ShapeError(f"{op.name} takes {op.arity} operands, got {len(inputs)}")
        ty = self._infer(op, inputs, attrs)
        return self._insert(Node(next(self._ids), op, inputs, attrs, ty, origin, loc))

    def add_fused(self, region: Graph, inputs: Iterable[int], origin: str) -> int:
        """Add a fused elementwise node computing ``region`` (args in order = inputs)."""
        ty = TupleType(tuple(region.node(o).type for o in region.outputs.values()))
        node = Node(next(self._ids), FUSED, tuple(inputs), {"region": region}, ty, origin)
        return self._insert(node)

    def get(self, tup: int, index: int, origin: str) -> int:
        ty = self.node(tup).type.items[index]
        return self._insert(Node(next(self._ids), GET, (tup,), {"index": index}, ty, origin))

    def _infer(self, op: Op, inputs: tuple[int, ...], attrs: dict) -> Type:
        shapes = [self.node(i).shape for i in inputs]
        return Type(self.dtype, tuple(op.shape(*shapes, **attrs)))

    # -- queries
    def node(self, nid: int) -> Node:
        return self.nx.nodes[nid]["node"]

    def nodes(self) -> list[Node]:
        return [self.node(n) for n in self.topo()]

    def topo(self) -> list[int]:
        """Deterministic topological order (creation order breaks ties), once per edit."""
        if self._order is None:
            self._order = list(nx.lexicographical_topological_sort(self.nx))
        return list(self._order)

    def _arg_index(self) -> dict[str, int]:
        """Input name -> node, kept up to date by ``_insert`` and ``remove``."""
        if self._args is None:
            self._args = {self.node(n).attrs["name"]: n for n in sorted(self.nx.nodes)
                          if self.node(n).op is ARG}
        return self._args

    def args(self) -> dict[str, int]:
        """Input name -> node, in node order."""
        return dict(sorted(self._arg_index().items(), key=lambda item: item[1]))

    def input_node(self, name: str) -> int | None:  # one look-up; args() sorts them all
        return self._arg_index().get(name)

    def users(self, nid: int) -> list[int]:
        return sorted({v for _, v in self.nx.out_edges(nid)})

    def ancestors(self, nid: int) -> set[int]:
        return nx.ancestors(self.nx, nid)

    def depends_on(self, sources: set[int]) -> set[int]:
        """Every node reachable from ``sources`` (sources included)."""
        out = set(sources)
        for s in sources:
            out |= nx.descendants(self.nx, s)
        return out

    def __len__(self) -> int:
        return self.nx.number_of_nodes()

    # -- rewriting
    def copy(self) -> Graph:
        g = Graph(self.dtype)
        g.nx = self.nx.copy()
        g.outputs = dict(self.outputs)
        return g

    def replace_all_uses(self, old: int, new: int) -> None:
        """Make every user of ``old`` (and every output) use ``new`` instead."""
        for user in self.users(old):
            node = self.node(user)
            inputs = tuple(new if i == old else i for i in node.inputs)
            self._rewire(replace(node, inputs=inputs))
        for name, o in self.outputs.items():
            if o == old:
                self.outputs[name] = new

    def _rewire(self, node: Node) -> None:
        self._edited()
        self.nx.remove_edges_from([(u, node.id, k) for u, _, k in
                                   self.nx.in_edges(node.id, keys=True)])
        self.nx.nodes[node.id]["node"] = node
        for pos, src in enumerate(node.inputs):
            self.nx.add_edge(src, node.id, key=pos)

    def remove(self, nid: int) -> None:
        self._edited()
        if self.node(nid).op is ARG and self._args is not None:
            self._args.pop(self.node(nid).attrs["name"], None)
        self.nx.remove_node(nid)

    def dead_code(self, keep_args: bool = True) -> set[int]:
        """Nodes that no output needs."""
        live: set[int] = set(self.outputs.values())
        stack = list(live)
        while stack:  # one walk up from every output at once
            for src in self.node(stack.pop()).inputs:
                if src not in live:
                    live.add(src)
                    stack.append(src)
        return {n for n in self.nx.nodes
                if n not in live and not (keep_args and self.node(n).op is ARG)}


@dataclass(frozen=True)
class Carry:
    """A value carried across steps: initial value from ``init``, final value to ``final``."""

    name: str
    init: str
    final: str | None


@dataclass(frozen=True)
class Scan:
    """A loop over time. Body args: ``seqs`` (sliced per step), ``consts`` and carries;
    body outputs: each carry's next value (same name), ``stacked`` per-step outputs (T, ...)
    and ``summed`` per-step outputs added up over the steps (gradient accumulators)."""

    body: Graph
    seqs: tuple[str, ...]
    consts: tuple[str, ...]
    carries: tuple[Carry, ...]
    stacked: tuple[str, ...]
    summed: tuple[str, ...] = ()
    reverse: bool = False


# program.meta[NO_GRAD]: the inputs declared ``grad=False``, which autodiff does not
# differentiate (absent when every input is differentiable).
NO_GRAD = "no_grad"
STAGES = ("args", "pre", "scan", "post")  # the order in which a program fills its environment


@dataclass(frozen=True)
class Program:
    """pre-loop graph, scan, post-loop graph over an environment of named arrays.

    ``args`` maps each name the caller provides to its role (a ``rnnc.names.Role``) and type;
    ``results`` names what the program returns.
    """

    args: Mapping[str, tuple[str, Type]]
    pre: Graph
    scan: Scan
    post: Graph
    results: tuple[str, ...]
    dtype: str = "f32"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def graphs(self) -> tuple[Graph, Graph, Graph]:
        return self.pre, self.scan.body, self.post

    def env_types(self, after: str = "post") -> dict[str, Type]:
        """The type of every name in the environment once stage ``after`` has run: the args,
        then the pre-loop outputs, the scan's stacked ([T,...]) and summed outputs and final
        carries, then the post-loop outputs (a later writer of a name wins)."""
        if after not in STAGES:
            raise RnncValueError(f"stage must be one of {STAGES}, got {after!r}")
        env = {name: ty for name, (_, ty) in self.args.items()}
        if after == "args":
            return env
        env.update(_output_types(self.pre))
        if after == "pre":
            return env
        body = self.scan.body
        for name in self.scan.stacked:
            ty = body.node(body.outputs[name]).type
            env[name] = Type(ty.dtype, ("T",) + ty.shape)
        for name in self.scan.summed:
            env[name] = body.node(body.outputs[name]).type
        for c in self.scan.carries:
            if c.final is not None:
                env[c.final] = env[c.init]
        if after == "scan":
            return env
        env.update(_output_types(self.post))
        return env

    def fingerprint(self) -> str:
        """The hex SHA-256 of the program's structure (see ``rnnc.fingerprint``)."""
        from rnnc.fingerprint import fingerprint  # it reads the IR: imported when asked

        return fingerprint(self)


def _output_types(g: Graph) -> dict[str, Type]:
    return {name: g.node(o).type for name, o in g.outputs.items()}


def verify(program: Program) -> None:
    """Check the program's structure and types; raise AssertionError naming the fault."""
    _check_graph(program.pre, "pre", program.env_types("args"), program.dtype)
    bound = _scan_bindings(program.scan, program.env_types("pre"))
    _check_graph(program.scan.body, "scan", bound, program.dtype)
    for name in program.scan.stacked + program.scan.summed:
        assert name in program.scan.body.outputs, f"scan: output {name!r} is never computed"
    _check_graph(program.post, "post", program.env_types("scan"), program.dtype)
    env = program.env_types()
    for r in program.results:
        assert r in env, f"result {r!r} is never computed"


def _scan_bindings(scan: Scan, env: Mapping[str, Type]) -> dict[str, Type]:
    """The type of each name the loop body may read, from the environment before the loop."""
    bound: dict[str, Type] = {}
    for name in scan.seqs:
        assert name in env, f"scan: sequence {name!r} is not in the environment"
        assert env[name].shape[0] == "T", f"scan: sequence {name!r} is {env[name]}, not [T,...]"
        bound[name] = Type(env[name].dtype, env[name].shape[1:])
    for name in scan.consts:
        assert name in env, f"scan: constant {name!r} is not in the environment"
        bound[name] = env[name]
    for c in scan.carries:
        assert c.init in env, f"scan: carry {c.name!r} init {c.init!r} not in the environment"
        bound[c.name] = env[c.init]
        assert c.name in scan.body.outputs, f"scan: carry {c.name!r} has no next value"
        assert scan.body.node(scan.body.outputs[c.name]).type == env[c.init], (
            f"scan: carry {c.name!r} changes type")
    assert set(scan.body.args()) <= set(bound), (
        f"scan: body inputs {sorted(set(scan.body.args()) - set(bound))} are not bound")
    return bound


def _check_graph(g: Graph, where: str, bound: Mapping[str, Type], dtype: str) -> None:
    assert nx.is_directed_acyclic_graph(g.nx), f"{where}: cycle"
    for node in g.nodes():
        _check_node(g, node, where, bound)
        assert node.type.dtype == dtype if isinstance(node.type, Type) else True
    for name, o in g.outputs.items():
        assert o in g.nx, f"{where}: output {name!r} refers to a missing node"


def _check_node(g: Graph, node: Node, where: str, bound: Mapping[str, Type]) -> None:
    for pos, src in enumerate(node.inputs):
        assert g.nx.has_edge(src, node.id, pos), f"{where}: edge {src}->{node.id} missing"
    if node.op is ARG:
        name = node.attrs["name"]
        assert name in bound, f"{where}: input {name!r} is not bound"
        assert bound[name].shape == node.shape, (
            f"{where}: input {name!r} has {node.type}, environment has {bound[name]}")
    elif node.op is FUSED:
        region = node.attrs["region"]
        assert len(region.args()) == len(node.inputs), f"{where}: fused arity"
        for nested in region.nodes():
            assert nested.op in ops.ELEMENTWISE or nested.op in (ARG, ops.constant) \
                or nested.op.kind in (ops.OpKind.LAYOUT, ops.OpKind.REDUCE), \
                f"{where}: {nested.op.name} inside a fused region"
    elif node.op is GET:
        assert isinstance(g.node(node.inputs[0]).type, TupleType)
    else:
        expect = g._infer(node.op, node.inputs, dict(node.attrs))
        assert expect == node.type, f"{where}: %{node.id} typed {node.type}, rule {expect}"


def retype(program: Program, dtype: str) -> Program:
    """The same program with every value of dtype ``dtype``."""
    if dtype not in DTYPES:
        raise RnncValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype == program.dtype:
        return program

    def graph(g: Graph) -> Graph:
        out = g.copy()
        out.dtype = dtype
        for nid in out.nx.nodes:
            node = out.node(nid)
            attrs = node.attrs
            if node.op is FUSED:
                attrs = {**attrs, "region": graph(attrs["region"])}
            out.nx.nodes[nid]["node"] = replace(node, type=_retype(node.type, dtype), attrs=attrs)
        return out

    scan = replace(program.scan, body=graph(program.scan.body))
    args = {n: (r, Type(dtype, t.shape)) for n, (r, t) in program.args.items()}
    return replace(program, args=args, pre=graph(program.pre), scan=scan,
                   post=graph(program.post), dtype=dtype)


def _retype(ty: Type | TupleType, dtype: str) -> Type | TupleType:
    if isinstance(ty, TupleType):
        return TupleType(tuple(Type(dtype, t.shape) for t in ty.items))
    return Type(dtype, ty.shape)
