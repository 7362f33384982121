"""Whole cells with linear carries run through every pipeline, for the backends' scan tests.

:func:`everything` runs a compiled cell (``parallel_scan=True`` on the backend under test, or
the unoptimized oracle) through inference, the training forward and the backward, in float64
on fixed random data, and returns every result by name, so that a test compares two functions
key by key.
"""

from __future__ import annotations

import numpy as np

import rnnc


def everything(fn: rnnc.Function, cell: rnnc.Cell, steps: int, batch: int, lengths,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Inference, the training forward's outputs and every gradient of ``fn`` (compiled from
    ``cell``) on ``steps`` x ``batch`` sequences, by name."""
    rng = np.random.default_rng(seed)
    params = {k: v + 0.1 * rng.standard_normal(v.shape)
              for k, v in cell.init_params(seed=0, dtype=np.float64).items()}
    (name, size), = cell.sizes("input").items()
    x = rng.standard_normal((steps, batch, size[-1]))
    states = {k: 0.5 * rng.standard_normal((batch, s[-1]))
              for k, s in cell.sizes("state").items()}
    ys, finals = fn(x, params, states=states, lengths=lengths)
    train_ys, train_finals, tape = fn.forward(x, params, states=states, lengths=lengths)
    d_y = {k: rng.standard_normal(v.shape) for k, v in ys.items()}
    d_s = {k: rng.standard_normal(v.shape) for k, v in finals.items()}
    g = fn.backward(tape, d_outputs=d_y, d_states=d_s)
    out = {}
    for prefix, values in (("y", ys), ("final", finals), ("train.y", train_ys),
                           ("train.final", train_finals), ("grad.x", {name: g.x}),
                           ("grad.param", g.params), ("grad.state", g.states)):
        out.update({f"{prefix}.{k}": np.asarray(v) for k, v in values.items()})
    return out
