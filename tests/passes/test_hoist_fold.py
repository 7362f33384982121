"""Input-only reductions leave the loop (hoist-sequence, rule (c)); loop-invariant terms of a sum
are added once (canonicalize).

Structure is checked on the program right after hoist-sequence (what later passes do to it is
theirs); values against the unoptimized traced program (``optimize=False``) in float64.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import rnnc
from rnnc import ops, passes
from rnnc.ir import ARG, FUSED, Graph, Program
from rnnc.printer import format_program
from rnnc.tools.bench.configs import ln_lstm
from tests.passes.common import check_pass, environment
from tests.strategies import random_data

H = 16


def _ops(g: Graph) -> Counter:
    """Op names in ``g``, regions of fused nodes included."""
    out: Counter = Counter()
    for node in g.nodes():
        if node.op is FUSED:
            out += _ops(node.attrs["region"])
        elif node.op is not ARG:
            out[node.op.name] += 1
    return out


def _after_hoist(cell: rnnc.Cell, mode: str, lengths: bool = False,
                 reverse: bool = False) -> Program:
    names = passes.pipeline(mode, lengths)
    return passes.run(cell.program(reverse=reverse), names[:names.index("hoist-sequence") + 1])


def _reductions(g: Graph) -> int:
    c = _ops(g)
    return sum(c[op.name] for op in (ops.mean, ops.sum_, ops.amax, ops.amin))


# ------------------------------------------------------------------ hoisting: layer-norm cells


@pytest.mark.parametrize("reverse", [False, True], ids=["forward-scan", "reverse-scan"])
@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("mode", ["inference", "forward"])
def test_ln_lstm_loop_keeps_only_the_recurrent_layer_norms(mode, lengths, reverse) -> None:
    p = _after_hoist(ln_lstm(8, H), mode, lengths, reverse)
    # ln(h @ U) and ln(c): two means each; ln(x @ W) runs before the loop.
    assert _ops(p.scan.body)["mean"] == 4, format_program(p)
    assert _ops(p.pre)["mean"] == 2, format_program(p)
    # The loop reads one hoisted sequence as wide as x @ W (plus the mask with lengths).
    widths = {n: p.env_types()[n].shape[-1] for n in p.scan.seqs}
    assert sorted(widths.values()) == ([1, 4 * H] if lengths else [4 * H]), widths


def test_ln_lstm_forward_computes_its_input_side_saved_values_before_the_loop() -> None:
    p = _after_hoist(ln_lstm(8, H), "forward")
    saved_before = [n for n in p.pre.outputs if n.startswith("save.")]
    assert len(saved_before) == 3, format_program(p)  # centred, 1/std and normalized x @ W
    assert not set(saved_before) & set(p.scan.stacked)
    assert set(saved_before) <= set(p.results)


@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("mode", ["inference", "forward"])
def test_layer_norm_gru_loop_keeps_only_the_recurrent_layer_norms(mode, lengths) -> None:
    cell = rnnc.cells.layer_norm_gru(8, H)
    p = _after_hoist(cell, mode, lengths)
    assert _ops(p.scan.body)["mean"] == 6, format_program(p)  # three LN(h W_h*)
    assert _ops(p.pre)["mean"] == 6, format_program(p)  # three LN(x W_i*)
    widths = [p.env_types()[n].shape[-1] for n in p.scan.seqs if n != "len.mask"]
    assert sum(widths) == 3 * H, format_program(p)  # no more than x @ W_i* reads


@pytest.mark.parametrize("cell", ["ln_lstm", "layer_norm_gru"])
def test_backward_has_no_more_reductions_in_the_loop(cell) -> None:
    make = ln_lstm if cell == "ln_lstm" else rnnc.cells.layer_norm_gru
    traced = passes.run(make(8, H).program(), passes.ORACLE["backward"])
    p = _after_hoist(make(8, H), "backward")
    assert _reductions(p.scan.body) <= _reductions(traced.scan.body)


# ------------------------------------------------------------------ hoisting: the rule itself


def _cell(step) -> rnnc.Cell:
    """A cell with input x (4 wide), state h (4): h' = tanh(step(x, h) ...)."""
    c = rnnc.Cell("rule")
    x, h = c.input("x", 4), c.state("h", 4)
    U = c.param("U", (4, 4))
    new = rnnc.tanh(step(x, h @ U))
    c.update(h=new)
    c.output("y", new)
    return c


