"""GFLOP/s of every installed BLAS at the GEMM shapes of rnnc's benchmarks (docs/benchmarks.md).

``python benchmarks/gemm_shapes.py [--threads N] [--reps 20] [--shapes 64x512x2048,...]``
prints one row per M x K x N shape and one column per library found by
``rnnc.backends.llvm.blas.available()`` (OpenBLAS, MKL, SciPy's BLAS), plus NumPy's
``matmul`` for reference. The row-major product is C (M x N) = A (M x K) @ B (K x N).

``--dtype bf16`` measures instead rnnc's bfloat16 kernel of the host's tier (AMX, AVX512-BF16
or the emulation: ``rnnc.backends.llvm.bf16``) against ``torch.matmul`` on bf16 tensors, in
the same run: per shape GFLOP/s of both, rnnc / torch, rnnc / the best bf16 GEMM measured at
the shape, and each as a fraction of the measured bf16 GEMM peak (torch on ``PEAK_SHAPE``). A
call of rnnc's kernel converts A to bf16 and multiplies (the weights are packed once, as in a
run); ``--threads`` splits its column panels between threads as the thread team does.
``--clock cpu`` (one thread only) times by the calling thread's CPU time instead of the wall
clock: on a shared machine a call longer than a scheduler slice waits for other processes,
which the wall clock counts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rnnc.backends.llvm import blas as blas_lib

PEAK_SHAPE = (2048, 2048, 2048)
SHAPES = ((2048, 2048, 2048), (6400, 512, 2048), (64, 512, 2048), (16, 256, 1024),
          (1, 256, 1024), (1, 512, 2048))


def parse_shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    """'64x512x2048,1x256x1024' -> ((64, 512, 2048), (1, 256, 1024))."""
    shapes = []
    for item in text.split(","):
        m, k, n = (int(v) for v in item.lower().split("x"))
        shapes.append((m, k, n))
    return tuple(shapes)


def median_seconds(call, reps: int, budget_s: float = 2.0, clock=time.perf_counter) -> float:
    """Median of ``reps`` timed calls after two warm-up calls (fewer if over budget), timed
    by ``clock``."""
    call()
    call()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < reps and (len(times) < 3 or time.perf_counter() < deadline):
        start = clock()
        call()
        times.append(clock() - start)
    return statistics.median(times)


def gemm_call(library: blas_lib.Blas, a: np.ndarray, b: np.ndarray, c: np.ndarray):
    """A no-argument call computing c = a @ b through ``library``."""
    (m, k), n = a.shape, b.shape[1]
    return lambda: blas_lib.call_gemm_ctypes(library, False, False, m, n, k, 1.0, a, k, b, n,
                                             0.0, c, n)


def gflops(m: int, k: int, n: int, seconds: float) -> float:
    return 2.0 * m * k * n / seconds / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                        help="comma-separated MxKxN (default: SHAPES in this file)")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="bf16 only: cpu times the calling thread's CPU time (--threads 1)")
    args = parser.parse_args()
    if args.clock == "cpu" and (args.dtype != "bf16" or args.threads != 1):
        parser.error("--clock cpu times one thread: it takes --dtype bf16 --threads 1")
    if args.dtype == "bf16":
        return bf16_table(args.shapes, args.threads, args.reps,
                          time.thread_time if args.clock == "cpu" else time.perf_counter)
    libraries = blas_lib.available()
    if not libraries:
        raise SystemExit("no BLAS found: pip install scipy-openblas32 (or mkl)")
    for library in libraries.values():
        blas_lib.set_threads(args.threads, library)
    names = list(libraries) + ["numpy"]
    header = f"{'M x K x N':>18} " + " ".join(f"{name:>10}" for name in names)
    print(f"GFLOP/s, float32, {args.threads} threads (NumPy's BLAS keeps its own threads)")
    print(header)
    rng = np.random.default_rng(0)
    for m, k, n in args.shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c = np.zeros((m, n), np.float32)
        calls = [gemm_call(library, a, b, c) for library in libraries.values()]
        calls.append(lambda a=a, b=b, c=c: np.matmul(a, b, out=c))
        cells = [gflops(m, k, n, median_seconds(call, args.reps)) for call in calls]
        print(f"{f'{m}x{k}x{n}':>18} " + " ".join(f"{v:10.1f}" for v in cells), flush=True)
    return 0


def bf16_table(shapes, threads: int, reps: int, clock=time.perf_counter) -> int:
    """The bf16 rows: rnnc's kernel and torch.matmul, GFLOP/s and fractions of the peak."""
    import torch

    from rnnc.backends.llvm import bf16
    from rnnc.backends.llvm.bf16_jit import Bf16Gemm

    torch.set_num_threads(threads)
    tier = bf16.host_tier()
    rng = np.random.default_rng(0)
    rows = []
    for m, k, n in dict.fromkeys((PEAK_SHAPE,) + tuple(shapes)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32)
        gemm, out = Bf16Gemm(tier, k, n), np.empty((m, n), np.float32)
        gemm.prepare(a, w)  # packs w, once

        def ours(a=a, w=w, gemm=gemm, out=out, m=m) -> None:
            gemm.prepare(a, w)
            gemm.multiply(m, out, threads)

        ta, tw = torch.from_numpy(a).bfloat16(), torch.from_numpy(w).bfloat16()
        rows.append(((m, k, n), gflops(m, k, n, median_seconds(ours, reps, clock=clock)),
                     gflops(m, k, n, median_seconds(lambda ta=ta, tw=tw: ta @ tw, reps,
                                                    clock=clock))))
    peak = rows[0][2]  # torch on PEAK_SHAPE
    clock_name = "CPU time" if clock is time.thread_time else "wall clock"
    print(f"GFLOP/s ({clock_name}), bf16 operands, float32 accumulation, {threads} threads; tier "
          f"{tier}; bf16 GEMM peak = torch on {'x'.join(map(str, PEAK_SHAPE))} = {peak:.1f}")
    print("rnnc/best: against the best bf16 GEMM measured at the shape (rnnc's or torch's)")
    print(f"{'M x K x N':>18} {'rnnc':>8} {'torch':>8} {'rnnc/torch':>10} {'rnnc/best':>9} "
          f"{'rnnc/peak':>9} {'torch/peak':>10}")
    for (m, k, n), mine, theirs in rows:
        print(f"{f'{m}x{k}x{n}':>18} {mine:8.1f} {theirs:8.1f} {mine / theirs:10.2f} "
              f"{mine / max(mine, theirs):9.2f} {mine / peak:9.2f} {theirs / peak:10.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
