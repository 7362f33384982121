"""Programs as Graphviz DOT text: one cluster per graph, edges labelled by operand position."""

from __future__ import annotations

from collections.abc import Sequence

from rnnc.ir import ARG, FUSED, Graph, Program


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _graph(g: Graph, prefix: str, label: str) -> list[str]:
    lines = [f"  subgraph cluster_{prefix} {{", f"    label={_quote(label)};"]
    for node in g.nodes():
        if node.op is ARG:
            text, shape = f"{node.attrs['name']}\\n{node.type}", "ellipse"
        elif node.op is FUSED:
            ops = sorted({n.op.name for n in node.attrs["region"].nodes() if n.op is not ARG})
            text, shape = f"fused\\n{' '.join(ops)}\\n{node.type}", "box3d"
        else:
            text, shape = f"{node.op.name}\\n{node.type}", "box"
        lines.append(f"    {prefix}{node.id} [label={_quote(text)}, shape={shape}];")
    for src, dst, pos in sorted(g.nx.edges(keys=True)):
        lines.append(f"    {prefix}{src} -> {prefix}{dst} [label={pos}];")
    for name, out in g.outputs.items():
        lines.append(f"    {prefix}out_{len(lines)} [label={_quote(name)}, shape=plaintext];")
        lines.append(f"    {prefix}{out} -> {prefix}out_{len(lines) - 1};")
    lines.append("  }")
    return lines


def _program(program: Program, prefix: str, indent: str = "") -> list[str]:
    """The pre-loop graph, the scan body and the post-loop graph as clusters."""
    direction = "reverse" if program.scan.reverse else "forward"
    lines = []
    for part, g, label in (("pre_", program.pre, "pre"),
                           ("scan_", program.scan.body, f"scan {direction}"),
                           ("post_", program.post, "post")):
        if len(g):
            lines.extend(indent + line for line in _graph(g, prefix + part, label))
    return lines


def to_dot(program: Program, title: str = "rnnc") -> str:
    """The pre-loop graph, the scan body and the post-loop graph as one DOT digraph."""
    lines = [f"digraph {_quote(title)} {{", "  rankdir=TB;", "  node [fontname=monospace];"]
    lines.extend(_program(program, ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_dot_all(programs: Sequence[tuple[Program, str]], title: str = "rnnc") -> str:
    """Several programs (a training forward and its backward) as one DOT digraph, each a
    cluster labelled with its title: one picture, where one file holds one graph (SVG)."""
    if len(programs) == 1:
        return to_dot(programs[0][0], programs[0][1])
    lines = [f"digraph {_quote(title)} {{", "  rankdir=TB;", "  node [fontname=monospace];"]
    for number, (program, label) in enumerate(programs):
        lines += [f"  subgraph cluster_p{number} {{", f"    label={_quote(label)};"]
        lines.extend(_program(program, f"p{number}_", "  "))
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
