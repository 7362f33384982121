"""The fuzzer's own parts: the generator is deterministic, prints runnable source and draws
the stress patterns; the reference agrees with the oracle; the shrinker finds small cells."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import rnnc
from tests.fuzz.campaign import fuzz
from tests.fuzz.cells import generate
from tests.fuzz.differential import Target, check, make_data
from tests.fuzz.patterns import PATTERNS, patterns
from tests.fuzz.reference import evaluate
from tests.fuzz.shrink import predicate, report, shrink
from tests.fuzz.spec import build, source

# How many of the first 300 cells must show each pattern (about half of what they show now):
# if a change to the generator loses a pattern, this fails instead of the fuzzer going blind.
AT_LEAST = {
    "bias added twice": 50, "same matmul twice in a sum": 40, "sum of 5+ terms": 35,
    "matmuls sharing a left operand": 60, "parameter used twice": 95,
    "temporary shared by two uses": 130, "slice of a concatenation": 18,
    "slices of one matmul (gate split)": 45, "matmul of a concatenation": 20,
    "matmul of an expression": 17, "mean or sum": 11, "layer_norm": 7, "where": 70,
    "constant on the left": 85, "constant on the right": 75, "1 - (1 - v)": 5,
    "negation": 22, "division": 15, "exp, log, sqrt or rsqrt": 23,
    "parameter-only expression": 23, "two or more states": 110, "three states": 40,
    "two or more inputs": 80, "output that is not a new state": 130,
    "two or more outputs": 105, "state kept or swapped": 17,
    "state wide enough for the LLVM small-batch GEMM": 45,
}


def test_generator_draws_every_stress_pattern() -> None:
    counts = Counter()
    for seed in range(300):
        counts.update(patterns(generate(seed)))
    assert set(AT_LEAST) == set(PATTERNS)
    low = {name: counts[name] for name, least in AT_LEAST.items() if counts[name] < least}
    assert not low, f"patterns drawn too rarely in seeds 0-299: {low}"


def test_generator_is_deterministic_and_prints_runnable_source() -> None:
    for seed in (0, 7, 123):
        assert generate(seed) == generate(seed)
        text = source(generate(seed))
        namespace: dict = {}
        exec(compile(text, "<reproducer>", "exec"), namespace)  # noqa: S102
        cell = namespace["make_cell"]()
        assert isinstance(cell, rnnc.Cell)
        assert rnnc.printer.format_program(cell.program()) == \
            rnnc.printer.format_program(build(generate(seed)).program())
    assert len({source(generate(s)) for s in range(50)}) == 50


@pytest.mark.parametrize("masked", [False, True])
def test_reference_agrees_with_the_oracle(masked: bool) -> None:
    """The loop of tests/fuzz/reference.py, written without rnnc, and the oracle agree; and
    the reference notices when they would not (a perturbed parameter)."""
    for seed in range(20):
        spec = generate(seed)
        cell = build(spec)
        data = make_data(cell, 4, 3, seed)
        lengths = data.lengths if masked else None
        want_ys, want_states = rnnc.compile(cell, optimize=False)(
            data.xs if len(data.xs) > 1 else next(iter(data.xs.values())), data.params,
            states=data.states, lengths=lengths)
        ys, states, margins = evaluate(spec, data.xs, data.params, data.states, lengths)
        assert set(margins) <= {""} and all(m >= 0.0 for m in margins.values())
        for name, v in want_ys.items():
            np.testing.assert_allclose(ys[name], v, rtol=1e-12, atol=1e-12)
        for name, v in want_states.items():
            np.testing.assert_allclose(states[name], v, rtol=1e-12, atol=1e-12)
    name = next(iter(data.params))
    data.params[name] = data.params[name] + 0.1
    ys, states, _ = evaluate(spec, data.xs, data.params, data.states, lengths)
    moved = [not np.allclose(ys[n], want_ys[n]) for n in ys] + \
        [not np.allclose(states[n], want_states[n]) for n in states]
    assert any(moved)


class _Perturbed:
    """A fake compiled function: the NumPy backend with ``delta`` added to every output when
    ``trigger(cell)`` holds. It tests the shrinker, not rnnc."""

    def __init__(self, cell: rnnc.Cell, delta: float, trigger, precision: str = "fp32") -> None:
        self.fn = rnnc.compile(cell, backend="numpy", precision=precision)
        self.precision = precision
        self.delta = delta if trigger(cell) else 0.0

    def _shift(self, ys: dict) -> dict:
        return {n: v + self.delta for n, v in ys.items()}

    def __call__(self, *args, **kwargs):
        ys, states = self.fn(*args, **kwargs)
        return self._shift(ys), states

    def forward(self, *args, **kwargs):
        ys, states, tape = self.fn.forward(*args, **kwargs)
        return self._shift(ys), states, tape

    def backward(self, *args, **kwargs):
        return self.fn.backward(*args, **kwargs)


def _has_op(cell: rnnc.Cell, name: str) -> bool:
    return any(node.op.name == name for node in cell.program().scan.body.nodes())


def test_shrinker_reduces_an_injected_output_error_to_a_tiny_cell() -> None:
    target = Target("perturbed", lambda cell, **o: _Perturbed(cell, 0.1, lambda c: True, **o))
    seed = next(s for s in range(50) if generate(s).size() >= 30)
    c_spec = generate(seed)
    found = check(c_spec, 4, 3, seed, target)
    assert found and all(m.quantity.split()[1].startswith("y[") for m in found)
    small, T, B = shrink(c_spec, 4, 3, predicate(target, found[0], seed))
    # One input, one state kept or updated by a leaf, one output: nothing else is needed.
    assert small.size() <= 6, source(small)
    assert len(small.outputs) == 1 and len(small.states) == 1 and (T, B) == (1, 1)
    assert predicate(target, found[0], seed)(small, T, B)


def test_shrinker_keeps_the_construct_that_triggers_the_error() -> None:
    """A fake miscompilation of ``where`` only: the shrunk cell is small and has a where."""
    target = Target("where-bug", lambda cell, **o: _Perturbed(
        cell, 0.1, lambda c: _has_op(c, "where"), **o))
    seed = next(s for s in range(100) if "where" in patterns(generate(s))
                and generate(s).size() >= 25)
    found = check(generate(seed), 4, 3, seed, target)
    assert found
    text = report(generate(seed), 4, 3, seed, target, found)
    small_source = text.split("Minimal reproducer", 1)[1]
    assert "rnnc.where(" in small_source
    assert "replay(make_cell(), 'where-bug'" in small_source
    small, _, _ = shrink(generate(seed), 4, 3, predicate(target, found[0], seed))
    assert small.size() <= 10, source(small)
    assert _has_op(build(small), "where")


def test_campaign_reports_a_failure_with_a_reproducer() -> None:
    target = Target("perturbed", lambda cell, **o: _Perturbed(cell, 0.1, lambda c: True, **o))
    reports, stats = fuzz([3, 4], target, lambda k: (("float64", False),), shrink_budget_s=60)
    assert len(reports) == 2 and stats.cells == 2
    assert all("def make_cell():" in r and "max error 0.1" in r for r in reports)


def test_bundled_failure_is_traced_to_its_cell() -> None:
    """In a bundle, only cells with a where are 'miscompiled': the report names one of them."""
    target = Target("where-bug", lambda cell, **o: _Perturbed(
        cell, 0.1, lambda c: _has_op(c, "where"), **o))
    seeds = [s for s in range(40) if "where" not in patterns(generate(s))][:3]
    seeds.append(next(s for s in range(40, 100) if "where" in patterns(generate(s))))
    reports, stats = fuzz(seeds, target, lambda k: (("float64", True),), bundle_size=4,
                          shrink_budget_s=60)
    assert len(reports) == 1 and stats.cells == 4
    assert f"fuzz seed {seeds[-1]}" in reports[0] and "rnnc.where(" in reports[0]
