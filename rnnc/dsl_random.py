"""Random masks in a cell: ``rnnc.bernoulli`` and the program args it reads.

The first ``rnnc.bernoulli`` of a cell adds the args ``rng.key`` (the call's seed) and
``rng.counter`` (each row's step and batch index) to its graph; ``Cell.program`` declares them
(role ``random``), and a call of the compiled function makes them from its ``seed=``
(``rnnc.philox.random_env``). Each call of ``rnnc.bernoulli`` in a cell gets its own stream
number, so two masks of one step differ.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rnnc import ops, philox
from rnnc.errors import RnncTypeError, RnncValueError, ShapeError
from rnnc.ir import Graph, Type
from rnnc.names import RNG_COUNTER, RNG_KEY, Role

# The args a random cell reads, with their per-step shapes and their place in the scan.
ARGS = {RNG_KEY: ((4,), "const"), RNG_COUNTER: (("B", 4), "seq")}


def bernoulli(p: float, like: Any, per: str = "step") -> Any:
    """A 0.0/1.0 mask of ``like``'s per-step shape ``(B, n)``: 1.0 with probability ``p``.

    ``per="step"`` draws a new mask every step; ``per="sequence"`` one mask that every step of
    a sequence shares (variational dropout). Masks come from the counter-based generator
    Philox4x32-10 keyed by the ``seed=`` of the call (``rnnc.philox``): the same seed gives the
    same masks on every backend, in float32 and float64, and backward regenerates them instead
    of saving them. No gradient flows through a mask (like a comparison). A cell that calls it
    needs ``seed=`` at every call."""
    from rnnc.dsl import Value, _user_location

    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise RnncTypeError(f"bernoulli's p must be a Python number in [0, 1], got "
                            f"{type(p).__name__} {p!r} (at {_user_location()})")
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        raise RnncValueError(f"bernoulli's p is the probability of a 1.0: a number in [0, 1], "
                             f"got {p!r} (at {_user_location()})")
    if per not in philox.PER:
        raise RnncValueError(f"bernoulli's per must be 'step' (a new mask every step) or "
                             f"'sequence' (one mask per sequence), got {per!r} "
                             f"(at {_user_location()})")
    if not isinstance(like, Value):
        raise RnncTypeError(f"bernoulli's like= must be a traced rnnc value whose shape the "
                            f"mask takes, got {type(like).__name__} (at {_user_location()})")
    if len(like.shape) != 2 or like.shape[0] != "B":
        raise ShapeError(f"bernoulli's like= must be a per-step value [B,n], got "
                         f"{ops.fmt_shape(like.shape)} (at {_user_location()})")
    cell, graph = like.cell, like.cell.graph
    stream = sum(1 for node in graph.nodes() if node.op is ops.bernoulli)
    attrs = {"p": float(p), "per": per, "size": like.shape[1], "stream": stream}
    nid = graph.add(ops.bernoulli, _args(graph), attrs, loc=_user_location())
    return Value(cell, nid)


def _args(graph: Graph) -> tuple[int, int]:
    """The graph's ``rng.key`` and ``rng.counter`` nodes, made on first use."""
    have = graph.args()
    return tuple(have[name] if name in have else graph.arg(name, shape)
                 for name, (shape, _) in ARGS.items())


def program_args(body: Graph, dtype: str = "f32"
                 ) -> tuple[dict[str, tuple[Role, Type]], tuple[str, ...], tuple[str, ...]]:
    """The random args ``body`` reads: their declarations, and the scan's sequences and
    constants among them (all empty for a cell without masks)."""
    names = [name for name in ARGS if name in body.args()]
    args = {}
    for name in names:
        shape, binding = ARGS[name]
        args[name] = (Role.RANDOM, Type(dtype, ("T",) + shape if binding == "seq" else shape))
    seqs = tuple(n for n in names if ARGS[n][1] == "seq")
    return args, seqs, tuple(n for n in names if ARGS[n][1] == "const")


def draws_masks(args: Any) -> bool:
    """Whether a program with ``args`` (its ``Program.args``) reads random args."""
    return any(name in args for name in ARGS)
