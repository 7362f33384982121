"""Random cells built to stress algebraic rewrites, from an integer seed.

``generate(seed)`` draws a :class:`~tests.fuzz.spec.CellSpec` from
``numpy.random.default_rng(seed)``: the same seed always gives the same cell, which
``spec.source`` prints as the Python a user would type and ``spec.build`` runs.

The draws are motifs that rewrites look for and have got wrong: a bias added twice, the same
matmul twice (``x0 @ W0 + x0 @ W0``), long sums with repeated terms, a temporary shared by two
gates and a state, gate families over shared operands (gate fusion), ``concat([x, h]) @ W`` and
its slices, slices of concatenations across part boundaries, reductions, ``where``, constants
on either side (``2.0 - v``, ``1.0 - (1.0 - v)``), negation, division, ``exp``/``log``/
``sqrt``/``rsqrt`` on safe domains, parameter-only expressions, two or three states, outputs
that are not states, several inputs, and rare edge cases (a state swap, a state kept as is, an
output that is an input or a previous state).

Values stay bounded so float32 results are comparable with a float64 oracle: every temporary
carries a magnitude bound, anything past ``LIMIT`` goes through ``tanh``, denominators are
``1 + exp(v)`` or ``sigmoid(v) + 0.5``, logs and square roots take ``v * v + c`` or a sigmoid
plus a constant, and states are updated through ``tanh``, a convex mix or ``where`` of bounded
values, so they stay in (-1, 1) over any number of steps.
"""

from __future__ import annotations

import numpy as np

from tests.fuzz.generator import Generator, Pooled
from tests.fuzz.motifs import MOTIFS, finish
from tests.fuzz.spec import CellSpec, var


def generate(seed: int) -> CellSpec:
    """The random cell of ``seed`` (deterministic)."""
    g = Generator(np.random.default_rng(seed))
    for k in range(int(g.rng.choice([1, 1, 2, 3]))):
        name, width = f"x{k}", int(g.rng.integers(1, 6))
        g.inputs.append((name, width))
        g.pool.append(Pooled(var(name), width, 3.0))
    n_states = int(g.rng.choice([1, 2, 2, 3]))
    for k in range(n_states):
        # Now and then a state wide enough for the LLVM backend's own small-batch GEMM.
        width = int(g.rng.choice([1, 2, 3, 4, 5, 16])) if g.chance(0.95) else 32
        g.states.append((f"s{k}", width))
        g.pool.append(Pooled(var(f"s{k}"), width, 1.0))
    names = list(MOTIFS)
    weights = np.array([MOTIFS[n][1] for n in names], float)
    for _ in range(int(g.rng.integers(2, 5))):
        MOTIFS[names[int(g.rng.choice(len(names), p=weights / weights.sum()))]][0](g)
    return finish(g)
