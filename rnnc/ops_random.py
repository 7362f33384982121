"""The random family: ``bernoulli``, the op behind ``rnnc.bernoulli``, a 0.0/1.0 mask drawn by
Philox4x32-10, declared with its shape rule, NumPy reference, VJP and docstring.

``bernoulli[p, per, size, stream](key, counter)`` reads the program args ``rng.key`` (``[4]``)
and ``rng.counter`` (``[B,4]`` per step) that ``rnnc.philox`` describes. Element ``(r, j)``
of its ``[B, size]`` result is 1.0 where the first Philox word of the counter

    (b_r * size + j, t_r if per == "step" else 0, stream, 0)

under the key is below ``threshold(p)``, with ``t_r`` and ``b_r`` row ``r`` of ``counter``.
``stream`` tells apart the calls of one cell. A row's draw depends on its own counter row
only, never on its position, so the op means the same over ``[T,B,4]`` as over ``[B,4]``.
The mask passes no gradient, like a comparison. It is elementwise as backends and fusion see it
(one loop or kernel over its result), though element ``(r, j)`` reads row ``r`` of
``rng.counter``, all of ``rng.key`` and its own column index ``j``; ``random=True`` keeps it in
the loop body and makes autodiff draw it again instead of saving it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rnnc import philox
from rnnc.errors import ShapeError
from rnnc.op_types import Op, OpKind, fmt_shape, register

Shape = tuple[Any, ...]


def bernoulli_shape(key: Shape, counter: Shape, p: float, per: str, size: int,
                    stream: int) -> Shape:
    if tuple(key) != (4,) or len(counter) < 1 or counter[-1] != 4:
        raise ShapeError(f"bernoulli reads rng.key [4] and rng.counter [...,4], got "
                         f"{fmt_shape(key)}, {fmt_shape(counter)}")
    if per not in philox.PER:
        raise ShapeError(f"bernoulli's per must be one of {philox.PER}, got {per!r}")
    return tuple(counter[:-1]) + (size,)


def bernoulli_ref(key: np.ndarray, counter: np.ndarray, p: float, per: str, size: int,
                  stream: int) -> np.ndarray:
    key, counter = np.asarray(key), np.asarray(counter)
    words = philox.join(key[0::2], key[1::2])
    t = philox.join(counter[..., 0], counter[..., 1])
    b = philox.join(counter[..., 2], counter[..., 3])
    bits = philox.mask_bits((int(words[0]), int(words[1])), t, b, size, p, stream, per)
    return bits.astype(np.result_type(key, counter))


def _vjp_bernoulli(e, g, xs, y, **attrs: Any):
    return None, None


# rnnc.bernoulli(p, like, ...) takes attributes, not operands: rnnc/dsl_random.py writes it.
bernoulli = register(Op("bernoulli", OpKind.ELEMENTWISE, 2, bernoulli_shape, bernoulli_ref,
                        _vjp_bernoulli, random=True,
                        doc="A 0.0/1.0 mask, 1.0 with probability ``p``, drawn by Philox from "
                            "``rng.key`` and ``rng.counter``; no gradient."))
