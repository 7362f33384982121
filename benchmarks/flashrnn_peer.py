"""Time rnnc's CUDA sLSTM and LSTM against FlashRNN's fused CUDA kernels on one GPU.

``python benchmarks/flashrnn_peer.py [--cells slstm,lstm] [--configs C1] [--modes
inference,training] [--backends cuda_fused,cuda] [--precision highest|bf16]``

FlashRNN (Pöppel, Beck, Hochreiter, "FlashRNN: I/O-Aware Optimization of Traditional RNNs on
modern hardware", 2024; PyPI ``flashrnn``) runs LSTM, GRU and sLSTM with head-wise
(block-diagonal) recurrence as one fused kernel. This script gives it rnnc's parameters
(:func:`to_flashrnn`: FlashRNN's gate order ``i, f, z, o`` and its ``Wx [B, T, G, N, D]``,
``R [G, N, D, P]``, ``b [G, N, D]`` layout) and times, with the input projection ``x @ W``
inside every FlashRNN call as it is inside rnnc's:

- ``rnnc device``: ``rnnc.compile(cell, backend="cuda")`` on CuPy arrays (cuda_vs_cudnn.py's
  device row); sLSTM is ``rnnc.cells.slstm`` with 4 heads, LSTM ``rnnc.cells.lstm`` (one head);
- ``flashrnn cuda_fused`` and ``flashrnn cuda``: ``flashrnn(Wx, R, b, function=...)`` on CUDA
  tensors, each backend its own row; a backend that fails (its JIT compile, a size it does not
  take) is reported with its error and the other still runs.

Inference is the forward; training adds the backward of ``sum(y)`` (gradients of x and every
parameter). The first call (FlashRNN's JIT compile, rnnc's tuning) is timed apart; then
medians (min-max) of ``--reps`` synchronized calls after ``--warmup`` calls; the ratio is
rnnc / FlashRNN (lower is better). Each row also gives the largest difference of FlashRNN's
``y`` from rnnc's on that input, which checks the parameter mapping on the GPU.

The two sLSTMs differ where the states start (``tests/rnnc/test_flashrnn_peer.py`` checks
both): FlashRNN sets the stabilizer ``m' = i~`` while every ``n`` is 0, and clamps ``n' >= 1``.
From zero states (as here) or from states with ``n >= 1`` both compute the same ``y``: after
stabilization one of the gates ``i``, ``f`` is exactly 1, so ``n >= 1`` holds for every step
and the clamp never acts.

Needs flashrnn (with einops and ninja; docs/benchmarks.md says how to carry the wheels), CuPy,
PyTorch with CUDA and a GPU, and exits saying what is missing. ``--dry`` runs the same code on
the CPU at a tiny size (rnnc's CUDA backend emulated, FlashRNN's ``vanilla`` PyTorch backend)
as a smoke test of this script; its times mean nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_vs_cudnn  # noqa: E402  (benchmarks/ is no package: the script beside this one)

from rnnc.tools import bench  # noqa: E402

CELLS = ("slstm", "lstm")
# Where FlashRNN's gates i, f, z, o sit in rnnc's gate order of each cell.
SLSTM_GATES = (1, 2, 0, 3)  # rnnc.cells.slstm: z, i, f, o
LSTM_GATES = "ifgo"  # rnnc.cells.lstm's W_i?, W_h?, b_i?, b_h? (g is FlashRNN's z)
STATES = {"slstm": ("h", "c", "n", "m"), "lstm": ("h", "c")}
GPU_BACKENDS = ("cuda_fused", "cuda")


def flashrnn_missing() -> str | None:
    """Why FlashRNN cannot run here, or None when it imports."""
    try:
        import flashrnn  # noqa: F401
    except Exception as err:  # an ImportError, or its import failing on what it imports
        return f"flashrnn does not import ({type(err).__name__}: {err})"
    return None


def to_flashrnn(cell: str, params: dict[str, np.ndarray], heads: int
                ) -> dict[str, np.ndarray]:
    """rnnc's parameters of ``cell`` as FlashRNN's: ``W`` (I, G*N*D) with ``x @ W`` reshaped
    to (..., G, N, D) giving Wx, ``R`` (G, N, D, P): ``Ry[g, n, e] = sum_p y[n, p] R[g, n, e,
    p]``, and ``b`` (G, N, D); gates in FlashRNN's order i, f, z, o."""
    if cell == "slstm":
        W, R, b = params["W"], params["R"], params["b"]
        d = R.shape[1]
        W = W.reshape(W.shape[0], heads, 4, d)[:, :, SLSTM_GATES].transpose(0, 2, 1, 3)
        R = R.reshape(heads, d, 4, d)[:, :, SLSTM_GATES].transpose(2, 0, 3, 1)
        b = b.reshape(heads, 4, d)[:, SLSTM_GATES].transpose(1, 0, 2)
        return {"W": W.reshape(W.shape[0], -1), "R": R, "b": b}
    if cell == "lstm":
        return {"W": np.concatenate([params[f"W_i{g}"] for g in LSTM_GATES], axis=1),
                "R": np.stack([params[f"W_h{g}"].T for g in LSTM_GATES])[:, None],
                "b": np.stack([params[f"b_i{g}"] + params[f"b_h{g}"]
                               for g in LSTM_GATES])[:, None]}
    raise ValueError(f"to_flashrnn: cell must be one of {CELLS}, got {cell!r}")


