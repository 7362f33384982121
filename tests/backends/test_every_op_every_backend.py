"""One row per primitive: every backend against the op's NumPy reference.

Each row builds a small cell whose output applies one primitive (with the attributes and
broadcasts it is used with) to per-step values, compiles it for every backend, and compares the
whole sequence with a float64 loop that calls that primitive's ``ref`` directly. A backend with a
wrong rule for the op fails its row; a primitive without a row fails
``test_every_primitive_has_a_row``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import rnnc
from rnnc import ops, ops_tensor
from rnnc import ops_elementwise as elementwise
from rnnc.dsl import Value

I, H = 4, 4
T, B = 3, 2


@dataclass(frozen=True)
class Row:
    """``operands(x, h, W, b)`` gives the op's operands; ``attrs`` its attributes."""

    op: ops.Op
    operands: Callable
    attrs: dict | None = None


def _positive(v):
    return v * v + 0.5


def _tied(x, h):
    """x with h's column 0 in its column 0: equal operands there."""
    if isinstance(x, Value):
        return rnnc.concat([h[:, 0:1], x[:, 1:4]])
    return np.concatenate([h[:, 0:1], x[:, 1:4]], -1)


# Operands are built from the step's input x (B,I), state h (B,H), matrix W (I,H) and vector b
# (H,), in the DSL for the cell and in NumPy for the reference: the same callables serve both.
ROWS: dict[str, Row] = {
    "add": Row(ops.add, lambda x, h, W, b: (x, h)),
    "add-vector": Row(ops.add, lambda x, h, W, b: (x, b)),
    "sub": Row(ops.sub, lambda x, h, W, b: (b, x)),
    "mul": Row(ops.mul, lambda x, h, W, b: (x, h + 1.0)),
    "div": Row(ops.div, lambda x, h, W, b: (x, _positive(h))),
    "neg": Row(ops.neg, lambda x, h, W, b: (x,)),
    "exp": Row(ops.exp, lambda x, h, W, b: (x,)),
    "log": Row(ops.log, lambda x, h, W, b: (_positive(x),)),
    "tanh": Row(ops.tanh, lambda x, h, W, b: (x * 3.0,)),
    "sigmoid": Row(ops.sigmoid, lambda x, h, W, b: (x * 3.0,)),
    "relu": Row(ops.relu, lambda x, h, W, b: (x,)),
    "sqrt": Row(ops.sqrt, lambda x, h, W, b: (_positive(x),)),
    "rsqrt": Row(ops.rsqrt, lambda x, h, W, b: (_positive(x),)),
    "where": Row(ops.where, lambda x, h, W, b: (x - 0.2, h, b)),
    "matmul": Row(ops.matmul, lambda x, h, W, b: (x, W)),
    "matmul-transpose-b": Row(ops.matmul, lambda x, h, W, b: (h, W), {"transpose_b": True}),
    "concat": Row(ops.concat, lambda x, h, W, b: (x[:, 0:1], h[:, 1:4])),
    "slice": Row(ops.slice_, lambda x, h, W, b: (rnnc.concat([x, h]) if isinstance(x, Value)
                                                 else np.concatenate([x, h], -1),),
                 {"start": 2, "stop": 6}),
    "slice-strided": Row(ops.slice_, lambda x, h, W, b: (rnnc.concat([x, h]) if isinstance(
        x, Value) else np.concatenate([x, h], -1),), {"start": 1, "stop": 8, "step": 2}),
    "slice-strided-narrow": Row(ops.slice_, lambda x, h, W, b: (x,),
                                {"start": 0, "stop": 4, "step": 3}),
    "pad": Row(ops.pad, lambda x, h, W, b: (x[:, 1:3],), {"before": 1, "after": 1}),
    # The gradient of a strided slice: x's columns two apart, zeros between.
    "pad-strided": Row(ops.pad, lambda x, h, W, b: (x[:, 1:3],),
                       {"before": 1, "after": 0, "step": 2}),
    "pad-strided-wide": Row(ops.pad, lambda x, h, W, b: (x[:, 0:2],),
                            {"before": 0, "after": 0, "step": 3}),
    "sum": Row(ops.sum_, lambda x, h, W, b: (x * h,)),
    "mean": Row(ops.mean, lambda x, h, W, b: (x + h,)),
    "expand": Row(ops.expand, lambda x, h, W, b: (x[:, 2:3],), {"size": H}),
    # x and h share columns where x's column is copied, so the comparisons meet ties too.
    "less": Row(ops.less, lambda x, h, W, b: (_tied(x, h), h)),
    "less_equal": Row(ops.less_equal, lambda x, h, W, b: (_tied(x, h), h)),
    "greater": Row(ops.greater, lambda x, h, W, b: (_tied(x, h), b)),
    "greater_equal": Row(ops.greater_equal, lambda x, h, W, b: (_tied(x, h), h)),
    "maximum": Row(ops.maximum, lambda x, h, W, b: (x, h)),
    "maximum-vector": Row(ops.maximum, lambda x, h, W, b: (b, x)),
    "minimum": Row(ops.minimum, lambda x, h, W, b: (x, h)),
    "abs": Row(ops.abs_, lambda x, h, W, b: (x - 0.1,)),
    "power-3": Row(ops.power, lambda x, h, W, b: (x,), {"exponent": 3.0}),
    "power-negative": Row(ops.power, lambda x, h, W, b: (_positive(x),), {"exponent": -2.0}),
    "power-fraction": Row(ops.power, lambda x, h, W, b: (_positive(x),), {"exponent": 1.5}),
    "softplus": Row(ops.softplus, lambda x, h, W, b: (x * 20.0,)),
    "stop_gradient": Row(ops.stop_gradient, lambda x, h, W, b: (x,)),
    "amax": Row(ops.amax, lambda x, h, W, b: (x * h,)),
    "amin": Row(ops.amin, lambda x, h, W, b: (x + h,)),
}

