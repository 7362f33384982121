"""Names the compiler gives values in a program's environment.

A user's inputs, states, parameters and outputs are Python identifiers (``rnnc.dsl`` checks
it). Every name the compiler makes up contains a dot (``h.final``, ``save.0``, ``d.y``,
``grad.W``, ``hoist.0``), so it can never be a user's name, and a pass that asks "did I already
run?" by looking for its own name cannot be fooled by one.
"""

from __future__ import annotations

MASK = "len.mask"  # f[T,B,1]: 1.0 while step t is inside its sequence's length, else 0.0