def flashrnn_forward(cell: str, x: Any, mapped: dict[str, Any], backend: str,
                     dtype: str = "float32", states: Any = None) -> tuple[Any, Any]:
    """FlashRNN over ``x`` (T, B, I) with :func:`to_flashrnn`'s torch tensors: ``y`` (T, B, H)
    and the last states (S, B, 1, N, D), S in the order of ``STATES[cell]``."""
    from flashrnn import flashrnn

    G, N, D = mapped["b"].shape
    T, B = x.shape[:2]
    Wx = (x.transpose(0, 1) @ mapped["W"]).reshape(B, T, G, N, D)
    all_states, last = flashrnn(Wx, mapped["R"], mapped["b"], states=states, function=cell,
                                backend=backend, dtype=dtype)
    return all_states[0].permute(1, 0, 2, 3).reshape(T, B, N * D), last


def flashrnn_call(cell: str, params: dict[str, np.ndarray], heads: int, mode: str,
                  backend: str, place: cuda_vs_cudnn.Place, precision: str
                  ) -> Callable[[Any], Any]:
    """``x -> y`` of FlashRNN with rnnc's ``params``; training also runs the backward."""
    torch = place.torch
    dtype = "bfloat16" if precision == "bf16" else "float32"
    mapped = {name: torch.from_numpy(np.ascontiguousarray(value))
              .to(place.torch_device, getattr(torch, dtype))
              for name, value in to_flashrnn(cell, params, heads).items()}

    def infer(x: Any) -> Any:
        with torch.no_grad():
            return flashrnn_forward(cell, x.to(mapped["W"].dtype), mapped, backend, dtype)[0]

    def train(x: Any) -> Any:
        for tensor in mapped.values():
            tensor.grad = None
            tensor.requires_grad_(True)
        x = x.to(mapped["W"].dtype).detach().requires_grad_(True)
        y = flashrnn_forward(cell, x, mapped, backend, dtype)[0]
        y.float().sum().backward()
        return y

    return infer if mode == "inference" else train


def heads_of(cell: str) -> int:
    """FlashRNN's heads for ``cell``: the benchmarked sLSTM's, one for the LSTM."""
    return bench.tensor_steps.HEADS if cell == "slstm" else 1


