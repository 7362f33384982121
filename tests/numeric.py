"""Central differences: the independent oracle for gradients in the tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def central_difference(f: Callable[[], float], a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d f() / d a, element by element: ``a`` is perturbed in place and restored."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + eps
        up = f()
        a[i] = old - eps
        down = f()
        a[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


# The arguments of a compiled function's backward, in the groups double_backward returns
# cotangents for: the forward's inputs, parameters and initial states, and backward's own
# output and final-state cotangents.
BACKWARD_ARGS = ("x", "params", "states", "d_outputs", "d_states")


def _dot(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return sum(float(np.vdot(a[k], b[k])) for k in b)


def _by_name(gx: Any, names: list[str]) -> dict[str, np.ndarray]:
    """``g.x`` (an array for one input, a dict for several, None for none) by input name."""
    if gx is None:
        return {}
    return dict(gx) if isinstance(gx, dict) else {names[0]: gx}


def _first_order(fn: Any, z: dict[str, dict[str, np.ndarray]], lengths: np.ndarray | None
                 ) -> dict[str, dict[str, np.ndarray]]:
    """``fn``'s gradients (x, params, states) at the backward arguments ``z``."""
    x = z["x"]
    _, _, tape = fn.forward(next(iter(x.values())) if len(x) == 1 else x, z["params"],
                            states=z["states"], lengths=lengths)
    g = fn.backward(tape, d_outputs=z["d_outputs"], d_states=z["d_states"])
    return {"x": _by_name(g.x, [n for n in x if n not in fn.no_grad]), "params": g.params,
            "states": g.states}


def directional_second_order(fn: Any, z: dict[str, dict[str, np.ndarray]],
                             lengths: np.ndarray | None, seed: int, eps: float = 1e-6
                             ) -> list[tuple[str, float, float]]:
    """``fn.double_backward`` against central differences of ``fn``'s own gradient, float64.

    ``z`` holds the backward's arguments by :data:`BACKWARD_ARGS` group (each a dict of
    arrays). For random cotangents ``u`` of the gradient ``G(z)`` and, per group, a random
    direction ``v`` in that group alone, the double backward's cotangent of the group, dotted
    with ``v``, must equal ``(<u, G(z + eps v)> - <u, G(z - eps v)>) / (2 eps)``. Returns
    ``(group, double backward, central difference)`` for each group that has values."""
    rng = np.random.default_rng(seed)
    g = _first_order(fn, z, lengths)
    u = {k: {n: rng.standard_normal(np.shape(a)) for n, a in v.items()} for k, v in g.items()}
    x = z["x"]
    _, _, tape = fn.forward(next(iter(x.values())) if len(x) == 1 else x, z["params"],
                            states=z["states"], lengths=lengths)
    dd_out, dd_st, dd = fn.double_backward(tape, z["d_outputs"], z["d_states"], u["x"],
                                           u["params"], u["states"])
    cotangents = {"x": _by_name(dd.x, [n for n in x if n not in fn.no_grad]),
                  "params": dd.params, "states": dd.states, "d_outputs": dd_out,
                  "d_states": dd_st}
    found = []
    for group in BACKWARD_ARGS:
        v = {n: rng.standard_normal(np.shape(a)) for n, a in cotangents[group].items()}
        if not v:
            continue
        side = []
        for sign in (1.0, -1.0):
            moved = {k: dict(vals) for k, vals in z.items()}
            moved[group] = {n: a + sign * eps * v[n] if n in v else a
                            for n, a in z[group].items()}
            gm = _first_order(fn, moved, lengths)
            side.append(sum(_dot(gm[k], u[k]) for k in u))
        found.append((group, _dot(cotangents[group], v), (side[0] - side[1]) / (2 * eps)))
    return found
