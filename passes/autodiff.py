"""autodiff: reverse-mode differentiation of the scan body, with a save plan.

``autodiff-forward`` turns a program into its training forward: the same loop, also stacking
every per-step value the backward reads as ``save.N``. ``autodiff-backward`` turns it into the
backward program: a scan in the opposite direction carrying the states' cotangents (``d.h``,
from ``d.h.final``), reading saved values, inputs and output cotangents (``d.y``) per step, and
returning ``grad.<input>`` (stacked), ``grad.<param>`` (summed over the steps) and
``grad.<state>`` (the last carries). VJPs are rnnc ops: the later passes optimize the result.
Save plan: a value a VJP rule reads is taken from where it already lives (an input sequence, a
parameter, the mask), recomputed when it depends on parameters only, is a random mask
(``bernoulli``, drawn again from the seed and counter args) or an elementwise expansion of
narrower values (``passes/_expansions.py``), and saved otherwise, so backward never recomputes
a forward matmul.

Example (``tests/passes/test_pass_examples.py`` checks the listings)::

    c = rnnc.Cell("elman")
    x, h = c.input("x", 2), c.state("h", 2)
    W, U = c.param("W", (2, 2)), c.param("U", (2, 2))
    new = rnnc.tanh(x @ W + h @ U)
    c.update(h=new)
    c.output("y", new)

Before, in both modes (after fuse-gate-matmuls)::

    program elman forward: after fuse-gate-matmuls (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], U: f32[2,2]
      scan forward seqs(x) consts(W, U) carries(h=h->h.final) stacked(y) {
        %0: f32[B,2] = matmul(x, W)
        %1: f32[B,2] = matmul(h, U)
        %2: f32[B,2] = add(%0, %1)
        %3: f32[B,2] = tanh(%2)
        yield h=%3, y=%3
      }
      results: y, h.final
    }

After autodiff-forward: the loop also stacks ``save.0`` (the new state, for ``tanh``'s
derivative ``1 - y^2``) and ``save.1`` (the old state, for the gradient of ``U``)::

    program elman forward: after autodiff-forward (f32) {
      inputs: x: f32[T,B,2]
      states: h: f32[B,2]
      params: W: f32[2,2], U: f32[2,2]
      scan forward seqs(x) consts(W, U) carries(h=h->h.final) stacked(y, save.0, save.1) {
        %0: f32[B,2] = matmul(x, W)
        %1: f32[B,2] = matmul(h, U)
        %2: f32[B,2] = add(%0, %1)
        %3: f32[B,2] = tanh(%2)
        yield h=%3, y=%3, save.0=%3, save.1=h
      }
      results: y, h.final, save.0, save.1
    }

After autodiff-backward: ``matmul[transpose_b=True](g, U)`` is ``g @ U.T``,
``matmul[transpose_a=True](a, g)`` is ``a.T @ g``::

    program elman backward: after autodiff-backward (f32) {
      inputs: x: f32[T,B,2]
      params: U: f32[2,2], W: f32[2,2]
      saved: save.0: f32[T,B,2], save.1: f32[T,B,2]
      cotangents: d.y: f32[T,B,2], d.h.final: f32[B,2]
      scan reverse seqs(d.y, save.0, save.1, x) consts(U, W) carries(d.h=d.h.final->grad.h)
          stacked(grad.x) summed(grad.W, grad.U) {
        %0: f32[B,2] = add(d.h, d.y)  # autodiff
        %1: f32[] = constant[value=1.0]()  # autodiff
        %2: f32[B,2] = mul(save.0, save.0)  # autodiff
        %3: f32[B,2] = sub(%1, %2)  # autodiff
        %4: f32[B,2] = mul(%0, %3)  # autodiff
        %5: f32[B,2] = matmul[transpose_b=True](%4, U)  # autodiff
        %6: f32[2,2] = matmul[transpose_a=True](save.1, %4)  # autodiff
        %7: f32[B,2] = matmul[transpose_b=True](%4, W)  # autodiff
        %8: f32[2,2] = matmul[transpose_a=True](x, %4)  # autodiff
        yield d.h=%5, grad.x=%7, grad.W=%8, grad.U=%6
      }
      results: grad.x, grad.W, grad.U, grad.h
    }
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rnnc import names, ops
from rnnc.errors import RnncValueError
from rnnc.ir import ARG, Carry, Graph, Program, SavePlan, Scan, Type
from rnnc.names import Role, cotangent, final_state, gradient
from rnnc.passes import register
from rnnc.passes._expansions import expands
from rnnc.passes._saves import check_save_plans
from rnnc.passes._unbroadcast import unbroadcast

__all__ = ["autodiff_backward", "autodiff_forward", "check_save_plans"]

ORIGIN = "autodiff"
# Arg roles a derivative is taken for: a forward's inputs and parameters and, when the program
# is itself a backward (a second derivative), its saved values and cotangents too.
_DIFFERENTIABLE = (Role.INPUT, Role.PARAM, Role.SAVED, Role.COTANGENT)


def _first_free_save(program: Program) -> int:
    """One past the largest ``save.N`` the program already reads, stacks or returns."""
    return names.next_saved(set(program.args) | set(program.results)
                            | set(program.scan.body.outputs))


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
    # Random masks (bernoulli) and what no matmul computes from them, parameters and
    # constants (``1 - m``, ``m / (1 - p)``): drawn again in backward, never saved.
    drawn: set[int] = field(init=False)
    # Selections among inputs, the mask and constants (mask-lengths' ``where(len.mask, x,
    # 0)``): one elementwise pass over what backward reads anyway, never stacked.
    selections: set[int] = field(init=False)

    # Elementwise expansions of narrower values (``exp(dt[:, :, None] * A)``), recomputed from
    # them, never saved (passes/_expansions.py).
    expansions: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.param_only, self.drawn, self.selections = set(), set(), set()
        self.expansions = set()
        for node in self.fwd.nodes():
            if node.op is ARG:
                if self.roles[node.attrs["name"]] == "const":
                    self.param_only.add(node.id)
            elif all(i in self.param_only for i in node.inputs) and not node.op.random:
                self.param_only.add(node.id)
            elif node.op.random or node.op is not ops.matmul and all(
                    i in self.param_only or i in self.drawn for i in node.inputs):
                self.drawn.add(node.id)
            elif node.op is ops.where and all(self._read_as_is(i) for i in node.inputs):
                self.selections.add(node.id)
            elif expands(self.fwd, node, self.expansions,
                         lambda i: i in self.param_only or self._read_as_is(i)):
                self.expansions.add(node.id)

    def _read_as_is(self, nid: int) -> bool:
        """Whether backward reads forward value ``nid`` without saving it: a sequence, a
        parameter or a constant."""
        node = self.fwd.node(nid)
        if node.op is ARG:
            return self.roles[node.attrs["name"]] != "carry"
        return node.op is ops.constant

    def arg(self, name: str, shape: tuple, kind: str) -> int:
        if name not in self.args:
            (self.seqs if kind == "seq" else self.consts).append(name)
            self.args[name] = self.bwd.arg(name, shape, ORIGIN)
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
            # A random mask is drawn again from its counter (the seed, the step, the row):
            # regenerating it costs less than stacking it, and its args are inputs anyway.
            recompute = node.op is not ARG and (node.op is ops.constant or top in self.drawn
                                                 or top in self.param_only
                                                 or top in self.selections
                                                 or top in self.expansions)
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
        name = self.saved.setdefault(nid, names.saved(self.first_save + len(self.saved)))
        return self.arg(name, node.shape, "seq")

    def save_plan(self, dtype: str) -> SavePlan:
        """The saved values in order, each with its type as a sequence."""
        return tuple((name, Type(dtype, ("T",) + self.fwd.node(nid).shape))
                     for nid, name in self.saved.items())


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
    data = set(program.no_grad)  # inputs declared grad=False
    differentiable = {nid for name, nid in args.items() if name not in data and (
        program.args.get(name, ("carry",))[0] in _DIFFERENTIABLE or roles[name] == "carry")}
    active = fwd.depends_on(differentiable)

    cts: dict[int, int] = {}

    def accumulate(nid: int, g: int) -> None:
        cts[nid] = e(ops.add, cts[nid], g) if nid in cts else g

    carry_args = {}
    for c in scan.carries:
        shape = fwd.node(fwd.outputs[c.name]).shape
        carry_args[c.name] = plan.bwd.arg(cotangent(c.name), shape, ORIGIN)
        accumulate(fwd.outputs[c.name], carry_args[c.name])
    for name in scan.stacked:
        shape = fwd.node(fwd.outputs[name]).shape
        accumulate(fwd.outputs[name], plan.arg(cotangent(name), shape, "seq"))
    for name in scan.summed:  # a sum over steps: every step sees the same cotangent
        shape = fwd.node(fwd.outputs[name]).shape
        accumulate(fwd.outputs[name], plan.arg(cotangent(name), shape, "const"))

    for nid in reversed(fwd.topo()):
        node = fwd.node(nid)
        if nid not in cts or node.op is ARG or node.op.vjp is None:
            continue
        xs = [_Fwd(i) for i in node.inputs]
        grads = node.op.vjp(e, cts[nid], xs, _Fwd(nid), **node.attrs)
        for src, g in zip(node.inputs, grads, strict=True):
            if g is not None and src in active:
                accumulate(src, unbroadcast(e, g, fwd.node(src).shape))

    outputs: dict[str, int] = {}
    for c in scan.carries:
        ct = cts.get(args[c.name])
        if ct is None:  # the state never influences anything: its cotangent is zero
            zero = plan.bwd.add(ops.constant, (), {"value": 0.0}, ORIGIN)
            ct = plan.bwd.add(ops.where, (zero, carry_args[c.name], zero), {}, ORIGIN)
        outputs[cotangent(c.name)] = ct
    for name, nid in args.items():
        if nid in cts and roles[name] != "carry":
            outputs[gradient(name)] = cts[nid]
    return plan, _prune(plan, outputs)


def _prune(plan: _Plan, outputs: dict[str, int]) -> dict[str, int]:
    """Drop what no output needs: a VJP rule differentiates every operand, also one nothing
    differentiable reaches (a ``grad=False`` input, a comparison), and the forward values only
    those derivatives read are not saved. The saved values left keep their order, numbered
    from ``first_save`` without gaps. Returns ``outputs`` with the nodes renumbering made."""
    bwd = plan.bwd
    bwd.outputs = dict(outputs)
    for nid in sorted(bwd.dead_code()):
        bwd.remove(nid)
    live = set(bwd.outputs.values())
    kept = {}
    for fid, name in plan.saved.items():
        old = plan.args[name]
        if not bwd.users(old) and old not in live:
            bwd.remove(old)
            plan.seqs.remove(name)
            del plan.args[name], plan.values[fid]
            continue
        new_name = names.saved(plan.first_save + len(kept))
        if new_name != name:  # every name below it is already free or renamed
            new = bwd.arg(new_name, bwd.node(old).shape, ORIGIN)
            bwd.replace_all_uses(old, new)
            bwd.remove(old)
            plan.seqs[plan.seqs.index(name)] = new_name
            del plan.args[name]
            plan.args[new_name] = plan.values[fid] = new
        kept[fid] = new_name
    plan.saved = kept
    return dict(bwd.outputs)


def _check(program: Program) -> None:
    if len(program.pre) or len(program.post):
        raise RnncValueError("autodiff runs before hoisting: the pre- and post-loop graphs of "
                             "its input must be empty")


def _planned(program: Program, plan: _Plan) -> tuple[SavePlan, ...]:
    """``program.saves`` with the save plan of this autodiff after those before it."""
    return program.saves + (plan.save_plan(program.dtype),)


@register("autodiff-forward")
def autodiff_forward(program: Program) -> Program:
    """The training forward: the same loop, also stacking the values backward reads."""
    _check(program)
    plan, _ = _backward_body(program)
    body = program.scan.body.copy()
    saved = tuple(plan.saved.values())
    for nid, name in plan.saved.items():
        body.outputs[name] = nid
    scan = replace(program.scan, body=body, stacked=program.scan.stacked + saved)
    return replace(program, scan=scan, results=program.results + saved,
                   saves=_planned(program, plan))


def _backward_args(program: Program, plan: _Plan) -> dict[str, tuple[str, Type]]:
    """The backward program's args: what it reads of the forward's args, the saved values,
    the cotangents of the stacked and summed outputs and of the final states."""
    dtype, body = program.dtype, program.scan.body
    saved = set(plan.saved.values())
    args: dict[str, tuple[str, Type]] = {}
    for name in plan.seqs:
        if name in program.args:
            args[name] = program.args[name]
        else:
            role = Role.SAVED if name in saved else Role.COTANGENT
            args[name] = (role, Type(dtype, ("T",) + plan.bwd.node(plan.args[name]).shape))
    for name in plan.consts:  # a parameter, or the cotangent of a summed output
        args[name] = program.args.get(name) or (
            Role.COTANGENT, Type(dtype, plan.bwd.node(plan.args[name]).shape))
    for c in program.scan.carries:
        args[_final_cotangent(c)] = (Role.COTANGENT,
                                     Type(dtype, body.node(body.outputs[c.name]).shape))
    return args


def _final_cotangent(c: Carry) -> str:
    """The cotangent of the carry's final value: where the backward carry starts."""
    return cotangent(c.final or final_state(c.name))


@register("autodiff-backward")
def autodiff_backward(program: Program) -> Program:
    """The backward program: a scan in the opposite direction over the saved values."""
    _check(program)
    scan = program.scan
    plan, outputs = _backward_body(program)
    plan.bwd.outputs = outputs
    carries = tuple(Carry(cotangent(c.name), _final_cotangent(c), gradient(c.init))
                    for c in scan.carries)
    of_seqs = {gradient(n) for n in scan.seqs}
    of_consts = {gradient(n) for n in scan.consts}
    stacked = tuple(n for n in outputs if n in of_seqs)
    summed = tuple(n for n in outputs if n in of_consts)
    bscan = Scan(plan.bwd, seqs=tuple(plan.seqs), consts=tuple(plan.consts), carries=carries,
                 stacked=stacked, summed=summed, reverse=not scan.reverse)
    results = stacked + summed + tuple(c.final for c in carries)
    dtype = program.dtype
    return replace(program, args=_backward_args(program, plan), pre=Graph(dtype), scan=bscan,
                   post=Graph(dtype), results=results, saves=_planned(program, plan))
