"""The cell DSL: a tracing builder that records one time step of a cell as an IR graph."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnc import dsl_numpy, dsl_random, dsl_tensor, ops
from rnnc import ops_elementwise as elementwise
from rnnc.dsl_checks import check_allocatable, check_name, initial_values
from rnnc.errors import CellError, RnncTypeError, RnncValueError, ShapeError
from rnnc.ir import Carry, Graph, Program, Scan, Type
from rnnc.names import Role, final_state

_HERE = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = {os.path.join(_HERE, f) for f in ("dsl.py", "dsl_random.py", "ops.py", "ir.py",
                                              "composites.py", "dsl_numpy.py", "dsl_tensor.py")}

Init = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _user_location() -> str:
    """The first stack frame outside the DSL's own files, as 'file:line: code'."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _INTERNAL:
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    import linecache

    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}: {code}"


class Value:
    """A traced value of a cell: one node of its step graph."""

    __array_priority__ = 1000  # so `ndarray * value` defers to Value.__rmul__

    def __init__(self, cell: Cell, node: int) -> None:
        self.cell = cell
        self.node = node

    @property
    def shape(self) -> tuple:
        return self.cell.graph.node(self.node).shape

    def __repr__(self) -> str:
        return f"<rnnc.Value %{self.node} {self.cell.graph.node(self.node).type}>"

    def __add__(self, o): return apply(ops.add, self, o)
    def __radd__(self, o): return apply(ops.add, o, self)
    def __sub__(self, o): return apply(ops.sub, self, o)
    def __rsub__(self, o): return apply(ops.sub, o, self)
    def __mul__(self, o): return apply(ops.mul, self, o)
    def __rmul__(self, o): return apply(ops.mul, o, self)
    def __truediv__(self, o): return apply(ops.div, self, o)
    def __rtruediv__(self, o): return apply(ops.div, o, self)
    # Python's floor division and modulo: a % b has the sign of b, a // b = (a - a % b) / b.
    def __mod__(self, o): return apply(elementwise.mod, self, o)
    def __rmod__(self, o): return apply(elementwise.mod, o, self)
    def __floordiv__(self, o): return apply(elementwise.floor_divide, self, o)
    def __rfloordiv__(self, o): return apply(elementwise.floor_divide, o, self)
    def __neg__(self): return apply(ops.neg, self)
    def __pos__(self): return self
    def __abs__(self): return apply(ops.abs_, self)
    # Comparisons are 0.0/1.0 masks; == and != stay identity, which graphs rely on to hash.
    def __lt__(self, o): return apply(ops.less, self, o)
    def __le__(self, o): return apply(ops.less_equal, self, o)
    def __gt__(self, o): return apply(ops.greater, self, o)
    def __ge__(self, o): return apply(ops.greater_equal, self, o)

    def __matmul__(self, o):
        if isinstance(o, Transposed):
            return apply(ops.matmul, self, o.matrix, transpose_b=True)
        return apply(ops.matmul, self, o)

    def __rmatmul__(self, o): return apply(ops.matmul, o, self)

    def __pow__(self, exponent: Any) -> Value:
        """``x ** p`` for a constant Python number ``p``."""
        if isinstance(exponent, bool) or not isinstance(
                exponent, (int, float, np.floating, np.integer)):
            raise ShapeError(f"x ** p needs a constant Python number p, got "
                             f"{type(exponent).__name__}; for a traced exponent write "
                             f"rnnc.exp(p * rnnc.log(x)) (at {_user_location()})")
        return apply(ops.power, self, exponent=float(exponent))

    def __rpow__(self, base: Any) -> Value:
        raise ShapeError(f"p ** x with a traced exponent x is not supported: ** takes a constant "
                         f"Python number exponent; write rnnc.exp(x * math.log(p)) "
                         f"(at {_user_location()})")

    @property
    def T(self) -> Transposed:  # noqa: N802 - NumPy's name
        """The transpose of a matrix parameter, valid only on the right of ``@``:
        ``x @ W.T`` is ``matmul[transpose_b]`` of ``W`` as stored (tied weights)."""
        shape = self.shape
        if len(shape) != 2 or any(isinstance(d, str) for d in shape):
            raise ShapeError(f".T needs a matrix parameter (k, n), got "
                             f"{ops.fmt_shape(shape)} (at {_user_location()})")
        return Transposed(self)

    def reshape(self, *shape: Any) -> Value: return dsl_tensor.reshape(self, *shape)
    def sum(self, axis: int = -1, keepdims: bool = False) -> Value:
        return dsl_tensor.total(self, axis, keepdims)
    def mean(self, axis: int = -1, keepdims: bool = False) -> Value:
        return dsl_tensor.average(self, axis, keepdims)

    def __getitem__(self, key: Any) -> Value:
        """Slice the last axis: ``v[:, a:b]``, ``v[:, a:b:s]`` (every ``s``-th column,
        ``s >= 1``), ``v[..., a:b]``; add axes with None: ``v[:, :, None]``, ``v[..., None]``."""
        return dsl_tensor.index(self, key)

    def __bool__(self) -> bool:
        raise RnncTypeError("a traced rnnc value has no truth value; use rnnc.where(c, a, b)")

    def __array__(self, *a, **k):
        raise RnncTypeError("a traced rnnc value cannot become a NumPy array")

    # ``array * value`` runs the operator; ``np.tanh(value)``, ``np.concatenate([...])`` and
    # the like raise an error naming rnnc's function (rnnc.tanh, rnnc.concat).
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return dsl_numpy.array_ufunc(ufunc, method, inputs, kwargs, _user_location())
    def __array_function__(self, func, types, args, kwargs):
        raise dsl_numpy.refuse(func.__name__, _user_location())


