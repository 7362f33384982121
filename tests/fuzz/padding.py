"""NaN and Inf in the padding: what an input holds past a sequence's length reaches no result.

PyTorch's packed sequences never read the padding, and rnnc must not either: with lengths, a
cell's inputs at steps t >= length hold NaN, +Inf or -Inf (by seed), and every output, final
state and gradient must be finite and equal the oracle's on the same data zero-padded, within
the fuzzer's tolerances (tests/fuzz/differential.py). The oracle on the NaN-padded data is
compared too (the unoptimized program is no exception), and the input gradients past the
lengths must be exactly zero.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tests.fuzz.differential import (
    Data,
    Mismatch,
    Stats,
    Target,
    case,
    compare,
    expected,
    make_data,
    oracle,
    run_pipelines,
)
from tests.fuzz.spec import build, bundle

FILLS = (np.nan, np.inf, -np.inf)
ORACLE = Target("oracle", oracle)


def padded(data: Data, fill: float) -> Data:
    """``data`` with every input's steps past each sequence's length set to ``fill``."""
    past = np.arange(next(iter(data.xs.values())).shape[0])[:, None] >= data.lengths[None, :]
    xs = {n: np.where(past[:, :, None], fill, x) for n, x in data.xs.items()}
    return replace(data, xs=xs)


def _grad_x_past_lengths(fn, data: Data, dtype: str, target: str) -> list[Mismatch]:
    """A mismatch for each input whose gradient past the lengths is not exactly zero."""
    got = run_pipelines(fn, data, dtype, True, ("backward",))
    past = np.arange(next(iter(data.xs.values())).shape[0])[:, None] >= data.lengths[None, :]
    found = []
    for name, g in got.items():
        if name.startswith("backward g.x") and np.any(np.asarray(g)[past] != 0):
            found.append(Mismatch(target, dtype, True, f"{name} past the lengths is not zero",
                                  np.inf, 0.0))
    return found


def check_padding(seeds: list[int], target: Target, dtype: str, stats: Stats
                  ) -> list[Mismatch]:
    """Run the fuzz cells of ``seeds`` (side by side as one bundle cell when several) with
    NaN/Inf padding on ``target`` in ``dtype`` and on the oracle; compare both with the
    oracle on zero padding."""
    cases = [case(s) for s in seeds]
    first = cases[0]
    spec = first.spec if len(cases) == 1 else bundle([c.spec for c in cases])
    cell = build(spec)
    data = make_data(cell, first.T, first.B, first.seed)
    bad = padded(data, FILLS[first.seed % len(FILLS)])
    want = expected(cell, spec, padded(data, 0.0), True)
    if want.problems:
        return want.problems
    found = compare(ORACLE, oracle(cell), bad, want, "float64", True, stats)
    try:
        fn = target.compile(cell)
    except Exception as err:
        return found + [Mismatch(target.name, "-", True,
                                 f"compile raised {type(err).__name__}: {err}", np.inf, 0.0)]
    found += compare(target, fn, bad, want, dtype, True, stats)
    if not found:
        found += _grad_x_past_lengths(fn, bad, dtype, target.name)
    return found


def fuzz_padding(seeds, target: Target, bundle_size: int = 1,
                 dtypes: tuple[str, ...] = ("float64", "float32")) -> tuple[list[str], Stats]:
    """:func:`check_padding` over ``seeds`` in bundles of ``bundle_size``, each in the next
    of ``dtypes`` in turn; one report line per failing bundle (its seeds, dtype and fill)."""
    stats, reports = Stats(), []
    seeds = list(seeds)
    for k, start in enumerate(range(0, len(seeds), bundle_size)):
        group, dtype = seeds[start:start + bundle_size], dtypes[k % len(dtypes)]
        found = check_padding(group, target, dtype, stats)
        stats.cells += len(group)
        if found:
            fill = FILLS[group[0] % len(FILLS)]
            reports.append(f"fuzz seeds {group} ({dtype}, padding {fill}, as one bundle cell "
                           f"when several): " + "; ".join(m.describe() for m in found[:4]))
    return reports, stats
