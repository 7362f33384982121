"""Differential fuzzing of ``rnnc.torch.RNN`` under ``torch.compile``, masks in the cell.

Each fuzz cell, with zoneout on its states and variational dropout on its first input, runs
as a layer (one or two directions, extra inputs) compiled with ``aot_eager`` and eagerly, and
its outputs, final states and the gradients of every input, initial state and parameter are
compared with the unoptimized program run with the seed torch's generator dictates
(tests/fuzz/torch_compile.py). Default run: three cells (one bidirectional with extra inputs,
one in one direction, one without parameters), a few seconds. ``pytest -m slow``: 1,000 more
cells on ``aot_eager`` in 10 chunks of 100 (2 to 3 minutes each on one core), and 6 on
``inductor`` (about a minute each, most of it inductor's own compile), which draws the seed
with torch's generator when ``fallback_random`` is on, as here.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from tests.fuzz import torch_compile as fz  # noqa: E402 - needs torch

DEFAULT_SEEDS = (2, 4, 17)
SLOW_SEEDS = range(300, 1300)
SLOW_CHUNKS = 10


def _run(seeds, backend: str = "aot_eager") -> None:
    stats, reports = fz.Stats(), []
    for seed in seeds:
        found = fz.check(seed, backend, stats)
        if found:
            reports.append(fz.report(seed, found))
    print(f"torch.compile {backend}: {stats.cells} cells, {stats.comparisons} arrays compared, "
          f"worst error {stats.worst:.2g}, masks changed the result in {stats.masks_mattered}")
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)
    # Not vacuous: every cell compared its outputs and gradients on both paths, and in
    # nearly every cell the masks changed the result (zoneout on a state the output reads).
    assert stats.cells == len(seeds)
    assert stats.comparisons >= 2 * 4 * stats.cells
    assert stats.masks_mattered >= 0.8 * stats.cells


def test_torch_compile_matches_oracle() -> None:
    _run(DEFAULT_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(SLOW_CHUNKS))
def test_slow_torch_compile_matches_oracle(chunk: int) -> None:
    size = len(SLOW_SEEDS) // SLOW_CHUNKS
    _run(SLOW_SEEDS[chunk * size:(chunk + 1) * size])


@pytest.mark.slow
def test_slow_torch_compile_inductor_matches_oracle() -> None:
    from torch._inductor import config

    with config.patch(fallback_random=True):
        _run(range(1300, 1306), "inductor")
