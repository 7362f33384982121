"""The rules behind the primitives of ``rnnc.ops``: shape rules, layout index rules, NumPy
references and VJP rules. ``rnnc.ops`` declares each op once from these.

A VJP rule receives an emitter ``e`` (``e(op, *inputs, **attrs) -> value``), the cotangent ``g``
of the result, the op's inputs ``xs``, its result ``y`` and its attributes; it returns one
cotangent (or None for "no gradient") per input, at the shape of the result. The autodiff
transform reduces broadcast cotangents back to the input's shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc.errors import ShapeError
from rnnc.op_types import Piece, broadcast_shapes, elementwise_shape, fmt_shape  # noqa: F401 - re-exported
from rnnc.op_types import op_named as _op
from rnnc.precision import BF16, matmul_attrs, round_bf16

Shape = tuple[Any, ...]


# ---------------------------------------------------------------- shape rules


def matmul_shape(a: Shape, b: Shape, transpose_a: bool = False,
                  transpose_b: bool = False, precision: str | None = None) -> Shape:
    if precision not in (None, "fp32", BF16):
        raise ShapeError(f"matmul's precision must be 'fp32' or 'bf16', got {precision!r}")
    if len(a) < 1 or len(b) < 1:
        raise ShapeError(f"matmul needs arrays, got {fmt_shape(a)} @ {fmt_shape(b)}")
    if transpose_a:
        # Contract every leading axis: sum over rows of a[r, :]^T b[r, :].
        if transpose_b or a[:-1] != b[:-1]:
            raise ShapeError(f"matmul[transpose_a] needs equal leading axes, got "
                             f"{fmt_shape(a)}, {fmt_shape(b)}")
        return (a[-1], b[-1])
    if len(b) != 2 or any(isinstance(d, str) for d in b):
        raise ShapeError(f"matmul's right operand must be a matrix (k, n) without batch axes, "
                         f"got {fmt_shape(b)}")
    k, n = (b[1], b[0]) if transpose_b else b
    if a[-1] != k:
        raise ShapeError(
            f"matmul: inner sizes differ: {fmt_shape(a)} @ "
            f"{fmt_shape(b)}{'^T' if transpose_b else ''} (expected left operand with {k} "
            f"features, got {a[-1]})"
        )
    return a[:-1] + (n,)


def concat_shape(*shapes: Shape) -> Shape:
    if not shapes:
        raise ShapeError("concat needs at least one operand")
    lead = broadcast_shapes(*(s[:-1] + (1,) for s in shapes))[:-1]
    for s in shapes:
        if len(s) < 1 or s[:-1] != lead:
            raise ShapeError("concat needs equal leading axes, got "
                             + ", ".join(fmt_shape(s) for s in shapes))
    return lead + (sum(s[-1] for s in shapes),)


def check_step(op: str, step: Any) -> int:
    """A layout op's ``step``: a positive int (1 is contiguous)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ShapeError(f"{op} step must be a positive integer (1: contiguous), got {step!r}")
    return int(step)


def step_attrs(step: int) -> dict[str, int]:
    """The ``step`` attribute as it is stored: omitted when 1, so contiguous layout ops keep
    one form (and print as they always have)."""
    return {} if step == 1 else {"step": step}


def slice_width(start: int, stop: int, step: int = 1) -> int:
    """How many columns ``[start:stop:step]`` holds."""
    return len(range(start, stop, step))


def slice_shape(a: Shape, start: int, stop: int, step: int = 1) -> Shape:
    step = check_step("slice", step)
    if len(a) < 1 or not (0 <= start < stop <= a[-1]):
        where = f"{start}:{stop}" + (f":{step}" if step != 1 else "")
        raise ShapeError(f"slice [{where}] out of range for {fmt_shape(a)}")
    return a[:-1] + (slice_width(start, stop, step),)


def pad_shape(a: Shape, before: int, after: int, step: int = 1) -> Shape:
    step = check_step("pad", step)
    # ``step - 1`` zeros between neighbouring columns of the operand.
    return a[:-1] + (a[-1] + (a[-1] - 1) * (step - 1) + before + after,)