class Transposed:
    """``W.T``: a matrix read transposed by the ``@`` it is the right operand of, and nothing
    else (rnnc has no transpose op: ops act on the feature axis of each row)."""

    __array_priority__ = 1000

    def __init__(self, matrix: Value) -> None:
        self.matrix = matrix

    def __repr__(self) -> str:
        return f"<rnnc.Value %{self.matrix.node}.T>"

    def misuse(self, *_: Any) -> Any:
        raise ShapeError(f"W.T is valid only as the right operand of @ (x @ W.T), not here "
                         f"(at {_user_location()})")


# Every operator but ``x @ W.T`` is a misuse of W.T; say so instead of a bare TypeError.
for _name in ("add", "sub", "mul", "truediv", "pow", "matmul"):
    setattr(Transposed, f"__{_name}__", Transposed.misuse)
    setattr(Transposed, f"__r{_name}__", Transposed.misuse)
for _name in ("lt", "le", "gt", "ge", "neg", "pos", "abs", "getitem", "bool", "array"):
    setattr(Transposed, f"__{_name}__", Transposed.misuse)


def _as_value(cell: Cell, v: Any) -> Value:
    if isinstance(v, Transposed):
        v.misuse()
    if isinstance(v, Value):
        if v.cell is not cell:
            raise CellError(f"a value of cell {v.cell.name!r} used in cell {cell.name!r} "
                            f"(at {_user_location()})")
        return v
    if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool):
        return Value(cell, cell.graph.add(ops.constant, (), {"value": float(v)},
                                          loc=_user_location()))
    raise RnncTypeError(f"expected an rnnc value or a Python number, got {type(v).__name__} "
                        f"(at {_user_location()})")


def apply(op: ops.Op, *args: Any, **attrs: Any) -> Value:
    """Record ``op(*args)`` in the cell the traced arguments belong to."""
    for a in args:
        if isinstance(a, Transposed):
            a.misuse()
    cells = [a.cell for a in args if isinstance(a, Value)]
    if not cells:
        raise RnncTypeError(f"{op.name} needs at least one traced rnnc value")
    cell = cells[0]
    values = [_as_value(cell, a) for a in args]
    loc = _user_location()
    try:
        nid = cell.graph.add(op, [v.node for v in values], attrs, loc=loc)
    except ShapeError as err:
        shapes = ", ".join(str(cell.graph.node(v.node).type) for v in values)
        raise ShapeError(f"{op.name}({shapes}): {err} (at {loc})") from None
    return Value(cell, nid)