def measure(record: dict[str, Any], config: bench.Config, cell: str, mode: str,
            place: cuda_vs_cudnn.Place, backends: tuple[str, ...], precision: str,
            reps: int, warmup: int) -> None:
    """Time rnnc's device call and each FlashRNN backend on one row; append to ``record``'s
    ``rows`` and ``errors`` (a failing contestant is reported, the others still run)."""
    label = {"config": config.name, "cell": cell, "mode": mode}
    spec = bench.CELLS[cell]
    grid = bench.layer_params(spec, config)
    x = np.random.default_rng(0).standard_normal((config.T, config.B, config.I)) \
        .astype(np.float32)
    x_torch = place.torch.from_numpy(x).to(place.torch_device)
    options = {"graph": not place.emulate, "precision": precision}
    calls: dict[str, Callable[[], Any]] = {}
    try:
        device = cuda_vs_cudnn.rnnc_device_call(spec, config, grid, mode, place, options)
        x_dev = place.device_array(x)
        calls["rnnc device"] = lambda: device(x_dev)
    except Exception as err:  # a check reports what failed and goes on
        record["errors"].append({**label, "contestant": "rnnc device",
                                 "error": f"{type(err).__name__}: {err}"})
    for backend in backends:
        peer = flashrnn_call(cell, grid[0][0], heads_of(cell), mode, backend, place, precision)
        calls[f"flashrnn {backend}"] = lambda peer=peer: peer(x_torch)
    reference = None
    times: dict[str, tuple[float, float, float]] = {}
    differences: dict[str, float] = {}
    first_ms: dict[str, float] = {}
    for name, call in calls.items():
        try:
            begin = time.perf_counter()
            y = call()  # the first call: FlashRNN's JIT compile, rnnc's tuning
            place.sync()
            first_ms[name] = (time.perf_counter() - begin) * 1e3
            y = np.asarray(y["y"].get() if hasattr(y["y"], "get") else y["y"]) \
                if isinstance(y, dict) else y.detach().float().cpu().numpy()
            if name == "rnnc device":
                reference = y
            elif reference is not None:
                differences[name] = float(np.max(np.abs(y - reference)))
            times[name] = cuda_vs_cudnn.timed(call, place.sync, reps, warmup)
        except Exception as err:
            record["errors"].append({**label, "contestant": name,
                                     "error": f"{type(err).__name__}: {err}"})
    for row in cuda_vs_cudnn.ratio_rows(label, times):
        name = row["contestant"]
        record["rows"].append({**row, "max_abs_diff_y": differences.get(name),
                               "first_call_ms": first_ms[name]})


def print_table(rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> None:
    """The rows as an aligned table, then each error."""
    lines = [("config", "cell", "mode", "contestant", "ms (min-max)", "rnnc / it",
              "max |y - y_rnnc|", "first call ms")]
    for r in rows:
        diff = r["max_abs_diff_y"]
        lines.append((r["config"], r["cell"], r["mode"], r["contestant"],
                      f"{r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f})",
                      "" if r["ratio"] is None else f"{r['ratio']:.2f}",
                      "" if diff is None else f"{diff:.1e}", f"{r['first_call_ms']:.1f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    print()
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
    for e in errors:
        print(f"error: {e['config']} {e['cell']} {e['mode']} {e.get('contestant', '')}: "
              f"{e['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="C1")
    parser.add_argument("--cells", default=",".join(CELLS))
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--backends", default=",".join(GPU_BACKENDS),
                        help="FlashRNN backends, each its own row (--dry: vanilla)")
    parser.add_argument("--precision", choices=("highest", "bf16"), default="highest",
                        help="bf16: rnnc precision='bf16', FlashRNN dtype bfloat16")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dry", action="store_true",
                        help="smoke test on the CPU at a tiny size: rnnc emulated, FlashRNN's "
                             "vanilla backend")
    args = parser.parse_args(argv)
    if args.reps < 5:
        parser.error("--reps must be at least 5 (medians of at least five runs)")
    unknown = sorted(set(args.cells.split(",")) - set(CELLS))
    if unknown:
        parser.error(f"--cells: FlashRNN runs {', '.join(CELLS)}, not {', '.join(unknown)}")
    missing = flashrnn_missing() or (None if args.dry else cuda_vs_cudnn.gpu_missing())
    if missing:
        print(f"flashrnn_peer: needs flashrnn and an NVIDIA GPU with CuPy and PyTorch (CUDA): "
              f"{missing}. (--dry runs this script on the CPU as a smoke test.)",
              file=sys.stderr)
        return 2
    place = cuda_vs_cudnn.Place(args.dry)
    backends = ("vanilla",) if args.dry else tuple(args.backends.split(","))
    record: dict[str, Any] = {"rows": [], "errors": []}
    for config_name in args.configs.split(","):
        config = bench.CONFIGS[config_name]
        config = bench.tiny(config) if args.dry else config
        for cell in args.cells.split(","):
            for mode in args.modes.split(","):
                measure(record, config, cell, mode, place, backends, args.precision,
                        args.reps, args.warmup)
                print(f"flashrnn_peer: {config.name} {cell} {mode} done", flush=True)
    print_table(record["rows"], record["errors"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
