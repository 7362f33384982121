"""An independent oracle for layers of cells with shaped states: the unoptimized NumPy cell,
run one sequence at a time and composed into layers and directions by hand.

Each sequence runs alone (batch 1) over its own steps only, reversed for direction 1 and
reversed back, so lengths and the reverse direction are plain slicing here, not the layer's
masked scans; dropout between layers multiplies by the masks the layer's tape recorded.
Gradients compose each cell's backward the same way, down the layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import rnnc


@dataclass
class Composed:
    """What the oracle computed: the output, final states and the cells' tapes."""

    y: np.ndarray  # (T, B, D*K), time-major
    final: dict[str, np.ndarray]  # (L*D, B, *shape)
    tapes: dict[tuple[int, int, int], object]  # (layer, direction, sequence) -> tape


class Oracle:
    """A stack of ``num_layers`` layers of the cells ``factory`` makes, ``directions`` wide."""

    def __init__(self, factory: Callable[[int, int], rnnc.Cell], input_size: int,
                 hidden_size: int, num_layers: int, directions: int) -> None:
        self.factory, self.hidden_size = factory, hidden_size
        self.input_size, self.L, self.D = input_size, num_layers, directions
        self._functions: dict[int, rnnc.Function] = {}

    def function(self, in_size: int) -> rnnc.Function:
        """The unoptimized NumPy program of the cell made for input width ``in_size``."""
        if in_size not in self._functions:
            cell = self.factory(in_size, self.hidden_size)
            self._functions[in_size] = rnnc.compile(cell, backend="numpy", optimize=False)
        return self._functions[in_size]

    def forward(self, x: np.ndarray, lengths: np.ndarray, params: list[list[dict]],
                init: dict[str, np.ndarray], masks: list[np.ndarray | None] = ()) -> Composed:
        """Run time-major ``x`` through the layers, sequence by sequence."""
        T, B = x.shape[:2]
        final = {n: np.zeros_like(a) for n, a in init.items()}
        tapes, inp = {}, x
        for k in range(self.L):
            fn, outs = self.function(inp.shape[2]), []
            for d in range(self.D):
                row = k * self.D + d
                y = None
                for b in range(B):
                    n = int(lengths[b])
                    seq = inp[:n, b:b + 1][::-1] if d else inp[:n, b:b + 1]
                    st0 = {s: a[row, b:b + 1] for s, a in init.items()}
                    ys, st, tape = fn.forward(np.ascontiguousarray(seq), params[k][d], st0)
                    out = ys["y"][::-1] if d else ys["y"]
                    if y is None:
                        y = np.zeros((T, B, out.shape[2]))
                    y[:n, b] = out[:, 0]
                    for s in final:
                        final[s][row, b] = st[s][0]
                    tapes[k, d, b] = tape
                outs.append(y)
            inp = np.concatenate(outs, axis=2)
            if k < self.L - 1 and len(masks) and masks[k] is not None:
                inp = inp * masks[k]
        return Composed(inp, final, tapes)

    def backward(self, run: Composed, lengths: np.ndarray, d_y: np.ndarray,
                 d_final: dict[str, np.ndarray], in_sizes: list[int],
                 masks: list[np.ndarray | None] = ()) -> tuple[np.ndarray, list, dict]:
        """``(d_x, d_params[layer][direction], d_init)`` of the loss whose gradients w.r.t.
        the output and final states are ``d_y`` and ``d_final``, through the cells' tapes."""
        T, B = d_y.shape[:2]
        K = d_y.shape[2] // self.D
        g_params = [[{} for _ in range(self.D)] for _ in range(self.L)]
        g_init = {n: np.zeros_like(a) for n, a in d_final.items()}
        g_out = d_y
        for k in range(self.L - 1, -1, -1):
            if k < self.L - 1 and len(masks) and masks[k] is not None:
                g_out = g_out * masks[k]
            fn, g_in = self.function(in_sizes[k]), np.zeros((T, B, in_sizes[k]))
            for d in range(self.D):
                row = k * self.D + d
                for b in range(B):
                    n = int(lengths[b])
                    gy = g_out[:n, b:b + 1, d * K:(d + 1) * K]
                    gy = np.ascontiguousarray(gy[::-1] if d else gy)
                    g = fn.backward(run.tapes[k, d, b], {"y": gy},
                                    {s: a[row, b:b + 1] for s, a in d_final.items()})
                    g_in[:n, b] += (g.x[::-1] if d else g.x)[:, 0]
                    for name, a in g.params.items():
                        g_params[k][d][name] = g_params[k][d].get(name, 0) + a
                    for s in g_init:
                        g_init[s][row, b] = g.states[s][0]
            g_out = g_in
        return g_out, g_params, g_init
