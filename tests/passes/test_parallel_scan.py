"""parallel-scan: linear carries become linear_scan ops before an empty loop.

The oracle is the unoptimized traced program (``rnnc.compile(cell, backend="numpy",
optimize=False)``), plus float64 loops written here for the op itself. Every cell of
rnnc/cells_scan.py is checked in inference, training forward and backward, with and without
lengths, in both directions, on the NumPy, LLVM and emulated CUDA backends.
"""

from __future__ import annotations

import numpy as np
import pytest

import rnnc
from rnnc import ops, passes
from rnnc.passes import PASSES
from rnnc.passes._affine import linear_coefficients
from rnnc.printer import format_program
from rnnc.verify import verify

T, B = 5, 3
LENGTHS = np.array([5, 2, 1])
CELLS = {
    "sru": lambda: rnnc.cells.sru(4, 4),
    "sru_projected": lambda: rnnc.cells.sru(3, 4),
    "min_gru": lambda: rnnc.cells.min_gru(3, 4),
    "min_lstm": lambda: rnnc.cells.min_lstm(3, 4),
    "qrnn": lambda: rnnc.cells.qrnn(3, 4),
    "diag_linear": lambda: rnnc.cells.diag_linear(3, 4),
}
try:
    import llvmlite  # noqa: F401

    BACKENDS = ["numpy", "llvm", "cuda"]
except ImportError:
    BACKENDS = ["numpy", pytest.param("llvm", marks=pytest.mark.skip(reason="needs llvmlite")),
                "cuda"]


def _options(backend: str) -> dict:
    # llvm runs parallel-scan only when asked (rnnc.compile's parallel_scan=True)
    return ({"backend": "cuda", "emulate": True} if backend == "cuda" else
            {"backend": backend, "parallel_scan": True} if backend == "llvm" else
            {"backend": backend})


def problem(cell: rnnc.Cell, seed: int = 0):
    """float64 parameters (the cell's init, perturbed), inputs and nonzero initial states."""
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=seed, dtype=np.float64).items()}
    xs = {n: rng.standard_normal((T, B, s[-1])) for n, s in cell.sizes("input").items()}
    x = xs if len(xs) > 1 else next(iter(xs.values()))
    states = {k: 0.5 * rng.standard_normal((B, s[-1])) for k, s in cell.sizes("state").items()}
    return params, x, states


def _flat(value, prefix: str) -> dict[str, np.ndarray]:
    if isinstance(value, dict):
        return {f"{prefix}.{k}": np.asarray(v) for k, v in value.items()}
    return {prefix: np.asarray(value)}


def everything(fn: rnnc.Function, cell: rnnc.Cell, lengths) -> dict[str, np.ndarray]:
    """Inference, the training forward's outputs and every gradient of ``fn``."""
    params, x, states = problem(cell)
    ys, finals = fn(x, params, states=states, lengths=lengths)
    ys2, finals2, tape = fn.forward(x, params, states=states, lengths=lengths)
    rng = np.random.default_rng(1)
    d_y = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
    d_s = {k: rng.standard_normal(v.shape) for k, v in finals.items()}
    g = fn.backward(tape, d_outputs=d_y, d_states=d_s)
    out = {}
    for prefix, value in (("y", ys), ("final", finals), ("train.y", ys2), ("train.final", finals2),
                          ("grad.x", g.x), ("grad.param", g.params), ("grad.state", g.states)):
        out.update(_flat(value, prefix))
    return out


# Reverse scans with lengths run under ``-m slow`` here (the default run keeps reverse and
# lengths each here, and both together on numpy in the partly linear cell's test below).
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lengths,reverse", [
    (None, False), (LENGTHS, False), (None, True),
    pytest.param(LENGTHS, True, marks=pytest.mark.slow)],
    ids=["full-forward", "lengths-forward", "full-reverse", "lengths-reverse"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_cells_match_the_sequential_oracle(name: str, lengths, reverse: bool,
                                           backend: str) -> None:
    cell = CELLS[name]()
    want = everything(rnnc.compile(cell, backend="numpy", optimize=False, reverse=reverse),
                      cell, lengths)
    got = everything(rnnc.compile(cell, reverse=reverse, **_options(backend)), cell, lengths)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name} {key} on {backend}")


