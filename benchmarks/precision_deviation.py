"""Measure how far precision="bf16" moves results from float32, against a float64 reference.

``python benchmarks/precision_deviation.py [--cells lstm,gru,ln_lstm] [--T 100] [--B 64]
[--size 512] [--backend llvm]``

For each cell at C1's sizes (T=100, B=64, I=H=512 by default), one training forward and the
backward of a fixed random cotangent of ``y`` run three times on the same data: the oracle in
float64 (``optimize=False``, the reference), ``backend`` in float32 (``precision="fp32"``) and
``backend`` with bfloat16 GEMMs (``precision="bf16"``). Each quantity (the outputs ``y``, the
input gradient ``g.x`` and every parameter gradient) prints its error relative to the
reference's scale, ``max|got - ref| / max|ref|``, and its median relative error
``median(|got - ref|) / median(|ref|)``, for float32 and for bf16. docs/precision.md quotes
the results. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse

import numpy as np

import rnnc
from rnnc.tools.bench.configs import ln_lstm

CELLS = {"lstm": rnnc.cells.lstm, "gru": rnnc.cells.gru, "ln_lstm": ln_lstm}


def _run(fn: rnnc.Function, x: np.ndarray, params: dict, d_y: np.ndarray, dtype
         ) -> dict[str, np.ndarray]:
    ys, _, tape = fn.forward(x.astype(dtype), {k: v.astype(dtype) for k, v in params.items()})
    g = fn.backward(tape, {"y": d_y.astype(dtype)})
    return {"y": ys["y"], "g.x": g.x, **{f"g.{k}": v for k, v in g.params.items()}}


def _errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    diff = np.abs(got.astype(np.float64) - ref)
    return (float(diff.max() / np.abs(ref).max()),
            float(np.median(diff) / max(np.median(np.abs(ref)), 1e-300)))


def measure(name: str, T: int, B: int, size: int, backend: str) -> list[tuple]:
    """Rows (quantity, float32 max, float32 median, bf16 max, bf16 median) of one cell."""
    cell = CELLS[name](size, size)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, size))
    params = cell.init_params(seed=0, dtype=np.float64)
    d_y = rng.standard_normal((T, B, size)) / np.sqrt(T * B)
    ref = _run(rnnc.compile(cell, optimize=False), x, params, d_y, np.float64)
    fp32 = _run(rnnc.compile(cell, backend=backend), x, params, d_y, np.float32)
    bf16 = _run(rnnc.compile(cell, backend=backend, precision="bf16"), x, params, d_y,
                np.float32)
    return [(q, *_errors(fp32[q], ref[q]), *_errors(bf16[q], ref[q])) for q in ref]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="lstm,gru,ln_lstm")
    parser.add_argument("--T", type=int, default=100)
    parser.add_argument("--B", type=int, default=64)
    parser.add_argument("--size", type=int, default=512, help="input and hidden size")
    parser.add_argument("--backend", default="llvm")
    args = parser.parse_args()
    print(f"T={args.T} B={args.B} I=H={args.size}, backend {args.backend}; error relative to "
          f"the float64 oracle: max|d| / max|ref| and median|d| / median|ref|")
    print(f"{'cell':8} {'quantity':14} {'fp32 max':>9} {'fp32 med':>9} {'bf16 max':>9} "
          f"{'bf16 med':>9}")
    for name in args.cells.split(","):
        for q, *errors in measure(name, args.T, args.B, args.size, args.backend):
            print(f"{name:8} {q:14} " + " ".join(f"{e:9.2e}" for e in errors), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
