"""The IR verifier: checks that a program's graphs are well formed and well typed.

The pass manager runs it after every pass (``rnnc.passes``), and tests run it on programs they
build by hand; it raises ``AssertionError`` naming the first fault, since a fault is a bug in
rnnc, never the user's.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Node, Program, Scan, TupleType, Type
from rnnc.names import Role


def verify(program: Program) -> None:
    """Check the program's structure and types; raise AssertionError naming the fault."""
    for name, (role, _) in program.args.items():
        assert isinstance(role, Role), f"arg {name!r}: role {role!r} is not a Role"
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
    try:  # a topological order exists only without cycles, and it is cached per edit
        nodes = g.nodes()
    except nx.NetworkXUnfeasible:
        raise AssertionError(f"{where}: cycle") from None
    for node in nodes:
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
        expect = g.infer(node.op, node.inputs, dict(node.attrs))
        assert expect == node.type, f"{where}: %{node.id} typed {node.type}, rule {expect}"
