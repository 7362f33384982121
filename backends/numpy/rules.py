"""NumPy rules: each primitive runs its own reference implementation.

``linear_scan``'s reference is a sequential loop over the steps, each step vectorized over the
batch and the features; :func:`linear_scan_log_depth` computes the same recurrence in
``log2(T)`` rounds (Hillis-Steele over affine maps), the form a parallel backend would take,
and the tests hold the two against each other.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rnnc import ops
from rnnc.ops_scan import steps

RULES: dict[ops.Op, Callable] = {op: op.ref for op in ops.PRIMITIVES}


def linear_scan_log_depth(a, b, c0, reverse: bool = False, exclusive: bool = False
                          ) -> np.ndarray:
    """``linear_scan`` as an inclusive Hillis-Steele scan of the maps ``c -> A[t] c + Bv[t]``.

    Composing step ``s``'s map after step ``r``'s gives ``(A[s] A[r], A[s] Bv[r] + Bv[s])``;
    round ``k`` composes each step with the one ``2**k`` before it. Folding ``c0`` into the
    first step's offset first makes each step's offset, at the end, the value after it."""
    c0 = np.asarray(c0)
    shape = (steps(a, b, c0),) + c0.shape
    dtype = np.result_type(a, b, c0)
    A = np.array(np.broadcast_to(a, shape), dtype)
    Bv = np.array(np.broadcast_to(b, shape), dtype)
    if reverse:
        A, Bv = A[::-1].copy(), Bv[::-1].copy()
    Bv[0] = A[0] * c0 + Bv[0]
    k = 1
    while k < shape[0]:
        Bv[k:], A[k:] = A[k:] * Bv[:-k] + Bv[k:], A[k:] * A[:-k]
        k *= 2
    if exclusive:
        Bv = np.concatenate([c0[None].astype(dtype), Bv[:-1]])
    return Bv[::-1].copy() if reverse else Bv