@pytest.mark.parametrize("name", sorted(CELLS))
def test_no_loop_work_is_left(name: str) -> None:
    fn = rnnc.compile(CELLS[name](), backend="numpy")
    for mode in ("inference", "forward", "backward"):
        assert fn.op_counts(mode)["loop"] == {}, (name, mode)
        assert "linear_scan" in fn.op_counts(mode)["outside"], (name, mode)
        for lengths in (False, True):
            scan = fn.program(mode, "f64", lengths).scan
            assert not (scan.carries or scan.seqs or scan.stacked or scan.summed), (name, mode)
            assert len(scan.body) == 0
            # With no loop between them, post's nodes join pre.
            assert len(fn.program(mode, "f64", lengths).post) == 0, (name, mode)


def test_saved_values_share_a_pass_with_the_scan_coefficients() -> None:
    """minGRU's training forward computes the coefficients of its scan and the values it
    saves from the same hoisted product: one elementwise region reads it (before the merge
    of post into pre, a second region in post read it again and recomputed the gate)."""
    fn = rnnc.compile(CELLS["min_gru"](), backend="numpy")
    pre = fn.program("forward", "f64").pre
    (product,) = [n.id for n in pre.nodes() if n.op is ops.matmul]
    readers = [pre.node(u).op.name for u in pre.users(product)]
    assert readers == ["fused"], readers
    region = pre.node(pre.users(product)[0]).attrs["region"]
    assert [n.op.name for n in region.nodes()].count("sigmoid") == 1


def test_the_pass_is_in_every_pipeline_after_hoisting() -> None:
    for mode, names in passes.PIPELINES.items():
        if "hoist-sequence" in names:
            at = names.index("parallel-scan")
            follow = ("hoist-sequence", "drop-empty-loop", "cse", "prune-outputs")
            assert names[at - 1] == "hoist-sequence", mode
            assert names[at + 1:at + 6] == follow + ("fuse-elementwise",), mode
    dump = rnnc.dump(rnnc.cells.min_gru(2, 3), after="parallel-scan", backend="numpy")
    assert "linear_scan" in dump


# ------------------------------------------------------------ which updates are linear


def _carry_form(update, extra_state: bool = False):
    """The coefficients parallel-scan finds for state ``c`` updated to ``update(c, x, g, d, W)``
    (x an input, g = sigmoid(x), d a second state, W a matrix), after hoist-sequence."""
    cell = rnnc.Cell("form")
    x = cell.input("x", 3)
    c = cell.state("c", 3)
    d = cell.state("d", 3)
    g = rnnc.sigmoid(x)
    cell.update(c=update(c, x, g, d, cell.param("W", (3, 3))), d=rnnc.tanh(d + x))
    cell.output("y", c)
    program = passes.run(cell.program(), ("canonicalize", "hoist-sequence"))
    body = program.scan.body
    args = body.args()
    carried = {args[n] for n in ("c", "d") if n in args}
    return linear_coefficients(body, args.get("c"), carried, body.outputs["c"])


LINEAR = {
    "A*c+B": lambda c, x, g, d, W: g * c + x,
    "c*A+B": lambda c, x, g, d, W: c * g + x,
    "B+A*c": lambda c, x, g, d, W: x + g * c,
    "c+B": lambda c, x, g, d, W: c + x,
    "A*c": lambda c, x, g, d, W: c * g,
    "lerp": lambda c, x, g, d, W: (1 - g) * c + g * x,
    "lerp-other-way": lambda c, x, g, d, W: c + g * (x - c),
    "division": lambda c, x, g, d, W: (c - x) / (g + 1.0),
    "masked": lambda c, x, g, d, W: rnnc.where(x, g * c, c),
    "negated": lambda c, x, g, d, W: -(x - c * g),
    "no-c": lambda c, x, g, d, W: x * g,
}
NOT_LINEAR = {
    "square": lambda c, x, g, d, W: c * c + x,
    "tanh": lambda c, x, g, d, W: rnnc.tanh(c) + x,
    "reads-other-carry": lambda c, x, g, d, W: d * c + x,
    "offset-reads-other-carry": lambda c, x, g, d, W: c + d,
    "matmul": lambda c, x, g, d, W: c @ W + x,
    "condition-on-c": lambda c, x, g, d, W: rnnc.where(c, x, c),
    "reduction": lambda c, x, g, d, W: c + rnnc.sum(c),
    "divide-by-c": lambda c, x, g, d, W: x / (c * c + 1.0),
}


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_linear_updates_are_found(name: str) -> None:
    assert _carry_form(LINEAR[name]) is not None, name


