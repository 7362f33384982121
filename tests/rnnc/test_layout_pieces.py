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
    (ops.slice_, [7], {"start": 1, "stop": 6, "step": 2}),
    (ops.slice_, [7], {"start": 0, "stop": 7, "step": 3}),
    (ops.slice_, [7], {"start": 2, "stop": 7, "step": 4}),
    (ops.slice_, [7], {"start": 6, "stop": 7, "step": 5}),
    (ops.pad, [3], {"before": 2, "after": 1}),
    (ops.pad, [3], {"before": 0, "after": 4}),
    (ops.pad, [3], {"before": 5, "after": 0}),
    (ops.pad, [3], {"before": 1, "after": 2, "step": 2}),
    (ops.pad, [4], {"before": 0, "after": 0, "step": 3}),
    (ops.pad, [1], {"before": 2, "after": 1, "step": 4}),
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
            out[..., j] = xs[p.operand][..., p.column(j)] if p.reads(j) else 0.0
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


def test_piece_div_reads_every_div_th_column():
    """``div`` spreads the operand: columns on the grid read ``(scale*j + offset) // div``,
    the others are 0.0."""
    piece = ops.Piece(0, 7, 0, scale=1, offset=-1, div=3)
    assert [piece.reads(j) for j in range(7)] == [False, True, False, False, True, False,
                                                   False]
    assert [piece.column(j) for j in (1, 4)] == [0, 1]
    assert not ops.Piece(0, 2, None).reads(0)


@pytest.mark.parametrize("width,start,stop,step", [(7, 1, 6, 2), (9, 0, 9, 4), (5, 4, 5, 3)])
def test_strided_slice_and_its_scatter_are_adjoint(width, start, stop, step):
    """The strided slice's gradient (a ``pad`` with the same ``step``) puts every column back
    where the slice took it from: <slice(x), g> == <x, vjp(g)>."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, width))
    y = ops.slice_.ref(x, start=start, stop=stop, step=step)
    g = rng.standard_normal(y.shape)

    def emit(op, *xs, **attrs):
        return op.ref(*xs, **attrs)

    emit.shape = np.shape
    (back,) = ops.slice_.vjp(emit, g, (x,), y, start=start, stop=stop, step=step)
    assert back.shape == x.shape
    np.testing.assert_allclose((y * g).sum(), (x * back).sum(), rtol=1e-12)
    np.testing.assert_array_equal(back[..., start:stop:step], g)
