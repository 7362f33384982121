"""``rnnc::rnn``: ``rnnc.torch.RNN`` as one ``torch.library`` custom op, for ``torch.compile``.

``torch.compile`` cannot trace into NumPy or native code, so while it compiles, the module calls
the custom op ``rnnc::rnn`` instead of its ``autograd.Function``: the compiled graph holds the
whole layer as one opaque op, whose fake rule gives the output shapes and whose backward is a
second op, ``rnnc::rnn_backward``. An op's arguments are tensors and numbers only, so ``key``
names the module in a registry of live modules; an op cannot return rnnc's tape either, so the
backward op runs the training forward again for it (a compiled step costs one forward more than
an eager one). A cell's extra inputs travel as one more tensor list, ``extras`` (in
``module.extra_names`` order, laid out like ``x``), and get gradients like ``x``. Eager calls
never come here: they keep vmap and double backward.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from rnnc.interop.torch_autograd import from_numpy, to_numpy

_MODULES: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_ARGS = ("int key, Tensor x, Tensor?[] states, Tensor[] params, Tensor? lengths, Tensor? seed, "
         "Tensor[] extras")


def register(module: Any) -> int:
    """Make ``module`` (an ``rnnc.torch.RNN``) reachable by the ops; return its key."""
    _MODULES[id(module)] = module
    return id(module)


def apply(module: Any, x: torch.Tensor, states: list[torch.Tensor | None],
          lengths: np.ndarray | None, extras: list[torch.Tensor] = ()) -> list[torch.Tensor]:
    """``[y, *final_states]`` through the op, drawing the dropout seed from torch's RNG;
    ``extras`` are the cell's extra inputs in ``module.extra_names`` order."""
    seed = None
    if module.training and module.dropout > 0 and module.num_layers > 1:
        seed = torch.randint(0, 2**62, (1,))
    lens = None if lengths is None else torch.as_tensor(lengths)
    return torch.ops.rnnc.rnn(module._op_key, x, states, module._flat_parameters(), lens, seed,
                              list(extras))


def _run(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
         params: list[torch.Tensor], lengths: torch.Tensor | None, seed: torch.Tensor | None,
         extras: list[torch.Tensor], train: bool) -> tuple[Any, tuple[Any, ...]]:
    module = _MODULES[key]
    given = {n: to_numpy(s) for n, s in zip(module.state_names, states, strict=True)
             if s is not None}
    extra = {n: to_numpy(e) for n, e in zip(module.extra_names, extras, strict=True)}
    rng = None if seed is None else np.random.default_rng(int(seed.item()))
    return module, module.layer.forward(
        to_numpy(x), None if lengths is None else lengths.numpy(), given, train=train,
        params=module._rnnc_params(tuple(params)), rng=rng, apply_dropout=seed is not None,
        extra=extra)


def _state_shape(module: Any, x: torch.Tensor, name: str) -> tuple[Any, ...]:
    B = x.shape[0 if module.batch_first else 1]
    return (module.num_layers * (2 if module.bidirectional else 1), B,
            module.layer.state_sizes[name])


@torch.library.custom_op("rnnc::rnn", mutates_args=(), schema=f"({_ARGS}) -> Tensor[]")
def _rnn(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
         params: list[torch.Tensor], lengths: torch.Tensor | None, seed: torch.Tensor | None,
         extras: list[torch.Tensor]) -> list[torch.Tensor]:
    module, (y, final, _) = _run(key, x, states, params, lengths, seed, extras, train=False)
    return [from_numpy(y, x), *(from_numpy(final[n], x) for n in module.state_names)]


@_rnn.register_fake
def _rnn_fake(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
              params: list[torch.Tensor], lengths: torch.Tensor | None,
              seed: torch.Tensor | None, extras: list[torch.Tensor]) -> list[torch.Tensor]:
    module = _MODULES[key]
    width = (2 if module.bidirectional else 1) * module.layer.output_size
    y = x.new_empty((*x.shape[:2], width))
    return [y, *(x.new_empty(_state_shape(module, x, n)) for n in module.state_names)]


@torch.library.custom_op("rnnc::rnn_backward", mutates_args=(),
                         schema=f"({_ARGS}, Tensor d_y, Tensor[] d_final) -> Tensor[]")
def _rnn_backward(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
                  params: list[torch.Tensor], lengths: torch.Tensor | None,
                  seed: torch.Tensor | None, extras: list[torch.Tensor], d_y: torch.Tensor,
                  d_final: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[d_x, *d_states, *d_extras, *d_params]``."""
    module, (_, _, tape) = _run(key, x, states, params, lengths, seed, extras, train=True)
    names = module.state_names
    g = module.layer.backward(tape, to_numpy(d_y), {n: to_numpy(d) for n, d in
                                                    zip(names, d_final, strict=True)})
    return [from_numpy(g.x, x), *(from_numpy(g.states[n], x) for n in names),
            *(from_numpy(g.extra[n], x) for n in module.extra_names),
            *(from_numpy(a, x) for a in module._torch_grads(g.params))]


@_rnn_backward.register_fake
def _rnn_backward_fake(key: int, x: torch.Tensor, states: list[torch.Tensor | None],
                       params: list[torch.Tensor], lengths: torch.Tensor | None,
                       seed: torch.Tensor | None, extras: list[torch.Tensor],
                       d_y: torch.Tensor, d_final: list[torch.Tensor]) -> list[torch.Tensor]:
    module = _MODULES[key]
    return [x.new_empty(x.shape),
            *(x.new_empty(_state_shape(module, x, n)) for n in module.state_names),
            *(e.new_empty(e.shape) for e in extras),
            *(p.new_empty(p.shape) for p in params)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: list[torch.Tensor]) -> None:
    key, x, states, params, lengths, seed, extras = inputs
    ctx.key, ctx.n_states, ctx.n_extras = key, len(states), len(extras)
    ctx.given = tuple(s is not None for s in states)
    ctx.shapes = [o.shape for o in output]
    ctx.save_for_backward(x, lengths, seed, *states, *extras, *params)


def _backward(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[Any, ...]:
    x, lengths, seed, *rest = ctx.saved_tensors
    n_in = ctx.n_states + ctx.n_extras
    states, extras, params = rest[:ctx.n_states], rest[ctx.n_states:n_in], rest[n_in:]
    # An output the loss does not use has no gradient: zeros.
    d_y, *d_final = [x.new_zeros(s) if g is None else g
                     for g, s in zip(grads, ctx.shapes, strict=True)]
    out = torch.ops.rnnc.rnn_backward(ctx.key, x, list(states), list(params), lengths, seed,
                                      list(extras), d_y, d_final)
    d_states = [g if given else None
                for g, given in zip(out[1:1 + ctx.n_states], ctx.given, strict=True)]
    if not any(ctx.given):  # a list of Nones reaches autograd as one None
        d_states = None
    d_extras = list(out[1 + ctx.n_states:1 + n_in])
    return None, out[0], d_states, list(out[1 + n_in:]), None, None, d_extras


torch.library.register_autograd("rnnc::rnn", _backward, setup_context=_setup_context)