@pytest.mark.parametrize("name", sorted(NOT_LINEAR))
def test_other_updates_are_not(name: str) -> None:
    assert _carry_form(NOT_LINEAR[name]) is None, name


def _partly_linear_cell() -> rnnc.Cell:
    """``s`` is linear; ``u`` reads ``s``'s new value (so becomes linear in a second round
    once ``s`` is a sequence); ``h`` is a tanh recurrence reading both."""
    cell = rnnc.Cell("partly")
    x = cell.input("x", 3)
    s, u, h = cell.state("s", 3), cell.state("u", 3), cell.state("h", 3)
    W = cell.param("W", (3, 3))
    f = rnnc.sigmoid(x @ W)
    s_new = f * s + (1 - f) * x
    u_new = 0.5 * u + s_new * f
    h_new = rnnc.tanh(h @ W + u + s_new)
    cell.update(s=s_new, u=u_new, h=h_new)
    cell.output("y", h_new * s)
    return cell


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_linear_carries_leave_the_loop_and_the_others_stay(lengths, reverse: bool) -> None:
    cell = _partly_linear_cell()
    fn = rnnc.compile(cell, reverse=reverse, backend="numpy")
    for mode in ("inference", "forward"):
        program = fn.program(mode, "f64", lengths is not None)
        assert [c.name for c in program.scan.carries] == ["h"], mode
        assert sum(n.op is ops.linear_scan for n in program.pre.nodes()) >= 2, mode
    want = everything(rnnc.compile(cell, optimize=False, reverse=reverse), cell, lengths)
    got = everything(fn, cell, lengths)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", sorted(CELLS) + ["partly"])
@pytest.mark.parametrize("mode", ["inference", "forward", "backward"])
def test_verifies_and_is_idempotent(name: str, mode: str) -> None:
    cell = _partly_linear_cell() if name == "partly" else CELLS[name]()
    for masked in (False, True):
        names = passes.pipeline(mode, masked)
        program = passes.run(cell.program(), names[:names.index("parallel-scan") + 1])
        again = PASSES["parallel-scan"](program)
        verify(again)
        assert format_program(again) == format_program(program), (name, mode, masked)


def test_a_carry_without_a_sequence_stays_in_the_loop() -> None:
    """``c' = 0.5 c + b`` reads no sequence: the number of steps is not known before the loop
    (without lengths), so the carry stays; with lengths the mask gives it."""
    cell = rnnc.Cell("counter")
    x = cell.input("x", 2)
    c = cell.state("c", 2)
    c_new = c * 0.5 + cell.param("b", (2,))
    cell.update(c=c_new)
    cell.output("y", x + c_new)
    fn = rnnc.compile(cell, backend="numpy")
    assert [c.name for c in fn.program("inference").scan.carries] == ["c"]
    assert fn.program("inference", lengths=True).scan.carries == ()
    for lengths in (None, LENGTHS):
        want = everything(rnnc.compile(cell, optimize=False), cell, lengths)
        got = everything(fn, cell, lengths)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12, err_msg=key)


def test_an_output_copying_an_input_needs_no_loop() -> None:
    """A stacked output that only reads a sequence becomes that sequence."""
    cell = rnnc.Cell("echo")
    x = cell.input("x", 2)
    h = cell.state("h", 2)
    cell.update(h=h + x)
    cell.output("y", x)
    cell.output("z", h)
    fn = rnnc.compile(cell, backend="numpy")
    assert fn.op_counts("inference")["loop"] == {}
    want = everything(rnnc.compile(cell, optimize=False), cell, None)
    got = everything(fn, cell, None)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-12, err_msg=key)


