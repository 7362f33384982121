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
# Arg roles a derivative is taken for: a forward's inputs and parameters and, when the program
# is itself a backward (a second derivative), its saved values and cotangents too.
_DIFFERENTIABLE = ("input", "param", "saved", "cotangent")


def _first_free_save(program: Program) -> int:
    """One past the largest ``save.N`` the program already reads, stacks or returns."""
    names = set(program.args) | set(program.results) | set(program.scan.body.outputs)
    taken = [int(n[5:]) for n in names if n.startswith("save.") and n[5:].isdigit()]
    return max(taken, default=-1) + 1


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
    args: dict[str, int] = field(default_factory=dict)  # backward inputs made by ``arg``
    # The first free save.N number: differentiating a program that already reads or stacks
    # saved values (a second derivative) numbers its own saves after them.
    first_save: int = 0
    # Forward nodes that depend on parameters (and constants) only: one sweep in topological
    # order, so an expression reused at every level costs its size, not 2**depth.
    param_only: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.param_only = set()
        for node in self.fwd.nodes():
            if node.op is ARG:
                if self.roles[node.attrs["name"]] == "const":
                    self.param_only.add(node.id)
            elif all(i in self.param_only for i in node.inputs):
                self.param_only.add(node.id)

    def arg(self, name: str, shape: tuple, kind: str) -> int:
        if name not in self.args:
            (self.seqs if kind == "seq" else self.consts).append(name)
            self.args[name] = self.bwd.arg(name, shape, kind, ORIGIN)
        return self.args[name]

    def read(self, nid: int) -> int:
        """The backward node holding forward value ``nid`` at the same step."""
        # A recomputed parameter-only value needs its operands first: visit them with an
        # explicit stack (a chain of thousands of nodes must not recurse).
        stack = [nid]
        while stack:
            top = stack[-1]
            if top in self.values:
                stack.pop()
                continue
            node = self.fwd.node(top)
            recompute = node.op is not ARG and (node.op is ops.constant
                                                 or top in self.param_only)
            missing = [i for i in node.inputs if i not in self.values] if recompute else []
            if missing:
                stack.extend(reversed(missing))  # leftmost first, as a recursion would
                continue
            stack.pop()
            self.values[top] = self._place(top, recompute)
        return self.values[nid]

    def _place(self, nid: int, recompute: bool) -> int:
        """Where backward reads ``nid``: an input, a recomputation, or a saved value."""
        node = self.fwd.node(nid)
        if node.op is ARG and self.roles[node.attrs["name"]] != "carry":
            return self.arg(node.attrs["name"], node.shape, self.roles[node.attrs["name"]])
        if recompute:
            return self.bwd.add(node.op, [self.values[i] for i in node.inputs], node.attrs,
                                ORIGIN)
        name = self.saved.setdefault(nid, f"save.{self.first_save + len(self.saved)}")
        return self.arg(name, node.shape, "seq")


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
    plan = _Plan(fwd, Graph(program.dtype), roles, first_save=_first_free_save(program))
    e = _Emitter(plan)
    args = fwd.args()
    differentiable = {nid for name, nid in args.items()
                      if program.args.get(name, ("carry",))[0] in _DIFFERENTIABLE
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
    for name in scan.summed:  # a sum over steps: every step sees the same cotangent
        shape = fwd.node(fwd.outputs[name]).shape
        accumulate(fwd.outputs[name], plan.arg(f"d.{name}", shape, "const"))

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
        else:
            role = "cotangent" if name.startswith("d.") else "saved"
            args[name] = (role, Type(dtype, ("T",) + plan.bwd.node(plan.args[name]).shape))
    for name in plan.consts:  # a parameter, or the cotangent of a summed output
        args[name] = program.args.get(name) or (
            "cotangent", Type(dtype, plan.bwd.node(plan.args[name]).shape))
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
