"""Central differences: the independent oracle for gradients in the tests."""

from __future__ import annotations

from collections.abc import Callable

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
