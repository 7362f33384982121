"""Second derivatives of a compiled function: the derivative of its backward.

:func:`double_backward` is :meth:`rnnc.api.Function.double_backward`; it runs the backward of
the backward program and the forward's backward through the values the forward saved.

A module of its own, not a part of ``rnnc.api``: a second derivative is a client of a compiled
function, not a way of running one. It needs only the public hooks that :class:`Function`
below names (the runners of the second-order modes, the saved values, the cotangents flowing
in, and how gradients sum), like ``rnnc.check`` does, and ``tests/test_architecture.py``
checks that neither reaches a private attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from rnnc import validate
from rnnc.errors import RnncValueError
from rnnc.grads import NP, Grads, Tape, cotangent_env, cotangents, input_cotangents
from rnnc.layout import Layout
from rnnc.names import cotangent, final_state, gradient


class Function(Protocol):
    """The public hooks of :class:`rnnc.api.Function` that second derivatives run through."""

    inputs: Mapping[str, tuple]
    states: Mapping[str, tuple]
    params: Mapping[str, tuple]
    no_grad: tuple[str, ...]
    layout: Layout

    def runner(self, mode: str, dtype: str, masked: bool) -> Any: ...
    def saved_names(self, mode: str, dtype: str, masked: bool) -> tuple[str, ...]: ...
    def upstream(self, tape: Tape, d_outputs: Any, d_states: Any
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]: ...
    def sum_grads(self, tape: Tape, results: tuple[Mapping[str, np.ndarray], ...],
                  states: Mapping[str, np.ndarray]) -> Grads: ...
    def zero_grads(self, tape: Tape, d_st: dict[str, np.ndarray]) -> Grads: ...


def double_backward(fn: Function, tape: Tape, d_outputs: Mapping[str, Any] | None,
                    d_states: Mapping[str, Any] | None, g_x: Mapping[str, Any] | None,
                    g_params: Mapping[str, Any] | None, g_states: Mapping[str, Any] | None
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Grads]:
    """The derivative of ``backward(tape, d_outputs, d_states)``.

    ``g_x`` (by input name; none for an input declared ``grad=False``), ``g_params`` and
    ``g_states`` are cotangents of the ``Grads`` that backward returns (omitted entries
    are zero). Returns the cotangents of
    backward's arguments: ``(of d_outputs, of d_states, Grads)``, where ``Grads`` holds
    those of the forward's ``x``, ``params`` and initial ``states``. The backward reads
    them directly and through the values the forward saved, so this runs the backward of
    the backward program ("backward.backward"), then the forward's backward with the
    saved values' cotangents ("forward.backward"), each after the training forward
    ("backward.forward", "forward.forward") that saves what it reads.
    """
    if not isinstance(tape, Tape) or tape.owner is not fn:
        raise RnncValueError("double_backward() takes a tape from this function's forward()")
    if tape.device is not None:
        raise RnncValueError("double_backward() of a device call is not supported: run "
                             "forward() on NumPy arrays to take second derivatives")
    dtype, T, B = tape.dtype, tape.T, tape.B
    d_out, d_st = fn.upstream(tape, d_outputs, d_states)
    u_x = input_cotangents(fn.inputs, fn.no_grad, g_x, dtype, T, B)
    u_st = cotangents("g_states cotangent", fn.states, g_states, dtype, T, B)
    u_given = validate.named_arrays("g_params cotangent", fn.params, g_params, dtype,
                                    None, False)
    u_flat = fn.layout.pack({n: u_given.get(n, np.zeros(s, NP[dtype]))
                             for n, s in fn.params.items()}, NP[dtype])
    if T == 0:  # backward passed d_states through: so does its derivative
        zero = fn.zero_grads(tape, {s: np.zeros_like(v) for s, v in d_st.items()})
        return ({n: np.zeros_like(v) for n, v in d_out.items()}, u_st, zero)
    u_params = fn.layout.block_views(u_flat)
    direct = _backward_of_backward(fn, tape, cotangent_env(d_out, d_st),
                                        {**u_x, **u_st, **u_params})
    through = _backward_through_saves(fn, tape, d_out, d_st, direct)
    dd_out = {n: direct.get(gradient(cotangent(n)), np.zeros_like(v))
              for n, v in d_out.items()}
    dd_st = {s: direct.get(gradient(cotangent(final_state(s))), np.zeros_like(v))
             for s, v in d_st.items()}
    return dd_out, dd_st, fn.sum_grads(tape, (direct, through), through)

def _second_order(fn: Function, mode: str, tape: Tape, env: dict[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """Run the second-order ``mode`` ("a.backward") on ``env`` after "a.forward" has
    stacked what it reads."""
    masked, dims = tape.lengths is not None, {"T": tape.T, "B": tape.B}
    writer = mode.rsplit(".", 1)[0] + ".forward"
    stacked = fn.runner(writer, tape.dtype, masked)(env, dims)
    env = {**env, **{n: stacked[n] for n in fn.saved_names(writer, tape.dtype, masked)}}
    return fn.runner(mode, tape.dtype, masked)(env, dims)

def _backward_of_backward(fn: Function, tape: Tape, cotangents: dict[str, np.ndarray],
                          of_grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The backward program's own backward: given the cotangents ``of_grads`` of its
    results (by the names of what they are gradients of), the gradients of its inputs."""
    env = {**tape.env, **cotangents}
    env.update({cotangent(gradient(n)): v for n, v in of_grads.items()})
    return _second_order(fn, "backward.backward", tape, env)

def _backward_through_saves(fn: Function, tape: Tape, d_out: dict[str, np.ndarray],
                            d_st: dict[str, np.ndarray], direct: Mapping[str, np.ndarray]
                            ) -> dict[str, np.ndarray]:
    """The forward's backward given the cotangents ``direct`` found for its saved values:
    how they flow back to x, params and states."""
    zeros = cotangent_env({n: np.zeros_like(v) for n, v in d_out.items()},
                           {n: np.zeros_like(v) for n, v in d_st.items()})
    saved = fn.saved_names("forward", tape.dtype, tape.lengths is not None)
    env = {**tape.env, **zeros}
    env.update({cotangent(n): direct.get(gradient(n), np.zeros_like(tape.env[n]))
                for n in saved})
    return _second_order(fn, "forward.backward", tape, env)
