"""The backward paths of ``rnnc.RNN``: gradients, and the derivative of the gradients.

Both compose the compiled cells' own ``backward`` and ``double_backward`` the way the forward
run composes the cells: layer by layer, each direction through its own compiled function (the
reverse direction's runs backwards in time itself), through the dropout masks.

The backward of a device call's tape runs its glue on the device too (``rnnc.layers.arrays``):
cotangents given as host arrays are uploaded, gradients are device arrays. Double backward
runs on the host only, as ``Function.double_backward`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rnnc.api import Grads
from rnnc.errors import RnncTypeError, RnncValueError
from rnnc.layers import checks
from rnnc.layers.arrays import Arrays
from rnnc.layers.checks import Grid
from rnnc.layers.run import LayerTape, reads_extra
from rnnc.layers.stack import LayerStack

States = dict[str, np.ndarray]


@dataclass
class LayerGrads:
    """Gradients: ``x`` shaped like the input, ``params[layer][direction]``, ``states`` and
    ``extra`` (each extra input's, shaped like it, summed over the layers that read it; zero
    for an input the cell declares ``grad=False``)."""

    x: np.ndarray
    params: Grid
    states: dict[str, np.ndarray]
    extra: dict[str, np.ndarray] = field(default_factory=dict)


class _Paths:
    """How one tape's arrays reach its cells: time order per direction, lengths, dropout."""

    def __init__(self, layer: LayerStack, tape: LayerTape, ops: Arrays | None = None) -> None:
        self.layer, self.tape = layer, tape
        self.ops = Arrays(tape.device) if ops is None else ops
        self.valid = self.ops.valid_steps(tape.T, tape.lengths)

    def time_major(self, a: np.ndarray) -> np.ndarray:
        """``(T, B, ...)`` from the layer's layout (its own inverse)."""
        return a.transpose(1, 0, 2) if self.layer.batch_first else a

    def output_cotangent(self, g: np.ndarray, d: int) -> np.ndarray:
        """Direction ``d``'s part of a layer output's cotangent, as its cell sees it."""
        H = self.layer.output_size
        return self.ops.contiguous(self.zero_past(g[:, :, d * H:(d + 1) * H]))

    def zero_past(self, a: np.ndarray) -> np.ndarray:
        """``a`` with the steps past each sequence's length set to zero."""
        return self.ops.zero_past_lengths(a, self.valid)

    def dropout(self, k: int, g: np.ndarray) -> np.ndarray:
        """``g`` through the dropout mask after layer ``k`` (none after the last)."""
        mask = self.tape.dropout_masks[k] if k < self.layer.num_layers - 1 else None
        return g if mask is None else g * mask

    def extra_grads(self) -> States:
        """Zero gradients of the extra inputs, time-major, to add each layer's to."""
        return {n: self.ops.zeros_like(a) for n, a in self.tape.extra.items()}

    def add_x(self, k: int, gx: Any, into: np.ndarray, extra: States | None) -> None:
        """Add a cell's input gradient ``gx`` (a dict when it has extra inputs) to ``into``
        and, when layer ``k`` reads the caller's extra inputs, theirs to ``extra``."""
        if not isinstance(gx, Mapping):
            if gx is not None:  # None: the cell's one input is declared grad=False
                into += gx
            return
        # An input declared grad=False (c.input(..., grad=False)) has no gradient: it adds
        # nothing, so its LayerGrads entry stays zero.
        if self.layer.input_name in gx:
            into += gx[self.layer.input_name]
        if extra is not None and reads_extra(self.layer, k):
            for n in extra:
                if n in gx:
                    extra[n] += gx[n]

    def layer_backward(self, k: int, g_out: np.ndarray, d_states: Mapping[str, np.ndarray],
                       into: np.ndarray | None = None, extra: States | None = None
                       ) -> tuple[np.ndarray, list[Grads]]:
        """Backward through layer ``k`` given its output's cotangent (before dropout) and the
        final states' ``(L*D, B, *shape)``: its input's cotangent (added to ``into`` when given)
        and each direction's Grads; the extra inputs' cotangents are added to ``extra``."""
        layer, tape, D = self.layer, self.tape, self.layer.num_directions
        g_out = self.dropout(k, g_out)
        gx = self.ops.zeros((tape.T, tape.B, layer.layer_input_size(k)), tape.dtype) \
            if into is None else into
        grads = []
        for d in range(D):
            # the function that recorded the tape: its precision may not be the layer's now
            g = tape.tapes[k][d].owner.backward(
                tape.tapes[k][d], {layer.output_name: self.output_cotangent(g_out, d)},
                {n: d_states[n][k * D + d] for n in layer.state_sizes})
            self.add_x(k, g.x, gx, extra)
            grads.append(g)
        return gx, grads

    def caller_extra(self, extra: States) -> States:
        """The extra inputs' gradients in the caller's layout, zero past the lengths."""
        return {n: self.ops.contiguous(self.time_major(self.zero_past(a)))
                for n, a in extra.items()}