def test_rnn_layers_of_linear_cells() -> None:
    """A bidirectional two-layer rnnc.RNN of minGRU with lengths (the reverse direction is a
    reverse scan) against the same layer on the oracle."""
    kwargs = {"num_layers": 2, "bidirectional": True, "seed": 0, "dtype": np.float64,
              "backend": "numpy"}
    x = np.random.default_rng(3).standard_normal((T, B, 3))
    results = []
    for layer in (rnnc.RNN(rnnc.cells.min_gru, 3, 4, **kwargs),
                  rnnc.RNN(rnnc.cells.min_gru, 3, 4, optimize=False, **kwargs)):
        y, states, tape = layer.forward(x, lengths=LENGTHS)
        g = layer.backward(tape, np.cos(y))
        results.append([y, states["h"], g.x, *(v for row in g.params for p in row
                                                 for _, v in sorted(p.items()))])
    assert results[0][1].shape == (4, B, 4)
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_long_chains_need_no_deep_recursion() -> None:
    """A gate made by 1,200 chained ops, and an update adding 300 terms: the first becomes a
    scan, the second (deeper than the coefficient trees go) stays in the loop. (Only the
    inference: in training the chain then moves to ``post``, and hoist-sequence's sinking
    recurses once per node.)"""
    cell = rnnc.Cell("chains")
    x = cell.input("x", 2)
    c, d = cell.state("c", 2), cell.state("d", 2)
    gate = x
    for _ in range(1200):
        gate = rnnc.sigmoid(gate)
    total = d
    for k in range(300):
        total = total + x * float(k)
    cell.update(c=gate * c + x, d=total)
    cell.output("y", c)
    fn = rnnc.compile(cell, backend="numpy")
    assert [c.name for c in fn.program("inference", "f64").scan.carries] == ["d"]
    params, x, states = problem(cell)
    got = fn(x, params, states=states, lengths=LENGTHS)
    want = rnnc.compile(cell, optimize=False)(x, params, states=states, lengths=LENGTHS)
    for ours, theirs in zip(got, want, strict=True):
        for key in theirs:
            np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-10, atol=1e-12)


def test_scan_ops_name_what_is_wrong_with_their_shapes() -> None:
    cases = [
        (lambda: ops.linear_scan.shape(("B", 4), ("B", 4), ("B", 4)), r"must be a \[T,\.\.\.\]"),
        (lambda: ops.linear_scan.shape(("T", "B", 5), ("T", "B", 4), ("B", 4)),
         r"A \[T,B,5\] does not broadcast to the result \[T,B,4\]"),
        (lambda: ops.linear_scan.shape(("T", "B", 4), ("T", "B", 4), ("T", "B", 4)),
         r"initial value must be a per-step value"),
        (lambda: ops.last_step.shape(("B", 4)), r"last_step needs a \[T,\.\.\.\] sequence"),
    ]
    for build, message in cases:
        with pytest.raises(rnnc.ShapeError, match=message) as caught:
            build()
        assert isinstance(caught.value, rnnc.RnncError)


def test_parallel_scan_is_a_compile_option() -> None:
    """On by default for numpy (and cuda), off for llvm; parallel_scan= overrides either way,
    and anything but a bool is refused before compiling."""
    cell = CELLS["min_gru"]()

    def scans(fn) -> bool:
        return "linear_scan" in fn.op_counts("inference")["outside"]

    assert scans(rnnc.compile(cell, backend="numpy"))
    assert not scans(rnnc.compile(cell, parallel_scan=False, backend="numpy"))
    pytest.importorskip("llvmlite")
    assert not scans(rnnc.compile(cell, backend="llvm"))
    assert scans(rnnc.compile(cell, backend="llvm", parallel_scan=True))
    with pytest.raises(rnnc.RnncTypeError, match="parallel_scan must be True or False"):
        rnnc.compile(cell, parallel_scan="yes", backend="numpy")


def test_an_empty_loop_runs_no_steps(monkeypatch) -> None:
    """With every carry a scan, the NumPy runner walks no loop body: a few graphs, not
    one graph per step."""
    from rnnc.backends.numpy import runtime

    cell = CELLS["min_gru"]()
    params = cell.init_params(dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((50, 2, cell.sizes("input")["x"][-1]))
    want, _ = rnnc.compile(cell, optimize=False)(x, params)  # the oracle loops: run it first
    fn = rnnc.compile(cell, backend="numpy")
    assert fn.op_counts("inference")["loop"] == {}
    calls = []
    real = runtime.run_graph
    monkeypatch.setattr(runtime, "run_graph", lambda *a, **k: calls.append(1) or real(*a, **k))
    ys, _ = fn(x, params)
    np.testing.assert_allclose(ys["y"], want["y"], rtol=1e-10, atol=1e-12)
    assert len(calls) <= 3, len(calls)  # pre, post, ...: not one per step of the 50
