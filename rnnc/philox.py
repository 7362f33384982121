"""Philox4x32-10, the counter-based generator behind ``rnnc.bernoulli``, in NumPy.

Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), as in
the Random123 library: a 128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)``
give four 32-bit words after ten rounds; the same counter and key always give the same words,
so any element of any step can be drawn by itself, in any order, on any device.

A mask element is 1.0 where the first word is below ``threshold(p) = round(p * 2**32)``
(clamped to ``[0, 2**32]``), with the counter

    (element index in the step b * n + j, step t (0 for a mask per sequence), stream, 0)

and the key the call's 64-bit seed. The numbers are exact integers on every backend, so
NumPy, LLVM and CUDA draw the same bits and float32 and float64 the same masks.

A program carries the seed and the counter's per-row part as two args of its dtype, each
32-bit word split into 16-bit halves (exact in float32): ``rng.key``, ``f[4]`` = the halves of
``k0`` and ``k1``, and ``rng.counter``, ``f[T,B,4]`` = the halves of ``t`` and of the batch
row ``b`` (:func:`random_env` makes both from a seed). Each row reading its own ``b`` keeps an
element's draw independent of how a backend splits the batch between threads.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.names import RNG_COUNTER, RNG_KEY

# Random123's multipliers and Weyl key increments for Philox4x32.
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF
PER = ("step", "sequence")  # rnnc.bernoulli(..., per=...): a new mask every step, or one
SEED_LIMIT = 2**64


def _mulhilo(m: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 32-bit words of ``m * x`` (64-bit product)."""
    product = np.uint64(m) * x.astype(np.uint64)
    return (product >> np.uint64(32)).astype(np.uint32), (product & np.uint64(MASK32)).astype(
        np.uint32)


def philox4x32(counter: tuple[Any, Any, Any, Any], key: tuple[int, int],
               rounds: int = ROUNDS) -> tuple[np.ndarray, ...]:
    """The four output words of Philox4x32 for ``counter`` (four uint32 arrays or ints, which
    broadcast) and ``key`` (two ints), after ``rounds`` rounds."""
    shape = np.broadcast_shapes(*(np.shape(c) for c in counter))
    c0, c1, c2, c3 = (np.broadcast_to(np.asarray(c, np.uint64) & np.uint64(MASK32), shape)
                      .astype(np.uint32) for c in counter)
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    for r in range(rounds):
        if r:  # the key advances before every round but the first
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
    return c0, c1, c2, c3


def threshold(p: float) -> int:
    """The integer a first output word must be below for a 1.0: round(p * 2**32), clamped."""
    return min(max(round(float(p) * 2**32), 0), 2**32)


def check_seed(seed: Any) -> int:
    """``seed`` as an int in ``[0, 2**64)``, or an RnncError saying what a seed must be."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise RnncTypeError(f"seed must be an integer in [0, 2**64), got "
                            f"{type(seed).__name__} {seed!r}")
    seed = operator.index(seed)
    if not 0 <= seed < SEED_LIMIT:
        raise RnncValueError(f"seed must be an integer in [0, 2**64), got {seed}")
    return seed


def key_words(seed: int) -> tuple[int, int]:
    """The Philox key of a 64-bit seed: its low and high 32-bit words."""
    return seed & MASK32, seed >> 32


def halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high 16-bit halves of 32-bit words."""
    words = np.asarray(words, np.int64)
    return words & 0xFFFF, words >> 16


def join(low: Any, high: Any) -> np.ndarray:
    """32-bit words from their 16-bit halves held as floats."""
    return (np.asarray(low).astype(np.uint32) | (np.asarray(high).astype(np.uint32) << 16))


def random_env(seed: int, T: int, B: int, dtype: Any) -> dict[str, np.ndarray]:
    """``rng.key`` and ``rng.counter`` of a call with ``seed`` over ``T`` steps of ``B`` rows."""
    key = np.concatenate([np.array(halves(w)) for w in key_words(seed)]).astype(dtype)
    t = np.broadcast_to(np.arange(T)[:, None], (T, B))
    b = np.broadcast_to(np.arange(B)[None, :], (T, B))
    counter = np.stack([*halves(t), *halves(b)], axis=-1).astype(dtype)
    return {RNG_KEY: key, RNG_COUNTER: counter}


def mask_bits(key: tuple[int, int], t: Any, rows: Any, size: int, p: float, stream: int,
              per: str) -> np.ndarray:
    """The 0/1 mask (bool) of rows ``rows`` (batch indices, any shape) at step(s) ``t``
    (broadcasting with ``rows``), ``size`` columns: shape ``rows.shape + (size,)``."""
    rows = np.asarray(rows, np.uint64)[..., None]
    index = (rows * np.uint64(size) + np.arange(size, dtype=np.uint64)) & np.uint64(MASK32)
    step = np.asarray(t, np.uint64)[..., None] if per == "step" else 0
    first = philox4x32((index, step, stream, 0), key)[0]
    return first.astype(np.uint64) < np.uint64(threshold(p)) if threshold(p) < 2**32 else \
        np.ones(first.shape, bool)


def mask(seed: int, t: int, batch: int, size: int, p: float, stream: int, per: str = "step",
         dtype: Any = np.float64) -> np.ndarray:
    """The ``(batch, size)`` mask ``rnnc.bernoulli(p, per=per)`` draws at step ``t`` as the
    ``stream``-th call in its cell, for a call with ``seed``: the reference."""
    return mask_bits(key_words(seed), t, np.arange(batch), size, p, stream, per).astype(dtype)
