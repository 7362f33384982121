"""The primitive ops: each declared once with its shape rule, NumPy reference and VJP.

A shape is a tuple of dims; a dim is an int or a symbol ("T" steps, "B" batch). Per-step values
are ``(B, n)``, parameters ``(n,)`` or ``(k, n)``, sequences outside the loop ``(T, B, n)`` and
Python scalars ``()``. Every op works on the last (feature) axis and treats the leading axes as
rows, so the same op is valid inside the loop on ``(B, n)`` and, once hoisted, on ``(T, B, n)``.

All values of a program share one floating dtype, so the dtype rule of every op is the same:
the result has the dtype of its operands.

A VJP rule receives an emitter ``e`` (``e(op, *inputs, **attrs) -> value``), the cotangent ``g``
of the result, the op's inputs ``xs``, its result ``y`` and its attributes; it returns one
cotangent (or None for "no gradient") per input, at the shape of the result. The autodiff
transform reduces broadcast cotangents back to the input's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc.errors import ShapeError

Shape = tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class Op:
    """A primitive: a name plus one rule per job."""

    name: str
    kind: str  # "elementwise" | "matmul" | "reduce" | "layout" | "source" | "structural"
    arity: int | None  # None: any number of inputs
    shape: Callable[..., Any]
    ref: Callable[..., Any]
    vjp: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return f"Op({self.name})"


REGISTRY: dict[str, Op] = {}


def _register(op: Op) -> Op:
    assert op.name not in REGISTRY, op.name
    REGISTRY[op.name] = op
    return op


def fmt_shape(shape: Shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# ---------------------------------------------------------------- shape rules


def broadcast_shapes(*shapes: Shape) -> Shape:
    """NumPy broadcasting over symbolic dims; a symbol only matches itself or 1."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(-rank, 0):
        dims = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(dims) > 1:
            raise ShapeError(
                "cannot broadcast shapes " + ", ".join(fmt_shape(s) for s in shapes)
                + f": axis {axis} has sizes {sorted(map(str, dims))}"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _elementwise_shape(*shapes: Shape, **_: Any) -> Shape:
    return broadcast_shapes(*shapes)


def _matmul_shape(a: Shape, b: Shape, transpose_a: bool = False,
                  transpose_b: bool = False) -> Shape:
    if len(a) < 1 or len(b) < 1:
        raise ShapeError(f"matmul needs arrays, got {fmt_shape(a)} @ {fmt_shape(b)}")
    if transpose_a:
        # Contract every leading axis: sum over rows of a[r, :]^T b[r, :].
        if transpose_b or a[:-1] != b[:-1]:
            raise ShapeError(
                f"matmul[transpose_a] needs equal leading axes, got {fmt_shape(a)}, {fmt_shape(b)}"
            )
        return (a[-1], b[-1])
    if len(b) != 2 or any(isinstance(d, str) for d in b):
        raise ShapeError(
            f"matmul's right operand must be a matrix (k, n) without batch axes, got {fmt_shape(b)}"
        )
    k, n = (b[1], b[0]) if transpose_b else b
    if a[-1] != k:
        raise ShapeError(
            f"matmul: inner sizes differ: {fmt_shape(a)} @ "
            f"{fmt_shape(b)}{'^T' if transpose_b else ''} (expected left operand with {k} "
            f"features, got {a[-1]})"
        )
    return a[:-1] + (n,)


def _concat_shape(*shapes: Shape) -> Shape:
    if not shapes:
        raise ShapeError("concat needs at least one operand")
    lead = broadcast_shapes(*(s[:-1] + (1,) for s in shapes))[:-1]
    for s in shapes:
        if len(s) < 1 or s[:-1] != lead:
            raise ShapeError("concat needs equal leading axes, got "
                             + ", ".join(fmt_shape(s) for s in shapes))
    return lead + (sum(s[-1] for s in shapes),)


def _slice_shape(a: Shape, start: int, stop: int) -> Shape:
    if len(a) < 1 or not (0 <= start < stop <= a[-1]):
        raise ShapeError(f"slice [{start}:{stop}] out of range for {fmt_shape(a)}")
    return a[:-1] + (stop - start,)


def _pad_shape(a: Shape, before: int, after: int) -> Shape:
    return a[:-1] + (a[-1] + before + after,)


def _reduce_shape(a: Shape) -> Shape:
    if len(a) < 1:
        raise ShapeError(f"reduction over features needs an array, got {fmt_shape(a)}")
    return a[:-1] + (1,)


def _expand_shape(a: Shape, size: int) -> Shape:
    if len(a) < 1 or a[-1] != 1:
        raise ShapeError(f"expand needs a last axis of 1, got {fmt_shape(a)}")
    return a[:-1] + (size,)


def _sum_rows_shape(a: Shape) -> Shape:
    return a[-1:]


def _constant_shape(value: float) -> Shape:
    return ()


# ---------------------------------------------------------------- references


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split on sign so exp never overflows; the result is exact at saturation.
    with np.errstate(over="ignore"):
        z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(x.dtype, copy=False)


def _matmul_ref(a, b, transpose_a=False, transpose_b=False):
    if transpose_a:
        return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])
    return a @ (b.T if transpose_b else b)


