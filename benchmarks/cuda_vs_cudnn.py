"""Time rnnc's CUDA backend against cuDNN (PyTorch nn.LSTM/nn.GRU on the GPU), in one run.

``python benchmarks/cuda_vs_cudnn.py [--configs C1,C2,C3,C4] [--cells lstm,gru] [--graph]``

Configurations C1-C4 of docs/benchmarks.md, float32, inference and training (forward + backward of
sum(y)); medians (min-max) of ``--reps`` timed calls after ``--warmup`` calls, and the ratio
rnnc / cuDNN (lower is better). rnnc is timed through its public API, which takes and returns
NumPy arrays, so its times include copying inputs to the device and results back; cuDNN gets
device tensors. rnnc runs through ``rnnc.RNN`` in every configuration (C4, stacked and
bidirectional, too), as in ``rnnc bench``. Needs CuPy, PyTorch with CUDA and a GPU; otherwise it
exits with a message saying what is missing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rnnc.tools import bench
from rnnc.tools.bench.peers import torch_module


def gpu_missing() -> str | None:
    """What this benchmark lacks here, or None when it can run."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device (a CPU-only build, or no GPU)"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "CuPy sees no CUDA device"
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x)"
    return None


def cudnn_call(spec: bench.CellSpec, config: bench.Config, grid: list, mode: str
               ) -> Callable[[Any], Any]:
    """nn.LSTM / nn.GRU on the GPU with rnnc's weights (PyTorch's gate order and layout)."""
    import torch

    module = torch_module(spec, config, grid).cuda()

    def infer(x):
        with torch.no_grad():
            y = module(x)[0]
        torch.cuda.synchronize()
        return y

    def train(x):
        module.zero_grad(set_to_none=True)
        x = x.detach().requires_grad_(True)
        y = module(x)[0]
        y.sum().backward()
        torch.cuda.synchronize()
        return y

    return infer if mode == "inference" else train


def timed(call: Callable[[], Any], reps: int, warmup: int) -> tuple[float, float, float]:
    """Median, min and max milliseconds of ``reps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times), max(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="C1,C2,C3,C4")
    parser.add_argument("--cells", default="lstm,gru")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--graph", action="store_true",
                        help="replay the time loop as a CUDA graph (CudaBackend(graph=True))")
    args = parser.parse_args(argv)
    missing = gpu_missing()
    if missing:
        print(f"cuda_vs_cudnn: needs an NVIDIA GPU with CuPy and PyTorch (CUDA): {missing}.",
              file=sys.stderr)
        return 2
    import torch

    if args.reps < 5:
        parser.error("--reps must be at least 5 (medians of at least five runs)")
    options = {"graph": True} if args.graph else {}
    rows = [("config", "cell", "mode", "rnnc ms (min-max)", "cuDNN ms (min-max)", "ratio")]
    for config_name in args.configs.split(","):
        config = bench.CONFIGS[config_name]
        for cell in args.cells.split(","):
            spec = bench.CELLS[cell]
            grid = bench.layer_params(spec, config)
            x = np.random.default_rng(0).standard_normal(
                (config.T, config.B, config.I)).astype(np.float32)
            x_gpu = torch.from_numpy(x).cuda()
            for mode in args.modes.split(","):
                rnnc_fn, _ = bench.rnnc_call(spec, config, grid, mode, "cuda", options)
                peer = cudnn_call(spec, config, grid, mode)
                ours = timed(lambda f=rnnc_fn, x=x: f(x), args.reps, args.warmup)
                theirs = timed(lambda f=peer, x=x_gpu: f(x), args.reps, args.warmup)
                rows.append((config_name, cell, mode,
                             f"{ours[0]:.2f} ({ours[1]:.2f}-{ours[2]:.2f})",
                             f"{theirs[0]:.2f} ({theirs[1]:.2f}-{theirs[2]:.2f})",
                             f"{ours[0] / theirs[0]:.2f}"))
                print(" | ".join(rows[-1]), flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
