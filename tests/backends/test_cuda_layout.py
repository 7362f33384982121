"""The CUDA kernel writer reads every layout op through its index rule (``Op.pieces``).

A layout op that rnnc does not ship (a reversal, a strided pick, a mix of operands and zeros)
gets its CUDA rule from ``rules.layout_rule`` alone, the way every registered layout op gets
its entry in ``rules.RULES``, and runs in emulation exactly like its NumPy reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from rnnc import ops
from rnnc.backends.cuda import rules
from rnnc.backends.cuda.runtime import CudaBackend
from rnnc.ir import Graph, Program, Scan, Type
from rnnc.names import Role
from rnnc.verify import verify

T, B = 2, 3


def _op(name: str, arity: int | None, width, ref, pieces) -> ops.Op:
    def shape(*shapes, **attrs):
        return shapes[0][:-1] + (width(*(s[-1] for s in shapes), **attrs),)

    return ops.Op(name, ops.OpKind.LAYOUT, arity, shape, ref, pieces=pieces)


reverse = _op("reverse", 1, lambda n: n, lambda x: x[..., ::-1],
              lambda n: (ops.Piece(0, n, 0, -1, n - 1),))
every_other = _op("every_other", 1, lambda n: (n + 1) // 2, lambda x: x[..., ::2],
                  lambda n: (ops.Piece(0, (n + 1) // 2, 0, 2, 0),))


def _interleave_ref(a, b, gap):
    zeros = np.zeros(a.shape[:-1] + (gap,), a.dtype)
    return np.concatenate([b[..., ::-1], zeros, a], axis=-1)


def _interleave_pieces(n, m, gap):
    # b reversed, then ``gap`` zeros, then a: reads out of range at most columns clamp.
    return (ops.Piece(0, m, 1, -1, m - 1), ops.Piece(m, m + gap, None),
            ops.Piece(m + gap, m + gap + n, 0, 1, -(m + gap)))


interleave = _op("interleave", 2, lambda n, m, gap: n + m + gap, _interleave_ref,
                 _interleave_pieces)


def _program(op: ops.Op, widths: list[int], attrs: dict) -> Program:
    pre = Graph("f32")
    xs = [pre.arg(f"x{i}", ("T", "B", w)) for i, w in enumerate(widths)]
    out = pre.add(op, xs, attrs)
    pre.outputs = {"y": pre.add(ops.tanh, [out])}  # a consumer in the same graph
    pre.outputs["z"] = out
    args = {f"x{i}": (Role.INPUT, Type("f32", ("T", "B", w))) for i, w in enumerate(widths)}
    scan = Scan(Graph("f32"), seqs=(), consts=(), carries=(), stacked=())
    program = Program(args, pre, scan, Graph("f32"), ("y", "z"), "f32")
    verify(program)
    return program


@pytest.mark.parametrize("op,widths,attrs", [(reverse, [5], {}), (every_other, [5], {}),
                                             (interleave, [3, 2], {"gap": 2})],
                         ids=lambda v: getattr(v, "name", None))
def test_a_new_layout_op_needs_no_cuda_change(monkeypatch: pytest.MonkeyPatch, op: ops.Op,
                                              widths: list[int], attrs: dict) -> None:
    monkeypatch.setitem(rules.RULES, op, rules.layout_rule(op))
    rng = np.random.default_rng(0)
    env = {f"x{i}": rng.standard_normal((T, B, w)).astype(np.float32)
           for i, w in enumerate(widths)}
    runner = CudaBackend(emulate=True).build(_program(op, widths, attrs), "inference")
    got = runner(env, {"T": T, "B": B})
    want = op.ref(*env.values(), **attrs)
    np.testing.assert_array_equal(got["z"], want)
    np.testing.assert_allclose(got["y"], np.tanh(want), rtol=1e-6)