def _loop_and_pre(cell: rnnc.Cell) -> tuple[Counter, Counter]:
    p = _after_hoist(cell, "inference")
    return _ops(p.scan.body), _ops(p.pre)


def test_a_reduction_of_a_raw_input_moves_when_the_loop_reads_no_more() -> None:
    loop, pre = _loop_and_pre(_cell(lambda x, hu: x - rnnc.mean(x) + hu))
    assert loop["mean"] == 0 and pre["mean"] == 1 and pre["sub"] == 1


def test_a_reduction_stays_when_moving_it_would_read_more_per_step() -> None:
    # The loop reads x anyway (hu * x); hoisted, amax(x) or x * amax(x) would be one more
    # sequence to read.
    loop, pre = _loop_and_pre(_cell(lambda x, hu: x * rnnc.amax(x) + hu * x))
    assert loop["amax"] == 1 and pre["amax"] == 0


def test_groups_that_free_a_sequence_only_together_move_together() -> None:
    # mean(x) and amax(x) are two groups; each alone leaves x read, both free it.
    loop, pre = _loop_and_pre(_cell(lambda x, hu: hu * rnnc.mean(x) + rnnc.amax(x)))
    assert loop["mean"] == loop["amax"] == 0 and pre["mean"] == pre["amax"] == 1


def test_trailing_slices_stay_in_the_loop_unless_that_reads_more() -> None:
    def both_halves(x, hu):
        n = x - rnnc.mean(x)
        return rnnc.concat([n[:, 2:4], n[:, 0:2]]) + hu

    loop, pre = _loop_and_pre(_cell(both_halves))
    assert pre["mean"] == 1 and loop["slice"] == 2 and pre["slice"] == 0

    def one_half(x, hu):
        n = x - rnnc.mean(x)
        return rnnc.concat([n[:, 0:2], hu[:, 0:2]])

    loop, pre = _loop_and_pre(_cell(one_half))
    assert pre["mean"] == 1 and pre["slice"] == 1 and loop["slice"] == 1


def test_hoisting_reductions_keeps_meaning_and_is_idempotent() -> None:
    cell = ln_lstm(3, 4)
    env = environment(cell, 4, 3)
    program = passes.run(cell.program(), passes.pipeline("forward")[:3])  # up to autodiff
    check_pass(program, "hoist-sequence", env, 4, 3)


# ------------------------------------------------------------------ folding bias pairs


def _canonical(cell: rnnc.Cell) -> Program:
    return passes.run(cell.program(), ["canonicalize"])


def _bias_adds(p: Program) -> list[int]:
    """Widths of the loop's adds that read a loop constant: its bias adds per step."""
    body = p.scan.body
    consts = {body.args()[n] for n in p.scan.consts if n in body.args()}
    return [body.node(n.id).shape[-1] for n in body.nodes()
            if n.op is ops.add and any(i in consts for i in n.inputs)
            and len(n.shape) == 2]


@pytest.mark.parametrize("mode", ["inference", "forward"])
def test_lstm_adds_one_bias_per_step(mode) -> None:
    p = _after_hoist(rnnc.cells.lstm(8, H), mode)
    assert sum(_bias_adds(p)) == 4 * H, format_program(p)  # one bias per gate element
    pre_adds = [n for n in p.pre.nodes() if n.op is ops.add]
    names = {frozenset(p.pre.node(i).attrs.get("name") for i in n.inputs) for n in pre_adds}
    assert names == {frozenset({f"b_i{g}", f"b_h{g}"}) for g in "ifgo"}, format_program(p)


