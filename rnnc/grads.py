"""What training returns and takes: the tape of a training forward, the gradients of a
backward, and the cotangents flowing into a backward program."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnc import validate
from rnnc.errors import RnncValueError
from rnnc.names import cotangent, final_state

NP = {"f32": np.float32, "f64": np.float64}


@dataclass
class Tape:
    """What a training forward saved for backward. Usable any number of times.

    Like PyTorch's saved tensors, a tape refers to the caller's input and parameter arrays
    (the values rnnc saved itself are read-only): changing those in place between forward
    and backward gives wrong gradients."""

    owner: Any  # the rnnc.Function whose forward recorded it
    dtype: str
    T: int
    B: int
    env: dict[str, np.ndarray]  # with rng.key and rng.counter when the cell draws masks
    lengths: np.ndarray | None
    seed: int | None = None  # the forward's seed: backward draws the same masks from it
    device: Any = None  # a device call's device (rnnc.device.Device): env lives there


@dataclass
class Grads:
    """Gradients: ``x``, ``params``, ``states``.

    ``x`` is an array for a cell with one input (None when that input is declared
    ``grad=False``) and an :class:`InputGrads` dict by name for a cell with several, holding
    the differentiable inputs only."""

    x: Any
    params: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    flat: np.ndarray | None = None


class InputGrads(dict):
    """The gradients of a cell's inputs by name. An input declared ``grad=False`` has none:
    it is not a key, and ``grads[name]`` raises an RnncValueError that says so."""

    def __init__(self, grads: Mapping[str, np.ndarray], no_grad: tuple[str, ...]) -> None:
        super().__init__(grads)
        self.no_grad = no_grad

    def __missing__(self, name: str) -> Any:
        if name in self.no_grad:
            raise RnncValueError(no_gradient(name))
        raise KeyError(name)


def no_gradient(name: str) -> str:
    """Why input ``name``, declared grad=False, has no gradient."""
    return (f"input {name!r} is declared grad=False (c.input({name!r}, n, grad=False)): rnnc "
            f"computes no gradient for it; declare it with grad=True to get one")


def cotangent_env(d_out: Mapping[str, np.ndarray], d_st: Mapping[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """The cotangent inputs of a backward program: ``d.<output>`` and ``d.<state>.final``."""
    env = {cotangent(n): v for n, v in d_out.items()}
    env.update({cotangent(final_state(n)): v for n, v in d_st.items()})
    return env


def cotangents(kind: str, shapes: Mapping[str, tuple], given: Any, dtype: str, T: int, B: int,
               device: Any = None) -> dict[str, np.ndarray]:
    """Upstream gradients by name; omitted entries are zero (on ``device`` in a device
    call)."""
    concrete = {n: tuple(T if d == "T" else B if d == "B" else d for d in s)
                for n, s in shapes.items()}
    out = validate.named_arrays(kind, concrete, given, dtype, B, False, device=device)
    zeros = np.zeros if device is None else device.zeros
    return {n: out[n] if n in out else zeros(s, NP[dtype]) for n, s in concrete.items()}


def input_cotangents(inputs: Mapping[str, tuple], no_grad: tuple[str, ...], given: Any,
                     dtype: str, T: int, B: int) -> dict[str, np.ndarray]:
    """The cotangents of the input gradients a backward returned, by input name (omitted ones
    zero); one for an input declared grad=False, which has no gradient, is refused."""
    if isinstance(given, Mapping):
        for name in no_grad:
            if given.get(name) is not None:
                raise RnncValueError(f"g_x cotangent {name!r} given, but "
                                     f"{no_gradient(name)}: leave it out")
        given = {n: v for n, v in given.items() if n not in no_grad}
    shapes = {n: ("T", "B", s[-1]) for n, s in inputs.items() if n not in no_grad}
    return cotangents("g_x cotangent", shapes, given, dtype, T, B)
