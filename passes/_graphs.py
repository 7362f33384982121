"""Graph-editing helpers shared by the passes: node copies, fresh names, dead-code removal."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from rnnc import ops
from rnnc.ir import ARG, FUSED, GET, Graph, Program
from rnnc.ops_tensor import parse


def copy_node(dst: Graph, src: Graph, nid: int, inputs: Iterable[int], origin: str) -> int:
    """Re-create node ``nid`` of ``src`` in ``dst`` over ``inputs`` (its type re-inferred)."""
    node = src.node(nid)
    assert node.op not in (ARG, FUSED, GET), node
    return dst.add(node.op, inputs, dict(node.attrs), origin=origin, loc=node.loc)


def env_names(p: Program) -> set[str]:
    """Every name the program's environment can hold, and every name a graph reads."""
    names = set(p.env_types()) | {c.name for c in p.scan.carries}
    for g in p.graphs():
        names |= set(g.args())
    return names


def arg_of(g: Graph, name: str, shape: tuple, origin: str) -> int:
    """The input node of ``g`` named ``name``, made if missing."""
    have = g.input_node(name)
    return have if have is not None else g.arg(name, shape, origin)


def remove_dead(g: Graph, keep_args: Iterable[str] = ()) -> None:
    """Delete nodes no output needs, keeping the inputs named in ``keep_args``."""
    keep = set(keep_args)
    for n in sorted(g.dead_code(keep_args=False)):
        node = g.node(n)
        if node.op is ARG and node.attrs["name"] in keep:
            continue
        g.remove(n)


def downstream(g: Graph, sources: set[int]) -> set[int]:
    """``sources`` and every node that reads one of them, directly or not: one walk in
    topological order, however many sources."""
    out = set(sources)
    for nid in g.topo():
        if nid not in out and any(i in out for i in g.node(nid).inputs):
            out.add(nid)
    return out


def is_row_contraction(g: Graph, nid: int) -> bool:
    """A matmul[transpose_a], sum_rows or einsum without rows of per-step values: a sum over
    the batch rows (an einsum ``"...he,...hd->hde"``, a head-wise weight's gradient)."""
    node = g.node(nid)
    if node.op is ops.matmul and node.attrs.get("transpose_a"):
        return per_step(g.node(node.inputs[0]).shape)
    if node.op is ops.sum_rows:
        return per_step(g.node(node.inputs[0]).shape)
    if node.op is ops.einsum:
        operands, (out_rows, _) = parse(node.attrs["spec"])
        return not out_rows and any(rows and per_step(g.node(i).shape)
                                    for (rows, _), i in zip(operands, node.inputs, strict=True))
    return False


def per_step(shape: tuple) -> bool:
    """Whether a body value of ``shape`` varies over the batch (leading "B")."""
    return len(shape) > 0 and shape[0] == "B"


def constant_value(g: Graph, nid: int) -> float | None:
    node = g.node(nid)
    return float(node.attrs["value"]) if node.op is ops.constant else None


def prune_outputs(p: Program) -> Program:
    """Drop outputs nobody reads: post outputs not in results, unused stacked/summed/pre (the
    one output pruning of the passes: canonicalize and prune-outputs run it). A graph whose
    outputs all stay is kept as it is, and ``p`` itself where nothing goes."""
    post = _keep_outputs(p.post, set(p.results))
    post_reads = set(post.args())
    s = p.scan
    needed = set(p.results) | post_reads
    stacked = tuple(n for n in s.stacked if n in needed)
    summed = tuple(n for n in s.summed if n in needed)
    body = _keep_outputs(s.body, {c.name for c in s.carries} | set(stacked) | set(summed))
    reads = set(body.args())
    seqs = tuple(n for n in s.seqs if n in reads or n in p.args)
    consts = tuple(n for n in s.consts if n in reads or n in p.args)
    pre_needed = set(seqs) | set(consts) | {c.init for c in s.carries} | post_reads
    pre = _keep_outputs(p.pre, pre_needed | set(p.results))
    if pre is p.pre and body is s.body and post is p.post \
            and (seqs, consts, stacked, summed) == (s.seqs, s.consts, s.stacked, s.summed):
        return p
    scan = replace(s, body=body, seqs=seqs, consts=consts, stacked=stacked, summed=summed)
    return replace(p, pre=pre, scan=scan, post=post)


def _keep_outputs(g: Graph, names: set[str]) -> Graph:
    """``g`` with only the outputs in ``names``: a copy, or ``g`` itself if all stay."""
    if all(n in names for n in g.outputs):
        return g
    g = g.copy()
    g.outputs = {n: o for n, o in g.outputs.items() if n in names}
    return g
