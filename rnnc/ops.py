"""The primitive ops: each declared once with its shape rule, NumPy reference and VJP.

A shape is a tuple of dims; a dim is an int or a symbol ("T" steps, "B" batch). Per-step values
are ``(B, n)``, parameters ``(n,)`` or ``(k, n)``, sequences outside the loop ``(T, B, n)`` and
Python scalars ``()``. Every op works on the last (feature) axis and treats the leading axes as
rows, so the same op is valid inside the loop on ``(B, n)`` and, once hoisted, on ``(T, B, n)``.

All values of a program share one floating dtype, so the dtype rule of every op is the same:
the result has the dtype of its operands.

The rules themselves (shapes, layout index rules, references, VJPs) live in ``rnnc.op_rules``.
The elementwise family ``rnnc.ops_elementwise`` declares its ops with their rules and docs in one
place (``floor``, ``mod``, ``sin``, ``gelu``, ...): ``rnnc.ops.elementwise.<name>``.
"""

from __future__ import annotations

import numpy as np

# The op families declare their ops themselves (importing one registers them); the shared
# types are re-exported: code names them rnnc.ops.Op, rnnc.ops.Piece, ... The rules name the ops
# they emit through op_types.op_named, looked up when they run, so none of them imports this module.
from rnnc import op_rules as rules
from rnnc import op_rules_random as random_rules
from rnnc import op_rules_scan as scan_rules
from rnnc import op_rules_select as select
from rnnc import ops_elementwise as elementwise  # noqa: F401
from rnnc import ops_tensor as tensor  # noqa: F401
from rnnc.op_types import (  # noqa: F401
    REGISTRY,
    Op,
    OpKind,
    Piece,
    Shape,
    fmt_shape,
    op_named,
    register,
)
from rnnc.ops_elementwise import (  # noqa: F401 - the comparing and selecting ops, by their names
    abs_,
    greater,
    greater_equal,
    less,
    less_equal,
    maximum,
    minimum,
)

_register = register

# ---------------------------------------------------------------- the table

E, M, R, L, S = (OpKind.ELEMENTWISE, OpKind.MATMUL, OpKind.REDUCE, OpKind.LAYOUT,
                 OpKind.SOURCE)


def _unary(name, ref, vjp):
    return _register(Op(name, E, 1, rules.elementwise_shape, ref, vjp))


def _binary(name, ref, vjp):
    return _register(Op(name, E, 2, rules.elementwise_shape, ref, vjp))


add = _binary("add", np.add, rules.vjp_add)
sub = _binary("sub", np.subtract, rules.vjp_sub)
mul = _binary("mul", np.multiply, rules.vjp_mul)
div = _binary("div", np.divide, rules.vjp_div)
neg = _unary("neg", np.negative, rules.vjp_neg)
exp = _unary("exp", np.exp, rules.vjp_exp)
log = _unary("log", np.log, rules.vjp_log)
tanh = _unary("tanh", np.tanh, rules.vjp_tanh)
sigmoid = _unary("sigmoid", rules.sigmoid, rules.vjp_sigmoid)
relu = _unary("relu", lambda x: np.maximum(x, 0).astype(x.dtype, copy=False), rules.vjp_relu)
sqrt = _unary("sqrt", np.sqrt, rules.vjp_sqrt)
rsqrt = _unary("rsqrt", lambda x: 1 / np.sqrt(x), rules.vjp_rsqrt)
where = _register(Op("where", E, 3, rules.elementwise_shape, rules.where_ref, rules.vjp_where))
power = _unary("power", rules.power_ref, rules.vjp_power)  # attribute: exponent, a float
softplus = _unary("softplus", rules.softplus_ref, rules.vjp_softplus)
# The identity, with no gradient: what autodiff must treat as a constant.
stop_gradient = _unary("stop_gradient", select.stop_gradient_ref, select.vjp_stop_gradient)
matmul = _register(Op("matmul", M, 2, rules.matmul_shape, rules.matmul_ref, rules.vjp_matmul))
concat = _register(Op("concat", L, None, rules.concat_shape, rules.concat_ref, rules.vjp_concat,
                      pieces=rules.concat_pieces))
# attribute step (omitted when 1): a strided slice; pad's step spreads the columns apart.
slice_ = _register(Op("slice", L, 1, rules.slice_shape, rules.slice_ref, rules.vjp_slice,
                      pieces=rules.slice_pieces))
pad = _register(Op("pad", L, 1, rules.pad_shape, rules.pad_ref, rules.vjp_pad,
                   pieces=rules.pad_pieces))
sum_ = _register(Op("sum", R, 1, rules.reduce_shape,
                    lambda x: x.sum(axis=-1, keepdims=True), rules.vjp_sum))
mean = _register(Op("mean", R, 1, rules.reduce_shape,
                    lambda x: x.mean(axis=-1, keepdims=True), rules.vjp_mean))
amax = _register(Op("amax", R, 1, rules.reduce_shape,
                    lambda x: x.max(axis=-1, keepdims=True), select.vjp_amax))
amin = _register(Op("amin", R, 1, rules.reduce_shape,
                    lambda x: x.min(axis=-1, keepdims=True), select.vjp_amin))
expand = _register(Op("expand", L, 1, rules.expand_shape,
                      lambda x, size: np.repeat(x, size, axis=-1), rules.vjp_expand,
                      pieces=rules.expand_pieces))
sum_rows = _register(Op("sum_rows", R, 1, rules.sum_rows_shape,
                        lambda x: x.reshape(-1, x.shape[-1]).sum(axis=0), rules.vjp_sum_rows))
constant = _register(Op("constant", S, 0, rules.constant_shape, rules.constant_ref,
                        rules.vjp_constant))
# A 0.0/1.0 mask drawn by Philox4x32-10 from rng.key and rng.counter: rnnc/op_rules_random.py.
# Elementwise as backends and fusion see it (one loop or kernel over its result), though element
# (r, j) reads row r of rng.counter, all of rng.key and its own column index j.
bernoulli = _register(Op("bernoulli", E, 2, random_rules.bernoulli_shape,
                         random_rules.bernoulli_ref, random_rules.vjp_bernoulli, random=True))

# Over the time axis, outside the loop only (parallel-scan makes them): rnnc/op_rules_scan.py.
linear_scan = _register(Op("linear_scan", OpKind.SCAN, 3, scan_rules.linear_scan_shape,
                           scan_rules.linear_scan_ref, scan_rules.vjp_linear_scan))
last_step = _register(Op("last_step", OpKind.SCAN, 1, scan_rules.last_step_shape,
                         scan_rules.last_step_ref, scan_rules.vjp_last_step))

PRIMITIVES: tuple[Op, ...] = tuple(REGISTRY.values())

# Ops whose output at one element depends only on the same element of the inputs (after
# broadcasting); the unit a backend emits as one loop or one kernel.
ELEMENTWISE: frozenset[Op] = frozenset(op for op in PRIMITIVES if op.kind is OpKind.ELEMENTWISE)
