"""The LLVM backend reads layout ops only through their index rule (``Op.pieces``): ops it has
never seen, declared with a shape rule, a reference and pieces alone, compile inside a fused
region and match their references."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llvmlite")

from rnnc import ops  # noqa: E402
from rnnc.backends.llvm import codegen  # noqa: E402
from rnnc.backends.llvm.runtime import LlvmBackend  # noqa: E402
from rnnc.ir import Carry, Graph, Program, Scan, Type  # noqa: E402
from rnnc.names import Role
from rnnc.verify import verify  # noqa: E402

# Not registered: no table of any backend knows them.
REVERSE = ops.Op("reverse", ops.OpKind.LAYOUT, 1, lambda a: a, lambda x: x[..., ::-1],
                 pieces=lambda w: (ops.Piece(0, w, 0, -1, w - 1),))
EVEN = ops.Op("even", ops.OpKind.LAYOUT, 1, lambda a: a[:-1] + ((a[-1] + 1) // 2,),
              lambda x: x[..., ::2], pieces=lambda w: (ops.Piece(0, (w + 1) // 2, 0, 2, 0),))
# Columns shift right by ``by``, zeros first; the last ``by`` columns fall off.
SHIFT = ops.Op("shift", ops.OpKind.LAYOUT, 1, lambda a, by: a,
               lambda x, by: np.concatenate([np.zeros_like(x[..., :by]), x[..., :-by]], -1),
               pieces=lambda w, by: (ops.Piece(0, by, None), ops.Piece(by, w, 0, 1, -by)))
# Two operands: the second one backwards, then the first one.
MIRROR = ops.Op("mirror", ops.OpKind.LAYOUT, 2, lambda a, b: a[:-1] + (a[-1] + b[-1],),
                lambda x, y: np.concatenate([y[..., ::-1], x], -1),
                pieces=lambda wa, wb: (ops.Piece(0, wb, 1, -1, wb - 1),
                                       ops.Piece(wb, wb + wa, 0, 1, -wb)))


def _program(width: int) -> Program:
    region = Graph("f64")
    x = region.arg("x", ("B", width))
    h = region.arg("h", ("B", width))
    r = region.add(REVERSE, [x])
    s = region.add(SHIFT, [x], {"by": 2})
    e = region.add(EVEN, [region.add(ops.add, [r, s])])
    m = region.add(MIRROR, [x, region.add(ops.tanh, [h])])
    region.outputs = {"h": region.add(ops.add, [h, r]), "e": e, "m": m}

    body = Graph("f64")
    bx, bh = body.arg("x", ("B", width)), body.arg("h", ("B", width))
    fused = body.add_fused(region, [bx, bh], "test")
    body.outputs = {"h": body.get(fused, 0, "test"), "e": body.get(fused, 1, "test"),
                    "m": body.get(fused, 2, "test")}
    scan = Scan(body, seqs=("x",), consts=(), carries=(Carry("h", "h", "h.final"),),
                stacked=("e", "m"), summed=())
    args = {"x": (Role.INPUT, Type("f64", ("T", "B", width))),
            "h": (Role.STATE, Type("f64", ("B", width)))}
    program = Program(args, Graph("f64"), scan, Graph("f64"), ("e", "m", "h.final"), dtype="f64")
    verify(program)
    return program


def _reference(x: np.ndarray, h: np.ndarray, by: int = 2) -> dict[str, np.ndarray]:
    es, ms = [], []
    for step in x:
        r = REVERSE.ref(step)
        es.append(EVEN.ref(r + SHIFT.ref(step, by=by)))
        ms.append(MIRROR.ref(step, np.tanh(h)))
        h = h + r
    return {"e": np.stack(es), "m": np.stack(ms), "h.final": h}


@pytest.mark.parametrize("width", [3, 8])
def test_layout_ops_unknown_to_the_backend_follow_their_pieces(width: int) -> None:
    runner = LlvmBackend(cache_dir=False).build(_program(width), "inference")
    rng = np.random.default_rng(width)
    for T, B in ((1, 1), (4, 3)):
        x, h = rng.standard_normal((T, B, width)), rng.standard_normal((B, width))
        got = runner({"x": x, "h": h}, {"T": T, "B": B})
        for name, want in _reference(x, h).items():
            np.testing.assert_allclose(got[name], want, rtol=1e-12, atol=1e-12, err_msg=name)


def _gate_sum_program(units: int) -> Program:
    """A step whose region writes three gates' values into their columns of one ``3 * units``
    wide value, the way an LSTM's backward assembles the gradient of its concatenated gates:
    ``pad(-x) + pad(x * h) + pad(x + h)``; its middle gate, sliced, is the next ``h``. (Arithmetic
    only: the math library's functions have selects of their own.)"""
    region = Graph("f64")
    x, h = region.arg("x", ("B", units)), region.arg("h", ("B", units))
    gates = [region.add(ops.neg, [x]), region.add(ops.mul, [x, h]), region.add(ops.add, [x, h])]
    pads = [region.add(ops.pad, [g], {"before": k * units, "after": (2 - k) * units})
            for k, g in enumerate(gates)]
    g = region.add(ops.add, [region.add(ops.add, [pads[0], pads[1]]), pads[2]])
    middle = region.add(ops.slice_, [g], {"start": units, "stop": 2 * units})
    region.outputs = {"g": g, "m": middle}

    body = Graph("f64")
    bx, bh = body.arg("x", ("B", units)), body.arg("h", ("B", units))
    fused = body.add_fused(region, [bx, bh], "test")
    body.outputs = {"h": body.get(fused, 1, "test"), "g": body.get(fused, 0, "test")}
    scan = Scan(body, seqs=("x",), consts=(), carries=(Carry("h", "h", "h.final"),),
                stacked=("g",), summed=())
    args = {"x": (Role.INPUT, Type("f64", ("T", "B", units))),
            "h": (Role.STATE, Type("f64", ("B", units)))}
    program = Program(args, Graph("f64"), scan, Graph("f64"), ("g", "h.final"), dtype="f64")
    verify(program)
    return program


def test_gate_columns_are_computed_only_in_their_own_columns() -> None:
    """Each gate's columns of the sum of pads run in a loop of their own, with no select
    between the gates (every gate at every column was 3x the work and did not vectorize),
    and the results match a float64 NumPy formula."""
    units = 8
    program = _gate_sum_program(units)
    text, _ = codegen.lower(program, "cblas")
    assert " select " not in text
    runner = LlvmBackend(cache_dir=False).build(program, "inference")
    rng = np.random.default_rng(7)
    T, B = 3, 2
    x, h = rng.standard_normal((T, B, units)), rng.standard_normal((B, units))
    got = runner({"x": x, "h": h}, {"T": T, "B": B})
    gs = []
    for step in x:
        g = np.concatenate([-step, step * h, step + h], -1)
        gs.append(g)
        h = g[:, units:2 * units]
    np.testing.assert_allclose(got["g"], np.stack(gs), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["h.final"], h, rtol=1e-12, atol=1e-12)