class Cell:
    """One time step of a recurrent cell, recorded by tracing."""

    def __init__(self, name: str = "cell") -> None:
        self.name = name
        self.graph = Graph("f32")
        self.inputs: dict[str, int] = {}
        self.no_grad: set[str] = set()  # inputs declared grad=False
        self.states: dict[str, int] = {}
        self.params: dict[str, int] = {}
        self.inits: dict[str, Init | None] = {}
        self.updates: dict[str, int] = {}
        self.outputs: dict[str, int] = {}

    # -- declarations
    def _declare(self, name: str, what: str) -> str:
        check_name(name, what)
        taken = {**self.inputs, **self.states, **self.params, **self.outputs}
        if name in taken:
            raise CellError(f"{what} name {name!r} is already used in cell {self.name!r}")
        return name

    def input(self, name: str, size: int | tuple[int, ...], grad: bool = True) -> Value:
        """A per-step input ``(B, size)`` or ``(B, *shape)``; the sequence passed to the function
        is (T, B, size), with a shape's sizes multiplied (row-major, docs/tensors.md).

        ``grad=False`` declares it data (a mask, conditioning features): autodiff takes no
        derivative for it and backward returns no gradient of it."""
        if not isinstance(grad, bool):
            raise RnncTypeError(f"grad of input {name!r} must be True or False, got {grad!r}")
        self._declare(name, "input")
        if not grad:
            self.no_grad.add(name)
        shape = dsl_tensor.feature_shape(size, f"input {name!r}")
        nid = self.graph.arg(name, ("B", int(np.prod(shape))))
        self.inputs[name] = nid
        return Value(self, nid) if len(shape) == 1 else dsl_tensor.reshape(Value(self, nid), shape)

    def state(self, name: str, size: int | tuple[int, ...]) -> Value:
        """A carried state ``(B, size)`` or ``(B, *shape)``: its value at step t-1. The order
        of the ``state`` calls is the order of an ``hx`` tuple given to ``rnnc.torch.RNN``
        (docs/porting.md)."""
        self._declare(name, "state")
        nid = self.graph.arg(name, ("B",) + dsl_tensor.feature_shape(size, f"state {name!r}"))
        self.states[name] = nid
        return Value(self, nid)

    def param(self, name: str, shape: int | tuple[int, ...], init: Init | float | None = None
              ) -> Value:
        """A parameter of ``shape`` (a vector ``(n,)``, a matrix ``(k, n)`` read as ``x @ W``:
        the transpose of an ``nn.Linear`` weight, or any rank, e.g. ``(H, d, d)`` for
        ``rnnc.einsum``). ``rnnc.torch.RNN`` registers it as ``{name}_l{k}``
        (``{name}_l{k}_reverse`` for a reverse direction)."""
        self._declare(name, "parameter")
        shape = dsl_tensor.feature_shape(shape, f"parameter {name!r}")
        if init is not None and not callable(init) and not isinstance(init, (int, float)):
            raise CellError(f"init of parameter {name!r} must be a callable or a number")
        nid = self.graph.arg(name, shape)
        self.params[name] = nid
        self.inits[name] = init
        return Value(self, nid)

    def update(self, **next_values: Value) -> None:
        """Set the next value of each named state."""
        for name, v in next_values.items():
            if name not in self.states:
                raise CellError(f"update of unknown state {name!r}; states are "
                                f"{sorted(self.states)}")
            if name in self.updates:
                raise CellError(f"state {name!r} is updated twice")
            v = _as_value(self, v)
            want = self.graph.node(self.states[name]).shape
            if v.shape != want:
                raise ShapeError(f"update of state {name!r} has shape {ops.fmt_shape(v.shape)}, "
                                 f"expected {ops.fmt_shape(want)} (at {_user_location()})")
            self.updates[name] = v.node

    def output(self, name: str, value: Value) -> None:
        """A per-step output ``(B, n)``, stacked over time into ``(T, B, n)``."""
        self._declare(name, "output")
        value = _as_value(self, value)
        if len(value.shape) != 2 or value.shape[0] != "B":
            raise ShapeError(f"output {name!r} must be a per-step value [B,n], got "
                             f"{ops.fmt_shape(value.shape)}: reshape it, v.reshape(-1) "
                             f"(at {_user_location()})")
        self.outputs[name] = value.node

    # -- use
    @property
    def hidden_size(self) -> int:
        return self.graph.node(next(iter(self.states.values()))).shape[1]

    def sizes(self, role: str) -> dict[str, tuple]:
        table = {"input": self.inputs, "state": self.states, "param": self.params}[role]
        return {n: self.graph.node(i).shape for n, i in table.items()}

    def check(self) -> None:
        """Raise CellError if the cell cannot be compiled."""
        if not self.inputs:
            raise CellError(f"cell {self.name!r} declares no input")
        if not self.states:
            raise CellError(f"cell {self.name!r} declares no state")
        missing = [s for s in self.states if s not in self.updates]
        if missing:
            raise CellError(f"state {missing[0]!r} of cell {self.name!r} is never updated "
                            f"(call cell.update({missing[0]}=...))")

    def init_params(self, seed: int = 0, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """PyTorch's default init: uniform in ±1/sqrt(hidden), reproducible from ``seed``."""
        self.check()
        rng = np.random.default_rng(seed)
        bound = 1.0 / np.sqrt(self.hidden_size)
        out = {}
        for name, shape in self.sizes("param").items():
            check_allocatable(name, shape, dtype)
            arr = initial_values(name, self.inits[name], rng, shape, bound)
            out[name] = np.ascontiguousarray(arr, dtype=dtype)
        return out

    def program(self, reverse: bool = False) -> Program:
        """The cell as a program: an empty pre-loop graph, the step as a scan, nothing after.

        ``reverse`` runs the scan over t = T-1, ..., 0 (the reverse direction of a layer)."""
        self.check()
        body = self.graph.copy()
        body.outputs = {**self.updates, **self.outputs}
        # DCE here keeps unused declarations (e.g. an unused parameter) as args.
        for n in sorted(body.dead_code()):
            body.remove(n)
        args = {}
        for name, nid in self.inputs.items():
            args[name] = (Role.INPUT, Type("f32", ("T",) + body.node(nid).shape))
        for name, nid in self.states.items():
            args[name] = (Role.STATE, Type("f32", body.node(nid).shape))
        for name, nid in self.params.items():
            args[name] = (Role.PARAM, Type("f32", body.node(nid).shape))
        random, seqs, consts = dsl_random.program_args(body)  # rng.*, when it draws masks
        args.update(random)
        scan = Scan(body, seqs=tuple(self.inputs) + seqs, consts=tuple(self.params) + consts,
                    carries=tuple(Carry(s, s, final_state(s)) for s in self.states),
                    stacked=tuple(self.outputs), reverse=reverse)
        results = tuple(self.outputs) + tuple(final_state(s) for s in self.states)
        no_grad = tuple(n for n in self.inputs if n in self.no_grad)
        return Program(args, Graph("f32"), scan, Graph("f32"), results, "f32", cell=self.name,
                       no_grad=no_grad)


# ---------------------------------------------------------------- functions on values

# Every op its family declares with dsl_function (the default) is a function of rnnc named after
# it, with the family's docstring: rnnc.tanh(v), rnnc.where(c, a, b). The others a cell writes as
# operators on values (+ - * / unary - ** @), as indexing (v[:, a:b]) or as Python numbers, or
# only passes make them.
_OPERANDS = {1: ("x",), 2: ("a", "b"), 3: ("cond", "a", "b")}  # parameter names by arity


def _function(op: ops.Op) -> Callable[..., Value]:
    """The DSL function recording ``op``: over a list of values when the op takes any number
    of operands, else over its operands."""
    if op.arity is None:
        def function(values: list[Value] | tuple[Value, ...]) -> Value:
            if not isinstance(values, (list, tuple)) or not values:
                raise RnncValueError(f"{op.name} takes a non-empty list of values")
            return apply(op, *values)
    else:
        member = elementwise.MEMBERS.get(op.name)
        attributes = member.attributes if member else ()  # constants after the operands
        signature = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                       for n in _OPERANDS[op.arity] + attributes])

        def function(*operands: Any, **named: Any) -> Value:
            args = signature.bind(*operands, **named).args
            return apply(op, *args[:op.arity], **dict(zip(attributes, args[op.arity:],
                                                          strict=True)))
        function.__signature__ = signature  # type: ignore[attr-defined]
    function.__name__ = function.__qualname__ = op.name
    function.__doc__ = op.doc
    return function


# The DSL functions by name, one per op of the registry a cell calls by name.
FUNCTIONS: dict[str, Callable[..., Value]] = {
    op.name: _function(op) for op in ops.REGISTRY.values() if op.dsl_function}
FUNCTIONS["bernoulli"] = dsl_random.bernoulli  # attributes, not operands: its own signature
FUNCTIONS.update(einsum=dsl_tensor.einsum, reshape=dsl_tensor.reshape)  # a spec, a shape
globals().update(FUNCTIONS)

__all__ = ["Cell", "Value", "apply", "FUNCTIONS", *FUNCTIONS]