# Ops whose result is not a per-step (B, n) value: each row wraps the op's result so the output
# is one, with the wrapping written twice (DSL and NumPy).
WRAPPED = {
    # (I, H) = x^T h summed over the batch, then applied to x again.
    "matmul-transpose-a": (ops.matmul, {"transpose_a": True},
                           lambda x, h, W, b: (x, h), lambda r, x: x @ r),
    # (H,) = the column sums of x * h, broadcast over the batch.
    "sum_rows": (ops.sum_rows, {}, lambda x, h, W, b: (x * h,), lambda r, x: x * 0.0 + r),
    "constant": (ops.constant, {"value": 0.3125}, lambda x, h, W, b: (), lambda r, x: x * r),
}


def _cell(name: str) -> rnnc.Cell:
    c = rnnc.Cell(name.replace("-", "_"))
    x = c.input("x", I)
    h = c.state("h", H)
    W = c.param("W", (I, H))
    b = c.param("b", (H,))
    if name in ROWS:
        row = ROWS[name]
        args = [v.node for v in row.operands(x, h, W, b)]
        y = Value(c, c.graph.add(row.op, args, row.attrs or {}))
    else:
        op, attrs, operands, wrap = WRAPPED[name]
        r = Value(c, c.graph.add(op, [v.node for v in operands(x, h, W, b)], attrs))
        y = wrap(r, x)
    c.update(h=rnnc.tanh(y * 0.5 + h * 0.5) if y.shape[-1] == H else rnnc.tanh(h + x))
    c.output("y", y)
    return c


def _reference(name: str, xs: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    h = np.zeros((B, H))
    ys = []
    for x in xs:
        if name in ROWS:
            row = ROWS[name]
            y = row.op.ref(*row.operands(x, h, p["W"], p["b"]), **(row.attrs or {}))
        else:
            op, attrs, operands, wrap = WRAPPED[name]
            y = wrap(op.ref(*operands(x, h, p["W"], p["b"]), **attrs), x)
        y = np.broadcast_to(y, (B, y.shape[-1])).astype(np.float64)
        h = np.tanh(y * 0.5 + h * 0.5) if y.shape[-1] == H else np.tanh(h + x)
        ys.append(y)
    return np.stack(ys)


def _backend(name: str) -> dict:
    if name == "cuda":
        return {"backend": "cuda", "emulate": True}
    return {"backend": name}


def test_every_primitive_has_a_row() -> None:
    covered = {r.op for r in ROWS.values()} | {w[0] for w in WRAPPED.values()}
    covered |= {ops.bernoulli}  # reads the call's seed: tests/rnnc/test_random.py, every backend
    # Over the time axis, never in a cell: tests/backends/test_linear_scan_backends.py.
    covered |= {ops.linear_scan, ops.last_step}
    # The elementwise family, from its table: tests/backends/test_elementwise_family_backends.py.
    covered |= {member.op for member in elementwise.DRAWN}
    # The tensor family, on values with feature shapes: tests/rnnc/test_tensor_ops.py.
    covered |= set(ops_tensor.FAMILY)
    missing = [op.name for op in ops.PRIMITIVES if op not in covered]
    assert not missing, f"primitives without a row: {missing}"


@pytest.mark.parametrize("backend", ["numpy", "llvm", "cuda"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(ROWS) + sorted(WRAPPED))
def test_backend_matches_reference(name: str, dtype, backend: str) -> None:
    cell = _cell(name)
    fn = rnnc.compile(cell, **_backend(backend))
    p = cell.init_params(seed=3, dtype=dtype)
    xs = np.random.default_rng(4).standard_normal((T, B, I)).astype(dtype)
    ys, _ = fn(xs, p)
    want = _reference(name, xs.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()})
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(ys["y"], want, rtol=tol, atol=tol, err_msg=f"{name} on {backend}")