def reduce_shape(a: Shape) -> Shape:
    if len(a) < 1:
        raise ShapeError(f"reduction over features needs an array, got {fmt_shape(a)}")
    return a[:-1] + (1,)


def expand_shape(a: Shape, size: int) -> Shape:
    if len(a) < 1 or a[-1] != 1:
        raise ShapeError(f"expand needs a last axis of 1, got {fmt_shape(a)}")
    return a[:-1] + (size,)


def sum_rows_shape(a: Shape) -> Shape:
    return a[-1:]


def constant_shape(value: float) -> Shape:  # a Python scalar
    return ()


# ---------------------------------------------------------------- layout index rules


def concat_pieces(*widths: int) -> tuple[Piece, ...]:
    out, start = [], 0
    for k, n in enumerate(widths):
        out.append(Piece(start, start + n, k, 1, -start))
        start += n
    return tuple(out)


def slice_pieces(width: int, start: int, stop: int, step: int = 1) -> tuple[Piece, ...]:
    return (Piece(0, slice_width(start, stop, step), 0, scale=step, offset=start),)


def pad_pieces(width: int, before: int, after: int, step: int = 1) -> tuple[Piece, ...]:
    end = before + (width - 1) * step + 1  # one past the operand's last column
    middle = (Piece(before, end, 0, 1, -before, div=step),)
    head = (Piece(0, before, None),) if before else ()
    tail = (Piece(end, end + after, None),) if after else ()
    return head + middle + tail


def expand_pieces(width: int, size: int) -> tuple[Piece, ...]:
    return (Piece(0, size, 0, 0, 0),)


# ---------------------------------------------------------------- references


def sigmoid(x: np.ndarray) -> np.ndarray:
    # Split on sign so exp never overflows; the result is exact at saturation.
    with np.errstate(over="ignore"):
        z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(x.dtype, copy=False)


def matmul_ref(a, b, transpose_a=False, transpose_b=False, precision=None):
    if precision == BF16:  # bfloat16 operands, products summed in float32 (rnnc.precision)
        a, b = round_bf16(a), round_bf16(b)
    if transpose_a:
        return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])
    return a @ (b.T if transpose_b else b)


def concat_ref(*xs):
    # Broadcast the leading (row) axes only: the feature sizes differ by design.
    lead = np.broadcast_shapes(*(x.shape[:-1] for x in xs))
    return np.concatenate([np.broadcast_to(x, lead + x.shape[-1:]) for x in xs], axis=-1)


def slice_ref(x, start: int, stop: int, step: int = 1):
    return x[..., start:stop:step]


def pad_ref(x, before: int, after: int, step: int = 1):
    n = x.shape[-1]
    out = np.zeros(x.shape[:-1] + (before + (n - 1) * step + 1 + after,), x.dtype)
    out[..., before:before + (n - 1) * step + 1:step] = x
    return out


def power_ref(x, exponent: float):
    """C99 ``pow(x, exponent)``: NumPy's, except that NumPy computes ``x ** 0.5`` as ``sqrt(x)``,
    which gives -0 at -0 and NaN at -inf where ``pow`` gives +0 and +inf."""
    x = np.asarray(x)
    out = np.power(x, np.asarray(exponent, x.dtype))
    if exponent == 0.5:
        out = np.where(x == -np.inf, np.asarray(np.inf, x.dtype), out + x.dtype.type(0.0))
    return out


def softplus_ref(x):
    # max(x, 0) + log1p(exp(-|x|)): exp never overflows and large |x| keeps full precision.
    x = np.asarray(x)
    return (np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))).astype(x.dtype, copy=False)


def where_ref(c, a, b):
    return np.where(c > 0, a, b)


def constant_ref(value: float, dtype=np.float64):
    return np.asarray(value, dtype=dtype)


# ---------------------------------------------------------------- vjp rules


def const(e, value: float):
    return e(_op("constant"), value=value)


def vjp_add(e, g, xs, y):
    return g, g


def vjp_sub(e, g, xs, y):
    return g, e(_op("neg"), g)


def vjp_mul(e, g, xs, y):
    a, b = xs
    return e(_op("mul"), g, b), e(_op("mul"), g, a)


