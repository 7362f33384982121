"""The selective SSM's two forms side by side: rnnc's parallel scan and its time loop.

``python benchmarks/selective_ssm_forms.py [--T 1024 --B 8 --D 256 --N 16 --reps 3]`` times a
training step (forward, then backward of sum(y)) of ``rnnc.cells.selective_ssm`` on the LLVM
backend with ``parallel_scan=True`` and ``False``, and prints, for each, what bounds it: the
bytes of ``(T, B, D, N)`` sequences the scan form writes and reads (its ``A``, ``Bv`` and the
scanned state, each ``4 T B D N`` bytes) against the loop form's per-step work, and the time of
the one hoisted input projection. The peers (PyTorch eager, the compiled step, JAX) are in
``rnnc bench --configs SSM --cells selective_ssm``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import rnnc


def _train(fn, x, params):
    ys, _, tape = fn.forward(x, params)
    fn.backward(tape, d_outputs={"y": np.ones_like(ys["y"])})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("T", 1024), ("B", 8), ("D", 256), ("N", 16), ("reps", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    T, B, D, N = args.T, args.B, args.D, args.N
    cell = rnnc.cells.selective_ssm(D, N)
    params = cell.init_params(seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, D)).astype(np.float32)
    sequence_mb = 4 * T * B * D * N / 1e6
    W = np.concatenate([params["W_dt"], params["W_B"], params["W_C"]], axis=1)
    start = time.perf_counter()
    x.reshape(T * B, D) @ W
    gemm_ms = 1e3 * (time.perf_counter() - start)
    print(f"T={T} B={B} D={D} N={N}: one (T,B,D,N) float32 sequence is {sequence_mb:.0f} MB; "
          f"the input projection (T*B, D) x (D, D+2N) takes {gemm_ms:.1f} ms in NumPy")
    for scan in (True, False):
        fn = rnnc.compile(cell, backend="llvm", parallel_scan=scan)
        _train(fn, x, params)  # compile and warm up
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            _train(fn, x, params)
            times.append(time.perf_counter() - start)
        counts = fn.op_counts("forward")
        print(f"parallel_scan={scan!s:5}: training step {1e3 * statistics.median(times):8.1f} ms "
              f"(min {1e3 * min(times):.1f}); forward loop ops {counts['loop'] or 'none'}")


if __name__ == "__main__":
    main()
