"""Time minGRU with the parallel-scan pass and without it, in one run.

``python benchmarks/parallel_scan.py [--backend llvm] [--steps 256,1024,4096,16384]
[--batch 1,8] [--hidden 512] [--input-size 512] [--mode inference,training] [--reps 5]``

Both sides compile the same cell for the same backend. "scan" is rnnc's pipeline, in which
``parallel-scan`` replaces minGRU's carry by one ``linear_scan`` and leaves no time loop;
"loop" is the same pipeline without that pass: a loop of one step per iteration. Training is
the training forward followed by the backward of ``sum(y)``. Each time is the median of
``--reps`` calls after one warm-up call, float32; loop/scan above 1: the pass helps. With JAX
installed, two peers run beside them on the same inputs and weights: "jax scan", a
``jax.lax.scan`` of the step, and "jax assoc", minGRU rewritten by hand as a
``jax.lax.associative_scan``, both under ``jax.jit``; scan/assoc below 1: rnnc's automatic
parallel form is faster than the hand-written one (``--no-jax`` leaves them out).

The programs are built with ``rnnc.passes`` and run by the backend's runner directly, which is
what ``rnnc.compile`` does with its pipeline. Not a test: nothing here fails on a timing.
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
    return passes.pipeline(mode, parallel_scan=scan)


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
        run = backends.get(backend).build(program, mode)
        env = parameters(program, env)
        return lambda: run(env, sizes)
    forward = passes.run(base, pipeline("forward", scan))
    backward = passes.run(base, pipeline("backward", scan))
    run_forward = backends.get(backend).build(forward, "forward")
    run_backward = backends.get(backend).build(backward, "backward")
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


def jax_peers(params: dict[str, np.ndarray], mode: str, T: int, B: int, input_size: int
              ) -> dict[str, Callable[[], object]]:
    """minGRU in JAX under ``jax.jit``, as the same inputs and weights: "jax scan" is
    ``jax.lax.scan`` of the step, "jax assoc" the hand-written parallel form, the gates of every
    step at once and ``jax.lax.associative_scan`` of the pairs ``(1 - z, z * h~)`` under
    ``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)``. Training is ``jax.grad`` of ``sum(y)`` with
    respect to the weights, ``x`` and ``h``, as rnnc's backward. Empty without JAX."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {}
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((T, B, input_size)).astype(np.float32))
    w = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    h = jnp.zeros((B, params["b_z"].shape[-1]), jnp.float32)

    def gates(w, x):
        z = jax.nn.sigmoid(x @ w["W_z"] + w["b_z"])
        return 1 - z, z * (x @ w["W_h"] + w["b_h"])

    def sequential(w, x, h):
        def step(h, xt):
            a, b = gates(w, xt)
            h = a * h + b
            return h, h
        return jax.lax.scan(step, h, x)[1]

    def parallel(w, x, h):
        a, b = gates(w, x)
        A, Bv = jax.lax.associative_scan(lambda l, r: (l[0] * r[0], r[0] * l[1] + r[1]),
                                         (a, b))
        return A * h + Bv

    def timed(form: Callable) -> Callable[[], object]:
        if mode == "inference":
            fn = jax.jit(form)
            return lambda: fn(w, x, h).block_until_ready()
        grad = jax.jit(jax.grad(lambda w, x, h: jnp.sum(form(w, x, h)), argnums=(0, 1, 2)))
        return lambda: jax.block_until_ready(grad(w, x, h))

    return {"jax scan": timed(sequential), "jax assoc": timed(parallel)}


def agree(y: np.ndarray, peer: object) -> None:
    """Stop unless rnnc's output and the peer's agree to float32 tolerance."""
    err = float(np.max(np.abs(y - np.asarray(peer))))
    if not err <= 1e-3 * max(1.0, float(np.max(np.abs(y)))):
        raise SystemExit(f"rnnc and jax.lax.associative_scan disagree: max |difference| {err}")


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
    ap.add_argument("--no-jax", action="store_true", help="leave out the JAX peers")
    args = ap.parse_args()
    cell = rnnc.cells.min_gru(args.input_size, args.hidden)
    params = cell.init_params(seed=0)
    print(f"minGRU I={args.input_size} H={args.hidden} float32 on {args.backend}; median of "
          f"{args.reps} calls; ms; loop/scan and scan/assoc are ratios of times")
    print(f"{'mode':<10} {'T':>6} {'B':>3} {'loop':>9} {'scan':>9} {'jax scan':>9} "
          f"{'jax assoc':>9} {'loop/scan':>9} {'scan/assoc':>10}")
    for mode in args.mode.split(","):
        for B in map(int, args.batch.split(",")):
            for T in map(int, args.steps.split(",")):
                fns = [call(cell, args.backend, mode, s, T, B) for s in (False, True)]
                loop, scan = (median_time(fn, args.reps) for fn in fns)
                peers = {} if args.no_jax else jax_peers(params, mode, T, B, args.input_size)
                if mode == "inference" and peers:
                    agree(fns[1]()["y"], peers["jax assoc"]())
                jax = {name: median_time(fn, args.reps) for name, fn in peers.items()}
                ms = [f"{1e3 * jax[n]:>9.2f}" if n in jax else f"{'-':>9}"
                      for n in ("jax scan", "jax assoc")]
                vs = f"{scan / jax['jax assoc']:>10.2f}" if "jax assoc" in jax else f"{'-':>10}"
                print(f"{mode:<10} {T:>6} {B:>3} {1e3 * loop:>9.2f} {1e3 * scan:>9.2f} "
                      f"{ms[0]} {ms[1]} {loop / scan:>9.2f} {vs}")


if __name__ == "__main__":
    main()