def _concat_ref(*xs):
    # Broadcast the leading (row) axes only: the feature sizes differ by design.
    lead = np.broadcast_shapes(*(x.shape[:-1] for x in xs))
    return np.concatenate([np.broadcast_to(x, lead + x.shape[-1:]) for x in xs], axis=-1)


def _where_ref(c, a, b):
    return np.where(c > 0, a, b)


def _constant_ref(value: float, dtype=np.float64):
    return np.asarray(value, dtype=dtype)


# ---------------------------------------------------------------- vjp rules


def _c(e, value: float):
    return e(constant, value=value)


def _vjp_add(e, g, xs, y):
    return g, g


def _vjp_sub(e, g, xs, y):
    return g, e(neg, g)


def _vjp_mul(e, g, xs, y):
    a, b = xs
    return e(mul, g, b), e(mul, g, a)


def _vjp_div(e, g, xs, y):
    a, b = xs
    ga = e(div, g, b)
    return ga, e(neg, e(mul, ga, y))


def _vjp_neg(e, g, xs, y):
    return (e(neg, g),)


def _vjp_exp(e, g, xs, y):
    return (e(mul, g, y),)


def _vjp_log(e, g, xs, y):
    return (e(div, g, xs[0]),)


def _vjp_tanh(e, g, xs, y):
    return (e(mul, g, e(sub, _c(e, 1.0), e(mul, y, y))),)


def _vjp_sigmoid(e, g, xs, y):
    return (e(mul, g, e(mul, y, e(sub, _c(e, 1.0), y))),)


def _vjp_relu(e, g, xs, y):
    return (e(where, xs[0], g, _c(e, 0.0)),)


def _vjp_sqrt(e, g, xs, y):
    return (e(div, e(mul, g, _c(e, 0.5)), y),)


def _vjp_rsqrt(e, g, xs, y):
    return (e(mul, g, e(mul, _c(e, -0.5), e(mul, y, e(mul, y, y)))),)


def _vjp_where(e, g, xs, y):
    c = xs[0]
    zero = _c(e, 0.0)
    return None, e(where, c, g, zero), e(where, c, zero, g)


def _vjp_matmul(e, g, xs, y, transpose_a=False, transpose_b=False):
    a, b = xs
    if transpose_a:
        # y = sum_r a_r^T b_r: the cotangents are per row again.
        return e(matmul, b, g, transpose_b=True), e(matmul, a, g)
    if transpose_b:
        return e(matmul, g, b), e(matmul, g, a, transpose_a=True)
    return e(matmul, g, b, transpose_b=True), e(matmul, a, g, transpose_a=True)


def _vjp_concat(e, g, xs, y):
    grads, start = [], 0
    for x in xs:
        n = e.shape(x)[-1]
        grads.append(e(slice_, g, start=start, stop=start + n))
        start += n
    return tuple(grads)


