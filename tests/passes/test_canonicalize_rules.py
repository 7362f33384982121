"""canonicalize's rewrites on small hand-written cells, checked on the printed IR."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import rnnc
from rnnc import ops
from rnnc.passes import run
from rnnc.printer import format_program
from tests.passes.common import environment
from tests.passes.test_pipelines import _has_autodiff, _loss
from tests.strategies import random_cells


def _body_ops(program) -> list[str]:
    return [n.op.name for n in program.scan.body.nodes() if n.op.name not in ("arg",)]


def test_identities_cse_and_folding() -> None:
    c = rnnc.Cell("ids")
    x = c.input("x", 2)
    h = c.state("h", 2)
    a = rnnc.tanh(x)
    b = rnnc.tanh(x)  # CSE merges it with a
    v = ((a * 1.0 + 0.0) - 0.0) / 1.0
    v = rnnc.composites.neg(rnnc.composites.neg(v))
    v = 1.0 - (1.0 - v)
    # An op on constants only (the DSL folds Python numbers itself, so build it directly).
    two = c.graph.add(ops.constant, (), {"value": 2.0})
    three = c.graph.add(ops.constant, (), {"value": 3.0})
    k = rnnc.Value(c, c.graph.add(ops.add, (c.graph.add(ops.mul, (two, three)), two))) - 1.0
    c.update(h=rnnc.tanh(v + b * k + h))
    c.output("y", h)
    p = run(c.program(), ["canonicalize"])
    ops_left = _body_ops(p)
    assert ops_left.count("tanh") == 2, format_program(p)
    assert "neg" not in ops_left and "div" not in ops_left and "sub" not in ops_left
    consts = [n.attrs["value"] for n in p.scan.body.nodes() if n.op.name == "constant"]
    assert consts == [7.0], format_program(p)


def test_bias_pair_is_added_once_to_the_input_projection() -> None:
    # x @ W_ih + b_ih + h @ W_hh + b_hh: the two biases are summed first (a loop constant that
    # hoist-sequence computes once per call), then added to the input-side product only.
    cell = rnnc.cells.rnn(3, 4)
    p = run(cell.program(), ["canonicalize"])
    body = p.scan.body
    def name(i: int) -> str | None:
        node = body.node(i)
        return node.attrs["name"] if node.op.name == "arg" else None

    products = {name(n.inputs[0]): n.id for n in body.nodes() if n.op.name == "matmul"}
    (user,) = body.users(products["x"])
    bias = body.node([i for i in body.node(user).inputs if i != products["x"]][0])
    assert bias.op.name == "add"
    assert sorted(name(i) for i in bias.inputs) == ["b_hh", "b_ih"]
    (outer,) = body.users(user)
    assert sorted(body.node(outer).inputs) == sorted((user, products["h"]))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
          database=None)
@given(random_cells(max_ops=5))
def test_random_cell_gradients_against_finite_differences(cell) -> None:
    assert _has_autodiff(), "autodiff-backward is not registered"
    T, B = 2, 2
    env = environment(cell, T, B, seed=1)
    rng = np.random.default_rng(2)
    fn = rnnc.compile(cell, backend="numpy")
    params = {k: env[k] for k in cell.params}
    xs = {k: env[k] for k in cell.inputs}
    x = xs if len(xs) > 1 else next(iter(xs.values()))
    ys, _, tape = fn.forward(x, params, states={s: env[s] for s in cell.states})
    d_out = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
    d_st = {s: rng.standard_normal(env[s].shape) for s in cell.states}
    g = fn.backward(tape, d_outputs=d_out, d_states=d_st)
    d = {**d_out, **{s + ".final": v for s, v in d_st.items()}}
    gx = g.x if isinstance(g.x, dict) else {next(iter(cell.inputs)): g.x}
    eps = 1e-6
    for key in list(cell.params) + list(cell.inputs) + list(cell.states):
        got = g.params.get(key) if key in cell.params else gx.get(key, g.states.get(key))
        want = np.zeros_like(env[key])
        for idx in np.ndindex(env[key].shape):
            plus, minus = dict(env), dict(env)
            plus[key], minus[key] = env[key].copy(), env[key].copy()
            plus[key][idx] += eps
            minus[key][idx] -= eps
            want[idx] = (_loss(cell, plus, d, T, B) - _loss(cell, minus, d, T, B)) / (2 * eps)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=key)


# Sums with repeated terms: each (name, expression) is applied to DSL values and to NumPy
# arrays alike, and the compiled cell must agree with a float64 NumPy loop of it.
REPEATED_TERMS = {
    "bias-twice": lambda x, h, W, U, b: x @ W + b + b,
    "matmul-twice": lambda x, h, W, U, b: x @ W + x @ W + b,
    "bias-twice-around-recurrent": lambda x, h, W, U, b: x @ W + b + h @ U + b,
    "bias-thrice-matmuls-twice": lambda x, h, W, U, b: b + x @ W + b + h @ U + h @ U + b + x @ W,
    "more-biases-than-matmuls": lambda x, h, W, U, b: b + b + x @ W + b,
    "shared-sum": lambda x, h, W, U, b: (x @ W + b) * (x @ W + b + h @ U),
}


def _repeated_cell(expr) -> rnnc.Cell:
    c = rnnc.Cell("r")
    x = c.input("x", 3)
    h = c.state("h", 4)
    W = c.param("W", (3, 4))
    U = c.param("U", (4, 4))
    b = c.param("b", (4,))
    hn = rnnc.tanh(expr(x, h, W, U, b)) * 0.5 + h * 0.5
    c.update(h=hn)
    c.output("y", hn)
    return c


def _repeated_reference(expr, xs: np.ndarray, p: dict) -> np.ndarray:
    h = np.zeros((xs.shape[1], 4))
    ys = []
    for x in xs:
        h = np.tanh(expr(x, h, p["W"], p["U"], p["b"])) * 0.5 + h * 0.5
        ys.append(h)
    return np.stack(ys)


@pytest.mark.parametrize("backend", [{"backend": "numpy"}, {"backend": "llvm"},
                                     {"backend": "cuda", "emulate": True}],
                         ids=["numpy", "llvm", "cuda-emulate"])
@pytest.mark.parametrize("name", sorted(REPEATED_TERMS))
def test_repeated_terms_keep_their_multiplicity(name: str, backend: dict) -> None:
    expr = REPEATED_TERMS[name]
    cell = _repeated_cell(expr)
    p = cell.init_params(seed=1, dtype=np.float64)
    xs = np.random.default_rng(0).standard_normal((6, 2, 3))
    ys, _ = rnnc.compile(cell, **backend)(xs, p)
    np.testing.assert_allclose(ys["y"], _repeated_reference(expr, xs, p), rtol=1e-12,
                               atol=1e-12)


def test_reassociation_counts_terms_with_multiplicity() -> None:
    cell = _repeated_cell(REPEATED_TERMS["bias-twice"])
    body = run(cell.program(), ["canonicalize"]).scan.body
    adds = [n for n in body.nodes() if n.op is ops.add]
    b = body.args()["b"]
    assert sum(n.inputs.count(b) for n in adds) == 2, format_program(
        run(cell.program(), ["canonicalize"]))


def test_rules_are_a_table_reaching_a_fixed_point() -> None:
    from rnnc.passes import canonicalize as module

    assert all(isinstance(r, module.Rule) for r in module.RULES)
    assert len({r.name for r in module.RULES}) == len(module.RULES)
    # A long sum with repeats settles in one run, and a second run changes nothing.
    expr = lambda x, h, W, U, b: sum([x @ W, b, h @ U, b, x @ W, b] * 8, b)  # noqa: E731
    once = run(_repeated_cell(expr).program(), ["canonicalize"])
    assert format_program(run(once, ["canonicalize"])) == format_program(once)


def test_a_rule_that_never_settles_is_an_error(monkeypatch) -> None:
    from rnnc.passes import canonicalize as module

    def flip(g, node):  # a + b -> b + a, forever
        a, b = node.inputs
        return g.add(ops.add, (b, a), origin="test") if a != b else None

    monkeypatch.setattr(module, "RULES", (module.Rule("flip", ops.add, flip),))
    with pytest.raises(RuntimeError, match="fixed point"):
        run(rnnc.cells.rnn(3, 4).program(), ["canonicalize"])
