"""Names the compiler gives values in a program's environment: one constructor per kind, one
parser for all of them.

A user's inputs, states, parameters and outputs are Python identifiers (``rnnc.dsl`` checks
it). Every name the compiler makes up contains a dot or a bar (``h.final``, ``save.0``,
``d.y``, ``grad.W``, ``hoist.0``, ``W_i|W_f``), so it can never be a user's name, and a pass
that asks "did I already run?" by looking for its own name cannot be fooled by one.

Names nest: the gradient of the cotangent of ``y`` is ``grad.d.y``; :func:`parse` takes off
the outermost layer, so ``parse("grad.d.y")`` is ``(Role.GRADIENT, "d.y")``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import NamedTuple


class Role(str, Enum):
    """What a name in a program's environment holds.

    ``INPUT`` to ``COTANGENT`` are the roles of a program's args (``Program.args``); the others
    are values a program computes. A user's name carries no role in its text: the role of
    ``x`` is whatever the program's args or the cell say.
    """

    INPUT = "input"  # a per-step sequence the caller passes, [T,B,n]
    STATE = "state"  # the initial value of a carried state, [B,n]
    PARAM = "param"  # a parameter or a packed block of parameters
    MASK = "mask"  # len.mask: 1.0 while a step is inside its sequence's length
    SAVED = "saved"  # save.N: a per-step value a training forward stacked for backward
    COTANGENT = "cotangent"  # d.NAME: the gradient flowing in for NAME
    OUTPUT = "output"  # a user's per-step output, stacked into [T,B,n]
    FINAL = "final"  # NAME.final: a carried state after the last step
    GRADIENT = "gradient"  # grad.NAME: a gradient a backward program returns
    HOISTED = "hoisted"  # hoist.N: computed before the loop, read by it
    SUNK = "sunk"  # sink.N: stacked by the loop so that the post-loop graph can finish it
    PACKED = "packed"  # A|B|...: parameters packed side by side along the last axis
    RANDOM = "random"  # rng.key, rng.counter: what the random masks of a call are drawn from

    def __str__(self) -> str:
        return self.value


MASK = "len.mask"  # f[T,B,1]: 1.0 while step t is inside its sequence's length, else 0.0
# The args of a cell that draws random masks (rnnc.philox): the call's seed, f[4], and the
# step and batch row of each row of each step, f[T,B,4], as 16-bit halves of 32-bit words.
RNG_KEY = "rng.key"
RNG_COUNTER = "rng.counter"

_FINAL = ".final"
_PACK = "|"
# Roles written as "prefix.rest", in the order parse tries them.
_PREFIXES: dict[str, Role] = {"d.": Role.COTANGENT, "grad.": Role.GRADIENT,
                              "save.": Role.SAVED, "hoist.": Role.HOISTED, "sink.": Role.SUNK}


def final_state(state: str) -> str:
    """The value of the carried ``state`` after the last step: ``h.final``."""
    return state + _FINAL


def cotangent(name: str) -> str:
    """The gradient of the loss flowing in for ``name``: ``d.y``, ``d.h.final``."""
    return "d." + name


def gradient(name: str) -> str:
    """The gradient a backward program returns for ``name``: ``grad.W``, ``grad.x``."""
    return "grad." + name


def saved(index: int) -> str:
    """The ``index``-th value a training forward stacks for backward: ``save.0``."""
    return f"save.{index}"


def hoisted(index: int) -> str:
    """The ``index``-th value hoist-sequence computes before the loop: ``hoist.0``."""
    return f"hoist.{index}"


def sunk(index: int) -> str:
    """The ``index``-th value the loop stacks for the post-loop graph: ``sink.0``."""
    return f"sink.{index}"


def packed(members: Iterable[str]) -> str:
    """The block of parameters ``members`` side by side: ``W_i|W_f``."""
    return _PACK.join(members)


# A fused region's operands and results have names of their own, local to the region (they are
# never in a program's environment, so they need no role).


def region_input(index: int) -> str:
    """Operand ``index`` of a fused region, inside the region: ``in0``."""
    return f"in{index}"


def region_output(index: int) -> str:
    """Result ``index`` of a fused region, inside the region: ``out0``."""
    return f"out{index}"


class Name(NamedTuple):
    """A compiler-made name taken apart: its role and what it is made of.

    ``base`` is the name it is about (``d.y`` -> ``"y"``, ``h.final`` -> ``"h"``), the
    decimal index (``save.3`` -> ``"3"``), or the members joined (``W_i|W_f``)."""

    role: Role
    base: str


def parse(name: str) -> Name | None:
    """The outermost layer of a compiler-made ``name``; None for a user's name."""
    if name == MASK:
        return Name(Role.MASK, name)
    if name in (RNG_KEY, RNG_COUNTER):
        return Name(Role.RANDOM, name)
    for prefix, role in _PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return Name(role, name[len(prefix):])
    if name.endswith(_FINAL) and len(name) > len(_FINAL):
        return Name(Role.FINAL, name[:-len(_FINAL)])
    if _PACK in name:
        return Name(Role.PACKED, name)
    return None


def role_of(name: str) -> Role | None:
    """The role a compiler-made ``name`` says it has; None for a user's name."""
    parsed = parse(name)
    return parsed.role if parsed is not None else None


def is_saved(name: str) -> bool:
    """Whether ``name`` is a ``save.N``."""
    parsed = parse(name)
    return parsed is not None and parsed.role is Role.SAVED and parsed.base.isdigit()


def next_saved(taken: Iterable[str]) -> int:
    """One past the largest ``N`` of a ``save.N`` in ``taken`` (0 if there is none)."""
    return max((int(parse(n).base) for n in taken if is_saved(n)), default=-1) + 1


def fresh(taken: set[str], make: Callable[[int], str]) -> Iterator[str]:
    """The names ``make(N)`` not in ``taken``, N increasing, each added to ``taken`` as it is
    given. ``taken`` only grows, so the search goes on from the last name given: n names take
    O(n) look-ups, not O(n**2) (a pass hoists one value per step of a long chain)."""
    k = 0
    while True:
        while make(k) in taken:
            k += 1
        taken.add(make(k))
        yield make(k)
