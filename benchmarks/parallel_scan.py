"""Time minGRU with the parallel-scan pass and without it, in one run.

``python benchmarks/parallel_scan.py [--backend llvm] [--steps 256,1024,4096,16384]
[--batch 1,8] [--hidden 512] [--input-size 512] [--mode inference,training] [--reps 5]``

Both sides compile the same cell for the same backend. "scan" is rnnc's pipeline, in which
``parallel-scan`` replaces minGRU's carry by one ``linear_scan`` and leaves no time loop;
"loop" is the same pipeline without that pass: a loop of one step per iteration. Training is
the training forward followed by the backward of ``sum(y)``. Each time is the median of
``--reps`` calls after one warm-up call, float32; the ratio is loop / scan (above 1: the pass
helps). The programs are built with ``rnnc.passes`` and run by the backend's runner directly,
which is what ``rnnc.compile`` does with its pipeline. Not a test: nothing here fails on a
timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import rnnc
from rnnc import backends, passes
from rnnc.ir import Program, retype
from rnnc.names import Role


def pipeline(mode: str, scan: bool) -> tuple[str, ...]:
    names = passes.pipeline(mode)
    return names if scan else tuple(n for n in names if n != "parallel-scan")


def parameters(program: Program, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The user's parameters packed into the program's blocks (fuse-gate-matmuls' layout)."""
    env = dict(params)
    for block in program.meta.get("layout", ()):
        env[block.name] = np.concatenate([params[m] for m, _, _ in block.members], axis=-1)
    return env


def call(cell: rnnc.Cell, backend: str, mode: str, scan: bool, T: int, B: int
         ) -> Callable[[], object]:
    """A function running one inference, or one training forward and backward."""
    base = retype(cell.program(), "f32")
    rng = np.random.default_rng(0)
    sizes = {"T": T, "B": B}
    x = rng.standard_normal((T, B, cell.sizes("input")["x"][-1])).astype(np.float32)
    h = np.zeros((B, cell.sizes("state")["h"][-1]), np.float32)
    env = {"x": x, "h": h, **cell.init_params(seed=0)}
    if mode == "inference":
        program = passes.run(base, pipeline("inference", scan))
        run = backends.get(backend).build(program)
        env = parameters(program, env)
        return lambda: run(env, sizes)
    forward = passes.run(base, pipeline("forward", scan))
    backward = passes.run(base, pipeline("backward", scan))
    run_forward = backends.get(backend).build(forward)
    run_backward = backends.get(backend).build(backward)
    env = parameters(forward, env)

    def train() -> object:
        out = run_forward(env, sizes)
        grads_in = dict(env)
        for name, (role, ty) in backward.args.items():
            if role == Role.SAVED:
                grads_in[name] = out[name]
            elif role == Role.COTANGENT:
                grads_in[name] = np.ones([sizes.get(d, d) for d in ty.shape], np.float32)
        return run_backward(grads_in, sizes)

    return train


def median_time(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llvm")
    ap.add_argument("--steps", default="256,1024,4096,16384")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--input-size", type=int, default=512)
    ap.add_argument("--mode", default="inference,training")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    cell = rnnc.cells.min_gru(args.input_size, args.hidden)
    print(f"minGRU I={args.input_size} H={args.hidden} float32 on {args.backend}; median of "
          f"{args.reps} calls; ratio = loop / scan")
    print(f"{'mode':<10} {'T':>6} {'B':>3} {'loop ms':>10} {'scan ms':>10} {'ratio':>7}")
    for mode in args.mode.split(","):
        for B in map(int, args.batch.split(",")):
            for T in map(int, args.steps.split(",")):
                loop, scan = (median_time(call(cell, args.backend, mode, s, T, B), args.reps)
                              for s in (False, True))
                print(f"{mode:<10} {T:>6} {B:>3} {1e3 * loop:>10.2f} {1e3 * scan:>10.2f} "
                      f"{loop / scan:>7.2f}")


if __name__ == "__main__":
    main()
