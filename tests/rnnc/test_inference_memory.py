"""Inference stays lean: beyond its outputs it allocates O(B*H), not O(T*B*H); training does not.

Measured with tracemalloc (NumPy reports its buffers to it) on the NumPy backend. "Extra" is
the peak traced memory of one call minus the bytes of what it returns. Inference saves nothing
per step, so its extra must not grow with T. The one allowance is what the inference program
itself computes over the whole sequence before the loop (the hoisted input projection, a GEMM
over T*B rows, which DESIGN wants): its bytes are taken from the program's pre-loop graph.
The training forward, by contrast, keeps per-step values on its tape, which grows with T.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

import rnnc
from rnnc.ir import Type

I, H, B = 8, 64, 4
STEP = B * H * 8  # bytes of one (B, H) float64 value


def _bytes(t: object, T: int) -> int:
    if isinstance(t, Type):
        dims = [T if d == "T" else B if d == "B" else d for d in t.shape]
        return int(np.prod(dims, dtype=np.int64)) * 8
    return sum(_bytes(item, T) for item in t.items)  # a fused region's results


def hoisted_bytes(fn: rnnc.Function, T: int) -> int:
    """Bytes of every whole-sequence value the inference program computes before the loop."""
    pre = fn.program("inference", "f64").pre
    total = 0
    for node in pre.nodes():
        if node.op.name in ("arg", "get"):
            continue
        if isinstance(node.type, Type) and "T" not in node.type.shape:
            continue
        total += _bytes(node.type, T)
    return total


def extra_bytes(fn: rnnc.Function, T: int, params: dict[str, np.ndarray]) -> int:
    """Peak traced bytes of one inference call, minus its outputs and the hoisted values."""
    x = np.random.default_rng(T).standard_normal((T, B, I))
    fn(x, params)  # builds and caches the runner, so only the call itself is measured
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ys, states = fn(x, params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    returned = sum(v.nbytes for v in ys.values()) + sum(v.nbytes for v in states.values())
    assert ys["y"].shape == (T, B, H)
    return peak - base - returned - hoisted_bytes(fn, T)


def tape_bytes(fn: rnnc.Function, T: int, params: dict[str, np.ndarray]) -> int:
    """Bytes the training forward keeps on its tape beyond the caller's inputs and states."""
    x = np.random.default_rng(T).standard_normal((T, B, I))
    _, _, tape = fn.forward(x, params)
    given = set(fn.inputs) | set(fn.states)
    return sum(v.nbytes for k, v in tape.env.items()
               if k not in given and k not in fn.params and v.ndim and v.shape[0] == T)


def test_inference_memory_does_not_grow_with_T() -> None:
    cell = rnnc.cells.lstm(I, H)
    fn = rnnc.compile(cell, backend="numpy")
    params = cell.init_params(seed=0, dtype=np.float64)
    param_bytes = sum(v.nbytes for v in params.values())
    short, mid, long = (extra_bytes(fn, T, params) for T in (50, 200, 400))
    # Saving even one (B, H) value per step would add 350 * STEP between T=50 and T=400.
    assert long - short <= 350 * STEP // 4, (short, long)
    # At T=200: the flat parameter buffer plus a bounded number of per-step temporaries.
    assert mid <= param_bytes + 64 * STEP, (mid, param_bytes)


def test_training_tape_grows_with_T() -> None:
    """The contrast: forward saves per-step values for backward, linear in T."""
    cell = rnnc.cells.lstm(I, H)
    fn = rnnc.compile(cell, backend="numpy")
    params = cell.init_params(seed=0, dtype=np.float64)
    short, long = tape_bytes(fn, 50, params), tape_bytes(fn, 400, params)
    assert short >= 50 * STEP, short  # at least one (B, H) value per step
    assert long >= 7 * short, (short, long)
    assert long - short >= 350 * STEP