def _vjp_slice(e, g, xs, y, start, stop):
    n = e.shape(xs[0])[-1]
    return (e(pad, g, before=start, after=n - stop),)


def _vjp_pad(e, g, xs, y, before, after):
    n = e.shape(xs[0])[-1]
    return (e(slice_, g, start=before, stop=before + n),)


def _vjp_sum(e, g, xs, y):
    return (e(expand, g, size=e.shape(xs[0])[-1]),)


def _vjp_mean(e, g, xs, y):
    n = e.shape(xs[0])[-1]
    return (e(expand, e(mul, g, _c(e, 1.0 / n)), size=n),)


def _vjp_expand(e, g, xs, y, size):
    return (e(sum_, g),)


def _vjp_sum_rows(e, g, xs, y):
    # Broadcast g over the rows of x; where() broadcasts without reading x's values.
    return (e(where, _c(e, 1.0), g, xs[0]),)


def _vjp_constant(e, g, xs, y, value):
    return ()


# ---------------------------------------------------------------- the table


def _unary(name, ref, vjp):
    return _register(Op(name, "elementwise", 1, _elementwise_shape, ref, vjp))


def _binary(name, ref, vjp):
    return _register(Op(name, "elementwise", 2, _elementwise_shape, ref, vjp))


add = _binary("add", np.add, _vjp_add)
sub = _binary("sub", np.subtract, _vjp_sub)
mul = _binary("mul", np.multiply, _vjp_mul)
div = _binary("div", np.divide, _vjp_div)
neg = _unary("neg", np.negative, _vjp_neg)
exp = _unary("exp", np.exp, _vjp_exp)
log = _unary("log", np.log, _vjp_log)
tanh = _unary("tanh", np.tanh, _vjp_tanh)
sigmoid = _unary("sigmoid", _sigmoid, _vjp_sigmoid)
relu = _unary("relu", lambda x: np.maximum(x, 0).astype(x.dtype, copy=False), _vjp_relu)
sqrt = _unary("sqrt", np.sqrt, _vjp_sqrt)
rsqrt = _unary("rsqrt", lambda x: 1 / np.sqrt(x), _vjp_rsqrt)
where = _register(Op("where", "elementwise", 3, _elementwise_shape, _where_ref, _vjp_where))
matmul = _register(Op("matmul", "matmul", 2, _matmul_shape, _matmul_ref, _vjp_matmul))
concat = _register(Op("concat", "layout", None, _concat_shape, _concat_ref, _vjp_concat))
slice_ = _register(Op("slice", "layout", 1, _slice_shape,
                      lambda x, start, stop: x[..., start:stop], _vjp_slice))
pad = _register(Op("pad", "layout", 1, _pad_shape,
                   lambda x, before, after: np.pad(x, [(0, 0)] * (x.ndim - 1) + [(before, after)]),
                   _vjp_pad))
sum_ = _register(Op("sum", "reduce", 1, _reduce_shape,
                    lambda x: x.sum(axis=-1, keepdims=True), _vjp_sum))
mean = _register(Op("mean", "reduce", 1, _reduce_shape,
                    lambda x: x.mean(axis=-1, keepdims=True), _vjp_mean))
expand = _register(Op("expand", "layout", 1, _expand_shape,
                      lambda x, size: np.repeat(x, size, axis=-1), _vjp_expand))
sum_rows = _register(Op("sum_rows", "reduce", 1, _sum_rows_shape,
                        lambda x: x.reshape(-1, x.shape[-1]).sum(axis=0), _vjp_sum_rows))
constant = _register(Op("constant", "source", 0, _constant_shape, _constant_ref, _vjp_constant))

PRIMITIVES: tuple[Op, ...] = tuple(REGISTRY.values())

# Ops whose output at one element depends only on the same element of the inputs (after
# broadcasting); the unit a backend emits as one loop or one kernel.
ELEMENTWISE: frozenset[Op] = frozenset(op for op in PRIMITIVES if op.kind == "elementwise")
