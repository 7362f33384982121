"""The LLVM loop nests of ``sum_axis`` (a sum over an inner feature axis) and ``sum_lead`` (a sum
over the rows): the kept inner axis is the innermost loop, so the adds vectorize over contiguous
elements (no gathers), and every element adds its terms in the same order as before (row after
row), checked against float64 NumPy formulas written here and against the unoptimized traced
program."""

from __future__ import annotations

import numpy as np
import pytest

import rnnc

pytest.importorskip("llvmlite")

T, B, D, N = 3, 2, 40, 3


def summing_cell() -> rnnc.Cell:
    """A ``(D, N)`` state scaled by a ``(D, N)`` parameter, its output the sum over ``D``: the
    state's update has no add, so the only adds of the inference program are the sum's."""
    c = rnnc.Cell("summing")
    x = c.input("x", N)
    h = c.state("h", (D, N))
    a = c.param("a", (D, N))
    new = h * a * x[:, None, :]
    c.update(h=new)
    c.output("y", new.sum(axis=0))
    return c


def test_sum_over_an_inner_axis_vectorizes() -> None:
    from rnnc.backends.llvm import blas, cache, codegen

    fn = rnnc.compile(summing_cell(), backend="llvm")
    counts = fn.op_counts()
    assert counts["loop"].get("sum_axis", 0) + counts["outside"].get("sum_axis", 0) == 1
    program = fn.program("inference")
    text, _ = codegen.lower(program, blas.get().convention)
    assert 'define internal void @"sum_axis.' in text
    optimized = str(cache.optimize(text))
    assert "fadd <" in optimized, "the sum over D does not vectorize"
    # Loaded as contiguous vectors: with the summed axis innermost, the vectorizer gathered
    # one element from each of several rows per lane.
    assert "gather" not in optimized


def _problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, N))
    params = {"a": rng.standard_normal((D, N))}
    states = {"h": rng.standard_normal((B, D, N))}
    return x, params, states


def test_sums_match_numpy_and_the_oracle() -> None:
    """Forward (``sum_axis``) against a NumPy loop; backward (``grad.a`` sums over the rows,
    ``sum_lead``) against the unoptimized program, float64."""
    x, params, states = _problem()
    cell = summing_cell()
    fn = rnnc.compile(cell, backend="llvm")
    ys, st, tape = fn.forward(x, params, states=states)
    h, want = states["h"], []
    for t in range(T):
        h = h * params["a"] * x[t][:, None, :]
        want.append(sum(h[:, d, :] for d in range(D)))  # d after d, as the kernel adds
    np.testing.assert_array_equal(ys["y"], np.stack(want))
    np.testing.assert_array_equal(st["h"], h)
    oracle = rnnc.compile(cell, optimize=False)
    _, _, tape_oracle = oracle.forward(x, params, states=states)
    d_y = {"y": np.random.default_rng(1).standard_normal(ys["y"].shape)}
    got, expect = fn.backward(tape, d_outputs=d_y), oracle.backward(tape_oracle, d_outputs=d_y)
    np.testing.assert_allclose(got.params["a"], expect.params["a"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.x, expect.x, rtol=1e-12, atol=1e-12)
