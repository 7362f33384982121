"""The buffer plan (backends/buffers.py): destinations, liveness and carry double-buffering.

The plan is checked against an independent walk of the step lists (no buffer is given to a
value while the value it holds is still read), and the backends that read it against the
unoptimized oracle."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import rnnc
from rnnc.backends.buffers import BufferPlan, plan_buffers
from rnnc.backends.steps import ProgramSteps, program_steps
from rnnc.dsl import Cell, tanh
from rnnc.ir import GET


def _chain() -> Cell:
    """A cell whose input goes through three products before the loop: the pre graph has
    several [T,B,4] temporaries, each dead once its readers are made; the first product is
    read twice."""
    c = Cell("chain")
    x, h = c.input("x", 3), c.state("h", 4)
    w1, w2, w3 = c.param("W1", (3, 4)), c.param("W2", (4, 4)), c.param("W3", (4, 4))
    u = c.param("U", (4, 4))
    m = x @ w1
    n = tanh(m) @ w2
    d = tanh((m * tanh(n)) @ w3)
    h_new = tanh(d + h @ u)
    c.update(h=h_new)
    c.output("y", h_new)
    return c


def _steps(cell: Cell, mode: str = "inference") -> ProgramSteps:
    return program_steps(rnnc.compile(cell, backend="numpy").program(mode))


def _last_reads(graph) -> dict[tuple[int, int], float]:
    """When each result of ``graph`` is last read (its step's position); outputs: never dead."""
    gets = {s.slot: (s.inputs[0], s.attrs["index"]) for s in graph.steps if s.op is GET}
    last: dict[tuple[int, int], float] = {}
    for position, step in enumerate(graph.steps):
        if step.op is GET:
            continue  # a get reads no memory; its readers read the fused result
        for i in step.inputs:
            key = gets.get(i, (i, 0))
            last[key] = max(last.get(key, -1), position)
    for output in graph.outputs.values():
        last[output.source] = math.inf
    return last


def _check_no_live_value_overwritten(steps: ProgramSteps, plan: BufferPlan) -> None:
    """Walk the graphs in order: a result may take a buffer only once the value in it is
    dead; the loop body's buffers are its own; the pre graph's outputs outlive it."""
    dies: dict[int, float] = {}  # buffer -> when its value is last read in the current graph
    for where in ("pre", "body", "post"):
        graph, graph_plan = getattr(steps, where), getattr(plan, where)
        # A value of an earlier graph is dead here unless it is that graph's output.
        dies = {n: (math.inf if end == math.inf else -1) for n, end in dies.items()}
        last = _last_reads(graph)
        for position, step in enumerate(graph.steps):
            for key, number in graph_plan.buffers.items():
                if key[0] != step.slot:
                    continue
                assert key not in graph_plan.writes
                assert dies.get(number, -1) < position, (where, key, number)
                dies[number] = last.get(key, position)
    outside = set(plan.pre.buffers.values()) | set(plan.post.buffers.values())
    assert set(plan.body.buffers.values()).isdisjoint(outside)


@pytest.mark.parametrize("name, mode", [
    ("chain", "inference"), ("chain", "forward"), ("lstm", "forward"), ("gru", "backward"),
    ("mgu", "backward"), ("min_gru", "inference"), ("layer_norm_gru", "forward")])
def test_no_buffer_is_taken_while_its_value_is_read(name: str, mode: str) -> None:
    cell = _chain() if name == "chain" else getattr(rnnc.cells, name)(3, 4)
    steps = _steps(cell, mode)
    _check_no_live_value_overwritten(steps, plan_buffers(steps))


def test_the_check_finds_a_value_overwritten_while_read() -> None:
    """The walk above fails a plan that gives a value the buffer of one still read."""
    steps = _steps(_chain())
    plan = plan_buffers(steps)
    first, *later = plan.pre.buffers  # the first product, read by the last region too
    broken = dict(plan.pre.buffers)
    broken[later[0]] = broken[first]
    with pytest.raises(AssertionError):
        _check_no_live_value_overwritten(steps, replace(plan, pre=replace(plan.pre,
                                                                          buffers=broken)))


def test_a_dead_temporary_s_buffer_serves_a_later_one() -> None:
    steps = _steps(_chain())
    plan = plan_buffers(steps)
    numbers = list(plan.pre.buffers.values())
    assert len(set(numbers)) < len(numbers)  # liveness: some buffer holds two values
    assert all(plan.shapes[n] == ("T", "B", 4) for n in numbers if numbers.count(n) > 1)


def test_a_result_is_written_in_place_by_the_stage_that_writes_it_last() -> None:
    """min_gru's loop is a linear scan before the loop: its results are made in their
    arrays by the pre graph, with no buffer of their own and no copy."""
    steps = _steps(rnnc.cells.min_gru(3, 4))
    plan = plan_buffers(steps)
    for name in ("y", "h.final"):
        source = steps.pre.outputs[name].source
        assert plan.pre.writes[source] == name and source not in plan.pre.buffers
    assert plan.pre.copies == ()


def test_a_value_both_stacked_and_carried_is_made_in_its_step_slot() -> None:
    """LSTM: h is both the output y and a carry. It is made in y's step slot and copied into
    h's next buffer; c is made in its own next buffer; each carry is double-buffered."""
    steps = _steps(rnnc.cells.lstm(3, 4))
    plan = plan_buffers(steps)
    h, c = plan.carry("h"), plan.carry("c")
    assert plan.body.writes[h.made] == "y" and not h.in_place and "h" in plan.body.copies
    assert plan.body.writes[c.made] == "c" and c.in_place and "c" not in plan.body.copies
    assert h.made not in plan.body.buffers and c.made not in plan.body.buffers
    assert (h.init, h.shape, c.init, c.shape) == ("h", ("B", 4), "c", ("B", 4))


def test_a_stacked_previous_carry_value_is_the_stack_one_step_behind() -> None:
    """A training forward of GRU saves the carry it read (save.4, the previous h), whose next
    value is the stacked y: the plan links them, so no step copies it."""
    steps = _steps(rnnc.cells.gru(3, 4), "forward")
    plan = plan_buffers(steps)
    assert plan.behind == {"save.4": "y"}
    assert plan.shifted == {}


@pytest.mark.parametrize("backend, options", [("llvm", {}), ("cuda", {"emulate": True})])
def test_backends_reading_the_plan_match_the_oracle(backend: str, options: dict) -> None:
    """A program whose pre graph reuses buffers and whose loop makes y and h in one value."""
    cell = _chain()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    params = cell.init_params(seed=0)
    got, got_finals = rnnc.compile(cell, backend=backend, **options)(x, params)
    want, want_finals = rnnc.compile(cell, optimize=False)(x, params)
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_finals["h"], want_finals["h"], rtol=1e-5, atol=1e-6)
