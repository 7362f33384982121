"""autodiff: reverse-mode differentiation of the scan body, with a save plan.

``autodiff-forward`` turns a program into its training forward: the same loop, stacking every
per-step value the backward needs as ``save.N``. ``autodiff-backward`` turns it into the
backward program: a scan in the opposite direction whose carries are the cotangents of the
states, whose per-step inputs are the saved values and the output cotangents ``d.<output>``,
and whose outputs are ``grad.<input>`` (stacked), ``grad.<param>`` (summed over steps) and
``grad.<state>`` (the final carries: cotangents of the initial states).

Save plan: a value a VJP rule reads is taken from where it already lives (an input sequence, a
parameter, the mask), recomputed when it depends on parameters only, and saved otherwise, so
backward never recomputes a forward matmul. Before (one step of ``h' = tanh(x@W + h@U)``)::

    %0 = matmul(x, W); %1 = matmul(h, U); %2 = add(%0, %1); %3 = tanh(%2)
    yield h=%3, y=%3

after, forward stacks ``save.0 = %3`` and ``save.1 = h``; backward (reverse, carry d.h)::

    %0 = add(d.h, d.y); %1 = mul(save.0, save.0); %2 = sub(1.0, %1); %3 = mul(%0, %2)
    %4 = matmul[transpose_b](%3, U); %5 = matmul[transpose_a](save.1, %3)
    %6 = matmul[transpose_b](%3, W); %7 = matmul[transpose_a](x, %3)
    yield d.h=%4, grad.U=%5, grad.x=%6, grad.W=%7
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rnnc import ops
from rnnc.errors import RnncValueError
from rnnc.ir import ARG, Carry, Graph, Program, Scan, Type
from rnnc.passes import register

ORIGIN = "autodiff"


@dataclass
class _Plan:
    """The backward body under construction and the forward values it reads."""

    fwd: Graph
    bwd: Graph
    roles: dict[str, str]  # forward body arg name -> "seq" | "const" | "carry"
    saved: dict[int, str] = field(default_factory=dict)  # forward node -> save.N
    values: dict[int, int] = field(default_factory=dict)  # forward node -> backward node
    seqs: list[str] = field(default_factory=list)
    consts: list[str] = field(default_factory=list)

    def param_only(self, nid: int) -> bool:
        node = self.fwd.node(nid)
        if node.op is ARG:
            return self.roles[node.attrs["name"]] == "const"
        return all(self.param_only(i) for i in node.inputs)

    def arg(self, name: str, shape: tuple, kind: str) -> int:
        args = self.bwd.args()
        if name in args:
            return args[name]
        (self.seqs if kind == "seq" else self.consts).append(name)
        return self.bwd.arg(name, shape, kind, ORIGIN)

    def read(self, nid: int) -> int:
        """The backward node holding forward value ``nid`` at the same step."""
        if nid in self.values:
            return self.values[nid]
        node = self.fwd.node(nid)
        if node.op is ARG and self.roles[node.attrs["name"]] != "carry":
            role = self.roles[node.attrs["name"]]
            out = self.arg(node.attrs["name"], node.shape, role)
        elif node.op is ops.constant or (node.op is not ARG and self.param_only(nid)):
            out = self.bwd.add(node.op, [self.read(i) for i in node.inputs], node.attrs, ORIGIN)
        else:
            name = self.saved.setdefault(nid, f"save.{len(self.saved)}")
            out = self.arg(name, node.shape, "seq")
        self.values[nid] = out
        return out


class _Emitter:
    """What a VJP rule calls: ``e(op, *operands, **attrs)``; operands are backward nodes or
    forward values wrapped in ``_Fwd``."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan

    def _resolve(self, v) -> int:
        return self.plan.read(v.id) if isinstance(v, _Fwd) else v

    def __call__(self, op: ops.Op, *operands, **attrs) -> int:
        return self.plan.bwd.add(op, [self._resolve(v) for v in operands], attrs, ORIGIN)

    def shape(self, v) -> tuple:
        if isinstance(v, _Fwd):
            return self.plan.fwd.node(v.id).shape
        return self.plan.bwd.node(v).shape


@dataclass(frozen=True)
class _Fwd:
    id: int


def _unbroadcast(e: _Emitter, g: int, shape: tuple) -> int:
    """Sum the cotangent ``g`` down to ``shape`` (undo NumPy broadcasting)."""
    have = e.shape(g)
    if have == shape:
        return g
    if shape and shape[-1] == 1 and have[-1] != 1:
        g = e(ops.sum_, g)
    if len(shape) < len(e.shape(g)):
        g = e(ops.sum_rows, g)
    elif len(shape) == 2 and shape[0] == 1 and e.shape(g)[:-1] != (1,):
        # A (1, n) operand broadcast over rows: contract the rows with a column of ones,
        # ones^T g, which keeps the leading axis of 1 (sum_rows would drop it).
        one = e(ops.constant, value=1.0)
        ones = e(ops.where, one, one, e(ops.slice_, g, start=0, stop=1))
        g = e(ops.matmul, ones, g, transpose_a=True)
    assert e.shape(g) == shape, (have, shape)
    return g


