"""How ``rnnc bench`` times rnnc and a peer: the contestants, warm-up and timed blocks, one row.

rnnc runs through its public layer, ``rnnc.RNN``, with the same weights the peers get. The
first call of each function (compilation, tracing, oneDNN primitive creation) is timed on its
own and kept to report compilation; then warm-up calls until the times settle; then the timed
repetitions, in one block per contestant.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import rnnc
from rnnc import process
from rnnc.tools.bench.configs import CELLS, CellSpec, Config, gemm_flop, layer_params
from rnnc.tools.bench.peers import jax_call, torch_builtin_call, torch_eager_call


def rnnc_call(spec: CellSpec, config: Config, grid: list, mode: str, backend: str,
              options: dict) -> tuple[Callable[[np.ndarray], Any], str]:
    """A callable ``x -> y`` timing ``rnnc.RNN`` with the weights ``grid``, and its label."""
    if spec.state_shapes is not None:
        return _compiled_call(spec, config, grid, mode, backend, options)
    layer = rnnc.RNN(spec.mode, config.I, config.H, num_layers=config.layers,
                     bidirectional=config.directions == 2, backend=backend, **options)
    if mode == "inference":
        return (lambda x: layer.forward(x, params=grid, train=False)[0]), "rnnc.RNN"

    def train(x: np.ndarray) -> np.ndarray:
        y, _, tape = layer.forward(x, params=grid)
        layer.backward(tape, d_y=np.ones_like(y))
        return y
    return train, "rnnc.RNN"


def _compiled_call(spec: CellSpec, config: Config, grid: list, mode: str, backend: str,
                   options: dict) -> tuple[Callable[[np.ndarray], Any], str]:
    """A one-layer cell with feature shapes through ``rnnc.compile`` (layers stack (B, n)
    states), the backend's default form (on LLVM the SSM keeps its loop, which measured faster
    than its parallel scan: benchmarks/selective_ssm_forms.py)."""
    cell = spec.factory(config.I, config.H)
    fn = rnnc.compile(cell, backend=backend)
    params = grid[0][0]
    if mode == "inference":
        return (lambda x: fn(x, params)[0]["y"]), "rnnc.compile"

    def train(x: np.ndarray) -> np.ndarray:
        ys, _, tape = fn.forward(x, params)
        fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})
        return ys["y"]
    return train, "rnnc.compile"


def _as_numpy(y: Any) -> np.ndarray:
    if hasattr(y, "detach"):
        y = y.detach().numpy()
    return np.asarray(y)


@dataclass
class Timing:
    """Seconds of the first call (compilation included) and of the timed repetitions."""

    first: float
    times: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.times)

    @property
    def min_ms(self) -> float:
        return 1e3 * min(self.times)

    @property
    def max_ms(self) -> float:
        return 1e3 * max(self.times)


# What a timing measures: elapsed time, or the CPU time of the whole process (every thread,
# spinning ones too). CPU time is the honest figure at one thread on a machine shared with
# other processes, where the wall time is mostly their time slices.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def _settle(call: Callable[[], Any], least: int, most: int = 30,
            clock: Callable[[], float] = time.perf_counter) -> None:
    """Call at least ``least`` times, then until a call is within 1.5x of the fastest seen.

    nn.LSTM's first few calls on a new shape can take hundreds of times longer than the rest
    (oneDNN builds its primitives); a fixed warm-up count would time those.
    """
    best = math.inf
    for n in range(most):
        start = clock()
        call()
        elapsed = clock() - start
        if n >= max(least - 1, 1) and elapsed <= 1.5 * best:
            return
        best = min(best, elapsed)


def timed(calls: dict[str, Callable[[], Any]], reps: int, warmup: int, clock: str = "wall"
          ) -> tuple[dict[str, Timing], dict[str, Any]]:
    """Time each call ``reps`` times in a block, right after its ``warmup`` untimed calls, on
    ``clock`` (a key of :data:`CLOCKS`).

    Blocks, not round-robin: OpenMP (PyTorch) and OpenBLAS threads spin for a while after
    their work, and alternating libraries call by call makes each pay for the other's
    spinning threads on a small machine. Returns the timings and each call's first result
    (for checking the answers agree).
    """
    now = CLOCKS[clock]
    timings, firsts = {}, {}
    for name, call in calls.items():
        start = now()
        firsts[name] = call()
        timings[name] = Timing(now() - start)
        _settle(call, warmup - 1, clock=now)
        for _ in range(reps):
            start = now()
            call()
            timings[name].times.append(now() - start)
    return timings, firsts


def bench_one(config: Config, cell: str, mode: str, peers: list[str], args: argparse.Namespace,
              options: dict) -> list[dict[str, Any]]:
    """Rows of one configuration, cell and mode: rnnc against every applicable peer."""
    spec = CELLS[cell]
    grid = layer_params(spec, config)
    x = np.random.default_rng(7).standard_normal((config.T, config.B, config.I)).astype(
        np.float32)
    run_rnnc, how = rnnc_call(spec, config, grid, mode, args.backend, options)
    calls: dict[str, Callable[[], Any]] = {"rnnc": lambda: run_rnnc(x)}
    labels = {"rnnc": how}
    for peer in peers:
        if peer == "torch" and spec.torch_module is None:
            continue
        if peer == "jax":
            import jax.numpy as jnp

            fn, labels[peer] = jax_call(spec, config, grid, mode)
            xj = jnp.asarray(x)
            calls[peer] = lambda fn=fn, xj=xj: fn(xj)
        else:
            import torch

            if peer == "torch":
                fn, labels[peer] = torch_builtin_call(spec, config, grid, mode)
            else:
                fn, labels[peer] = torch_eager_call(spec, config, grid, mode,
                                                    compiled=peer == "compile")
            xt = torch.from_numpy(x)
            calls[peer] = lambda fn=fn, xt=xt: fn(xt)
    timings, firsts = timed(calls, args.reps, args.warmup, getattr(args, "clock", "wall"))
    return rows_of(config, cell, mode, timings, firsts, labels, "fp32")


def rows_of(config: Config, cell: str, mode: str, timings: dict[str, Timing],
            firsts: dict[str, Any], labels: dict[str, str], precision: str
            ) -> list[dict[str, Any]]:
    """One row per peer of ``timings``: both sides' times, the ratio, GFLOP/s of the GEMMs
    (:func:`~.configs.gemm_flop`) and how far the first outputs are apart."""
    ours = timings["rnnc"]
    y = _as_numpy(firsts["rnnc"])
    flop = gemm_flop(CELLS[cell], config, mode)
    rows = []
    for peer in timings:
        if peer == "rnnc":
            continue
        theirs = timings[peer]
        diff = float(np.max(np.abs(y - _as_numpy(firsts[peer]))))
        rows.append({
            "config": config.name, "cell": cell, "mode": mode, "peer": peer,
            "peer_impl": labels[peer], "rnnc_impl": labels["rnnc"],
            "rnnc_ms": ours.median_ms, "rnnc_min_ms": ours.min_ms, "rnnc_max_ms": ours.max_ms,
            "peer_ms": theirs.median_ms, "peer_min_ms": theirs.min_ms,
            "peer_max_ms": theirs.max_ms, "ratio": ours.median_ms / theirs.median_ms,
            "rnnc_first_ms": 1e3 * ours.first, "peer_first_ms": 1e3 * theirs.first,
            "max_abs_diff": diff, "reps": len(ours.times), "precision": precision,
            "rnnc_gflops": flop / (ours.median_ms * 1e6),
            "peer_gflops": flop / (theirs.median_ms * 1e6),
        })
    return rows


_COMPILE_SCRIPT = r"""
import json, sys, time
import numpy as np
import rnnc
backend, options, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
x = np.random.default_rng(0).standard_normal((2, 1, size)).astype(np.float32)

