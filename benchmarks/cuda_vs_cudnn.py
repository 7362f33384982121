"""Time rnnc's CUDA backend against cuDNN, jax.lax.scan and a PyTorch eager loop on one GPU.

``python benchmarks/cuda_vs_cudnn.py [--configs C1,C2,C3,C4] [--cells lstm,gru,ln_lstm,...]
[--modes inference,training] [--no-graph] [--precision tf32|bf16]``

Configurations C1-C4 of docs/benchmarks.md, float32, inference and training (forward + backward
of sum(y)); medians (min-max) of ``--reps`` timed calls after ``--warmup`` calls, each ended by
a device synchronization, and ratios of rnnc to each peer (lower is better). Every contestant
gets device-resident data:

- ``rnnc device``: ``rnnc.compile(cell, backend="cuda")`` called on CuPy arrays, parameters as
  one flat device buffer (docs/device-calls.md): nothing crosses PCIe. One layer, one direction
  (C1-C3); C4 (stacked, bidirectional) has no such row until ``rnnc.RNN`` runs device calls.
- ``rnnc numpy``: ``rnnc.RNN`` through its NumPy API, copies in and out included (a separate row,
  every configuration);
- ``cudnn``: ``nn.LSTM`` / ``nn.GRU`` on CUDA tensors (LSTM and GRU only);
- ``jax``: ``jax.lax.scan`` under ``jax.jit`` on JAX's GPU (where JAX has one);
- ``eager``: a Python loop of the same cell in PyTorch on CUDA tensors.

``--precision bf16`` compiles rnnc with ``precision="bf16"`` and runs cuDNN and the eager loop
under ``torch.autocast(dtype=torch.bfloat16)``, the same semantics (docs/precision.md); JAX has
no such switch and is left out.

Needs CuPy, PyTorch with CUDA and a GPU, and exits saying what is missing. ``--emulate --size
tiny`` runs the same code on the CPU instead (rnnc in emulation, peers on the CPU) as a smoke
test of this script; its times mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import rnnc
from rnnc.tools import bench
from rnnc.tools.bench.peers import jax_call, torch_eager_call, torch_module

# JAX takes 75 % of the GPU's memory on first use unless told not to: CuPy and PyTorch share it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


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
        return "CuPy is not installed (pip install 'rnnc[cuda]')"
    return None


class Place:
    """Where the contestants run: a GPU (CuPy, torch 'cuda'), or the CPU with rnnc emulated."""

    def __init__(self, emulate: bool) -> None:
        import torch

        self.emulate, self.torch = emulate, torch
        self.torch_device = "cpu" if emulate else "cuda"

    def device_array(self, a: np.ndarray) -> Any:
        """``a`` as a device array for an rnnc device call."""
        if self.emulate:
            from rnnc.backends.cuda.device import EmulatedArray

            return np.array(a).view(EmulatedArray)
        import cupy

        return cupy.asarray(a)

    def sync(self) -> None:
        """Wait for every contestant's queued work."""
        if not self.emulate:
            import cupy

            cupy.cuda.get_current_stream().synchronize()
            self.torch.cuda.synchronize()


def rnnc_device_call(spec: bench.CellSpec, config: bench.Config, grid: list, mode: str,
                     place: Place, options: dict) -> Callable[[Any], Any] | None:
    """``x -> y`` of one compiled cell on device arrays, or None for stacked configurations;
    the compiled function is the call's ``function`` (its launch report, its tuning)."""
    if config.layers != 1 or config.directions != 1:
        return None
    fn = rnnc.compile(spec.factory(config.I, config.H), backend="cuda", emulate=place.emulate,
                      **options)
    flat = place.device_array(fn.pack(grid[0][0]))
    ones = place.device_array(np.ones((config.T, config.B, config.H), np.float32))
    def infer(x: Any) -> Any:
        return fn(x, flat)[0]

    def train(x: Any) -> Any:
        ys, _, tape = fn.forward(x, flat)
        fn.backward(tape, {name: ones for name in ys})
        return ys
    call = infer if mode == "inference" else train
    call.function = fn
    return call


def cudnn_call(spec: bench.CellSpec, config: bench.Config, grid: list, mode: str,
               place: Place) -> Callable[[Any], Any]:
    """nn.LSTM / nn.GRU with rnnc's weights (PyTorch's gate order and layout)."""
    torch = place.torch
    module = torch_module(spec, config, grid).to(place.torch_device)

    def infer(x):
        with torch.no_grad():
            return module(x)[0]

    def train(x):
        module.zero_grad(set_to_none=True)
        y = module(x.detach().requires_grad_(True))[0]
        y.sum().backward()
        return y

    return infer if mode == "inference" else train


def timed(call: Callable[[], Any], sync: Callable[[], None], reps: int, warmup: int
          ) -> tuple[float, float, float]:
    """Median, min and max milliseconds of ``reps`` synchronized calls after ``warmup``."""
    for _ in range(warmup):
        call()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times), max(times)


