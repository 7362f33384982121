"""Second-order differential fuzzing: double backward against central differences.

``fn.double_backward`` is the derivative of ``fn.backward``: given random cotangents ``u`` of
the gradients ``G`` (of x, parameters and initial states) that backward returns, it returns
the gradient of ``<u, G>`` with respect to backward's arguments (x, parameters, initial
states, output and final-state cotangents). For a random direction ``v`` in each of those five
groups alone, that gradient dotted with ``v`` must equal the central difference
``(<u, G(z + eps v)> - <u, G(z - eps v)>) / (2 eps)`` of the same function's first-order
gradient (:func:`tests.numeric.directional_second_order`). The first-order gradient is itself
compared with the oracle by the first-order fuzzer, on the same cells.

Float64 only, with ``eps = 1e-6``: the difference's truncation error (``eps**2`` times a third
derivative) and rounding error (``1e-16 / eps`` relative) stay near 1e-10 on these bounded cells
(the largest seen over thousands of cells is about 1e-8 relative), so ``TOLERANCE = 1e-6``
relative to ``max(1, |central difference|)`` leaves two orders of magnitude, while a dropped or
doubled term of a second derivative moves the result by far more. A cell whose run comes
within ``MARGIN`` of a ``where``/``relu`` switch is not compared: a perturbation of ``eps``
may cross it, and the difference then measures the jump, not the derivative.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import rnnc
from tests.fuzz.differential import TARGETS, Mismatch, Stats, Target, case, make_data
from tests.fuzz.reference import evaluate
from tests.fuzz.shrink import shrink
from tests.fuzz.spec import CellSpec, build, bundle, prune, source
from tests.numeric import directional_second_order

TOLERANCE = 1e-6
MARGIN = 1e-3
EPS = 1e-6


def check_second_order(cell: rnnc.Cell, T: int, B: int, seed: int, target: Target,
                       masked: bool, stats: Stats | None = None, spec: CellSpec | None = None
                       ) -> list[Mismatch]:
    """Compile ``cell`` for ``target`` and compare its double backward with central
    differences of its gradient, in float64, with or without lengths; skip it where the
    reference evaluation of ``spec`` (when given) comes near a where/relu switch."""
    stats = stats if stats is not None else Stats()
    data = make_data(cell, T, B, seed)
    lengths = data.lengths if masked else None
    if spec is not None:
        margins = evaluate(spec, data.xs, data.params, data.states, lengths)[2]
        if min(margins.values(), default=np.inf) < MARGIN:
            stats.skipped_float32 += 1  # counted with the near ties first order skips
            return []
    try:
        fn = target.compile(cell)
        z = {"x": data.xs, "params": data.params, "states": data.states,
             "d_outputs": data.d_outputs, "d_states": data.d_states}
        found = directional_second_order(fn, z, lengths, seed, EPS)
    except Exception as err:
        return [Mismatch(target.name, "float64", masked,
                         f"second-order raised {type(err).__name__}: {err}", np.inf, TOLERANCE)]
    stats.runs += 1
    problems = []
    for group, got, want in found:
        error = abs(got - want) / max(1.0, abs(want))
        stats.comparisons += 1
        stats.worst["float64"] = max(stats.worst["float64"], error)
        if not error <= TOLERANCE:
            problems.append(Mismatch(
                target.name, "float64", masked, f"second-order cotangent of {group} along a "
                f"random direction: double backward {got:.10g}, central difference {want:.10g}",
                error, TOLERANCE))
    return problems


def replay_second_order(cell: rnnc.Cell, target: str, T: int, B: int, seed: int,
                        masked: bool) -> list[Mismatch]:
    """Rerun one printed reproducer; print and return its mismatches."""
    found = check_second_order(cell, T, B, seed, TARGETS[target], masked)
    for m in found:
        print(m.describe())
    return found


def _check(spec: CellSpec, T: int, B: int, seed: int, target: Target, masked: bool,
           stats: Stats | None = None) -> list[Mismatch]:
    return check_second_order(build(spec), T, B, seed, target, masked, stats, spec)


def _kind(m: Mismatch) -> str:
    return m.quantity.split(":")[0] if "raised" in m.quantity else \
        m.quantity.split(" along")[0]


def _report(spec: CellSpec, T: int, B: int, seed: int, target: Target, found: list[Mismatch],
            budget_s: float) -> str:
    """Shrink ``spec`` for the first of ``found`` and print a reproducer."""
    first = found[0]

    def fails(candidate: CellSpec, t: int, b: int) -> bool:
        try:
            build(candidate)
        except Exception:  # the DSL refuses it: not a cell
            return False
        again = _check(candidate, t, b, seed, target, first.masked)
        return any(_kind(m) == _kind(first) for m in again)

    small, t, b = shrink(spec, T, B, fails, budget_s) if fails(spec, T, B) else \
        (prune(spec), T, B)
    lines = [f"{target.name}: double backward disagrees with central differences on fuzz seed "
             f"{seed}:"] + ["  " + m.describe() for m in found[:5]]
    lines += ["Minimal reproducer (from the repository root):", "", source(small), "",
              "from tests.fuzz.second_order import replay_second_order", "",
              f"replay_second_order(make_cell(), {target.name!r}, T={t}, B={b}, seed={seed}, "
              f"masked={first.masked})"]
    return "\n".join(lines)


def fuzz_second_order(seeds: Sequence[int], target: Target, masked: Callable[[int], bool],
                      bundle_size: int = 1, shrink_budget_s: float = 120.0,
                      max_shrunk: int = 2) -> tuple[list[str], Stats]:
    """Check the cells of ``seeds`` on ``target``, with lengths where ``masked(k)`` (``k``
    counts cells, or bundles of ``bundle_size`` compiled as one); return one report per
    failure (a bundle's failure is traced to the cell that fails alone) and what was
    compared."""
    stats, reports = Stats(), []
    groups = [list(seeds[i:i + bundle_size]) for i in range(0, len(seeds), bundle_size)]
    for k, group in enumerate(groups):
        cases = [case(s) for s in group]
        first = cases[0]
        spec = first.spec if len(cases) == 1 else bundle([c.spec for c in cases])
        found = _check(spec, first.T, first.B, first.seed, target, masked(k), stats)
        stats.cells += len(cases)
        if not found:
            continue
        culprit = next((c for c in cases if _check(c.spec, c.T, c.B, c.seed, target,
                                                   masked(k))), None) if len(cases) > 1 else first
        if len(reports) >= max_shrunk or culprit is None:
            reports.append(f"{target.name} second order on fuzz seeds {group}: "
                           f"{found[0].describe()} (not shrunk)")
        else:
            alone = _check(culprit.spec, culprit.T, culprit.B, culprit.seed, target, masked(k))
            reports.append(_report(culprit.spec, culprit.T, culprit.B, culprit.seed, target,
                                   alone or found, shrink_budget_s))
    return reports, stats
