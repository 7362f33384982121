"""One row per primitive: NumPy reference vs a plain NumPy expression, shape rule vs reference.

Every primitive in ``rnnc.ops.PRIMITIVES`` must have a row in ``ROWS``: a new primitive without
one fails ``test_every_primitive_has_a_row``. Shapes are written symbolically (``"T"``, ``"B"``)
for the shape rule and made concrete with ``SIZES`` for the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from rnnc import ops, ops_tensor
from rnnc import ops_elementwise as elementwise
from rnnc.errors import RnncError, ShapeError

SIZES = {"T": 3, "B": 2}
N = 4  # feature size


def _concrete(shape: tuple) -> tuple[int, ...]:
    return tuple(SIZES.get(d, d) if isinstance(d, str) else d for d in shape)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(1000) = inf gives the right limit 0
        return 1.0 / (1.0 + np.exp(-x))


@dataclass
class Row:
    """How to test one primitive.

    ``oracle`` is the plain NumPy expression the reference must match; ``shapes`` are operand
    shape tuples (symbolic) to check the shape rule on; ``bad`` are operand shapes the shape rule
    must reject; ``positive`` draws positive inputs (log, sqrt, rsqrt).
    """

    oracle: Callable[..., np.ndarray]
    shapes: list[tuple[tuple, ...]]
    bad: list[tuple[tuple, ...]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    positive: bool = False


# Operand shapes for elementwise ops: per-step, vector parameter, (B,1) reductions, scalars and
# hoisted (T,B,n) sequences, with broadcasting in both directions.
UNARY_SHAPES = [(("B", N),), ((N,),), (("B", 1),), (("T", "B", N),), ((),)]
BINARY_SHAPES = [
    (("B", N), ("B", N)),
    (("B", N), (N,)),
    ((N,), ("B", N)),
    (("B", N), ("B", 1)),
    (("B", 1), ("B", N)),
    (("B", N), ()),
    ((), ("B", N)),
    (("T", "B", N), ("T", "B", N)),
    (("T", "B", N), (N,)),
    (("T", "B", N), ("B", N)),
    (("T", "B", 1), ("T", "B", N)),
    ((N,), (N,)),
]
BINARY_BAD = [
    (("B", N), ("B", N + 1)),
    (("B", N), (N + 1,)),
    (("B", N), (5, N)),  # symbolic batch never matches a concrete size other than 1
    (("T", "B", N), ("B", N - 1)),
]

ROWS: dict[str, Row] = {
    "add": Row(lambda a, b: a + b, BINARY_SHAPES, BINARY_BAD),
    "sub": Row(lambda a, b: a - b, BINARY_SHAPES, BINARY_BAD),
    "mul": Row(lambda a, b: a * b, BINARY_SHAPES, BINARY_BAD),
    "div": Row(lambda a, b: a / b, BINARY_SHAPES, BINARY_BAD, positive=True),
    "neg": Row(lambda a: -a, UNARY_SHAPES),
    "exp": Row(np.exp, UNARY_SHAPES),
    "log": Row(np.log, UNARY_SHAPES, positive=True),
    "tanh": Row(np.tanh, UNARY_SHAPES),
    "sigmoid": Row(_sigmoid, UNARY_SHAPES),
    "relu": Row(lambda a: np.where(a > 0, a, 0.0), UNARY_SHAPES),
    "sqrt": Row(np.sqrt, UNARY_SHAPES, positive=True),
    "rsqrt": Row(lambda a: 1.0 / np.sqrt(a), UNARY_SHAPES, positive=True),
    "where": Row(
        lambda c, a, b: np.where(c > 0, a, b),
        [
            (("B", N), ("B", N), ("B", N)),
            (("B", N), (), ("B", N)),
            (("B", 1), ("B", N), (N,)),
            ((), ("B", N), ()),
            (("T", "B", N), ("T", "B", N), (N,)),
        ],
        [(("B", N), ("B", N), ("B", N + 1)), (("B", 3), ("B", N), ("B", N))],
    ),
    "matmul": Row(
        lambda a, b: a @ b,
        [(("B", 3), (3, N)), (("T", "B", 3), (3, N)), ((3,), (3, N)), (("B", 1), (1, N))],
        [
            (("B", 3), (N, N)),
            (("B", 3), ("B", 3)),  # the right operand may not carry a batch axis
            (("T", "B", 3), (3,)),
            ((), (3, N)),
        ],
    ),
    "concat": Row(
        lambda *xs: np.concatenate(xs, axis=-1),
        [(("B", 2), ("B", 3)), (("T", "B", 1), ("T", "B", 3), ("T", "B", 2)), (("B", N),)],
        [(("B", 2), ("T", "B", 3)), ((), ("B", 3))],
    ),
    "slice": Row(
        lambda a: a[..., 1:3],
        [(("B", N),), (("T", "B", N),), ((N,),)],
        [(("B", 2),), ((),)],
        attrs={"start": 1, "stop": 3},
    ),
    "pad": Row(
        lambda a: np.concatenate(
            [np.zeros(a.shape[:-1] + (1,)), a, np.zeros(a.shape[:-1] + (2,))], axis=-1),
        [(("B", N),), (("T", "B", N),), ((N,),)],
        attrs={"before": 1, "after": 2},
    ),
    "sum": Row(
        lambda a: np.sum(a, axis=-1, keepdims=True),
        [(("B", N),), (("T", "B", N),), ((N,),)],
        [((),)],
    ),
    "mean": Row(
        lambda a: np.sum(a, axis=-1, keepdims=True) / a.shape[-1],
        [(("B", N),), (("T", "B", N),), ((N,),)],
        [((),)],
    ),
    "expand": Row(
        lambda a: a * np.ones(a.shape[:-1] + (N,)),
        [(("B", 1),), (("T", "B", 1),)],
        [(("B", N),), ((),)],
        attrs={"size": N},
    ),
    "sum_rows": Row(
        lambda a: a.sum(axis=tuple(range(a.ndim - 1))),
        [(("B", N),), (("T", "B", N),)],
    ),
    "constant": Row(lambda: np.float64(2.5), [()], attrs={"value": 2.5}),
    "less": Row(lambda a, b: np.where(a < b, 1.0, 0.0), BINARY_SHAPES, BINARY_BAD),
    "less_equal": Row(lambda a, b: np.where(a <= b, 1.0, 0.0), BINARY_SHAPES, BINARY_BAD),
    "greater": Row(lambda a, b: np.where(a > b, 1.0, 0.0), BINARY_SHAPES, BINARY_BAD),
    "greater_equal": Row(lambda a, b: np.where(a >= b, 1.0, 0.0), BINARY_SHAPES, BINARY_BAD),
    "maximum": Row(np.maximum, BINARY_SHAPES, BINARY_BAD),
    "minimum": Row(np.minimum, BINARY_SHAPES, BINARY_BAD),
    "abs": Row(lambda a: np.where(a < 0, -a, a), UNARY_SHAPES),
    "power": Row(lambda a: a * a * a, UNARY_SHAPES, attrs={"exponent": 3.0}),
    "softplus": Row(lambda a: np.log(1.0 + np.exp(a)), UNARY_SHAPES),
    "stop_gradient": Row(lambda a: a, UNARY_SHAPES),
    "amax": Row(lambda a: np.sort(a, axis=-1)[..., -1:], [(("B", N),), (("T", "B", N),), ((N,),)],
                [((),)]),
    "amin": Row(lambda a: np.sort(a, axis=-1)[..., :1], [(("B", N),), (("T", "B", N),), ((N,),)],
                [((),)]),
    # rng.key [4] and rng.counter [...,4]: p=1 keeps every element (the bits themselves:
    # tests/rnnc/test_random.py, against Random123's known answers).
    "bernoulli": Row(lambda key, counter: np.ones(counter.shape[:-1] + (N,)),
                     [((4,), ("B", 4)), ((4,), ("T", "B", 4))],
                     [((3,), ("B", 4)), ((4,), ("B", 3))],
                     attrs={"p": 1.0, "per": "step", "size": N, "stream": 0}, positive=True),
    # Over the time axis (reverse: from the last step); A and Bv broadcast to [T,B,n].
    "linear_scan": Row(
        lambda a, b, c0: _reverse_linear_recurrence(a, b, c0),
        [(("T", "B", N), ("T", "B", N), ("B", N)), ((N,), ("T", "B", N), ("B", N)),
         (("T", "B", 1), (), ("B", N))],
        [(("B", N), ("B", N), ("B", N)), (("T", "B", N + 1), ("T", "B", N), ("B", N)),
         (("T", "B", N), ("T", "B", N), ("T", "B", N))],
        attrs={"reverse": True, "exclusive": False},
    ),
    "last_step": Row(lambda a: a[-1], [(("T", "B", N),), (("T", N),)], [(("B", N),), ((N,),)],
                     attrs={"reverse": False}),
}


def _reverse_linear_recurrence(a, b, c0):
    """C[t] = sum over s >= t of (A[t] ... A[s-1]) Bv[s], plus (A[t] ... A[T-1]) c0."""
    T = SIZES["T"]
    a, b = (np.broadcast_to(v, (T,) + c0.shape) for v in (a, b))
    return np.stack([sum(np.prod(a[t:s], axis=0) * b[s] for s in range(t, T))
                     + np.prod(a[t:], axis=0) * c0 for t in range(T)])


def test_every_primitive_has_a_row() -> None:
    # The elementwise family is tested from its own table (tests/rnnc/test_elementwise_family.py):
    # a row here is optional for its members, and adds broadcasting cases.
    # The tensor family likewise: tests/rnnc/test_tensor_ops.py.
    names = {op.name for op in ops.PRIMITIVES}
    required = names - {m.op.name for m in elementwise.DRAWN} - {
        op.name for op in ops_tensor.FAMILY}
    assert required <= set(ROWS) <= names, (
        f"primitives without a test row: {sorted(required - set(ROWS))}; "
        f"rows without a primitive: {sorted(set(ROWS) - names)}"
    )


def _row(op: ops.Op) -> Row:
    if op.name not in ROWS:
        pytest.fail(f"primitive {op.name!r} has no row in tests/rnnc/test_ops.py ROWS")
    return ROWS[op.name]


def _inputs(row: Row, shapes: tuple[tuple, ...], rng: np.random.Generator, dtype=np.float64):
    out = []
    for s in shapes:
        a = rng.standard_normal(_concrete(s))
        if row.positive:
            a = np.abs(a) + 0.5
        out.append(np.asarray(a, dtype=dtype))
    return out


PRIMS = pytest.mark.parametrize(
    "op", [op for op in ops.PRIMITIVES if op.name in ROWS],
    ids=lambda op: op.name)


@PRIMS
def test_ref_matches_numpy(op: ops.Op) -> None:
    row = _row(op)
    rng = np.random.default_rng(0)
    for shapes in row.shapes:
        xs = _inputs(row, shapes, rng)
        got = op.ref(*xs, **row.attrs)
        want = row.oracle(*xs)
        assert np.shape(got) == np.shape(want), (op.name, shapes)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{op.name}{shapes}")


@PRIMS
def test_ref_keeps_float32(op: ops.Op) -> None:
    """The dtype rule: the result has the dtype of the operands."""
    row = _row(op)
    rng = np.random.default_rng(1)
    shapes = row.shapes[0]
    xs = _inputs(row, shapes, rng, np.float32)
    attrs = dict(row.attrs)
    if op is ops.constant:
        attrs["dtype"] = np.float32
    got = np.asarray(op.ref(*xs, **attrs))
    assert got.dtype == np.float32, (op.name, got.dtype)
    want = row.oracle(*(x.astype(np.float64) for x in xs))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@PRIMS
def test_shape_rule_matches_ref(op: ops.Op) -> None:
    row = _row(op)
    rng = np.random.default_rng(2)
    for shapes in row.shapes:
        symbolic = op.shape(*shapes, **row.attrs)
        got = np.shape(op.ref(*_inputs(row, shapes, rng), **row.attrs))
        assert _concrete(symbolic) == got, (op.name, shapes, symbolic)
        # Symbols survive the rule: a batch axis in an operand stays symbolic in the result.
        if any("B" in s for s in shapes) and op is not ops.sum_rows:
            assert "B" in symbolic, (op.name, shapes, symbolic)


@PRIMS
def test_shape_rule_rejects_incompatible_shapes(op: ops.Op) -> None:
    row = _row(op)
    for shapes in row.bad:
        with pytest.raises(ShapeError) as info:
            op.shape(*shapes, **row.attrs)
        assert isinstance(info.value, RnncError) and isinstance(info.value, ValueError)
        # The message shows the offending shapes.
        msg = str(info.value)
        assert any(ops.fmt_shape(s) in msg for s in shapes), msg


def test_matmul_transposed_variants() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 2, 5))
    g = rng.standard_normal((3, 2, N))
    w = rng.standard_normal((N, 5))
    # transpose_a contracts every leading axis: sum over t, b of a[t,b]^T g[t,b].
    want = np.einsum("tbi,tbj->ij", a, g)
    np.testing.assert_allclose(ops.matmul.ref(a, g, transpose_a=True), want, rtol=1e-12)
    assert ops.matmul.shape(("T", "B", 5), ("T", "B", N), transpose_a=True) == (5, N)
    np.testing.assert_allclose(ops.matmul.ref(a, w, transpose_b=True),
                               np.einsum("tbk,nk->tbn", a, w), rtol=1e-12)
    assert ops.matmul.shape(("T", "B", 5), (N, 5), transpose_b=True) == ("T", "B", N)
    with pytest.raises(ShapeError):
        ops.matmul.shape(("B", 5), (5, N), transpose_b=True)
    with pytest.raises(ShapeError):
        ops.matmul.shape(("T", "B", 5), ("B", N), transpose_a=True)


def test_sigmoid_saturates_without_overflow() -> None:
    x = np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        y = ops.sigmoid.ref(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, _sigmoid(x.astype(np.float64)), rtol=1e-6, atol=0)