def vjp_div(e, g, xs, y):
    a, b = xs
    ga = e(_op("div"), g, b)
    return ga, e(_op("neg"), e(_op("mul"), ga, y))


def vjp_neg(e, g, xs, y):
    return (e(_op("neg"), g),)


def vjp_exp(e, g, xs, y):
    return (e(_op("mul"), g, y),)


def vjp_log(e, g, xs, y):
    return (e(_op("div"), g, xs[0]),)


def vjp_tanh(e, g, xs, y):
    return (e(_op("mul"), g, e(_op("sub"), const(e, 1.0), e(_op("mul"), y, y))),)


def vjp_sigmoid(e, g, xs, y):
    return (e(_op("mul"), g, e(_op("mul"), y, e(_op("sub"), const(e, 1.0), y))),)


def vjp_relu(e, g, xs, y):
    return (e(_op("where"), xs[0], g, const(e, 0.0)),)


def vjp_sqrt(e, g, xs, y):
    return (e(_op("div"), e(_op("mul"), g, const(e, 0.5)), y),)


def vjp_rsqrt(e, g, xs, y):
    return (e(_op("mul"), g, e(_op("mul"), const(e, -0.5), e(_op("mul"), y, e(_op("mul"), y, y)))),)


def vjp_power(e, g, xs, y, exponent):
    # p * x^(p-1), not p * y / x, which is 0/0 at x = 0.
    slope = e(_op("power"), xs[0], exponent=exponent - 1.0)
    return (e(_op("mul"), g, e(_op("mul"), slope, const(e, exponent))),)


def vjp_softplus(e, g, xs, y):
    return (e(_op("mul"), g, e(_op("sigmoid"), xs[0])),)


def vjp_where(e, g, xs, y):
    c = xs[0]
    zero = const(e, 0.0)
    return None, e(_op("where"), c, g, zero), e(_op("where"), c, zero, g)


def vjp_matmul(e, g, xs, y, transpose_a=False, transpose_b=False, precision=None):
    a, b = xs
    # The gradient GEMMs of a bfloat16 GEMM are bfloat16 GEMMs too (autocast's rule).
    at = matmul_attrs(precision)
    if transpose_a:
        # y = sum_r a_r^T b_r: the cotangents are per row again.
        return (e(_op("matmul"), b, g, transpose_b=True, **at),
                e(_op("matmul"), a, g, **at))
    if transpose_b:
        return e(_op("matmul"), g, b, **at), e(_op("matmul"), g, a, transpose_a=True, **at)
    return (e(_op("matmul"), g, b, transpose_b=True, **at),
            e(_op("matmul"), a, g, transpose_a=True, **at))


def vjp_concat(e, g, xs, y):
    grads, start = [], 0
    for x in xs:
        n = e.shape(x)[-1]
        grads.append(e(_op("slice"), g, start=start, stop=start + n))
        start += n
    return tuple(grads)


def vjp_slice(e, g, xs, y, start, stop, step=1):
    # Scatter g back to the sliced columns, zeros elsewhere (between them too, when strided).
    n = e.shape(xs[0])[-1]
    last = start + (slice_width(start, stop, step) - 1) * step
    return (e(_op("pad"), g, before=start, after=n - last - 1, **step_attrs(step)),)


def vjp_pad(e, g, xs, y, before, after, step=1):
    n = e.shape(xs[0])[-1]
    return (e(_op("slice"), g, start=before, stop=before + (n - 1) * step + 1,
              **step_attrs(step)),)


def vjp_sum(e, g, xs, y):
    return (e(_op("expand"), g, size=e.shape(xs[0])[-1]),)


def vjp_mean(e, g, xs, y):
    n = e.shape(xs[0])[-1]
    return (e(_op("expand"), e(_op("mul"), g, const(e, 1.0 / n)), size=n),)


def vjp_expand(e, g, xs, y, size):
    return (e(_op("sum"), g),)


def vjp_sum_rows(e, g, xs, y):
    # Broadcast g over the rows of x; where() broadcasts without reading x's values.
    return (e(_op("where"), const(e, 1.0), g, xs[0]),)


def vjp_constant(e, g, xs, y, value):
    return ()