def _check_tape(layer: LayerStack, tape: Any) -> LayerTape:
    if not isinstance(tape, LayerTape):
        raise RnncTypeError(f"backward() takes the tape from forward(train=True), got "
                            f"{type(tape).__name__}")
    if tape.owner is not layer:
        raise RnncValueError("this tape was recorded by another layer")
    return tape


def _zero_states(layer: LayerStack, B: int, dtype: np.dtype, ops: Arrays | None = None) -> States:
    LD = layer.num_layers * layer.num_directions
    ops = Arrays() if ops is None else ops
    return {n: ops.zeros((LD, B, *s), dtype) for n, s in layer.state_shapes.items()}


def backward_empty(layer: LayerStack, tape: LayerTape) -> LayerGrads:
    """Zero gradients for an empty batch: every parameter's gradient is a sum over none."""
    dtype, ops = tape.dtype, Arrays(tape.device)
    x_shape = (0, tape.T, layer.input_size) if layer.batch_first else \
        (tape.T, 0, layer.input_size)
    params = [[{n: ops.zeros(a.shape, dtype) for n, a in p.items()} for p in row]
              for row in layer.params]
    extra = {n: ops.zeros(x_shape[:2] + (s,), dtype) for n, s in layer.extra_sizes.items()}
    return LayerGrads(ops.zeros(x_shape, dtype), params, _zero_states(layer, 0, dtype, ops),
                      extra)


def backward(layer: LayerStack, tape: Any, d_y: Any, d_states: Any) -> LayerGrads:
    """The gradients of ``RNN.backward``: down the layers, each direction's cell backward."""
    tape = _check_tape(layer, tape)
    L, D, T, B = layer.num_layers, layer.num_directions, tape.T, tape.B
    ops = Arrays(tape.device)
    g_in = checks.check_d_y(layer, d_y, T, B, tape.dtype, ops)
    d_st = checks.check_states(layer, d_states, B, tape.dtype, "state gradient", ops=ops)
    if B == 0:
        layer.transfers = ops.transfers
        return backward_empty(layer, tape)
    paths = _Paths(layer, tape, ops)
    g_params: Grid = [[{} for _ in range(D)] for _ in range(L)]
    g_states = {n: ops.zeros((L * D, B, *s), tape.dtype)
                for n, s in layer.state_shapes.items()}
    g_extra = paths.extra_grads()
    for k in range(L - 1, -1, -1):
        g_in, grads = paths.layer_backward(k, g_in, d_st, extra=g_extra)
        for d, g in enumerate(grads):
            g_params[k][d] = g.params
            for n in layer.state_sizes:
                g_states[n][k * D + d] = g.states[n]
    gx = paths.time_major(paths.zero_past(g_in))
    layer.transfers = ops.transfers
    return LayerGrads(ops.contiguous(gx), g_params, g_states, paths.caller_extra(g_extra))


def double_backward(layer: LayerStack, tape: LayerTape, d_y: np.ndarray,
                    d_states: Mapping[str, np.ndarray], g_x: np.ndarray, g_params: Grid,
                    g_states: Mapping[str, np.ndarray],
                    g_extra: Mapping[str, np.ndarray] | None = None
                    ) -> tuple[np.ndarray, States, LayerGrads]:
    """The cotangents of ``RNN.double_backward``: of ``d_y``, ``d_states`` and, as
    ``LayerGrads``, of the forward's x, params, initial states and extra inputs.

    Each cell's part is ``Function.double_backward``; they compose as ``backward`` composes
    the cells' backward, in reverse: up the layers for what flows through the first
    backward's chain of ``d_y``, then down the layers for what reaches a layer's input,
    which the layer below computed.
    """
    if getattr(tape, "device", None) is not None:
        raise RnncValueError("double_backward of a device call's tape is not supported (nor is "
                             "Function.double_backward of a device call): run the forward on "
                             "host arrays for second derivatives")
    if tape.B == 0:
        grads = backward_empty(layer, tape)
        return np.zeros_like(d_y), {n: np.zeros_like(v) for n, v in d_states.items()}, grads
    paths = _Paths(layer, tape)
    d_out = _replay(paths, np.asarray(d_y), d_states)
    u_extra = {n: paths.zero_past(paths.time_major(np.asarray(g_extra[n])))
               if g_extra is not None and g_extra.get(n) is not None else np.zeros_like(a)
               for n, a in tape.extra.items()}
    c_d_y, c_d_states, c_inputs, c = _up(paths, d_out, d_states, (g_x, u_extra), g_params,
                                         g_states)
    _down(paths, c_inputs, c)
    c.x = np.ascontiguousarray(paths.time_major(paths.zero_past(c_inputs[0])))
    c.extra = paths.caller_extra(c.extra)
    return np.ascontiguousarray(paths.time_major(c_d_y)), c_d_states, c