def test_gru_folds_the_r_and_z_biases_and_keeps_b_hn_inside_the_reset() -> None:
    p = _after_hoist(rnnc.cells.gru(8, H), "inference")
    pre_sums = {frozenset(p.pre.node(i).attrs.get("name") for i in n.inputs)
                for n in p.pre.nodes() if n.op is ops.add}
    assert pre_sums == {frozenset({"b_ir", "b_hr"}), frozenset({"b_iz", "b_hz"})}
    body = p.scan.body
    args = body.args()
    (hn,) = [n for n in body.nodes() if n.op is ops.add and args["b_hn"] in n.inputs]
    assert [body.node(u).op for u in body.users(hn.id)] == [ops.mul]  # r * (h W_hn + b_hn)
    (inn,) = [n for n in body.nodes() if n.op is ops.add and args["b_in"] in n.inputs]
    assert body.node(body.users(inn.id)[0]).op is ops.add  # x W_in + b_in + r * (...)
    assert sum(_bias_adds(p)) == 4 * H  # r, z: one each; n: b_in and b_hn


def _sum_cell(expr) -> rnnc.Cell:
    c = rnnc.Cell("sums")
    x, h = c.input("x", 3), c.state("h", 4)
    W, U = c.param("W", (3, 4)), c.param("U", (4, 4))
    b, d = c.param("b", (4,)), c.param("d", (4,))
    new = rnnc.tanh(expr(x, h, W, U, b, d))
    c.update(h=new)
    c.output("y", new)
    return c


def _loop_constant_terms(p: Program) -> list[list[str]]:
    """For each add in the loop reading a value computed before it: the parameter names that
    value adds up, with multiplicity."""
    out = []
    for n in p.pre.nodes():
        if n.op is ops.add:
            names, stack = [], [n.id]
            while stack:
                node = p.pre.node(stack.pop())
                if node.op is ARG:
                    names.append(node.attrs["name"])
                else:
                    stack.extend(node.inputs)
            out.append(sorted(names))
    return out


@pytest.mark.parametrize("expr,terms", [
    (lambda x, h, W, U, b, d: x @ W + b + b, ["b", "b"]),
    (lambda x, h, W, U, b, d: x @ W + b + h @ U + b, ["b", "b"]),
    (lambda x, h, W, U, b, d: b + x @ W + d + h @ U + b, ["b", "b", "d"]),
    (lambda x, h, W, U, b, d: h + b + rnnc.tanh(x @ W) + d, ["b", "d"]),  # no matmul term
    (lambda x, h, W, U, b, d: x @ W + rnnc.sigmoid(d) + h @ U + b, ["b", "d"]),
], ids=["bias-twice", "bias-around-recurrent", "three-invariant-terms", "no-matmul",
        "computed-invariant-term"])
def test_invariant_terms_are_added_once_with_their_multiplicity(expr, terms) -> None:
    cell = _sum_cell(expr)
    p = _after_hoist(cell, "inference")
    assert sorted(max(_loop_constant_terms(p), key=len)) == terms, format_program(p)
    assert sum(_bias_adds(p)) == 4, format_program(p)  # one add of a loop constant per step
    env = environment(cell, 4, 3)
    check_pass(cell.program(), "canonicalize", env, 4, 3)


def test_a_lone_bias_stays_paired_with_its_matmul() -> None:
    p = _canonical(_sum_cell(lambda x, h, W, U, b, d: h @ U + x @ W + b))
    body = p.scan.body
    (add,) = [n for n in body.nodes() if n.op is ops.add and body.args()["b"] in n.inputs]
    (mm,) = [i for i in add.inputs if i != body.args()["b"]]
    assert body.node(mm).op is ops.matmul and body.node(mm).inputs[0] == body.args()["h"]


# ------------------------------------------------------------------ numbers against the oracle


