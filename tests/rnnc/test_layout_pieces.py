"""Every layout op's index rule (``Op.pieces``) reproduces its NumPy reference, column by column.

The LLVM region emitter and the CUDA kernel writer read layout ops only through ``pieces``, so
this is the contract both rely on."""

from __future__ import annotations

import numpy as np
import pytest

from rnnc import ops

CASES = [
    (ops.concat, [3, 1, 4], {}),
    (ops.concat, [2], {}),
    (ops.slice_, [7], {"start": 2, "stop": 5}),
    (ops.slice_, [7], {"start": 0, "stop": 7}),
    (ops.pad, [3], {"before": 2, "after": 1}),
    (ops.pad, [3], {"before": 0, "after": 4}),
    (ops.pad, [3], {"before": 5, "after": 0}),
    (ops.expand, [1], {"size": 6}),
]


def _by_pieces(op, xs, attrs):
    widths = tuple(x.shape[-1] for x in xs)
    pieces = op.pieces(*widths, **attrs)
    n = pieces[-1].stop
    out = np.full(xs[0].shape[:-1] + (n,), np.nan)
    covered = []
    for p in pieces:
        for j in range(p.start, p.stop):
            covered.append(j)
            out[..., j] = 0.0 if p.operand is None else xs[p.operand][..., p.column(j)]
    assert covered == list(range(n)), "pieces must cover every column once, in order"
    return out


@pytest.mark.parametrize("op,widths,attrs", CASES, ids=lambda v: getattr(v, "name", None))
def test_pieces_match_reference(op, widths, attrs):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 3, w)) for w in widths]
    np.testing.assert_array_equal(_by_pieces(op, xs, attrs), op.ref(*xs, **attrs))


def test_every_layout_op_has_an_index_rule():
    layout = [op for op in ops.PRIMITIVES if op.kind is ops.OpKind.LAYOUT]
    assert {op.name for op in layout} == {op.name for op, _, _ in CASES}
    assert all(op.pieces is not None for op in layout)