def _replay(paths: _Paths, d_y: np.ndarray, d_states: Mapping[str, np.ndarray]
            ) -> list[np.ndarray]:
    """Replay the first backward down the layers: the cotangent of each layer's output."""
    L = paths.layer.num_layers
    d_out: list[np.ndarray] = [np.empty(0)] * L
    d_out[L - 1] = paths.time_major(d_y)
    for k in range(L - 1, 0, -1):
        d_out[k - 1], _ = paths.layer_backward(k, d_out[k], d_states)
    return d_out


def _up(paths: _Paths, d_out: list[np.ndarray], d_states: Mapping[str, np.ndarray],
        g_inputs: tuple[np.ndarray, States], g_params: Grid, g_states: Mapping[str, np.ndarray]
        ) -> tuple[np.ndarray, States, list[np.ndarray], LayerGrads]:
    """Up the layers: each cell's double backward, given what flows into its gradients
    (``g_inputs``: those of x, and of the extra inputs time-major).

    Returns the cotangents of ``d_y``, of ``d_states``, of each layer's input, and the
    parameters', initial states' and extra inputs' so far (``x`` still empty).
    """
    layer, tape = paths.layer, paths.tape
    L, D, H, out = layer.num_layers, layer.num_directions, layer.output_size, layer.output_name
    names = layer.state_sizes
    g_x, u_extra = g_inputs
    u = paths.zero_past(paths.time_major(np.asarray(g_x)))
    c = LayerGrads(np.empty(0), [[{} for _ in range(D)] for _ in range(L)],
                   _zero_states(layer, tape.B, tape.dtype), paths.extra_grads())
    c_d_states = _zero_states(layer, tape.B, tape.dtype)
    c_inputs: list[np.ndarray] = []
    for k in range(L):
        c_d_out = np.zeros((tape.T, tape.B, D * H), tape.dtype)
        c_inputs.append(np.zeros((tape.T, tape.B, layer.layer_input_size(k)), tape.dtype))
        for d in range(D):
            row, fn = k * D + d, layer.function(k, d)
            dd_out, dd_st, g = fn.double_backward(
                tape.tapes[k][d], {out: paths.output_cotangent(paths.dropout(k, d_out[k]), d)},
                {n: d_states[n][row] for n in names},
                {n: v for n, v in {layer.input_name: u,
                                   **(u_extra if reads_extra(layer, k) else {})}.items()
                 if n not in fn.no_grad},
                g_params[k][d], {n: g_states[n][row] for n in names})
            c_d_out[:, :, d * H:(d + 1) * H] = paths.zero_past(dd_out[out])
            paths.add_x(k, g.x, c_inputs[k], c.extra)
            c.params[k][d] = {n: a.copy() for n, a in g.params.items()}
            for n in names:
                c.states[n][row] = g.states[n]
                c_d_states[n][row] = dd_st[n]
        u = paths.dropout(k, c_d_out)
    return u, c_d_states, c_inputs, c


def _down(paths: _Paths, c_inputs: list[np.ndarray], c: LayerGrads) -> None:
    """Down the layers: a layer's input is the layer below's output, so the cotangent of
    layer ``k``'s input flows back through layer ``k - 1`` (added to ``c_inputs`` and ``c``)."""
    layer, D = paths.layer, paths.layer.num_directions
    zeros = _zero_states(layer, paths.tape.B, paths.tape.dtype)
    for k in range(layer.num_layers - 1, 0, -1):
        _, grads = paths.layer_backward(k - 1, c_inputs[k], zeros, into=c_inputs[k - 1],
                                        extra=c.extra)
        for d, g in enumerate(grads):
            for n, a in g.params.items():
                c.params[k - 1][d][n] += a
            for n in layer.state_sizes:
                c.states[n][(k - 1) * D + d] += g.states[n]
