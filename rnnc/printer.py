"""Print programs as text: one equation per line, types on binders, the scan body indented;
count their ops."""

from __future__ import annotations

from rnnc.ir import ARG, FUSED, GET, Graph, Program
from rnnc.names import Role

INDENT = "  "
# The program's args, one line per role, in this order.
ARG_SECTIONS = ((Role.INPUT, "inputs"), (Role.STATE, "states"), (Role.PARAM, "params"),
                (Role.MASK, "mask"), (Role.RANDOM, "random"), (Role.SAVED, "saved"),
                (Role.COTANGENT, "cotangents"))


def _attrs(attrs: dict) -> str:
    shown = {k: v for k, v in attrs.items() if k not in ("region", "name", "role")}
    if not shown:
        return ""
    return "[" + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(shown.items())) + "]"


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return repr(float(f"{v:.9g}"))
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(map(_fmt, v)) + ")"
    return str(v)


def graph_lines(g: Graph, depth: int, names: dict[int, str] | None = None) -> list[str]:
    """The equations of ``g``; args print under their environment names."""
    names = dict(names or {})
    lines: list[str] = []
    pad = INDENT * depth
    counter = 0
    for node in g.nodes():
        if node.op is ARG:
            names[node.id] = node.attrs["name"]
            continue
        names[node.id] = f"%{counter}"
        counter += 1
        args = ", ".join(names[i] for i in node.inputs)
        note = f"  # {node.origin}" if node.origin != "dsl" else ""
        if node.op is GET:
            lines.append(f"{pad}{names[node.id]}: {node.type} = "
                         f"{names[node.inputs[0]]}[{node.attrs['index']}]{note}")
        elif node.op is FUSED:
            region: Graph = node.attrs["region"]
            lines.append(f"{pad}{names[node.id]}: {node.type} = fused({args}) {{{note}")
            # Region args are ordered like the fused node's operands: name them $0, $1, ...
            inner = {a: f"${k}" for k, a in enumerate(region.args().values())}
            lines.extend(graph_lines(region, depth + 1, inner))
            lines.append(f"{pad}}}")
        else:
            lines.append(f"{pad}{names[node.id]}: {node.type} = "
                         f"{node.op.name}{_attrs(dict(node.attrs))}({args}){note}")
    outs = ", ".join(f"{k}={names[v]}" for k, v in g.outputs.items())
    if outs:
        lines.append(f"{pad}yield {outs}")
    return lines


def format_program(p: Program, title: str = "") -> str:
    """The whole program as text."""
    out = [f"program {title or p.cell} ({p.dtype}) {{".replace("  ", " ")]
    for role, label in ARG_SECTIONS:
        items = [f"{n}: {t}" for n, (r, t) in p.args.items() if r == role]
        if items:
            out.append(f"{INDENT}{label}: " + ", ".join(items))
    if len(p.pre):
        out.append(f"{INDENT}pre {{")
        out.extend(graph_lines(p.pre, 2))
        out.append(f"{INDENT}}}")
    s = p.scan
    head = [f"{INDENT}scan {'reverse' if s.reverse else 'forward'}"]
    if s.seqs:
        head.append(f"seqs({', '.join(s.seqs)})")
    if s.consts:
        head.append(f"consts({', '.join(s.consts)})")
    if s.carries:
        head.append("carries(" + ", ".join(
            f"{c.name}={c.init}" + (f"->{c.final}" if c.final else "") for c in s.carries) + ")")
    if s.stacked:
        head.append(f"stacked({', '.join(s.stacked)})")
    if s.summed:
        head.append(f"summed({', '.join(s.summed)})")
    out.append(" ".join(head) + " {")
    out.extend(graph_lines(s.body, 2))
    out.append(f"{INDENT}}}")
    if len(p.post):
        out.append(f"{INDENT}post {{")
        out.extend(graph_lines(p.post, 2))
        out.append(f"{INDENT}}}")
    out.append(f"{INDENT}results: {', '.join(p.results)}")
    out.append("}")
    return "\n".join(out)


def op_counts(p: Program) -> dict[str, dict[str, int]]:
    """Node counts of ``p`` inside the loop body and outside it, by op name."""
    counts: dict[str, dict[str, int]] = {"loop": {}, "outside": {}}
    for where, graphs in (("loop", (p.scan.body,)), ("outside", (p.pre, p.post))):
        for g in graphs:
            for node in g.nodes():
                if node.op.name in ("arg", "get", "constant"):
                    continue
                counts[where][node.op.name] = counts[where].get(node.op.name, 0) + 1
    return counts