def ratio_rows(label: dict[str, Any], times: dict[str, tuple[float, float, float]],
               ours: str = "rnnc device") -> list[dict[str, Any]]:
    """One row per contestant of ``times`` (median, min, max ms), with ``label`` and the ratio
    of ``ours``'s median to its (None for ``ours`` itself, or when ``ours`` has no time)."""
    mine = times.get(ours)
    return [{**label, "contestant": name, "median_ms": median, "min_ms": low, "max_ms": high,
             "ratio": mine[0] / median if mine and name != ours else None}
            for name, (median, low, high) in times.items()]


def contestants(spec: bench.CellSpec, cell: str, config: bench.Config, mode: str,
                place: Place, options: dict, x: np.ndarray,
                compiled: dict[str, Any] | None = None) -> dict[str, Callable[[], Any]]:
    """Every contestant's call on this configuration, with its input bound; ``compiled``, if
    given, receives the device row's compiled function as ``compiled["rnnc device"]``."""
    grid = bench.layer_params(spec, config)
    x_dev = place.device_array(x)
    x_torch = place.torch.from_numpy(x).to(place.torch_device)
    calls: dict[str, Callable[[], Any]] = {}
    device = rnnc_device_call(spec, config, grid, mode, place, options)
    if device is not None:
        calls["rnnc device"] = lambda: device(x_dev)
        if compiled is not None:
            compiled["rnnc device"] = device.function
    numpy_call, _ = bench.rnnc_call(spec, config, grid, mode, "cuda",
                                    {**options, "emulate": True} if place.emulate else options)
    calls["rnnc numpy"] = lambda: numpy_call(x)
    if spec.torch_module is not None:
        peer = cudnn_call(spec, config, grid, mode, place)
        calls["cudnn"] = _autocast(lambda: peer(x_torch), place, options)
    bf16 = options.get("precision") == "bf16"
    if not bf16 and bench.peers.jax_available() and (place.emulate or _jax_on_gpu()):
        import jax.numpy as jnp

        jax_fn, _ = jax_call(spec, config, grid, mode)
        x_jax = jnp.asarray(x)
        calls["jax"] = lambda: jax_fn(x_jax)
    eager, _ = torch_eager_call(spec, config, grid, mode, place.torch_device)
    calls["eager"] = _autocast(lambda: eager(x_torch), place, options)
    return calls


def _autocast(call: Callable[[], Any], place: Place, options: dict) -> Callable[[], Any]:
    """``call`` under ``torch.autocast`` to bfloat16 when rnnc runs ``precision="bf16"``."""
    if options.get("precision") != "bf16":
        return call
    torch = place.torch

    def cast() -> Any:
        with torch.autocast(place.torch_device, dtype=torch.bfloat16):
            return call()
    return cast


def _jax_on_gpu() -> bool:
    import jax

    return jax.default_backend() == "gpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="C1,C2,C3,C4")
    parser.add_argument("--cells", default="lstm,gru,ln_lstm,peephole_lstm,mgu")
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-graph", dest="graph", action="store_false",
                        help="launch each call's plan from Python (graph=False) instead of "
                             "replaying it as a CUDA graph, the default")
    parser.add_argument("--precision", choices=("highest", "tf32", "bf16"),
                        default="highest")
    parser.add_argument("--emulate", action="store_true",
                        help="smoke test on the CPU: rnnc emulated, peers on the CPU")
    args = parser.parse_args(argv)
    if args.reps < 5:
        parser.error("--reps must be at least 5 (medians of at least five runs)")
    missing = None if args.emulate else gpu_missing()
    if missing:
        print(f"cuda_vs_cudnn: needs an NVIDIA GPU with CuPy and PyTorch (CUDA): {missing}. "
              f"(--emulate --size tiny runs this script on the CPU as a smoke test.)",
              file=sys.stderr)
        return 2
    place = Place(args.emulate)
    options = {"graph": args.graph, "precision": args.precision}
    rows = [("config", "cell", "mode", "contestant", "ms (min-max)", "rnnc device / it")]
    for config_name in args.configs.split(","):
        config = bench.CONFIGS[config_name]
        config = bench.tiny(config) if args.size == "tiny" else config
        for cell in args.cells.split(","):
            x = np.random.default_rng(0).standard_normal(
                (config.T, config.B, config.I)).astype(np.float32)
            for mode in args.modes.split(","):
                calls = contestants(bench.CELLS[cell], cell, config, mode, place, options, x)
                times = {name: timed(call, place.sync, args.reps, args.warmup)
                         for name, call in calls.items()}
                ours = times.get("rnnc device")
                for name, (median, low, high) in times.items():
                    ratio = f"{ours[0] / median:.2f}" if ours and name != "rnnc device" else ""
                    rows.append((config.name, cell, mode, name,
                                 f"{median:.2f} ({low:.2f}-{high:.2f})", ratio))
                    print(" | ".join(rows[-1]), flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