CELLS = {"ln_lstm": lambda: ln_lstm(3, 5), "lstm": lambda: rnnc.cells.lstm(3, 5),
         "layer_norm_gru": lambda: rnnc.cells.layer_norm_gru(3, 5),
         "gru": lambda: rnnc.cells.gru(3, 5)}


def _close(got, want, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=what)


BACKENDS = {"numpy": {"backend": "numpy"}, "llvm": {"backend": "llvm"},
            "cuda-emulate": {"backend": "cuda", "emulate": True}}
CASES = [(name, backend) for name in sorted(CELLS) for backend in ("numpy", "llvm")] + [
    (name, "cuda-emulate") for name in ("layer_norm_gru", "ln_lstm")]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward-scan", "reverse-scan"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("name,backend", CASES, ids=[f"{n}-{b}" for n, b in CASES])
def test_outputs_and_gradients_match_the_oracle(name, backend, with_lengths, reverse) -> None:
    if backend == "llvm":
        pytest.importorskip("llvmlite")
    cell = CELLS[name]()
    T, B = 5, 3
    x, params, states = random_data(cell, T, B, 3, np.float64)
    lengths = np.array([5, 2, 4]) if with_lengths else None
    oracle = rnnc.compile(cell, backend="numpy", optimize=False, reverse=reverse)
    fn = rnnc.compile(cell, reverse=reverse, **BACKENDS[backend])
    want_y, want_s = oracle(x, params, states, lengths=lengths)
    got_y, got_s = fn(x, params, states, lengths=lengths)
    for k in want_y:
        _close(got_y[k], want_y[k], f"inference output {k}")
    for k in want_s:
        _close(got_s[k], want_s[k], f"inference state {k}")
    want_y, want_s, want_tape = oracle.forward(x, params, states, lengths=lengths)
    got_y, got_s, got_tape = fn.forward(x, params, states, lengths=lengths)
    for k in want_y:
        _close(got_y[k], want_y[k], f"forward output {k}")
    rng = np.random.default_rng(4)
    d_out = {k: rng.standard_normal(v.shape) for k, v in want_y.items()}
    d_st = {k: rng.standard_normal(v.shape) for k, v in want_s.items()}
    want = oracle.backward(want_tape, d_out, d_st)
    got = fn.backward(got_tape, d_out, d_st)
    _close(got.x, want.x, "gradient of x")
    for k in want.params:
        _close(got.params[k], want.params[k], f"gradient of {k}")
    for k in want.states:
        _close(got.states[k], want.states[k], f"gradient of state {k}")


@pytest.mark.parametrize("name", ["ln_lstm", "lstm"])
def test_double_backward_matches_the_oracle(name) -> None:
    # The second-order programs run hoist-sequence and canonicalize after two autodiffs.
    cell = CELLS[name]()
    T, B = 4, 3
    x, params, states = random_data(cell, T, B, 5, np.float64)
    rng = np.random.default_rng(6)
    d_out = {"y": rng.standard_normal((T, B, 5))}
    d_st = {k: rng.standard_normal(v.shape) for k, v in states.items()}
    g_x = {"x": rng.standard_normal(x.shape)}
    g_params = {k: rng.standard_normal(v.shape) for k, v in params.items()}
    g_st = {k: rng.standard_normal(v.shape) for k, v in states.items()}
    results = []
    for fn in (rnnc.compile(cell, backend="numpy", optimize=False), rnnc.compile(cell,
                                                                                 backend="numpy")):
        tape = fn.forward(x, params, states, lengths=np.array([4, 1, 3]))[2]
        results.append(fn.double_backward(tape, d_out, d_st, g_x, g_params, g_st))
    (want_out, want_st, want), (got_out, got_st, got) = results
    for k in want_out:
        _close(got_out[k], want_out[k], f"cotangent of d_outputs[{k}]")
    for k in want_st:
        _close(got_st[k], want_st[k], f"cotangent of d_states[{k}]")
    _close(got.x, want.x, "cotangent of x")
    for k in want.params:
        _close(got.params[k], want.params[k], f"cotangent of {k}")
