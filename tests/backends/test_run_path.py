"""Nothing walks the IR while a compiled function runs: schedules are built at compile time.

A call is profiled and every function entered inside networkx (the IR's graph store) is
counted: no run path enters any. Every backend walks the schedule of
:mod:`rnnc.backends.steps`, and the CUDA host plans the loop's buffers when it is built.
"""

from __future__ import annotations

import cProfile
import pstats

import numpy as np
import pytest

import rnnc


def _networkx_calls(fn: rnnc.Function, T: int) -> int:
    cell = fn.cell
    p = cell.init_params(seed=0)
    x = np.random.default_rng(0).standard_normal((T, 2, 3)).astype(np.float32)
    fn(x, p, lengths=np.full(2, T))  # compile and warm up outside the profile
    _, _, tape = fn.forward(x, p)
    fn.backward(tape, d_outputs={"y": np.ones((T, 2, 4), np.float32)})
    profile = cProfile.Profile()
    profile.enable()
    fn(x, p, lengths=np.full(2, T))
    _, _, tape = fn.forward(x, p)
    fn.backward(tape, d_outputs={"y": np.ones((T, 2, 4), np.float32)})
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(calls for (path, _, _), (calls, *_) in stats.items() if "networkx" in path)


@pytest.mark.parametrize("backend", [{"backend": "numpy"}, {"backend": "llvm"},
                                     {"backend": "numpy", "optimize": False},
                                     {"backend": "cuda", "emulate": True},
                                     {"backend": "cuda", "emulate": True, "graph": True}],
                         ids=["numpy", "llvm", "oracle", "cuda", "cuda-graph"])
def test_run_path_never_touches_the_graph(backend: dict) -> None:
    fn = rnnc.compile(rnnc.cells.lstm(3, 4), **backend)
    assert _networkx_calls(fn, T=5) == 0
