"""One row per primitive: its VJP rule against float64 central differences of its NumPy reference.

The rules are evaluated eagerly: ``op.vjp`` is called with an emitter that applies each op's
NumPy reference at once (``e(op, *xs, **attrs) = op.ref(*xs, **attrs)``), so the rule is checked
on its own, without the autodiff transform or a backend. A rule returns cotangents at the shape
of the result; broadcast operands are summed back here with plain NumPy. A second set of tests
runs one-op cells through ``fn.forward``/``fn.backward`` to check that the autodiff transform
sums broadcast cotangents back (a ``(n,)`` parameter, ``(1, n)`` and ``(1, 1)``
parameters and a ``(B, 1)`` reduction against ``(B, n)``).

Every primitive in ``rnnc.ops.PRIMITIVES`` needs a row in ``ROWS``; a new one without a row
fails ``test_every_primitive_has_a_row``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import rnnc
from rnnc import ops, ops_tensor
from rnnc import ops_elementwise as elementwise

EPS = 1e-6
TOL = 1e-7  # central differences in float64 with EPS=1e-6 are good to ~1e-9 here


@dataclass
class Row:
    """Operand shapes (concrete), attributes, and how to draw the operands.

    ``positive``: operands in [0.5, 2] (log, sqrt, rsqrt). Otherwise operands are uniform in
    ±[0.2, 1.5] with random signs, away from relu's kink at 0. ``fixed`` marks operands that
    are not differentiated (where's condition).
    """

    shapes: tuple[tuple[int, ...], ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    positive: bool = False
    fixed: tuple[int, ...] = ()


B, N = 3, 4
# Each primitive maps to a list of cases; binary elementwise ops include broadcasting operands.
BROADCAST = [((B, N), (B, N)), ((B, N), (N,)), ((N,), (B, N)), ((B, N), (B, 1)),
             ((B, 1), (B, N)), ((B, N), ()), ((2, B, N), (N,))]
ROWS: dict[str, list[Row]] = {
    "add": [Row(s) for s in BROADCAST],
    "sub": [Row(s) for s in BROADCAST],
    "mul": [Row(s) for s in BROADCAST],
    "div": [Row(s, positive=True) for s in BROADCAST],
    "neg": [Row(((B, N),))],
    "exp": [Row(((B, N),))],
    "log": [Row(((B, N),), positive=True)],
    "tanh": [Row(((B, N),)), Row(((2, B, N),))],
    "sigmoid": [Row(((B, N),))],
    "relu": [Row(((B, N),)), Row(((2, B, N),))],
    "sqrt": [Row(((B, N),), positive=True)],
    "rsqrt": [Row(((B, N),), positive=True)],
    "where": [Row(((B, N), (B, N), (B, N)), fixed=(0,)),
              Row(((B, N), (N,), (B, 1)), fixed=(0,)),
              Row(((B, 1), (B, N), ()), fixed=(0,))],
    "matmul": [Row(((B, 5), (5, N))),
               Row(((2, B, 5), (5, N))),
               Row(((B, 5), (N, 5)), {"transpose_b": True}),
               Row(((B, 5), (B, N)), {"transpose_a": True}),
               Row(((2, B, 5), (2, B, N)), {"transpose_a": True})],
    "concat": [Row(((B, 2), (B, 3))), Row(((B, 1), (B, N), (B, 2)))],
    "slice": [Row(((B, 6),), {"start": 1, "stop": 4}), Row(((B, 6),), {"start": 0, "stop": 6}),
              Row(((2, B, 5),), {"start": 4, "stop": 5}),
              Row(((B, 7),), {"start": 1, "stop": 6, "step": 2}),
              Row(((2, B, 9),), {"start": 0, "stop": 9, "step": 4})],
    "pad": [Row(((B, 3),), {"before": 2, "after": 1}), Row(((B, 3),), {"before": 0, "after": 2}),
            Row(((B, 3),), {"before": 1, "after": 2, "step": 3})],
    "sum": [Row(((B, N),)), Row(((2, B, N),))],
    "mean": [Row(((B, N),)), Row(((2, B, N),))],
    "expand": [Row(((B, 1),), {"size": N}), Row(((2, B, 1),), {"size": 3})],
    "sum_rows": [Row(((B, N),)), Row(((2, B, N),))],
    "constant": [Row((), {"value": 1.5})],
    # Steps: no gradient to either operand, which the test checks as fixed.
    **{name: [Row(((B, N), (B, N)), fixed=(0, 1)), Row(((B, N), (N,)), fixed=(0, 1))]
       for name in ("less", "less_equal", "greater", "greater_equal")},
    "maximum": [Row(s) for s in BROADCAST],
    "minimum": [Row(s) for s in BROADCAST],
    "abs": [Row(((B, N),)), Row(((2, B, N),))],
    "power": [Row(((B, N),), {"exponent": 3.0}), Row(((B, N),), {"exponent": -2.0}),
              Row(((B, N),), {"exponent": 1.5}, positive=True),
              Row(((B, N),), {"exponent": 0.0})],
    "softplus": [Row(((B, N),)), Row(((2, B, N),))],
    "stop_gradient": [Row(((B, N),), fixed=(0,))],
    "amax": [Row(((B, N),)), Row(((2, B, N),))],
    "amin": [Row(((B, N),)), Row(((2, B, N),))],
    # A random mask: no gradient to the key or the counter.
    "bernoulli": [Row(((4,), (B, 4)), {"p": 0.5, "per": "step", "size": N, "stream": 1},
                      positive=True, fixed=(0, 1))],
    "linear_scan": [Row(((3, B, N), (3, B, N), (B, N))),
                    Row(((N,), (3, B, N), (B, N)), {"reverse": True}),
                    Row(((3, B, N), (3, B, N), (B, N)), {"exclusive": True}),
                    Row(((3, B, 1), (), (B, N)), {"reverse": True, "exclusive": True})],
    "last_step": [Row(((3, B, N),)), Row(((3, B, N),), {"reverse": True})],
}


class EagerEmitter:
    """Evaluates each op as the VJP rule emits it, with the op's NumPy reference."""

    def __call__(self, op: ops.Op, *xs: Any, **attrs: Any) -> np.ndarray:
        return np.asarray(op.ref(*(np.asarray(x, np.float64) for x in xs), **attrs), np.float64)

    def shape(self, v: Any) -> tuple[int, ...]:
        return np.shape(v)


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` over the axes NumPy broadcasting added or stretched to reach ``shape``."""
    g = np.asarray(g, np.float64)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return np.broadcast_to(g, shape)


def draw(rng: np.random.Generator, shape: tuple[int, ...], positive: bool) -> np.ndarray:
    if positive:
        return np.asarray(rng.uniform(0.5, 2.0, shape))
    return np.asarray(rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape))


def central_difference(f, xs: list[np.ndarray], k: int) -> np.ndarray:
    """d f(xs) / d xs[k] by central differences, element by element."""
    grad = np.zeros_like(xs[k])
    for idx in np.ndindex(xs[k].shape):
        plus = [x.copy() for x in xs]
        minus = [x.copy() for x in xs]
        plus[k][idx] += EPS
        minus[k][idx] -= EPS
        grad[idx] = (f(plus) - f(minus)) / (2 * EPS)
    return grad


def cases():
    for op in ops.PRIMITIVES:
        for i, row in enumerate(ROWS.get(op.name, ())):
            yield pytest.param(op, row, id=f"{op.name}-{i}")


def test_every_primitive_has_a_row() -> None:
    # The elementwise family is tested from its own table: tests/rnnc/test_elementwise_family.py.
    missing = [op.name for op in ops.PRIMITIVES
               if not ROWS.get(op.name) and op not in {m.op for m in elementwise.DRAWN}
               and op not in ops_tensor.FAMILY]  # tests/rnnc/test_tensor_ops.py
    assert not missing, f"primitives without a VJP row: {missing}"
    unknown = sorted(set(ROWS) - {op.name for op in ops.PRIMITIVES})
    assert not unknown, f"rows for unknown primitives: {unknown}"


@pytest.mark.parametrize("op,row", list(cases()))
def test_vjp_matches_central_differences(op: ops.Op, row: Row) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{op.name}{row.shapes}".encode()))
    xs = [draw(rng, s, row.positive) for s in row.shapes]
    y = np.asarray(op.ref(*xs, **row.attrs), np.float64)
    assert op.vjp is not None, f"{op.name} has no VJP rule"
    g = rng.standard_normal(y.shape)
    grads = op.vjp(EagerEmitter(), g, xs, y, **row.attrs)
    assert len(grads) == len(xs), (op.name, len(grads))

    def loss(values: list[np.ndarray]) -> float:
        return float(np.sum(g * op.ref(*values, **row.attrs)))

    for k, x in enumerate(xs):
        if k in row.fixed:
            assert grads[k] is None, f"{op.name}: operand {k} is not differentiable"
            continue
        assert grads[k] is not None, f"{op.name}: no cotangent for operand {k}"
        got = unbroadcast(grads[k], x.shape)
        want = central_difference(loss, xs, k)
        err = np.max(np.abs(got - want), initial=0.0) / max(1.0, np.max(np.abs(want),
                                                                          initial=0.0))
        assert err <= TOL, (op.name, k, row.shapes, got, want)


def test_vjp_rules_emit_only_registered_primitives() -> None:
    """A VJP rule builds IR, so it may only emit ops of the registry."""
    emitted: set[str] = set()

    class Recorder(EagerEmitter):
        def __call__(self, op, *xs, **attrs):
            assert op in ops.PRIMITIVES, op
            emitted.add(op.name)
            return super().__call__(op, *xs, **attrs)

    rng = np.random.default_rng(0)
    for op in ops.PRIMITIVES:
        for row in ROWS.get(op.name, ()):
            xs = [draw(rng, s, row.positive) for s in row.shapes]
            y = np.asarray(op.ref(*xs, **row.attrs), np.float64)
            op.vjp(Recorder(), np.ones_like(y), xs, y, **row.attrs)
    assert emitted <= {op.name for op in ops.PRIMITIVES}


# ------------------------------------------------------------ one-op cells through autodiff

T_CELL, B_CELL, N_CELL = 3, 2, 3


def _one_op_cell(build) -> rnnc.Cell:
    """A cell with input x and state h of N_CELL features and the parameters of ``PARAMS``;
    ``build(x, h, **params)`` gives the per-step value v; h' = tanh(v), y = v."""
    c = rnnc.Cell("one_op")
    x = c.input("x", N_CELL)
    h = c.state("h", N_CELL)
    params = {name: c.param(name, shape) for name, shape in PARAMS.items()}
    v = build(x, h, **params)
    c.update(h=rnnc.tanh(v))
    c.output("y", v)
    return c


# A vector, a matrix, and 2-D parameters with a leading axis of 1 that broadcast over the batch.
PARAMS = {"p": (N_CELL,), "W": (N_CELL, N_CELL), "r": (1, N_CELL), "s": (1, 1)}
ONE_OP = {
    "add-vector": lambda x, h, p, W, r, s: x + p + h,
    "sub-vector": lambda x, h, p, W, r, s: p - x * h,
    "mul-vector": lambda x, h, p, W, r, s: x * p + h,
    "div-vector": lambda x, h, p, W, r, s: x / (p * p + 1.0) + h,
    "add-reduced": lambda x, h, p, W, r, s: x + rnnc.sum(h * p),
    "mul-reduced": lambda x, h, p, W, r, s: rnnc.mean(x) * h + p,
    "sub-reduced": lambda x, h, p, W, r, s: rnnc.mean(h) - x * p,
    "where-branches": lambda x, h, p, W, r, s: rnnc.where(x, h * p, rnnc.mean(h)),
    "matmul": lambda x, h, p, W, r, s: x @ W + h @ W + p,
    "slice-concat": lambda x, h, p, W, r, s: rnnc.concat([x[:, 1:3], h[:, 0:1]]) * p,
    "sqrt-log": lambda x, h, p, W, r, s: rnnc.sqrt(x * x + 1.0) + rnnc.log(h * h + p * p + 1.0),
    "relu-exp": lambda x, h, p, W, r, s: rnnc.relu(x) * rnnc.exp(h) + p,
    "mul-row-matrix": lambda x, h, p, W, r, s: x * r + h,
    "add-one-by-one": lambda x, h, p, W, r, s: x + h * s,
    "maximum-minimum": lambda x, h, p, W, r, s: rnnc.maximum(x, p) + rnnc.minimum(h, x * 0.5),
    "abs-power-softplus": lambda x, h, p, W, r, s: abs(x) * p + h ** 3 + rnnc.softplus(x * p),
    "amax-amin": lambda x, h, p, W, r, s: rnnc.amax(x * p) - rnnc.amin(h) + x,
    "softmax": lambda x, h, p, W, r, s: rnnc.softmax(x * p + h),
    "logsumexp": lambda x, h, p, W, r, s: rnnc.logsumexp(x * p + h) * x,
    "transposed-matrix": lambda x, h, p, W, r, s: x @ W.T + h @ W,
    "comparison-mask": lambda x, h, p, W, r, s: (x > p) * h + (h <= 0.1) * x,
}


def _cell_loss(fn, arrays, dy, dh) -> float:
    params = {k: arrays[k] for k in PARAMS}
    ys, st = fn(arrays["x"], params, states={"h": arrays["h"]})
    return float(np.sum(dy * ys["y"]) + np.sum(dh * st["h"]))


@pytest.mark.parametrize("name", list(ONE_OP))
def test_one_op_cell_gradients_match_central_differences(name: str) -> None:
    """Unused parameters must get zero gradients; used ones their summed broadcast cotangent."""
    cell = _one_op_cell(ONE_OP[name])
    fn = rnnc.compile(cell, backend="numpy")
    rng = np.random.default_rng(len(name))
    arrays = {"x": draw(rng, (T_CELL, B_CELL, N_CELL), False),
              "h": rng.uniform(-0.5, 0.5, (B_CELL, N_CELL)),
              **{k: draw(rng, shape, False) * 0.5 for k, shape in PARAMS.items()}}
    dy = rng.standard_normal((T_CELL, B_CELL, N_CELL))
    dh = rng.standard_normal((B_CELL, N_CELL))
    _, _, tape = fn.forward(arrays["x"], {k: arrays[k] for k in PARAMS},
                            states={"h": arrays["h"]})
    g = fn.backward(tape, d_outputs={"y": dy}, d_states={"h": dh})
    got = {"x": g.x, "h": g.states["h"], **g.params}
    for key, base in arrays.items():
        num = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            vals = []
            for sign in (1, -1):
                moved = {k: v.copy() for k, v in arrays.items()}
                moved[key][idx] += sign * EPS
                vals.append(_cell_loss(fn, moved, dy, dh))
            num[idx] = (vals[0] - vals[1]) / (2 * EPS)
        assert got[key].shape == base.shape, (name, key)
        np.testing.assert_allclose(got[key], num, rtol=1e-6, atol=1e-7, err_msg=f"{name}: {key}")
