"""The pass manager owns the order, and the rewrite engine is the one place rules and CSE run.

Every pass a program goes through is listed in its pipeline (parallel-scan's follow-ups
included) and shows in ``rnnc dump``; no pass module runs another pass or the manager, and
CSE and output pruning are defined once (``passes/rewrite.py``, ``passes/_graphs.py``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import rnnc
from rnnc import ops, passes
from rnnc.ir import Graph
from rnnc.passes.rewrite import Rule, apply_rules
from rnnc.printer import format_program

ROOT = Path(__file__).resolve().parents[2]
FOLLOW = ("hoist-sequence", "drop-empty-loop", "cse", "prune-outputs")


# ------------------------------------------------------------ the pipelines list every pass


@pytest.mark.parametrize("mode", passes.MODES + passes.SECOND_ORDER)
def test_pipelines_list_parallel_scan_and_its_follow_ups(mode: str) -> None:
    names = passes.pipeline(mode)
    at = names.index("parallel-scan")
    assert names[at - 1] == "hoist-sequence"
    assert names[at:at + 6] == ("parallel-scan",) + FOLLOW + ("fuse-elementwise",)
    assert passes.FOLLOW_UPS["parallel-scan"] == FOLLOW
    # Without parallel scan its follow-ups go too; the hoisting before it stays.
    without = passes.pipeline(mode, masked=True, parallel_scan=False)
    assert without == ("mask-lengths",) + names[:at] + names[at + 5:]


def _titles(dump: str) -> list[str]:
    return re.findall(r"^program \S+ \w+: (.+) \(f32\) \{$", dump, flags=re.M)


def test_dump_prints_the_program_after_each_follow_up() -> None:
    dump = rnnc.dump(rnnc.cells.min_gru(2, 3), backend="numpy")
    steps = [t.removeprefix("after ") for t in _titles(dump)]
    assert steps == ["traced", *passes.pipeline("inference")], steps
    assert "linear_scan" in dump


def test_follow_ups_are_skipped_where_parallel_scan_changes_nothing() -> None:
    # No LSTM carry is linear in itself: parallel-scan returns its program, nothing to finish.
    dump = rnnc.dump(rnnc.cells.lstm(2, 3), backend="numpy")
    steps = [t.removeprefix("after ") for t in _titles(dump)]
    at = steps.index("parallel-scan")
    assert steps[at + 1:] == ["fuse-elementwise"], steps
    assert steps.count("hoist-sequence") == 1
    # Listed on their own, the same passes run.
    ran = []
    passes.run(rnnc.cells.lstm(2, 3).program(), ("parallel-scan", "cse"),
               lambda name, program, seconds: ran.append(name))
    assert ran == ["parallel-scan", "cse"]


def test_the_follow_ups_keep_the_results_of_the_oracle() -> None:
    # The oracle is the traced program (no optimization), run by the same NumPy backend.
    cell = rnnc.cells.min_gru(3, 4)
    params = cell.init_params(dtype=np.float64)
    x = np.random.default_rng(3).standard_normal((6, 2, 3))
    want, want_state = rnnc.compile(cell, optimize=False)(x, params)
    fn = rnnc.compile(cell, backend="numpy")
    got, got_state = fn(x, params)
    assert fn.op_counts("inference")["loop"] == {}  # the follow-ups ran: no loop work left
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_state["h"], want_state["h"], rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------ no pass runs another


def violations(root: Path = ROOT) -> list[str]:
    """Each place a pass module runs another pass, runs the manager, or defines CSE or output
    pruning of its own."""
    passes._load()
    entries = {fn.__name__: fn.__module__.rpartition(".")[2] for fn in passes.PASSES.values()}
    bad = []
    for path in sorted((root / "passes").glob("*.py")):
        if path.name == "__init__.py":
            continue
        here = path.stem
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"passes/{path.name}:{getattr(node, 'lineno', '?')}"
            names = []
            if isinstance(node, ast.Name):
                names = [node.id]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
                if node.module == "rnnc.passes":
                    bad += [f"{where}: imports the manager's {a.name}" for a in node.names
                            if a.name in ("run", "run_cached", "PASSES", "pipeline")]
            bad += [f"{where}: runs the pass {n} of passes/{entries[n]}.py" for n in names
                    if n in entries and entries[n] != here]
            if here != "rewrite" and "cse_key" in names:
                bad.append(f"{where}: merges equal nodes itself (CSE is passes/rewrite.py's)")
            if here != "_graphs" and _filters_outputs(node):
                bad.append(f"{where}: prunes outputs itself (prune_outputs is _graphs.py's)")
    return bad


def _filters_outputs(node: ast.AST) -> bool:
    """``g.outputs = {... for ... if ...}``: the outputs of a graph cut down to those read."""
    return (isinstance(node, ast.Assign) and isinstance(node.value, ast.DictComp)
            and any(isinstance(t, ast.Attribute) and t.attr == "outputs" for t in node.targets)
            and any(gen.ifs for gen in node.value.generators))


def test_no_pass_runs_another_or_copies_cse_or_pruning() -> None:
    assert not violations(), "\n".join(violations())


def test_the_check_sees_a_pass_running_another(tmp_path: Path) -> None:
    # What parallel_scan.py did: run hoist-sequence, merge equal nodes, prune its outputs.
    fake = tmp_path / "passes"
    fake.mkdir()
    (fake / "bad.py").write_text(
        "from rnnc.passes.hoist_sequence import hoist_sequence\n"
        "from rnnc.passes.rewrite import cse_key\n"
        "def f(p, g, names):\n"
        "    g.outputs = {n: o for n, o in g.outputs.items() if n in names}\n"
        "    return hoist_sequence(p)\n")
    found = violations(tmp_path)
    assert any("runs the pass hoist_sequence" in v for v in found), found
    assert any("merges equal nodes" in v for v in found), found
    assert any("prunes outputs" in v for v in found), found


# ------------------------------------------------------------ the rewrite engine


def _graph() -> tuple[Graph, int, int]:
    """A loop body computing ``tanh(x)`` twice and ``sigmoid(x)`` for nobody, whose carry
    ``h`` no output reads: the body, ``x`` and the first ``tanh``."""
    c = rnnc.Cell("dup")
    x, h = c.input("x", 2), c.state("h", 2)
    c.update(h=rnnc.tanh(x) + rnnc.tanh(x))
    c.output("y", h)
    g = c.program().scan.body.copy()
    g.outputs = {"h": g.outputs["h"]}
    x_arg = g.args()["x"]
    g.add(ops.sigmoid, (x_arg,))
    return g, x_arg, g.users(x_arg)[0]


def test_an_empty_table_is_cse_and_dead_code_removal() -> None:
    g, x, a = _graph()
    apply_rules(g, (), keep_args={"h"})
    assert [n.op.name for n in g.nodes() if n.op.name != "arg"] == ["tanh", "add"]
    assert g.node(g.outputs["h"]).inputs == (a, a)
    assert set(g.args()) == {"x", "h"}  # a kept input stays, read or not
    g, x, a = _graph()
    apply_rules(g, ())
    assert set(g.args()) == {"x"}


def test_rules_apply_in_table_order_until_none_does() -> None:
    calls = []

    def double(g, node):  # a + a -> 2 * a, once
        calls.append("double")
        a, b = node.inputs
        if a != b:
            return None
        two = g.add(ops.constant, (), {"value": 2.0}, origin="test")
        return g.add(ops.mul, (two, a), origin="test")

    def never(g, node):
        calls.append("never")
        return None

    g, x, a = _graph()
    seen = []

    class Context:
        def replaced(self, old: int, new: int) -> None:
            seen.append((g.node(old).op.name, g.node(new).op.name))

    table = (Rule("never-any", None, lambda g, n: never(g, n)), Rule("a+a", ops.add, double))
    apply_rules(g, table, context=Context(), what="test")
    left = [n.op.name for n in g.nodes() if n.op.name != "arg"]
    assert left == ["tanh", "constant", "mul"], left
    assert calls[calls.index("double") - 1] == "never"  # the any-op rule first: table order
    assert ("tanh", "tanh") in seen and ("add", "mul") in seen


def test_a_table_that_never_settles_names_its_pass() -> None:
    def flip(g, node):
        a, b = node.inputs
        return g.add(ops.add, (b, a), origin="test")

    g, _, _ = _graph()
    with pytest.raises(RuntimeError, match="my-pass did not reach a fixed point"):
        apply_rules(g, (Rule("flip", ops.add, flip),), what="my-pass")


def test_canonicalize_declares_its_rules_for_the_engine() -> None:
    from rnnc.passes import canonicalize

    assert canonicalize.Rule is Rule and canonicalize.RULES
    program = passes.run(rnnc.cells.gru(3, 4).program(), ["canonicalize"])
    assert format_program(passes.run(program, ["canonicalize"])) == format_program(program)


def test_verify_names_a_cycle() -> None:
    # passes.run verifies after every pass; a graph with a cycle is refused.
    program = passes.run(rnnc.cells.rnn(2, 3).program(), ["canonicalize"])
    body = program.scan.body
    first, last = body.topo()[0], body.outputs["h"]
    body.nx.add_edge(last, first, 0)  # an edge back from the step's result to its first node
    body._order = None
    with pytest.raises(AssertionError, match="scan: cycle"):
        passes.verify(program)
