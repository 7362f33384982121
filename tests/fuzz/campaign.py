"""Run the fuzzer over a range of seeds for one target; collect reports and statistics.

Each seed's cell is checked on its own, or, for targets whose compile cost is per program
rather than per node (the CUDA emulation runs g++ once per program), several cells are compiled
side by side as one bundle cell. A mismatch in a bundle is traced back to the cell whose
output, state or gradient it names, which is then checked, shrunk and reported on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from tests.fuzz.differential import Case, Mismatch, Stats, Target, case, check
from tests.fuzz.shrink import report
from tests.fuzz.spec import bundle

Combos = Callable[[int], tuple[tuple[str, bool], ...]]


def _owner(m: Mismatch) -> int | None:
    """The index of the bundled cell a mismatch names (``y[c3_y0]`` -> 3), if any."""
    found = re.search(r"\[c(\d+)_", m.quantity)
    return int(found.group(1)) if found else None


def _bundle_report(cases: list[Case], target: Target, found: list[Mismatch],
                   combos: tuple[tuple[str, bool], ...], shrink_budget_s: float) -> str:
    """Find the bundled cell that fails alone and report it; else report the whole bundle."""
    owners = [o for o in dict.fromkeys(_owner(m) for m in found) if o is not None]
    for i in owners + [i for i in range(len(cases)) if i not in owners]:
        c = cases[i]
        alone = check(c.spec, c.T, c.B, c.seed, target, combos)
        if alone:
            return report(c.spec, c.T, c.B, c.seed, target, alone, shrink_budget_s)
    first = cases[0]
    spec = bundle([c.spec for c in cases])
    return (f"(seeds {[c.seed for c in cases]} compiled as one bundle; no cell fails alone)\n"
            + report(spec, first.T, first.B, first.seed, target, found, shrink_budget_s))


def fuzz(seeds: Sequence[int], target: Target, combos: Combos, bundle_size: int = 1,
         shrink_budget_s: float = 300.0, max_shrunk: int = 3) -> tuple[list[str], Stats]:
    """Check the cells of ``seeds`` on ``target`` in the combinations ``combos(k)`` (``k``
    counts cells, or bundles); return what was compared and one report per failure: the
    first ``max_shrunk`` failures shrunk to a reproducer, the others in one line each."""
    stats, reports = Stats(), []
    groups = [list(seeds[i:i + bundle_size]) for i in range(0, len(seeds), bundle_size)]
    for k, group in enumerate(groups):
        cases = [case(s) for s in group]
        first = cases[0]
        spec = first.spec if len(cases) == 1 else bundle([c.spec for c in cases])
        found = check(spec, first.T, first.B, first.seed, target, combos(k), stats)
        stats.cells += len(cases)
        if not found:
            continue
        if len(reports) >= max_shrunk:
            reports.append(f"{target.name} disagrees with the oracle on fuzz seeds {group}: "
                           f"{found[0].describe()} (not shrunk: {max_shrunk} already were)")
        elif len(cases) == 1:
            reports.append(report(first.spec, first.T, first.B, first.seed, target, found,
                                  shrink_budget_s))
        else:
            reports.append(_bundle_report(cases, target, found, combos(k), shrink_budget_s))
    return reports, stats