def compile_and_run():
    cell = rnnc.cells.lstm(size, size)
    params = cell.init_params()
    start = time.perf_counter()
    fn = rnnc.compile(cell, backend=backend, **options)
    ys, _, tape = fn.forward(x, params)
    fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})
    first = time.perf_counter() - start
    start = time.perf_counter()
    ys, _, tape = fn.forward(x, params)
    fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})
    # What remains after taking away one warm run is compilation.
    return first - (time.perf_counter() - start)

print(json.dumps([compile_and_run(), compile_and_run()]))
"""


def compile_times(backend: str, options: dict, size: int) -> dict[str, float]:
    """Seconds to compile LSTM forward + backward: cold, cached in memory, cached on disk.

    Each measurement runs in a fresh process (imports excluded) whose home and cache
    directories point at a new temporary folder, so the first is cold; a second function
    in the same process hits the in-memory cache; a second process hits the disk cache.
    """
    with tempfile.TemporaryDirectory(prefix="rnnc-bench-") as tmp:
        env = process.child_environment(HOME=tmp, XDG_CACHE_HOME=tmp, RNNC_CACHE_DIR=tmp)
        argv = [sys.executable, "-c", _COMPILE_SCRIPT, backend, json.dumps(options), str(size)]
        results = []
        for _ in range(2):
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"compile-time measurement failed:\n{done.stderr[-2000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"cold_s": results[0][0], "memory_cached_s": results[0][1],
            "disk_cached_s": results[1][0]}