def _backward_body(program: Program) -> tuple[_Plan, dict[str, int]]:
    """Differentiate one step; return the plan and the backward body's named outputs."""
    scan = program.scan
    fwd = scan.body
    roles = {name: "seq" for name in scan.seqs}
    roles.update({name: "const" for name in scan.consts})
    roles.update({c.name: "carry" for c in scan.carries})
    plan = _Plan(fwd, Graph(program.dtype), roles)
    e = _Emitter(plan)
    args = fwd.args()
    differentiable = {nid for name, nid in args.items()
                      if program.args.get(name, ("carry",))[0] in ("input", "param")
                      or roles[name] == "carry"}
    active = fwd.depends_on(differentiable)

    cts: dict[int, int] = {}

    def accumulate(nid: int, g: int) -> None:
        cts[nid] = e(ops.add, cts[nid], g) if nid in cts else g

    carry_args = {}
    for c in scan.carries:
        shape = fwd.node(fwd.outputs[c.name]).shape
        carry_args[c.name] = plan.bwd.arg(f"d.{c.name}", shape, "carry", ORIGIN)
        accumulate(fwd.outputs[c.name], carry_args[c.name])
    for name in scan.stacked:
        shape = fwd.node(fwd.outputs[name]).shape
        accumulate(fwd.outputs[name], plan.arg(f"d.{name}", shape, "seq"))

    for nid in reversed(fwd.topo()):
        node = fwd.node(nid)
        if nid not in cts or node.op is ARG or node.op.vjp is None:
            continue
        xs = [_Fwd(i) for i in node.inputs]
        grads = node.op.vjp(e, cts[nid], xs, _Fwd(nid), **node.attrs)
        for src, g in zip(node.inputs, grads, strict=True):
            if g is not None and src in active:
                accumulate(src, _unbroadcast(e, g, fwd.node(src).shape))

    outputs: dict[str, int] = {}
    for c in scan.carries:
        ct = cts.get(args[c.name])
        if ct is None:  # the state never influences anything: its cotangent is zero
            zero = plan.bwd.add(ops.constant, (), {"value": 0.0}, ORIGIN)
            ct = plan.bwd.add(ops.where, (zero, carry_args[c.name], zero), {}, ORIGIN)
        outputs[f"d.{c.name}"] = ct
    for name, nid in args.items():
        if nid in cts and roles[name] != "carry":
            outputs[f"grad.{name}"] = cts[nid]
    return plan, outputs


def _check(program: Program) -> None:
    if len(program.pre) or len(program.post):
        raise RnncValueError("autodiff runs before hoisting: the pre- and post-loop graphs of "
                             "its input must be empty")


@register("autodiff-forward")
def autodiff_forward(program: Program) -> Program:
    """The training forward: the same loop, also stacking the values backward reads."""
    _check(program)
    plan, _ = _backward_body(program)
    body = program.scan.body.copy()
    names = tuple(plan.saved.values())
    for nid, name in plan.saved.items():
        body.outputs[name] = nid
    scan = replace(program.scan, body=body, stacked=program.scan.stacked + names)
    return replace(program, scan=scan, results=program.results + names)


@register("autodiff-backward")
def autodiff_backward(program: Program) -> Program:
    """The backward program: a scan in the opposite direction over the saved values."""
    _check(program)
    scan = program.scan
    plan, outputs = _backward_body(program)
    plan.bwd.outputs = outputs
    fwd = scan.body
    dtype = program.dtype
    args: dict[str, tuple[str, Type]] = {}
    for name in plan.seqs:
        if name in program.args:
            args[name] = program.args[name]
        elif name.startswith("d."):
            args[name] = ("cotangent", Type(dtype, ("T",) + plan.bwd.node(
                plan.bwd.args()[name]).shape))
        else:
            args[name] = ("saved", Type(dtype, ("T",) + plan.bwd.node(
                plan.bwd.args()[name]).shape))
    for name in plan.consts:
        args[name] = program.args[name]
    carries = []
    for c in scan.carries:
        init = f"d.{c.final}" if c.final else f"d.{c.name}.final"
        args[init] = ("cotangent", Type(dtype, fwd.node(fwd.outputs[c.name]).shape))
        carries.append(Carry(f"d.{c.name}", init, f"grad.{c.init}"))
    stacked = tuple(n for n in outputs if n.startswith("grad.") and n[5:] in scan.seqs)
    summed = tuple(n for n in outputs if n.startswith("grad.") and n[5:] in scan.consts)
    bscan = Scan(plan.bwd, seqs=tuple(plan.seqs), consts=tuple(plan.consts),
                 carries=tuple(carries), stacked=stacked, summed=summed,
                 reverse=not scan.reverse)
    results = stacked + summed + tuple(c.final for c in carries)
    return replace(program, args=args, pre=Graph(dtype), scan=bscan, post=Graph(dtype),
                   results=results)
